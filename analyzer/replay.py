"""Reconstruct the allocator state at any moment of a capture, exactly.

The final segments are ground truth; the trace tells how the state got there. Pairing each
`alloc` with its `free_requested`/`free_completed` gives every block a lifetime in event
indices; blocks freed without an `alloc` in the trace, and final blocks the trace never
touched, were alive before recording began. A block is live at event i when
`alloc_idx <= i < free_idx`, which makes any moment (the OOM, the peak, an index) a filter,
and the live-bytes timeline a cumulative sum. Equivalent to undoing events backwards from the
final segments, as PyTorch's viewer does, and checked against them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import numpy as np
import polars as pl
from snapana.model import EMPTY_STACK, Capture

NEVER = np.iinfo(np.int64).max  # free index of a block still live at the end

_SEGMENT_OPEN = {"segment_alloc": 1, "segment_map": 1}
_SEGMENT_CLOSE = {"segment_free": -1, "segment_unmap": -1}


@dataclass(frozen=True)
class Moment:
    """A point in the capture: `idx` is the event index it is taken after (-1: before all)."""

    kind: str  # "oom" | "peak" | "snapshot" | "event"
    idx: int
    time_us: int | None = None


@dataclass
class OomEvent:
    idx: int
    requested_bytes: int
    device_free_bytes: int | None
    stream: int
    stack_id: int
    time_us: int | None


@dataclass
class DeviceReplay:
    """Lifetimes, segment intervals and timelines for one device of a capture."""

    capture: Capture
    device: int
    lifetimes: pl.DataFrame
    segment_intervals: pl.DataFrame
    allocated: np.ndarray  # allocated bytes after each event
    reserved: np.ndarray  # reserved bytes after each event
    ooms: list[OomEvent]
    n_events: int
    mismatches: list[str] = field(default_factory=list)

    # ----- moments -------------------------------------------------------------------------
    @property
    def final(self) -> Moment:
        return Moment("snapshot", self.n_events - 1, self._time_at(self.n_events - 1))

    @property
    def oom(self) -> OomEvent | None:
        """The OOM that ended the job: the last `oom` entry of this device's trace."""
        return self.ooms[-1] if self.ooms else None

    @cached_property
    def peak(self) -> Moment:
        if self.n_events == 0 or self.baseline_allocated > int(self.allocated.max()):
            return Moment("peak", -1)  # highest before the first recorded event
        i = int(np.argmax(self.allocated))
        return Moment("peak", i, self._time_at(i))

    @property
    def peak_allocated_bytes(self) -> int:
        if self.n_events == 0:
            return self.baseline_allocated
        return int(max(self.allocated.max(), self.baseline_allocated))

    @property
    def baseline_allocated(self) -> int:
        """Allocated bytes before the first recorded event (blocks alive before recording)."""
        return int(self.lifetimes.filter(pl.col("alloc_idx") < 0)["size"].sum())

    def moment_of_interest(self) -> Moment:
        """The OOM point when there is one, else the peak of the recorded trace, else the
        snapshot moment (no history recorded)."""
        if self.oom is not None:
            return Moment("oom", self.oom.idx, self.oom.time_us)
        return self.peak if self.n_events else self.final

    def at(self, idx: int, kind: str = "event") -> Moment:
        return Moment(kind, idx, self._time_at(idx))

    def _time_at(self, idx: int) -> int | None:
        if idx < 0 or not self.capture.has_time:
            return None
        t = self._times[idx]
        return None if t is None else int(t)

    @cached_property
    def _times(self) -> list[int | None]:
        return self.capture.device_events(self.device)["time_us"].to_list()

    # ----- state at a moment ---------------------------------------------------------------
    def blocks_at(self, moment: Moment) -> pl.DataFrame:
        """Live blocks after event `moment.idx`, with state, pool and stream of their segment."""
        i = moment.idx
        live = self.lifetimes.filter(
            (pl.col("alloc_idx") <= i) & (pl.col("free_done_idx") > i)
        ).with_columns(
            pl.when(pl.col("free_req_idx") > i)
            .then(pl.lit("active_allocated"))
            .otherwise(pl.lit("active_pending_free"))
            .alias("state")
        )
        segs = self.segments_at(moment).select(
            pl.col("address").alias("segment_address"),
            pl.col("total_size").alias("segment_size"),
            "pool",
            pl.col("stream").alias("segment_stream"),
        )
        return (
            live.sort("address")
            .join_asof(segs.sort("segment_address"), left_on="address",
                       right_on="segment_address", strategy="backward")
            .with_columns(pl.col("pool").fill_null("0,0"))
        )

    def segments_at(self, moment: Moment) -> pl.DataFrame:
        i = moment.idx
        return self.segment_intervals.filter(
            (pl.col("open_idx") <= i) & (pl.col("close_idx") > i)
        ).sort("address")

    def free_blocks_at(self, moment: Moment) -> pl.DataFrame:
        """Cached-but-unallocated ranges: each live segment minus the blocks live in it."""
        segs = self.segments_at(moment)
        live = self.blocks_at(moment).sort("address")
        rows: dict[str, list[int | str]] = {"address": [], "size": [], "pool": [], "stream": [],
                                            "segment_address": []}
        by_seg: dict[int, list[tuple[int, int]]] = {}
        for a, s, sa in live.select("address", "size", "segment_address").iter_rows():
            if sa is not None:
                by_seg.setdefault(sa, []).append((a, s))
        for sa, total, pool, stream in segs.select(
            "address", "total_size", "pool", "stream"
        ).iter_rows():
            cursor = sa
            for a, s in by_seg.get(sa, []):
                if a > cursor:
                    _append_free(rows, cursor, a - cursor, pool, stream, sa)
                cursor = max(cursor, a + s)
            if sa + total > cursor:
                _append_free(rows, cursor, sa + total - cursor, pool, stream, sa)
        return pl.DataFrame(rows, schema={"address": pl.Int64, "size": pl.Int64,
                                          "pool": pl.Utf8, "stream": pl.Int64,
                                          "segment_address": pl.Int64})

    def allocated_at(self, moment: Moment) -> int:
        if moment.idx < 0 or self.n_events == 0:
            return self.baseline_allocated
        return int(self.allocated[moment.idx])

    def reserved_at(self, moment: Moment) -> int:
        if self.n_events == 0:
            if self.segment_intervals.is_empty():  # no allocator state recorded (memray)
                return self.baseline_allocated
            return int(self.segment_intervals["total_size"].sum())
        if moment.idx < 0:
            return int(self.reserved[0] - self._reserved_delta[0])
        return int(self.reserved[moment.idx])

    _reserved_delta: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))


def round_size(requested: int, granularity: int = 512) -> int:
    """The caching allocator's minimum rounding: up to a multiple of 512 bytes.

    Sources whose sizes are already exact (profiler traces, memory timelines, memray) say so
    with `metadata['size_rounding'] = 1`.
    """
    if granularity <= 1:
        return requested
    return max(granularity, -(-requested // granularity) * granularity)


def _append_free(rows: dict, address: int, size: int, pool: str, stream: int, seg: int) -> None:
    rows["address"].append(address)
    rows["size"].append(size)
    rows["pool"].append(pool)
    rows["stream"].append(stream)
    rows["segment_address"].append(seg)


def replay(capture: Capture, device: int) -> DeviceReplay:
    """Pair the trace's events into lifetimes and check them against the final segments."""
    events = capture.device_events(device)
    n = events.height
    actions = events["action"].to_list()
    addrs = events["addr"].to_list()
    sizes = events["size"].to_list()
    stacks = events["stack_id"].to_list()
    streams = events["stream"].to_list()
    mismatches: list[str] = []
    gran = int(capture.metadata.get("size_rounding", 512))

    # Lifetime rows: [addr, size, stack_id, stream, alloc_idx, free_req_idx, free_done_idx,
    # requested]. Trace sizes are the requested bytes; the block holds them rounded up to 512
    # (exact for final blocks, which take their size from the segments).
    rows: list[list[int]] = []
    open_blocks: dict[int, list[int]] = {}
    ooms: list[OomEvent] = []
    times = events["time_us"].to_list()
    dev_free = events["device_free"].to_list()
    for i in range(n):
        act = actions[i]
        if act == "alloc":
            a = addrs[i]
            if a in open_blocks:
                mismatches.append(f"event {i}: alloc at 0x{a:x} which is already live")
                open_blocks.pop(a)[6] = i
            row = [a, round_size(sizes[i], gran), stacks[i], streams[i], i, NEVER, NEVER,
                   sizes[i]]
            rows.append(row)
            open_blocks[a] = row
        elif act == "free_requested":
            row = open_blocks.get(addrs[i])
            if row is None:  # alive before recording began
                row = [addrs[i], round_size(sizes[i], gran), EMPTY_STACK, streams[i], -1, NEVER,
                       NEVER, sizes[i]]
                rows.append(row)
                open_blocks[addrs[i]] = row
            row[5] = i
        elif act in ("free_completed", "free"):
            row = open_blocks.pop(addrs[i], None)
            if row is None:
                row = [addrs[i], round_size(sizes[i], gran), EMPTY_STACK, streams[i], -1, i,
                       NEVER, sizes[i]]
                rows.append(row)
            if row[5] == NEVER:
                row[5] = i
            row[6] = i
        elif act == "oom":
            ooms.append(OomEvent(i, sizes[i], dev_free[i], streams[i], stacks[i], times[i]))

    # Final blocks: live ones must match the trace's open blocks exactly.
    final_blocks = capture.device_blocks(device).filter(
        pl.col("state").is_in(["active_allocated", "active_pending_free"])
    )
    for a, s, req, sid, state in final_blocks.select(
        "address", "size", "requested_size", "stack_id", "state"
    ).iter_rows():
        row = open_blocks.pop(a, None)
        if row is None:
            rows.append([a, s, sid, 0, -1, NEVER if state == "active_allocated" else -1, NEVER,
                         req])
            continue
        if row[7] != req:
            mismatches.append(
                f"block 0x{a:x}: trace requested {row[7]} bytes, segments say {req}"
            )
        row[1] = s
        if row[2] == EMPTY_STACK:
            row[2] = sid
        pending_in_trace = row[5] != NEVER
        if pending_in_trace != (state == "active_pending_free"):
            mismatches.append(f"block 0x{a:x}: state {state} disagrees with the trace")
    for a, row in open_blocks.items():
        if row[5] == NEVER or row[6] == NEVER:
            mismatches.append(f"block 0x{a:x} is live in the trace but not in the segments")
            row[6] = n  # close it at the end so it does not leak into later moments

    lifetimes = pl.DataFrame(
        rows,
        schema={"address": pl.Int64, "size": pl.Int64, "stack_id": pl.Int64, "stream": pl.Int64,
                "alloc_idx": pl.Int64, "free_req_idx": pl.Int64, "free_done_idx": pl.Int64,
                "requested_size": pl.Int64},
        orient="row",
    )
    allocated = _allocated_timeline(lifetimes, n)
    seg_intervals, reserved, reserved_delta = _segment_intervals(capture, device, actions,
                                                                 addrs, sizes, streams)
    if n and seg_intervals.is_empty():
        # No allocator segments (profiler traces, memory timelines): reserved is what the
        # source recorded after each event, else nothing is known to be cached.
        series = capture.metadata.get("reserved_timeline", {}).get(device)
        if series is not None and len(series) == n:
            reserved = np.maximum(np.asarray(series, dtype=np.int64), allocated)
        else:
            reserved = allocated.copy()
        before = lifetimes.filter((pl.col("alloc_idx") < 0) & (pl.col("free_req_idx") >= 0))
        reserved_delta = np.diff(reserved, prepend=int(before["size"].sum()))
    if n and (allocated.min() < 0 or reserved.min() < 0):
        mismatches.append("replaying back to the first event goes negative")
    dr = DeviceReplay(capture, device, lifetimes, seg_intervals, allocated, reserved, ooms, n,
                      mismatches)
    dr._reserved_delta = reserved_delta
    return dr


def _allocated_timeline(lifetimes: pl.DataFrame, n: int) -> np.ndarray:
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    size = lifetimes["size"].to_numpy()
    a_idx = lifetimes["alloc_idx"].to_numpy()
    f_idx = lifetimes["free_req_idx"].to_numpy()
    delta = np.zeros(n + 1, dtype=np.int64)
    started = a_idx >= 0
    np.add.at(delta, a_idx[started], size[started])
    ended = (f_idx >= 0) & (f_idx < n)
    np.add.at(delta, f_idx[ended], -size[ended])
    baseline = int(size[~started & (f_idx >= 0)].sum())
    return baseline + np.cumsum(delta[:n])


def _segment_intervals(
    capture: Capture, device: int, actions: list[str], addrs: list[int], sizes: list[int],
    streams: list[int],
) -> tuple[pl.DataFrame, np.ndarray, np.ndarray]:
    """Segment lifetimes (for fragmentation at a moment) and the reserved-bytes timeline."""
    n = len(actions)
    final = capture.device_segments(device)
    rows: list[list] = []
    open_segs: dict[int, list] = {}
    delta = np.zeros(max(n, 1), dtype=np.int64)
    for i, act in enumerate(actions):
        if act in _SEGMENT_OPEN:
            delta[i] = sizes[i]
            row = [addrs[i], sizes[i], "0,0", streams[i], i, NEVER]
            rows.append(row)
            open_segs[addrs[i]] = row
        elif act in _SEGMENT_CLOSE:
            delta[i] = -sizes[i]
            row = open_segs.pop(addrs[i], None)
            if row is None:
                row = [addrs[i], sizes[i], "0,0", streams[i], -1, i]
                rows.append(row)
            row[5] = i
    mapped = {r[0]: r for r in open_segs.values()}
    for a, total, pool, stream in final.select(
        "address", "total_size", "pool", "stream"
    ).iter_rows():
        row = mapped.pop(a, None)
        if row is None:
            rows.append([a, total, pool, stream, -1, NEVER])
        else:
            row[1], row[2], row[3] = total, pool, stream
    for row in mapped.values():  # expandable mappings folded into a final segment
        row[5] = NEVER
    seg_df = pl.DataFrame(
        rows,
        schema={"address": pl.Int64, "total_size": pl.Int64, "pool": pl.Utf8,
                "stream": pl.Int64, "open_idx": pl.Int64, "close_idx": pl.Int64},
        orient="row",
    )
    final_reserved = int(final["total_size"].sum())
    if n == 0:
        return seg_df, np.zeros(0, dtype=np.int64), delta[:0]
    delta = delta[:n]
    total_delta = int(delta.sum())
    reserved = final_reserved - total_delta + np.cumsum(delta)
    return seg_df, reserved, delta
