"""An independent replay of a raw snapshot pickle, for tests: plain Python over the decoded
dict, with the caching allocator's documented rules written out here rather than taken
from snapana (c10/cuda/CUDACachingAllocator.cpp: requests rounded up to 512 bytes; a free
block bigger than a large-pool request is split only when more than kSmallSize (1 MiB)
would remain, else the request takes all of it; with max_split_size_mb, a request of that
size or more is never split and takes a block less than kLargeBuffer (20 MiB) larger;
torch_npu adds 32 bytes to every request before rounding and picks the pool on the padded
size, which the final blocks and the pools of the trace's requests show).

The replay walks the trace forward from the state before its first event (the final
segments and blocks with every recorded event undone) and sizes each block as the
allocator cut it: from its address to the next block or segment end when what would
remain was too small to split off. With expandable segments on (recorded in the settings,
or shown by the segments), every remainder of 512 bytes or more is split (shouldSplit).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

MIN_BLOCK = 512
SMALL_SIZE = 1 << 20
LARGE_BUFFER = 20 << 20
PADS = (0, 32)
ACTIVE = {"active_allocated", "active_pending_free", "active_awaiting_free"}
FREES = ("free_completed", "free")


def rounded(request: int, pad: int = 0) -> int:
    return max(MIN_BLOCK, -(-(request + pad) // MIN_BLOCK) * MIN_BLOCK)


def final_blocks(raw, device: int) -> dict[int, tuple[int, int, str]]:
    """address -> (size, requested, state) of the snapshot's live blocks on `device`."""
    segs = raw if isinstance(raw, list) else raw["segments"]
    out = {}
    for seg in segs:
        if seg.get("device", 0) != device:
            continue
        addr = seg["address"]  # older layouts give blocks no address: they are contiguous
        for b in seg["blocks"]:
            if b["state"] in ACTIVE:
                out[b.get("address", addr)] = (b["size"], b.get("requested_size", b["size"]),
                                               b["state"])
            addr += b["size"]
    return out


def pool_witnesses(raw, device: int) -> dict[int, int]:
    """Per pad: the trace's requests that the pads send to different pools (torch_npu's
    malloc picks the pool on round_size(orig_size), which adds 32 bytes: a request within
    32 bytes of kSmallSize goes to the large pool) lying in a segment of the pool that pad
    picks. A small-pool segment is kSmallBuffer (2 MiB); a large-pool one never is (20 MiB,
    or a request of 10 MiB or more rounded up to 2 MiB). Expandable captures are skipped."""
    seen = dict.fromkeys(PADS, 0)
    trace = (raw.get("device_traces") or [[]] * (device + 1))[device] if isinstance(
        raw, dict) else []
    if any(e["action"] in ("segment_map", "segment_unmap") for e in trace):
        return seen
    whole = _ranges_before(raw, device, trace).whole  # start -> end, before the first event
    for e in trace:
        _apply_whole(whole, e)
        if e["action"] != "alloc":
            continue
        small = {p: rounded(e["size"], p) <= SMALL_SIZE for p in PADS}
        if len(set(small.values())) == 1:
            continue
        held = [b - a for a, b in whole.items() if a <= e["addr"] < b]
        if len(held) != 1:
            continue
        for p, is_small in small.items():
            seen[p] += is_small == (held[0] == 2 * SMALL_SIZE)
    return seen


def _apply_whole(whole: dict[int, int], e: dict) -> None:
    if e["action"] == "segment_alloc":
        whole[e["addr"]] = e["addr"] + e["size"]
    elif e["action"] == "segment_free":
        whole.pop(e["addr"], None)


def learned_pad(blocks, pools: dict[int, int] | None = None) -> int:
    """The bytes every witness among the final blocks shows added before rounding: a block
    whose request the pads round differently and whose size is one of them (and, given
    `pools`, each request the pads send to different pools, in the pool of one). Three
    witnesses of one pad and none of another, else 0."""
    seen = dict.fromkeys(PADS, 0)
    for p, n in (pools or {}).items():
        seen[p] += n
    for size, req, _ in blocks:
        if req <= 0:
            continue
        sizes = {p: rounded(req, p) for p in PADS}
        if len(set(sizes.values())) > 1:
            for p, s in sizes.items():
                seen[p] += s == size
    for p in PADS[1:]:
        if seen[p] >= 3 and not any(n for q, n in seen.items() if q != p):
            return p
    return 0


class _Ranges:
    """Memory the device holds at a moment: whole segments, and the mapped ranges of
    expandable ones (touching mapped pieces are one range)."""

    def __init__(self) -> None:
        self.whole: dict[int, int] = {}  # start -> end
        self.mapped: list[list[int]] = []  # sorted, disjoint, not touching [start, end)

    def map(self, lo: int, hi: int) -> None:
        keep = [r for r in self.mapped if r[1] < lo or r[0] > hi]
        joined = [r for r in self.mapped if not (r[1] < lo or r[0] > hi)]
        lo = min([lo] + [r[0] for r in joined])
        hi = max([hi] + [r[1] for r in joined])
        self.mapped = sorted(keep + [[lo, hi]])

    def unmap(self, lo: int, hi: int) -> None:
        out = []
        for a, b in self.mapped:
            if b <= lo or a >= hi:
                out.append([a, b])
                continue
            if a < lo:
                out.append([a, lo])
            if b > hi:
                out.append([hi, b])
        self.mapped = out

    def end_of(self, addr: int) -> int | None:
        for a, b in list(self.whole.items()) + [tuple(r) for r in self.mapped]:
            if a <= addr < b:
                return b
        return None

    def sizes(self) -> dict[int, int]:
        out = {a: b - a for a, b in self.whole.items()}
        out.update({a: b - a for a, b in self.mapped})
        return out


def _ranges_before(raw, device: int, trace: list[dict]) -> _Ranges:
    segs = raw if isinstance(raw, list) else raw["segments"]
    ranges = _Ranges()
    for s in segs:
        if s.get("device", 0) != device:
            continue
        if s.get("is_expandable"):
            ranges.map(s["address"], s["address"] + s["total_size"])
        else:
            ranges.whole[s["address"]] = s["address"] + s["total_size"]
    for e in reversed(trace):  # undo every segment event
        a, n = e.get("addr"), e.get("size")
        if e["action"] == "segment_alloc":
            ranges.whole.pop(a, None)
        elif e["action"] == "segment_free":
            ranges.whole[a] = a + n
        elif e["action"] == "segment_map":
            ranges.unmap(a, a + n)
        elif e["action"] == "segment_unmap":
            ranges.map(a, a + n)
    return ranges


def _apply(ranges: _Ranges, e: dict) -> None:
    a, n = e.get("addr"), e.get("size")
    if e["action"] == "segment_alloc":
        ranges.whole[a] = a + n
    elif e["action"] == "segment_free":
        ranges.whole.pop(a, None)
    elif e["action"] == "segment_map":
        ranges.map(a, a + n)
    elif e["action"] == "segment_unmap":
        ranges.unmap(a, a + n)


@dataclass
class RawReplay:
    moment: int | None  # trace index of the moment (the last OOM, else the peak); None: no trace
    live: dict[int, int]  # allocated blocks at the moment: address -> size
    segments: dict[int, int]  # segments (mapped ranges) at the moment: address -> size
    pending: int  # bytes freed but waiting on a stream at the moment
    peak: int  # peak allocated bytes
    pad: int
    freed_before: dict[int, int]  # blocks freed before any alloc of their address (rounded)
    max_split: int | None


def _cut(addr: int, size: int, starts: list[int], ranges: _Ranges, max_split) -> int:
    """The block a large request of `size` rounded bytes got at `addr`: the whole free
    block when what would remain is too small to split (see the module docstring;
    `max_split` is None for expandable segments: nothing is cut whole then)."""
    if size <= SMALL_SIZE or max_split is None:
        return size
    end = ranges.end_of(addr)
    k = bisect.bisect_right(starts, addr)
    nxt = starts[k] if k < len(starts) else None
    bounds = [b for b in (end, nxt) if b is not None]
    if not bounds:
        return size
    whole = min(bounds) - addr
    oversize = size >= max_split
    if oversize and whole - size < LARGE_BUFFER:  # never split
        return whole
    return whole if 0 < whole - size <= SMALL_SIZE else size


def raw_replay(raw, device: int) -> RawReplay:
    trace = (raw.get("device_traces") or [[]] * (device + 1))[device] if isinstance(
        raw, dict) else []
    final = final_blocks(raw, device)
    pad = learned_pad(final.values(), pool_witnesses(raw, device))
    settings = (raw.get("allocator_settings") or {}) if isinstance(raw, dict) else {}
    split = settings.get("max_split_size")
    # unlimited: the large pool splits remainders over kSmallSize; None: expandable
    # segments, which split them all
    max_split = split if isinstance(split, int) and 0 < split < (1 << 63) else 1 << 63
    segs = raw if isinstance(raw, list) else raw["segments"]
    if settings.get("expandable_segments") or any(s.get("is_expandable") for s in segs) or \
            any(e["action"] == "segment_map" for e in trace):
        max_split = None
    ranges = _ranges_before(raw, device, trace)
    last_alloc = {e["addr"]: i for i, e in enumerate(trace) if e["action"] == "alloc"}
    freed_before, seen = {}, set()  # blocks freed before any alloc of their address
    for e in trace:
        a = e.get("addr")
        if e["action"] == "alloc":
            seen.add(a)
        elif e["action"] in ("free_requested", *FREES) and a not in seen and \
                a not in freed_before:
            freed_before[a] = rounded(e["size"], pad)
    # the state before the first event: final blocks the trace never allocates, and the
    # blocks it frees before allocating their address
    live = {a: s for a, (s, _, st) in final.items()
            if a not in last_alloc and st == "active_allocated"}
    pending = {a: s for a, (s, _, st) in final.items()
               if a not in last_alloc and st != "active_allocated"}
    starts = sorted(set(live) | set(pending) | set(freed_before))
    for a, s in freed_before.items():
        live[a] = _cut(a, s, starts, ranges, max_split)
    totals, pendings = [sum(live.values())], [sum(pending.values())]
    total = totals[0]
    for i, e in enumerate(trace):
        a = e.get("addr")
        if e["action"] == "alloc":
            if a in final and last_alloc[a] == i:
                size = final[a][0]
            else:
                size = _cut(a, rounded(e["size"], pad), starts, ranges, max_split)
            live[a] = size
            total += size
            bisect.insort(starts, a)
        elif e["action"] == "free_requested" or (e["action"] in FREES and a not in pending):
            size = live.pop(a, 0)
            total -= size
            pending[a] = size
        if e["action"] in FREES:
            pending.pop(a, None)
            k = bisect.bisect_left(starts, a)
            if k < len(starts) and starts[k] == a:
                starts.pop(k)
        _apply(ranges, e)
        totals.append(total)
        pendings.append(sum(pending.values()))
    pos = max(range(len(totals)), key=lambda k: (totals[k], -k))
    ooms = [i for i, e in enumerate(trace) if e["action"] == "oom"]
    if ooms:  # the report's moment is the (last) OOM
        pos = ooms[-1] + 1
    # walk again to the moment for its blocks and segments
    state = _state_at(raw, device, trace, final, last_alloc, freed_before, pad, max_split,
                      pos - 1)
    return RawReplay(pos - 1 if trace else None, state[0], state[1], pendings[pos],
                     max(totals), pad, freed_before, max_split)


def live_after(raw, device: int, idx: int) -> dict[int, int]:
    """The allocated blocks (address -> size) after trace entry `idx` (-1: before the
    first)."""
    trace = raw["device_traces"][device]
    final = final_blocks(raw, device)
    last_alloc = {e["addr"]: i for i, e in enumerate(trace) if e["action"] == "alloc"}
    r = raw_replay(raw, device)
    return _state_at(raw, device, trace, final, last_alloc, r.freed_before, r.pad,
                     r.max_split, idx)[0]


def _state_at(raw, device, trace, final, last_alloc, freed_before, pad, max_split,
              idx: int) -> tuple[dict[int, int], dict[int, int]]:
    ranges = _ranges_before(raw, device, trace)
    live = {a: s for a, (s, _, st) in final.items()
            if a not in last_alloc and st == "active_allocated"}
    pending = {a for a, (_, _, st) in final.items()
               if a not in last_alloc and st != "active_allocated"}
    starts = sorted(set(live) | pending | set(freed_before))
    for a, s in freed_before.items():
        live[a] = _cut(a, s, starts, ranges, max_split)
    for i, e in enumerate(trace[:idx + 1]):
        a = e.get("addr")
        if e["action"] == "alloc":
            live[a] = final[a][0] if a in final and last_alloc[a] == i else _cut(
                a, rounded(e["size"], pad), starts, ranges, max_split)
            bisect.insort(starts, a)
        elif e["action"] == "free_requested" or (e["action"] in FREES and a not in pending):
            live.pop(a, None)
            pending.add(a)
        if e["action"] in FREES:
            pending.discard(a)
            k = bisect.bisect_left(starts, a)
            if k < len(starts) and starts[k] == a:
                starts.pop(k)
        _apply(ranges, e)
    return live, ranges.sizes()
