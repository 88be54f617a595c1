"""A pure-Python model of PyTorch's CUDA caching allocator that records real-format snapshots.

The sample snapshots must exercise the same rules a real dump obeys (512-byte rounding, the
small/large pools, splitting, coalescing, best-fit reuse, release-and-retry before an OOM,
private pools, streams, expandable segments), otherwise the analyzer would be tested against
layouts no real job can produce. Each live block also carries a ``family`` tag given by the
scenario: that is the ground truth a report is checked against, never written to the pickle.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import NoReturn

from .frames import Frame, FrameDict, FrameTable
from .rules import (
    LARGE_BUFFER,
    ROUNDUP_INTERVALS,
    allocation_size,
    expandable_page_size,
    is_small,
    round_size,
    should_split,
)

DEFAULT_POOL = (0, 0)
TIME_ORIGIN_US = 1_767_225_600_000_000  # fixed clock start: samples must be byte-stable
ADDRESS_ORIGIN = 0x7F2A_0000_0000  # where a Linux process's cudaMalloc ranges usually sit
ADDRESS_SPAN = 1 << 44
#: The addresses a recorded range may lie at: all of a 64-bit space above the null page, not
#: only CUDA's usual span (torch_npu's ranges sit near 0x12c0_0000_0000, far under it), so a
#: replay puts each segment where the job's own was and equal free blocks tie as they did.
ADDRESS_LOW, ADDRESS_HIGH = 1 << 12, 1 << 64

Stack = Sequence[Frame] | None
#: Where the driver put a new range, when it is known (a replay of a recorded trace): asked
#: with the segment event about to be made ("segment_alloc" or, for a new expandable
#: segment, "segment_map") and its size; None when unknown.
AddressOracle = Callable[[str, int], int | None]


class SimulatedOOM(RuntimeError):
    """Raised where PyTorch would raise torch.OutOfMemoryError; carries the message's numbers."""

    def __init__(
        self, requested: int, alloc_size: int, device_free: int, capacity: int,
        reserved: int, allocated: int,
    ) -> None:
        self.requested = requested
        self.alloc_size = alloc_size
        self.device_free = device_free
        self.capacity = capacity
        self.reserved = reserved
        self.allocated = allocated
        super().__init__(
            f"CUDA out of memory. Tried to allocate {alloc_size} bytes; {device_free} free of "
            f"{capacity}; {allocated} allocated by PyTorch, "
            f"{reserved - allocated} reserved but unallocated"
        )


@dataclass(eq=False)
class Block:
    """A contiguous range inside a segment: allocated, pending free, free, or unmapped."""

    address: int
    size: int
    segment: Segment
    requested: int = 0
    allocated: bool = False
    pending: bool = False
    mapped: bool = True
    frames: list[FrameDict] = field(default_factory=list)
    family: str = "unknown"
    stream_uses: set[int] = field(default_factory=set)

    @property
    def free(self) -> bool:
        """Usable by a new request (not allocated, no outstanding stream event)."""
        return not self.allocated and not self.pending

    @property
    def end(self) -> int:
        return self.address + self.size


@dataclass(eq=False)
class Segment:
    """One cudaMalloc (or, when expandable, one reserved virtual range mapped in pages)."""

    address: int
    size: int
    stream: int
    pool: tuple[int, int]
    small: bool
    expandable: bool
    frames: list[FrameDict]
    blocks: list[Block] = field(default_factory=list)


class _AddressSpace:
    """First-fit virtual addresses: a freed segment's range is handed out again."""

    def __init__(self) -> None:
        self._free: list[tuple[int, int]] = [(ADDRESS_LOW, ADDRESS_HIGH - ADDRESS_LOW)]

    def free_at(self, start: int, size: int) -> bool:
        """Whether [start, start + size) is wholly unused."""
        return any(s <= start and start + size <= s + n for s, n in self._free)

    def below(self, size: int, floor: int) -> int:
        """The highest free range of `size` ending at or under `floor`: CUDA's driver hands
        a process's cudaMalloc ranges out downwards (each new segment of a recorded trace
        lies under the last), which decides ties between equal free blocks."""
        for start, span in reversed(self._free):
            top = min(start + span, floor)
            if top - start >= size:
                self.take(top - size, size)
                return top - size
        return self.reserve(size)

    def reserve(self, size: int) -> int:
        """The lowest free range of `size` at or above ADDRESS_ORIGIN (a range nothing
        recorded names)."""
        for start, span in self._free:
            lo = max(start, ADDRESS_ORIGIN)
            if start + span - lo >= size:
                self.take(lo, size)
                return lo
        raise MemoryError("simulated address space exhausted")

    def take(self, start: int, size: int) -> None:
        """Mark [start, start + size) used: a range held before the simulation began."""
        out: list[tuple[int, int]] = []
        for s, n in self._free:
            if s + n <= start or start + size <= s:
                out.append((s, n))
                continue
            if s < start:
                out.append((s, start - s))
            if start + size < s + n:
                out.append((start + size, s + n - start - size))
        self._free = out

    def release(self, start: int, size: int) -> None:
        self._free.append((start, size))
        self._free.sort()
        merged: list[tuple[int, int]] = []
        for s, n in self._free:
            if merged and merged[-1][0] + merged[-1][1] == s:
                merged[-1] = (merged[-1][0], merged[-1][1] + n)
            else:
                merged.append((s, n))
        self._free = merged


class CachingAllocatorSim:
    """Simulated device 0: ``malloc``/``free`` like the caching allocator, ``snapshot`` like
    ``torch.cuda.memory._snapshot()``."""

    def __init__(
        self,
        capacity: int,
        outside_pytorch: int = 0,
        expandable_segments: bool = False,
        time_origin_us: int = TIME_ORIGIN_US,
        addresses: AddressOracle | None = None,
        max_split_size: int | None = None,
        roundup_divisions: Sequence[int] = (),
        trace_actions: frozenset[str] | None = None,
        request_pad: int = 0,
    ) -> None:
        """`addresses`: where new ranges go when a replay knows (the recorded trace's own);
        given, the ranges it does not name go downwards under the lowest one held, as the
        driver's do; without it (the samples) they go upwards from ADDRESS_ORIGIN.
        `max_split_size` (bytes; None: unlimited) and `roundup_divisions` (per power-of-two
        interval from 1 MiB) are PYTORCH_CUDA_ALLOC_CONF's max_split_size_mb and
        roundup_power2_divisions. `trace_actions`: the only actions written to `trace`
        (None: all; a replay reads back only its segment events). `request_pad`: bytes an
        accelerator's allocator adds to every request before rounding it (CUDA's: none;
        torch_npu's: 32, which a capture's final blocks show)."""
        self.capacity = capacity
        self.trace_actions = trace_actions
        self.max_split_size = max_split_size
        self.roundup_divisions = tuple(roundup_divisions)
        self.request_pad = request_pad
        self.outside_pytorch = outside_pytorch
        self.expandable_segments = expandable_segments
        self.table = FrameTable()
        self.trace: list[dict[str, object]] = []
        self.annotations: list[dict[str, object]] = []
        self.now_us = time_origin_us
        self.reserved = 0
        self.peak_allocated = 0
        self._segments: list[Segment] = []
        self._live: dict[int, Block] = {}
        self._pending: list[Block] = []
        self._freeable_pools: set[tuple[int, int]] = set()
        self._space = _AddressSpace()
        self._addresses = addresses
        self._nevents = 0
        self._allocated = 0
        #: free mapped blocks per (pool, small, stream), sorted by (size, address): PyTorch's
        #: BlockPool.blocks, so a best fit is a bisection rather than a scan of every block
        self._index: dict[tuple[tuple[int, int], bool, int], list[tuple[int, int]]] = {}
        self._by_key: dict[tuple[int, int], Block] = {}

    # ----------------------------------------------------------------- clock and trace
    def advance(self, us: int) -> None:
        """Let time pass between phases (kernels run, the host waits)."""
        self.now_us += us

    def _tick(self) -> int:
        t = self.now_us
        self._nevents += 1
        self.now_us += 3 + (self._nevents * 7919) % 29  # deterministic, uneven spacing
        return t

    def _record(
        self, action: str, addr: int, size: int, stream: int, frames: list[FrameDict],
        addr_key: str = "addr",
    ) -> None:
        if self.trace_actions is not None and action not in self.trace_actions:
            return
        self.trace.append({
            "action": action, addr_key: addr, "size": size, "stream": stream,
            "time_us": self._tick(), "compile_context": "N/A", "user_metadata": "",
            "frames": frames,
        })

    def annotate_start(self, name: str) -> None:
        """A record_function START annotation (e.g. ``Optimizer.step#AdamW.step``)."""
        self.annotations.append(
            {"stage": "START", "name": name, "device": 0, "time_us": self._tick()})

    def annotate_end(self, name: str) -> None:
        self.annotations.append(
            {"stage": "END", "name": name, "device": 0, "time_us": self._tick()})

    @contextmanager
    def annotate(self, name: str) -> Iterator[None]:
        self.annotate_start(name)
        try:
            yield
        finally:
            self.annotate_end(name)

    # ----------------------------------------------------------------- accounting
    @property
    def allocated(self) -> int:
        """Bytes in allocated blocks (PyTorch's allocated_bytes stat: block sizes)."""
        return self._allocated

    @property
    def pending_free(self) -> int:
        """Bytes in blocks freed but waiting on another stream: they still hold their place."""
        return sum(b.size for b in self._live.values() if b.pending)

    @property
    def device_free(self) -> int:
        """What cudaMemGetInfo would report as free."""
        return self.capacity - self.reserved - self.outside_pytorch

    def live_blocks(self) -> list[Block]:
        """Allocated and pending-free blocks, by address."""
        return sorted(self._live.values(), key=lambda b: b.address)

    def adopt(self, address: int, size: int, stream: int, small: bool,
              blocks: Sequence[tuple[int, int, int, bool]],
              pool: tuple[int, int] = DEFAULT_POOL) -> None:
        """A segment of the default pool that existed before the simulation began (a
        recorded window that starts mid-run), with its blocks: (address, size, requested,
        allocated); the gaps between them are its free blocks."""
        seg = Segment(address, size, stream, pool, small, False, self.table.empty)
        at = address
        for addr, nbytes, requested, allocated in sorted(blocks):
            if addr > at:
                seg.blocks.append(Block(at, addr - at, seg))
            block = Block(addr, nbytes, seg, requested=requested, allocated=allocated)
            seg.blocks.append(block)
            if allocated:
                self._live[addr] = block
                self._allocated += nbytes
            at = addr + nbytes
        if at < address + size:
            seg.blocks.append(Block(at, address + size - at, seg))
        self._segments.append(seg)
        for b in seg.blocks:
            if b.free:
                self._index_add(b)
        self._space.take(address, size)
        self.reserved += size

    def _new_range(self, action: str, size: int) -> int:
        """An address for a new segment (or expandable range) of `size`."""
        if self._addresses is None:
            return self._space.reserve(size)
        hint = self._addresses(action, size)
        if hint is not None and self._space.free_at(hint, size):
            self._space.take(hint, size)
            return hint
        floor = min((seg.address for seg in self._segments),
                    default=ADDRESS_ORIGIN + ADDRESS_SPAN)
        return self._space.below(size, floor)

    # ----------------------------------------------------------------- malloc / free
    def malloc(
        self, size: int, stack: Stack = None, *, stream: int = 0,
        pool: tuple[int, int] = DEFAULT_POOL, family: str = "unknown",
    ) -> int:
        """Allocate ``size`` bytes; returns the block address or raises SimulatedOOM."""
        frames = self.table.stack(stack)
        rounded = round_size(size + self.request_pad, self.roundup_divisions)
        small = is_small(rounded)
        block = self._find_free(rounded, small, stream, pool)
        if block is None:
            block = self._grow(rounded, small, stream, pool, frames)
            if block is None and self._release_oversize(rounded, small, stream, pool, frames):
                block = self._grow(rounded, small, stream, pool, frames)
            if block is None:
                self.release_cached(frames)
                block = self._grow(rounded, small, stream, pool, frames)
            if block is None:
                self._raise_oom(rounded, small, stream, frames)
        self._index_drop(block)
        block = self._split(block, rounded, small)
        block.allocated = True
        self._allocated += block.size
        block.requested = size
        block.frames = frames
        block.family = family
        self._live[block.address] = block
        self._record("alloc", block.address, size, stream, frames)
        self.peak_allocated = max(self.peak_allocated, self.allocated)
        return block.address

    def record_stream(self, addr: int, stream: int) -> None:
        """``tensor.record_stream(s)``: the free will wait for work queued on ``s``."""
        block = self._live[addr]
        if stream != block.segment.stream:
            block.stream_uses.add(stream)

    def free(self, addr: int, stack: Stack = None) -> None:
        """Release a tensor. With stream uses the block stays ``active_pending_free``."""
        block = self._live[addr]
        if not block.allocated:
            raise ValueError(f"double free of {addr:#x}")
        frames = self.table.stack(stack) if stack is not None else block.frames
        self._record("free_requested", addr, block.requested, block.segment.stream, frames)
        block.allocated = False
        self._allocated -= block.size
        if block.stream_uses:
            block.pending = True
            self._pending.append(block)
        else:
            self._free_block(block, frames)

    def complete_pending(self) -> None:
        """The events recorded on other streams have completed: finish the deferred frees."""
        pending, self._pending = self._pending, []
        for block in pending:
            self._free_block(block, block.frames)

    def empty_cache(self, stack: Stack = None) -> None:
        """``torch.cuda.empty_cache()``."""
        self.release_cached(self.table.stack(stack))

    # ----------------------------------------------------------------- internals
    def _find_free(
        self, rounded: int, small: bool, stream: int, pool: tuple[int, int]
    ) -> Block | None:
        """Best fit: the smallest cached free block of the same pool and stream (then lowest
        address), the order of PyTorch's (stream, size, ptr) block set. With expandable
        segments on, a block followed by unmapped pages counts as the size it can grow to,
        and larger blocks are tried while they can grow to less (get_free_block's
        ``expandable_size`` walk)."""
        index = self._index.get((pool, small, stream), [])
        at = bisect.bisect_left(index, (rounded, -1))
        if at == len(index):
            return None
        if self.expandable_segments:
            while self._by_key[index[at]].segment.expandable and at + 1 < len(index) and \
                    self._expandable_size(self._by_key[index[at + 1]]) < \
                    self._expandable_size(self._by_key[index[at]]):
                at += 1
        limit, found = self.max_split_size, self._by_key[index[at]]
        if limit is not None and (rounded < limit <= found.size or
                                  rounded >= limit and found.size >= rounded + LARGE_BUFFER):
            return None  # an oversize block serves only requests within 20 MiB of it
        return found

    def _release_oversize(self, rounded: int, small: bool, stream: int,
                          pool: tuple[int, int], frames: list[FrameDict]) -> bool:
        """release_available_cached_blocks (max_split_size_mb set, a cudaMalloc failed):
        cudaFree the smallest cached block of at least max(request, max_split_size), or else
        oversize blocks from the largest down until as much is freed; whether it did."""
        limit = self.max_split_size
        if limit is None:
            return False
        key = max(rounded, limit)
        cached = sorted(
            (b for seg in self._segments
             if seg.pool == pool and seg.small == small and seg.stream == stream
             and not seg.expandable for b in seg.blocks if b.free),
            key=lambda b: (b.size, b.address))
        one = next((b for b in cached if b.size >= key), None)
        if one is not None:
            self._release_segment(one.segment, frames)
            return True
        released = 0
        for block in reversed(cached):
            if released >= key or block.size < limit:
                break
            released += block.size
            self._release_segment(block.segment, frames)
        return released >= key

    def _release_segment(self, seg: Segment, frames: list[FrameDict]) -> None:
        """release_block: cudaFree a cached segment (its one free block)."""
        for b in seg.blocks:
            self._index_drop(b)
        self._record("segment_free", seg.address, seg.size, seg.stream, frames)
        self._segments.remove(seg)
        self._space.release(seg.address, seg.size)
        self.reserved -= seg.size

    @staticmethod
    def _expandable_size(block: Block) -> int:
        """A free block's size plus the unmapped range right after it, if any."""
        blocks = block.segment.blocks
        i = blocks.index(block)
        nxt = blocks[i + 1] if i + 1 < len(blocks) else None
        return block.size + (nxt.size if nxt is not None and not nxt.mapped else 0)

    def _fits(self, nbytes: int) -> bool:
        return self.reserved + nbytes <= self.capacity - self.outside_pytorch

    def _grow(
        self, rounded: int, small: bool, stream: int, pool: tuple[int, int],
        frames: list[FrameDict],
    ) -> Block | None:
        """A new cudaMalloc (or new mapped pages); None when the device has no room."""
        if self.expandable_segments and pool == DEFAULT_POOL:
            return self._grow_expandable(rounded, small, stream, pool, frames)
        size = allocation_size(rounded)
        if not self._fits(size):
            return None
        addr = self._new_range("segment_alloc", size)
        seg = Segment(addr, size, stream, pool, small, False, frames)
        seg.blocks.append(Block(addr, size, seg))
        self._segments.append(seg)
        self.reserved += size
        self._record("segment_alloc", addr, size, stream, frames)
        return seg.blocks[0]

    def _split(self, block: Block, rounded: int, small: bool) -> Block:
        """Carve the request from the front; the old block object stays as the remainder."""
        if not should_split(block.size, rounded, small or self.expandable_segments,
                            self.max_split_size):
            return block
        seg = block.segment
        new = Block(block.address, rounded, seg)
        block.address += rounded
        block.size -= rounded
        seg.blocks.insert(seg.blocks.index(block), new)
        self._index_add(block)
        return new

    def _free_block(self, block: Block, frames: list[FrameDict]) -> None:
        self._record(
            "free_completed", block.address, block.requested, block.segment.stream, frames)
        del self._live[block.address]
        block.pending = False
        block.stream_uses.clear()
        block.frames = self.table.empty
        block.family = "unknown"
        self._index_add(self._merge_neighbours(block))

    def _merge_neighbours(self, block: Block) -> Block:
        """Coalesce with free neighbours in the same state; ``block`` survives, as in PyTorch."""
        blocks = block.segment.blocks
        self._index_drop(block)
        i = blocks.index(block)
        if i + 1 < len(blocks):
            nxt = blocks[i + 1]
            if nxt.free and nxt.mapped == block.mapped:
                self._index_drop(nxt)
                block.size += nxt.size
                del blocks[i + 1]
        if i > 0:
            prv = blocks[i - 1]
            if prv.free and prv.mapped == block.mapped:
                self._index_drop(prv)
                block.address = prv.address
                block.size += prv.size
                del blocks[i - 1]
        return block

    def _index_add(self, block: Block) -> None:
        """A free mapped block enters its pool's (size, address) order."""
        if not block.mapped or not block.free:
            return
        seg = block.segment
        key = (block.size, block.address)
        bisect.insort(self._index.setdefault((seg.pool, seg.small, seg.stream), []), key)
        self._by_key[key] = block

    def _index_drop(self, block: Block) -> None:
        """A block leaves the order (taken, merged, resized, unmapped or released)."""
        key = (block.size, block.address)
        if self._by_key.get(key) is not block:
            return
        del self._by_key[key]
        seg = block.segment
        index = self._index[(seg.pool, seg.small, seg.stream)]
        del index[bisect.bisect_left(index, key)]

    def _releasable(self, pool: tuple[int, int]) -> bool:
        return pool == DEFAULT_POOL or pool in self._freeable_pools

    def release_cached(self, frames: list[FrameDict]) -> None:
        """release_cached_blocks: wait for pending frees, then cudaFree every cached segment
        that is entirely free (large pool first, then small; each in (stream, size, ptr) order)
        and unmap the free pages of expandable segments."""
        self.complete_pending()
        for small in (False, True):
            whole = [
                s for s in self._segments
                if s.small == small and not s.expandable and self._releasable(s.pool)
                and len(s.blocks) == 1 and s.blocks[0].free
            ]
            for seg in sorted(whole, key=lambda s: (s.stream, s.size, s.address)):
                self._release_segment(seg, frames)
            # release_blocks collects the pool's free expandable blocks in its set order
            # (stream, size, ptr), then unmaps each and frees a segment left fully unmapped
            free = sorted(
                (b for s in self._segments if s.small == small and s.expandable
                 and self._releasable(s.pool) for b in s.blocks if b.mapped and b.free),
                key=lambda b: (b.segment.stream, b.size, b.address))
            for block in free:
                self._unmap_block(block, frames)

    def releasable_bytes(self) -> int:
        """Bytes release_cached would return to the device now (used to calibrate scenarios)."""
        total = sum(b.size for b in self._pending)
        for seg in self._segments:
            if not self._releasable(seg.pool):
                continue
            if not seg.expandable:
                if len(seg.blocks) == 1 and (seg.blocks[0].free or seg.blocks[0].pending):
                    total += seg.size
                continue
            page = expandable_page_size(seg.small)
            for b in seg.blocks:
                if b.mapped and (b.free or b.pending):
                    lo = page * ((b.address - seg.address + page - 1) // page)
                    hi = page * ((b.end - seg.address) // page)
                    total += max(0, hi - lo)
        return total

    def _raise_oom(
        self, rounded: int, small: bool, stream: int, frames: list[FrameDict]
    ) -> NoReturn:
        device_free = self.device_free
        self._record("oom", device_free, rounded, stream, frames, addr_key="device_free")
        raise SimulatedOOM(
            rounded, allocation_size(rounded), device_free, self.capacity, self.reserved,
            self.allocated,
        )

    # ----------------------------------------------------------------- expandable segments
    def _virtual_size(self, page: int) -> int:
        """PyTorch reserves address space for 1 1/8 of the device per expandable segment."""
        total = self.capacity + self.capacity // 8
        return page * ((total + page - 1) // page)

    def _grow_expandable(
        self, rounded: int, small: bool, stream: int, pool: tuple[int, int],
        frames: list[FrameDict],
    ) -> Block | None:
        candidate: Block | None = self._find_expandable(rounded, small, stream, pool, frames)
        if candidate is not None and not candidate.mapped:
            candidate = self._map(candidate, min(candidate.size, rounded), frames)
        while candidate is not None and candidate.size < rounded:
            blocks = candidate.segment.blocks
            nxt = blocks[blocks.index(candidate) + 1]
            candidate = self._map(nxt, min(rounded - candidate.size, nxt.size), frames)
        return candidate

    def _find_expandable(
        self, rounded: int, small: bool, stream: int, pool: tuple[int, int],
        frames: list[FrameDict],
    ) -> Block:
        """An unmapped block (with a free mapped block just before it, if any) that has room;
        otherwise reserve a new expandable segment."""
        unmapped = [
            b for s in self._segments
            if s.expandable and s.small == small and s.stream == stream and s.pool == pool
            for b in s.blocks if not b.mapped
        ]
        # pool.unmapped is ordered by (stream, address): the lowest gap that has room wins
        for b in sorted(unmapped, key=lambda b: b.address):
            blocks = b.segment.blocks
            i = blocks.index(b)
            if i > 0 and blocks[i - 1].free:
                i -= 1
            room = 0
            for c in blocks[i:]:
                if room >= rounded or not c.free:
                    break
                room += c.size
            if room >= rounded:
                return blocks[i]
        page = expandable_page_size(small)
        vsize = self._virtual_size(page)
        addr = self._new_range("segment_map", vsize)
        seg = Segment(addr, vsize, stream, pool, small, True, frames)
        seg.blocks.append(Block(addr, vsize, seg, mapped=False))
        self._segments.append(seg)
        return seg.blocks[0]

    def _map(self, block: Block, size: int, frames: list[FrameDict]) -> Block | None:
        """Map whole pages covering ``size`` bytes at the start of an unmapped block."""
        seg = block.segment
        page = expandable_page_size(seg.small)
        offset = block.address - seg.address
        end = seg.address + page * ((offset + size + page - 1) // page)
        end = min(end, block.end)
        nbytes = end - block.address
        if not self._fits(nbytes):
            return None
        if nbytes < block.size:
            rest = Block(end, block.size - nbytes, seg, mapped=False)
            seg.blocks.insert(seg.blocks.index(block) + 1, rest)
            block.size = nbytes
        block.mapped = True
        block.requested = 0
        self.reserved += nbytes
        self._record("segment_map", block.address, nbytes, seg.stream, frames)
        merged = self._merge_neighbours(block)
        self._index_add(merged)
        return merged

    def _unmap_block(self, block: Block, frames: list[FrameDict]) -> None:
        """unmap_block: unmap the whole pages inside a free mapped block (partial pages stay
        mapped, as free blocks before and after); release_expandable_segment when nothing of
        the segment is mapped any more."""
        seg = block.segment
        page = expandable_page_size(seg.small)
        lo = seg.address + page * ((block.address - seg.address + page - 1) // page)
        hi = seg.address + page * ((block.end - seg.address) // page)
        if hi <= lo:
            return
        self._index_drop(block)
        i = seg.blocks.index(block)
        if hi < block.end:
            after = Block(hi, block.end - hi, seg)
            seg.blocks.insert(i + 1, after)
            self._index_add(after)
        if lo > block.address:
            before = Block(block.address, lo - block.address, seg)
            seg.blocks.insert(i, before)
            self._index_add(before)
        block.address, block.size, block.mapped = lo, hi - lo, False
        self.reserved -= hi - lo
        self._merge_neighbours(block)
        self._record("segment_unmap", lo, hi - lo, seg.stream, frames)
        if len(seg.blocks) == 1 and not seg.blocks[0].mapped:
            self._segments.remove(seg)
            self._space.release(seg.address, seg.size)

    # ----------------------------------------------------------------- snapshot
    def _segment_runs(self, seg: Segment) -> list[list[Block]]:
        """Blocks per reported segment: an expandable segment is reported once per
        contiguous mapped range, as PyTorch's snapshot does."""
        if not seg.expandable:
            return [seg.blocks]
        runs: list[list[Block]] = []
        current: list[Block] = []
        for b in seg.blocks:
            if b.mapped:
                current.append(b)
            elif current:
                runs.append(current)
                current = []
        if current:
            runs.append(current)
        return runs

    def segment_sizes(self) -> list[int]:
        """The sizes a snapshot taken now would report for its segments, sorted."""
        return sorted(sum(b.size for b in run)
                      for seg in self._segments for run in self._segment_runs(seg))

    def _segment_dict(self, seg: Segment, run: list[Block]) -> dict[str, object]:
        blocks = []
        allocated = active = requested = 0
        for b in run:
            if b.allocated:
                state = "active_allocated"
                allocated += b.size
            elif b.pending:
                state = "active_pending_free"
            else:
                state = "inactive"
            if b.allocated or b.pending:
                active += b.size
                requested += b.requested
            blocks.append({
                "address": b.address, "size": b.size, "requested_size": b.requested,
                "state": state, "frames": b.frames,
            })
        return {
            "device": 0, "address": run[0].address,
            "total_size": sum(b.size for b in run), "allocated_size": allocated,
            "active_size": active, "requested_size": requested, "stream": seg.stream,
            "segment_type": "small" if seg.small else "large",
            "segment_pool_id": seg.pool, "is_expandable": seg.expandable,
            "frames": seg.frames, "blocks": blocks,
        }

    def allocator_settings(self) -> dict[str, object]:
        """What `_snapshot()` records of the settings the simulator ran with (PyTorch keys the
        divisions by interval start in MiB, 1 to 32768: `roundup_key` doubling)."""
        items = ["expandable_segments:True"] if self.expandable_segments else []
        divisions = list(self.roundup_divisions[:ROUNDUP_INTERVALS])
        divisions += [divisions[-1] if divisions else 0] * (ROUNDUP_INTERVALS - len(divisions))
        if any(divisions):
            items.append("roundup_power2_divisions:[" + ",".join(
                f"{1 << i}:{d}" for i, d in enumerate(divisions)) + "]")
        return {
            "PYTORCH_CUDA_ALLOC_CONF": ",".join(items), "max_split_size": -1,
            "garbage_collection_threshold": 0.0,
            "expandable_segments": self.expandable_segments,
            "pinned_num_register_threads": 1, "release_lock_on_cudamalloc": False,
            "pinned_use_cuda_host_register": False,
            "graph_capture_record_stream_reuse": False,
            "roundup_power2_divisions": {str(1 << i): d for i, d in enumerate(divisions)},
        }

    def snapshot(self) -> dict[str, object]:
        """The dict ``torch.cuda.memory._snapshot()`` returns (layout of torch >= 2.6)."""
        segments = [
            self._segment_dict(seg, run)
            for seg in self._segments for run in self._segment_runs(seg)
        ]
        segments.sort(key=lambda s: s["address"])  # type: ignore[arg-type,return-value]
        return {
            "segments": segments,
            "device_traces": [list(self.trace)],
            "allocator_settings": self.allocator_settings(),
            "external_annotations": list(self.annotations),
        }


__all__ = ["CachingAllocatorSim", "SimulatedOOM", "Block", "Segment", "DEFAULT_POOL"]
