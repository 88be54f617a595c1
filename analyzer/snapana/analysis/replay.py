"""Reconstruct the allocator state at any moment of a capture, exactly.

The final segments are ground truth; the trace tells how the state got there. Pairing each
`alloc` with its `free_requested`/`free_completed` gives every block a lifetime in event
indices; blocks freed without an `alloc` in the trace, and final blocks the trace never
touched, were alive before recording began. A block is live at event i when
`alloc_idx <= i < free_idx`, which makes any moment (the OOM, the peak, an index) a filter,
and the live-bytes timeline a cumulative sum. Equivalent to undoing events backwards from the
final segments, as PyTorch's viewer does, and checked against them. The pairing is
`replay_pairs`', the blocks' sizes as the capture's allocator made them `replay_sizes`'.

Segments get lifetimes the same way. A `segment_alloc` lives until its `segment_free`. An
expandable segment (`expandable_segments:True`: one virtual range whose pages are mapped on
demand) lives as the pieces its `segment_map` events map, each until a `segment_unmap` takes
it or part of it; at a moment, the touching pieces of one range are one segment, as PyTorch's
snapshot reports one segment per contiguous mapped range (`replay_segments`). Reserved is the
mapped bytes and a free block is free mapped space; unmapped address space is neither.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from functools import cached_property
from typing import Literal

import numpy as np
import polars as pl

from snapana.allocator_model import config as alloc_conf
from snapana.allocator_model.rules import PLAIN, SizeRules
from snapana.analysis.replay_pairs import LIFETIME_SCHEMA, NEVER, pair_lifetimes
from snapana.analysis.replay_segments import segment_intervals
from snapana.analysis.replay_sizes import pool_witnesses, rounding_pad, taken_whole
from snapana.caching_allocator import ACTIVE_ALLOCATED, ACTIVE_PENDING_FREE, ACTIVE_STATES
from snapana.capture_kinds import size_rounding
from snapana.errors import InputError
from snapana.limits import MAX_TIME
from snapana.model import EMPTY_STACK, Capture
from snapana.units import parse_int, quote

__all__ = ["NEVER", "OVER_RESERVED", "DeviceReplay", "Moment", "MomentError", "MomentKind",
           "replay", "replay_or_final"]


class MomentError(InputError, ValueError):
    """A moment the capture does not have (no OOM, no timestamps, an index out of range)."""


#: Which moment a report shows: the OOM, the peak, the snapshot, or one asked for (--at).
MomentKind = Literal["oom", "peak", "snapshot", "event", "time"]


@dataclass(frozen=True)
class Moment:
    """A point in the capture: `idx` is the event index it is taken after (-1: before all).
    The replay alone makes them (`DeviceReplay.interest`, `.peak`, `.oom_moment`, `.final`,
    `.event`, `.time`, `.resolve`); later stages receive one and never recompute it."""

    kind: MomentKind  # "event" and "time": a moment asked for
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
    mismatches: list[str] = field(default_factory=list)  # blocks: trace vs final segments
    #: segments: where the trace's segment_alloc/free/map/unmap events disagree with each
    #: other or with the final segments (reserved still sums the intervals as replayed)
    segment_mismatches: list[str] = field(default_factory=list)
    #: how the capture's allocator sized its blocks: its recorded roundup_power2_divisions
    #: and the bytes it added to each request before rounding it (`rounding_pad`); None for
    #: a source that records requests as made (no rounding)
    sizes: SizeRules | None = PLAIN
    #: why this device's trace was not replayed (`replay_or_final`): its one moment is the
    #: snapshot; None: the trace was replayed
    unreplayable: str | None = None

    @property
    def request_pad(self) -> int:
        """Bytes the capture's allocator added to each request before rounding it."""
        return self.sizes.pad if self.sizes is not None else 0

    def __repr__(self) -> str:
        """One line (not the capture and the arrays it holds)."""
        return (f"<snapana DeviceReplay device {self.device}: {self.n_events:,} events, "
                f"{len(self.ooms)} OOM(s), {self.lifetimes.height:,} lifetimes>")

    # ----- moments -------------------------------------------------------------------------
    @property
    def final(self) -> Moment:
        return Moment("snapshot", self.n_events - 1, self._time_at(self.n_events - 1))

    @property
    def oom(self) -> OomEvent | None:
        """The OOM that ended the job: the last `oom` entry of this device's trace."""
        return self.ooms[-1] if self.ooms else None

    @cached_property
    def has_history(self) -> bool:
        """Whether the trace records allocations, not just the final state (without, there is
        no peak to find: the snapshot is the state)."""
        return self.n_events > 0 and bool(
            (self.capture.device_events(self.device)["action"] == "alloc").any())

    @cached_property
    def peak(self) -> Moment:
        """The peak of allocated bytes, counted as everywhere else: blocks in use, not blocks
        already freed and waiting on a stream (pending free). Before the first recorded event
        (-1) when nothing recorded rises above what was there before recording."""
        if not self.has_history or self.baseline_allocated > int(self.allocated.max()):
            return Moment("peak", -1)
        i = int(np.argmax(self.allocated))
        return Moment("peak", i, self._time_at(i))

    @property
    def peak_allocated_bytes(self) -> int:
        """Allocated bytes at `peak` (what every report calls the peak)."""
        if self.peak.idx < 0:
            return self.baseline_allocated
        return int(self.allocated[self.peak.idx])

    @property
    def baseline_allocated(self) -> int:
        """Allocated bytes before the first recorded event: blocks alive before recording,
        less those whose free was requested before it too (pending free at the snapshot,
        request index -1), which are pending-free bytes, not allocated ones."""
        return int(self.lifetimes.filter((pl.col("alloc_idx") < 0)
                                         & (pl.col("free_req_idx") >= 0))["size"].sum())

    @property
    def oom_moment(self) -> Moment | None:
        """The moment of the OOM that ended the job (None: no OOM)."""
        if self.oom is None:
            return None
        return Moment("oom", self.oom.idx, self.oom.time_us)

    @cached_property
    def interest(self) -> Moment:
        """The moment of interest, the one definition every report, table and explanation
        uses: the OOM when there is one, else the peak of the recorded allocations, else (no
        history recorded) the snapshot."""
        if self.oom_moment is not None:
            return self.oom_moment
        return self.peak if self.has_history else self.final

    def at(self, idx: int, kind: MomentKind = "event") -> Moment:
        return Moment(kind, idx, self._time_at(idx))

    def event(self, n: int) -> Moment:
        """The state after event `n` (-1: before the first)."""
        if not -1 <= n < self.n_events:
            raise MomentError(f"event {n} out of range (-1..{self.n_events - 1})")
        return self.at(n)

    def time(self, time_us: int) -> Moment:
        """The state after the last event at or before trace time `time_us` (µs)."""
        if not self.capture.has_time:
            raise MomentError(f"{self.capture.path} device {self.device}: no timestamps "
                              "recorded; use an event index")
        times = self._times.fill_null(strategy="forward")
        return self.at(int((times <= time_us).sum()) - 1, "time")

    def resolve(self, at: str | None) -> Moment:
        """The moment a user typed (--at): None or 'interest' (the moment of interest), 'oom',
        'peak', 'end', 'event:N' (after event N; -1 is before the first) or 'time:US' (after
        the last event at or before that trace time, in µs). Typed callers use `interest`,
        `peak`, `final`, `event` and `time` directly."""
        if at is None or at == "interest":
            return self.interest
        where = f"{self.capture.path} device {self.device}"
        if self.unreplayable is not None and at != "end":
            raise MomentError(f"{where}: {NOT_REPLAYED} ({self.unreplayable}), so no moment "
                              "but the snapshot ('end') can be shown")
        if at == "oom":
            if self.oom_moment is None:
                raise MomentError(f"{where} has no OOM; try --at peak or --at end")
            return self.oom_moment
        if at == "peak":
            if not self.has_history:
                raise MomentError(f"{where} records no allocation history, so no peak: its "
                                  "one moment is the snapshot ('end')")
            return self.peak
        if at == "end":
            return self.final
        kind, _, value = at.partition(":")
        if kind not in ("event", "time"):
            raise MomentError(f"--at {quote(at)}: use oom, peak, end, event:N or time:US")
        try:  # ASCII digits, one sign, in range: the command line's one integer parser
            n = (parse_int(value, "--at event:", -1, self.n_events - 1) if kind == "event"
                 else parse_int(value, "--at time:", -MAX_TIME, MAX_TIME))
        except ValueError as exc:
            raise MomentError(f"{exc}; use oom, peak, end, event:N or time:US") from None
        if kind == "event":
            return self.at(n)
        if not self.capture.has_time:
            raise MomentError(f"{where}: no timestamps recorded; use --at event:N")
        return self.time(n)

    def _time_at(self, idx: int) -> int | None:
        if idx < 0 or not self.capture.has_time:
            return None
        t = self._times[idx]
        return None if t is None else int(t)

    @cached_property
    def _times(self) -> pl.Series:
        return self.capture.device_events(self.device)["time_us"]

    # ----- state at a moment ---------------------------------------------------------------
    def blocks_at(self, moment: Moment) -> pl.DataFrame:
        """Live blocks after event `moment.idx`, with state, pool and stream of their segment
        (none when no segment live then holds the block's start: an inconsistent trace)."""
        i = moment.idx
        live = self.lifetimes.filter(
            (pl.col("alloc_idx") <= i) & (pl.col("free_done_idx") > i)
        ).with_columns(
            pl.when(pl.col("free_req_idx") > i)
            .then(pl.lit(ACTIVE_ALLOCATED))
            .otherwise(pl.lit(ACTIVE_PENDING_FREE))
            .alias("state")
        )
        segs = self.segments_at(moment).select(
            pl.col("address").alias("segment_address"),
            pl.col("total_size").alias("segment_size"),
            "pool",
            pl.col("stream").alias("segment_stream"),
        )
        joined = live.sort("address").join_asof(
            segs.sort("segment_address"), left_on="address", right_on="segment_address",
            strategy="backward")
        outside = pl.col("address") >= pl.col("segment_address") + pl.col("segment_size")
        return joined.with_columns(
            *(pl.when(outside).then(None).otherwise(pl.col(c)).alias(c)
              for c in ("segment_address", "segment_size", "pool", "segment_stream"))
        ).with_columns(pl.col("pool").fill_null("0,0"))

    def segments_at(self, moment: Moment) -> pl.DataFrame:
        """Segments live after event `moment.idx`: address, total_size, pool, stream,
        open_idx, close_idx, segment_type and expandable. An expandable segment is one row
        per contiguous mapped range (its open/close: the span this shape is sure to hold)."""
        i = moment.idx
        live = self.segment_intervals.filter(
            (pl.col("open_idx") <= i) & (pl.col("close_idx") > i)
        ).sort("address")
        if not live["expandable"].any():
            return live.drop("vseg")
        touching = (
            pl.col("expandable")
            & (pl.col("address") == (pl.col("address") + pl.col("total_size")).shift(1))
            & (pl.col("vseg") == pl.col("vseg").shift(1))
        ).fill_null(False)
        return (
            live.with_columns((~touching).cum_sum().alias("_run"))
            .group_by("_run", maintain_order=True)
            .agg(pl.col("address").first(), pl.col("total_size").sum(),
                 pl.col("pool").first(), pl.col("stream").first(),
                 pl.col("open_idx").max(), pl.col("close_idx").min(),
                 pl.col("segment_type").first(), pl.col("expandable").first())
            .drop("_run")
        )

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
                return _bytes_timeline(self.lifetimes, 0, "free_done_idx")[0]
            return int(self.segment_intervals["total_size"].sum())
        if moment.idx < 0:
            return int(self.reserved[0] - self._reserved_delta[0])
        return int(self.reserved[moment.idx])

    _reserved_delta: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))


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
    gran = size_rounding(capture.source)

    # Lifetimes: trace sizes are the requested bytes; the block holds them as the capture's
    # allocator rounds them (`SizeRules`: 512 bytes, or its roundup_power2_divisions, after
    # its pad; exact for final blocks, which take their size from the segments).
    seg_intervals, reserved, reserved_delta, seg_mismatches = segment_intervals(
        capture, device, events)
    conf = alloc_conf.recorded(capture.allocator_settings)
    rules: SizeRules | None = None
    if gran > 1:
        divisions = conf.roundup_divisions or ()
        pad = rounding_pad(capture.device_blocks(device),
                           pool_witnesses(events, seg_intervals, divisions), divisions)
        rules = SizeRules(divisions, pad)
    cols, clashes = pair_lifetimes(events, rules)
    mismatches = [msg for _, msg in sorted(clashes)]
    ooms = [
        OomEvent(int(k), size, dev_free, stream, stack, t)
        for k, size, dev_free, stream, stack, t in events.with_row_index("k")
        .filter(pl.col("action") == "oom")
        .select("k", "size", "device_free", "stream", "stack_id", "time_us").iter_rows()
    ]
    extra, from_segments = _match_final_blocks(capture, device, cols, n, mismatches)
    if extra:
        cols = {k: np.concatenate([v, np.asarray([row[j] for row in extra], dtype=np.int64)])
                for j, (k, v) in enumerate(cols.items())}
    if gran > 1 and not seg_intervals.is_empty():
        # a block the trace alone holds is its request rounded, unless the free block it
        # took was too small to split: then it holds the whole of it (the final blocks are
        # sized by the segments already)
        exact = np.zeros(len(cols["size"]), dtype=bool)
        exact[len(cols["size"]) - len(extra):] = True
        exact[from_segments] = True
        # expandable segments split every remainder from 512 bytes on (a capture that does
        # not record its settings shows them by its segments)
        if not (conf.expandable_segments or seg_intervals["expandable"].any()):
            cols["size"] = taken_whole(cols, exact, seg_intervals, conf.max_split_size)
    lifetimes = pl.DataFrame(cols, schema=LIFETIME_SCHEMA)
    _, allocated = _bytes_timeline(lifetimes, n, "free_req_idx")
    live_before, live = _bytes_timeline(lifetimes, n, "free_done_idx")
    if seg_intervals.is_empty():
        if n:
            reserved, reserved_delta = _reserved_without_segments(capture, device, live_before,
                                                                  live)
    else:
        over = _over_reserved(live_before, live, reserved, reserved_delta,
                              int(seg_intervals["total_size"].sum()))
        if over:
            mismatches.append(over)
    if n and (allocated.min() < 0 or reserved.min() < 0):
        mismatches.append("replaying back to the first event goes negative")
    dr = DeviceReplay(capture, device, lifetimes, seg_intervals, allocated, reserved, ooms, n,
                      mismatches, seg_mismatches, rules)
    dr._reserved_delta = reserved_delta
    return dr


def _match_final_blocks(capture: Capture, device: int, cols: dict[str, np.ndarray], n: int,
                        mismatches: list[str]) -> tuple[list[list[int]], list[int]]:
    """Final blocks: live ones must match the trace's open blocks exactly. Each one found
    open in `cols` takes its size (and stack, where the trace has none) from the segments;
    a trace block not in them is closed at the end (`n`). Returns the final blocks the trace
    never opened (rows to add, in `LIFETIME_SCHEMA`'s order) and the rows the segments
    sized; adds to `mismatches` where the two disagree."""
    final_blocks = capture.device_blocks(device).filter(
        pl.col("state").is_in(ACTIVE_STATES)
    )
    open_rows = np.flatnonzero(cols["free_done_idx"] == NEVER)
    open_blocks = {int(cols["address"][r]): int(r) for r in open_rows}
    extra: list[list[int]] = []
    from_segments: list[int] = []  # rows whose size the final segments give
    size_c, stack_c, req_c = cols["size"], cols["stack_id"], cols["requested_size"]
    for a, s, req, sid, state in final_blocks.select(
        "address", "size", "requested_size", "stack_id", "state"
    ).iter_rows():
        r = open_blocks.pop(a, None)
        if r is None:
            extra.append([a, s, sid, 0, -1, NEVER if state == ACTIVE_ALLOCATED else -1, NEVER,
                          req])
            continue
        if int(req_c[r]) != req:
            mismatches.append(
                f"block 0x{a:x}: trace requested {int(req_c[r])} bytes, segments say {req}"
            )
        size_c[r] = s
        from_segments.append(r)
        if stack_c[r] == EMPTY_STACK:
            stack_c[r] = sid
        pending_in_trace = cols["free_req_idx"][r] != NEVER
        if pending_in_trace != (state == ACTIVE_PENDING_FREE):
            mismatches.append(f"block 0x{a:x}: state {state} disagrees with the trace")
    for a, r in open_blocks.items():  # in the order the rows were opened
        mismatches.append(f"block 0x{a:x} is live in the trace but not in the segments")
        cols["free_done_idx"][r] = n  # close it at the end so it does not leak into later moments
    return extra, from_segments


def _reserved_without_segments(capture: Capture, device: int, live_before: int,
                               live: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """No allocator segments (profiler traces, memory timelines): reserved is what the
    source recorded after each event, else the live blocks (nothing is known to be cached;
    a pending-free block still occupies memory); and its change at each event."""
    series = capture.metadata.get("reserved_timeline", {}).get(device)
    if series is not None and len(series) == len(live):
        reserved = np.maximum(np.asarray(series, dtype=np.int64), live)
    else:
        reserved = live.copy()
    return reserved, np.diff(reserved, prepend=live_before)


#: How a report says a snapshot's trace was not replayed (`replay_or_final`).
NOT_REPLAYED = "the trace cannot be replayed in the order it is written"


def replay_or_final(capture: Capture, device: int) -> DeviceReplay:
    """The replay of the device's trace, unless it cannot be the history of the segments
    the snapshot records: replayed back from them, it has more bytes live than they reserve
    (entries reordered, reversed or lost). Every figure at any moment of such a replay is
    one no allocator state allows, so the trace is not used: the state is the snapshot's
    final segments and blocks (what the file records, checkable against it), its one
    moment the snapshot, and a warning says why. Sources without allocator segments (a
    profiler trace, a memory timeline) replay as they are."""
    dr = replay(capture, device)
    over = next((m for m in dr.mismatches if m.startswith(OVER_RESERVED)), None)
    if over is None or not dr.n_events or not capture.source.row.allocator_segments:
        return dr
    others = [m for m in dr.mismatches if not m.startswith(OVER_RESERVED)]
    ooms = f", {len(dr.ooms)} OOM entr{'y' if len(dr.ooms) == 1 else 'ies'} among them" \
        if dr.ooms else ""
    warning = (f"{NOT_REPLAYED}: replayed back from the final segments, {over}"
               f"{'; e.g. ' + others[0] if others else ''}; its {dr.n_events:,} "
               f"events{ooms} are not used, and the figures are the snapshot's final "
               "segments and blocks")
    bare = copy.copy(capture)
    bare.events = capture.events.filter(pl.col("device") != device)
    bare._device_events = {}
    bare.warnings = [*capture.warnings, warning]
    final = replay(bare, device)
    final.unreplayable = over
    return final


def _bytes_timeline(lifetimes: pl.DataFrame, n: int, end: str) -> tuple[int, np.ndarray]:
    """Bytes of blocks from their alloc to their `end` event (`free_req_idx`: allocated;
    `free_done_idx`: live, pending frees included): before the first event, and after each."""
    size = lifetimes["size"].to_numpy()
    a_idx = lifetimes["alloc_idx"].to_numpy()
    f_idx = lifetimes[end].to_numpy()
    started = a_idx >= 0
    baseline = int(size[~started & (f_idx >= 0)].sum())
    if n == 0:
        return baseline, np.zeros(0, dtype=np.int64)
    delta = np.zeros(n + 1, dtype=np.int64)
    np.add.at(delta, a_idx[started], size[started])
    ended = (f_idx >= 0) & (f_idx < n)
    np.add.at(delta, f_idx[ended], -size[ended])
    return baseline, baseline + np.cumsum(delta[:n])


#: How a replay says its blocks do not fit in its segments (the report then warns that its
#: reserved and cached figures are inconsistent; tests/fuzz/invariants.py looks for it).
OVER_RESERVED = "more bytes in live blocks than the segments reserve"


def _over_reserved(live_before: int, live: np.ndarray, reserved: np.ndarray,
                   reserved_delta: np.ndarray, final_reserved: int) -> str | None:
    """Blocks live inside segments, so live bytes (allocated + pending free) never exceed
    reserved; when they do (segment events without the final segments, a trace that lost
    segment events) say where, rather than print figures that cannot add up."""
    if not len(live):
        return (f"{OVER_RESERVED}: {live_before} > {final_reserved} bytes in the snapshot"
                if live_before > final_reserved else None)
    before = int(reserved[0] - reserved_delta[0])
    if live_before > before:
        return (f"{OVER_RESERVED}: {live_before} > {before} bytes before the first event")
    over = np.flatnonzero(live > reserved)
    if not over.size:
        return None
    i = int(over[0])
    return (f"{OVER_RESERVED}: {int(live[i])} > {int(reserved[i])} bytes after event {i} "
            f"({over.size} event(s) in all)")

