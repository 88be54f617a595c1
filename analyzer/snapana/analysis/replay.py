"""Reconstruct the allocator state at any moment of a capture, exactly.

The final segments are ground truth; the trace tells how the state got there. Pairing each
`alloc` with its `free_requested`/`free_completed` gives every block a lifetime in event
indices; blocks freed without an `alloc` in the trace, and final blocks the trace never
touched, were alive before recording began. A block is live at event i when
`alloc_idx <= i < free_idx`, which makes any moment (the OOM, the peak, an index) a filter,
and the live-bytes timeline a cumulative sum. Equivalent to undoing events backwards from the
final segments, as PyTorch's viewer does, and checked against them.

Segments get lifetimes the same way. A `segment_alloc` lives until its `segment_free`. An
expandable segment (`expandable_segments:True`: one virtual range whose pages are mapped on
demand) lives as the pieces its `segment_map` events map, each until a `segment_unmap` takes
it or part of it; at a moment, the touching pieces of one range are one segment, as PyTorch's
snapshot reports one segment per contiguous mapped range. Reserved is the mapped bytes and a
free block is free mapped space; unmapped address space is neither.
"""

from __future__ import annotations

import bisect
import copy
from dataclasses import dataclass, field
from functools import cached_property
from typing import Literal

import numpy as np
import polars as pl

from snapana.allocator_model import config as alloc_conf
from snapana.allocator_model.rules import (
    LARGE_BUFFER,
    LARGE_PAGE,
    MIN_BLOCK_SIZE,
    PLAIN,
    ROUNDING_PADS,
    SMALL_PAGE,
    SMALL_SIZE,
    SizeRules,
)
from snapana.caching_allocator import (
    ACTIVE_ALLOCATED,
    ACTIVE_PENDING_FREE,
    ACTIVE_STATES,
    MIN_PAD_WITNESSES,
)
from snapana.capture_kinds import size_rounding
from snapana.errors import InputError
from snapana.limits import MAX_TIME
from snapana.model import EMPTY_STACK, Capture
from snapana.units import parse_int, quote


class MomentError(InputError, ValueError):
    """A moment the capture does not have (no OOM, no timestamps, an index out of range)."""


NEVER = np.iinfo(np.int64).max  # free index of a block still live at the end


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


_ALLOC, _FREE_REQ, _FREE_DONE = 0, 1, 2
_PAIR_KIND = {"alloc": _ALLOC, "free_requested": _FREE_REQ, "free_completed": _FREE_DONE,
              "free": _FREE_DONE}
LIFETIME_SCHEMA = {"address": pl.Int64, "size": pl.Int64, "stack_id": pl.Int64,
                   "stream": pl.Int64, "alloc_idx": pl.Int64, "free_req_idx": pl.Int64,
                   "free_done_idx": pl.Int64, "requested_size": pl.Int64}


def _pair_kinds(events: pl.DataFrame) -> np.ndarray:
    """Each event's kind for pairing (`_PAIR_KIND`; -1: not a block event), from the action
    strings compared with each kind's names (on a million rows, faster than a lookup)."""
    action, kind = pl.col("action"), pl.lit(-1, pl.Int8)
    for k in set(_PAIR_KIND.values()):
        names = [a for a, v in _PAIR_KIND.items() if v == k]
        kind = pl.when(action == names[0] if len(names) == 1 else action.is_in(names)) \
            .then(pl.lit(k, pl.Int8)).otherwise(kind)
    return events.select(kind).to_series().to_numpy()


def _column(events: pl.DataFrame, name: str, fill: int) -> np.ndarray:
    """An Int64 column of `events` as numpy, nulls as `fill` (a view where it has none)."""
    column = events[name]
    return (column.fill_null(fill) if column.null_count() else column).to_numpy()


def _pair_lifetimes(events: pl.DataFrame, rules: SizeRules | None
                    ) -> tuple[dict[str, np.ndarray], list[tuple[int, str]]]:
    """Pair alloc / free_requested / free_completed events per address into lifetimes, each
    block sized by the capture allocator's `rules` (None: the requests as made).

    Vectorised form of this per-event state machine (events in order, one open row per
    address at most):
    - ``alloc``: a new row; an address already open is a mismatch, and its row ends here.
    - ``free_requested``: sets the open row's request index (the last one wins); with no
      open row, opens one that was alive before recording.
    - ``free_completed``/``free``: closes the open row (request index defaults to it); with
      no open row, a closed row alive before recording.
    Sorting by (address, event index) lays each address's events out in order: an event
    opens a row when it is an alloc, the address's first event, or follows a completion.
    Rows come back in the order they were opened; mismatches as (event index, message).
    """
    every_kind = _pair_kinds(events)
    values = {name: _column(events, name, fill) for name, fill in
              (("addr", 0), ("size", 0), ("stack_id", EMPTY_STACK), ("stream", 0))}
    # events are in index order already: a stable sort by address keeps it within each. The
    # positions sorted are the events' own (`i`), block events only
    block = every_kind >= 0
    if block.all():  # (a trace of PyTorch's: segment events are few, when any)
        order = np.argsort(values["addr"], kind="stable")
    else:
        rows = np.flatnonzero(block)
        order = rows[np.argsort(values["addr"][rows], kind="stable")]
    i = order
    kind = every_kind[order]
    addr = values["addr"][order]
    m = len(i)
    if m == 0:
        return {k: np.zeros(0, np.int64) for k in LIFETIME_SCHEMA}, []
    same = np.zeros(m, dtype=bool)
    same[1:] = addr[1:] == addr[:-1]
    prev = np.full(m, -1, dtype=np.int8)
    prev[1:] = kind[:-1]
    prev[~same] = -1
    is_alloc = kind == _ALLOC
    new_row = is_alloc | (prev == -1) | (prev == _FREE_DONE)
    clash = np.flatnonzero(is_alloc & same & ((prev == _ALLOC) | (prev == _FREE_REQ)))
    mismatches = [(int(i[p]), f"event {int(i[p])}: alloc at 0x{int(addr[p]):x} which is "
                   "already live") for p in clash]

    starts = np.flatnonzero(new_row)
    ends = np.empty_like(starts)
    ends[:-1] = starts[1:] - 1
    ends[-1] = m - 1
    row = np.cumsum(new_row)
    row -= 1
    opened_by_alloc = is_alloc[starts]
    sizes = values["size"][order]
    rounded = rules.blocks(sizes) if rules is not None else sizes.copy()
    opened_at = order[starts]  # the event that opened each row

    completed = kind[ends] == _FREE_DONE  # a completion is always the last event of its row
    req_idx = np.where(completed, i[ends], NEVER)
    done_idx = req_idx.copy()
    # an open row followed by another row at its address was ended by a clashing alloc
    next_same = np.zeros(len(starts), dtype=bool)
    next_same[:-1] = addr[starts[1:]] == addr[starts[:-1]]
    clashed = ~completed & next_same
    done_idx[:-1] = np.where(clashed[:-1], opened_at[1:], done_idx[:-1])
    rpos = np.flatnonzero(kind == _FREE_REQ)
    if len(rpos):
        rrows = row[rpos]
        last = np.ones(len(rpos), dtype=bool)
        last[:-1] = rrows[1:] != rrows[:-1]
        req_idx[rrows[last]] = i[rpos[last]]
    # a row a clashing alloc ended is no longer allocated from then on either: the
    # allocated timeline and the blocks at a moment must count the same rows
    req_idx = np.minimum(req_idx, done_idx)
    # a free that names another size than its alloc: the trace contradicts itself
    opener = starts[row]
    freed = np.flatnonzero(~new_row & (kind != _ALLOC) & (sizes > 0) & is_alloc[opener]
                           & (rounded != rounded[opener]))
    mismatches += [(int(i[p]), f"event {int(i[p])}: free at 0x{int(addr[p]):x} of "
                    f"{int(sizes[p])} bytes, allocated as {int(sizes[opener[p]])}")
                   for p in freed]

    cols = {
        "address": addr[starts],
        "size": rounded[starts],
        "stack_id": np.where(opened_by_alloc, values["stack_id"][opened_at], EMPTY_STACK),
        "stream": values["stream"][opened_at],
        "alloc_idx": np.where(opened_by_alloc, opened_at, -1),
        "free_req_idx": req_idx,
        "free_done_idx": done_idx,
        "requested_size": sizes[starts],
    }
    by_open = _in_order(opened_at, len(events))
    return {k: np.ascontiguousarray(v[by_open], dtype=np.int64) for k, v in cols.items()}, \
        mismatches


def _in_order(positions: np.ndarray, n: int) -> np.ndarray:
    """The order that sorts distinct positions in [0, n): `np.argsort(positions)`, by
    marking them and counting, without a sort."""
    marked = np.zeros(n, dtype=bool)
    marked[positions] = True
    rank = np.cumsum(marked)
    out = np.empty(len(positions), dtype=np.int64)
    out[rank[positions] - 1] = np.arange(len(positions))
    return out


def rounding_pad(blocks: pl.DataFrame, pools: dict[int, int] | None = None,
                 divisions: tuple[int, ...] = ()) -> int:
    """The bytes the allocator added to each request before rounding it (`ROUNDING_PADS`),
    as the final blocks show it: a block whose request the pads round differently, sized as
    one pad rounds it, is a witness; so is each request of the trace that the pads send to
    different pools (`pool_witnesses`: a capture that ends with nothing live still shows
    it). A pad other than 0 needs `MIN_PAD_WITNESSES` and no witness of another; else
    CUDA's rule (0) is assumed. `divisions`: the capture's roundup_power2_divisions, which
    round after the pad is added."""
    witnesses = dict.fromkeys(ROUNDING_PADS, 0)
    for pad, n in (pools or {}).items():
        witnesses[pad] += n
    live = blocks.filter(pl.col("state").is_in(ACTIVE_STATES) & (pl.col("requested_size") > 0))
    if not live.is_empty():
        req = live["requested_size"].to_numpy().astype(np.int64)
        size = live["size"].to_numpy().astype(np.int64)
        sized = {pad: SizeRules(divisions, pad).blocks(req) for pad in ROUNDING_PADS}
        base = sized[ROUNDING_PADS[0]]
        differ = np.logical_or.reduce([sized[pad] != base for pad in ROUNDING_PADS])
        for pad in ROUNDING_PADS:
            witnesses[pad] += int(((size == sized[pad]) & differ).sum())
    for pad in ROUNDING_PADS[1:]:
        if witnesses[pad] >= MIN_PAD_WITNESSES and not any(
                n for p, n in witnesses.items() if p != pad):
            return pad
    return 0


def pool_witnesses(events: pl.DataFrame, segments: pl.DataFrame,
                   divisions: tuple[int, ...] = ()) -> dict[int, int]:
    """Per pad of `ROUNDING_PADS`: the recorded requests that the pads send to different
    pools and that lie in a segment of the pool this pad chooses. The allocator picks the
    pool on the padded, rounded size (torch_npu's malloc: `get_pool(round_size(orig_size))`,
    round_size adding 32 bytes: a request within 32 bytes of kSmallSize is served from the
    large pool), so the pool of the segment holding such a request shows the pad. Only
    segments cut by the caching allocator count (an expandable range's type is a guess)."""
    out = dict.fromkeys(ROUNDING_PADS, 0)
    allocs = events.with_row_index("k").filter(pl.col("action") == "alloc")
    segs = segments.filter(~pl.col("expandable"))
    if allocs.is_empty() or segs.is_empty():
        return out
    req = allocs["size"].to_numpy().astype(np.int64)
    small = {pad: SizeRules(divisions, pad).blocks(req) <= SMALL_SIZE for pad in ROUNDING_PADS}
    differ = np.logical_or.reduce([small[p] != small[ROUNDING_PADS[0]] for p in ROUNDING_PADS])
    if not differ.any():
        return out
    addr = allocs["addr"].to_numpy().astype(np.int64)[differ]
    when = allocs["k"].to_numpy().astype(np.int64)[differ]
    seg_end = (segs["address"] + segs["total_size"]).to_numpy()
    # the segment holding an address is the live one whose end is the first above it
    end = _first_live(seg_end, segs["open_idx"].to_numpy(), segs["close_idx"].to_numpy(),
                      addr + 1, addr + int(segs["total_size"].to_numpy().max()), when)
    kinds: dict[int, set[str]] = {}
    for e, kind in zip(seg_end.tolist(), segs["segment_type"].to_list(), strict=True):
        kinds.setdefault(e, set()).add(kind)
    in_small = np.array([kinds.get(e) == {"small"} for e in end.tolist()], dtype=bool)
    in_large = np.array([kinds.get(e) == {"large"} for e in end.tolist()], dtype=bool)
    for pad in ROUNDING_PADS:
        chose = small[pad][differ]
        out[pad] = int((chose & in_small).sum() + (~chose & in_large).sum())
    return out


def taken_whole(cols: dict[str, np.ndarray], exact: np.ndarray, segments: pl.DataFrame,
                max_split_size: int | None) -> np.ndarray:
    """Block sizes with the allocator's split rule (`allocator_model.rules.should_split`):
    a block of the large pool takes the whole free block it was cut from when what would
    remain is too small to split off (at most kSmallSize; with max_split_size_mb, a request
    of that size or more takes any block it is given, which is less than kLargeBuffer
    larger). The free block a request took runs from its address to the next block or
    segment end live when it was made; a block held before recording is read in the state
    before the first event. Small-pool blocks never differ: their remainders are split from 512
    bytes on, and so are every pool's with expandable segments on (not called then).
    `exact` rows (sized by the final segments) keep their size."""
    size = cols["size"].copy()
    cand = np.flatnonzero(~exact & (size > SMALL_SIZE))
    if not cand.size:
        return size
    address, start, end = cols["address"], cols["alloc_idx"], cols["free_done_idx"]
    when = start[cand]  # -1: the state before the first event
    low = address[cand] + size[cand]
    reach = np.full(cand.size, SMALL_SIZE, dtype=np.int64)
    if max_split_size is not None:
        reach[size[cand] >= max_split_size] = LARGE_BUFFER - MIN_BLOCK_SIZE
    high = low + reach
    seg_end = (segments["address"] + segments["total_size"]).to_numpy()
    opened, closed = segments["open_idx"].to_numpy(), segments["close_idx"].to_numpy()
    next_block = _first_live(address, start, end, low, high, when)
    range_end = _first_live(seg_end, opened, closed, low, high, when)
    none = np.iinfo(np.int64).max
    boundary = np.minimum(np.where(next_block >= 0, next_block, none),
                          np.where(range_end >= 0, range_end, none))
    whole = boundary < none
    rows = cand[whole]
    size[rows] = boundary[whole] - address[rows]
    return size


#: Candidate (query, address) pairs looked at in one go by `_first_live`.
_PAIRS_AT_ONCE = 1 << 22


def _first_live(points: np.ndarray, opened: np.ndarray, closed: np.ndarray,
                low: np.ndarray, high: np.ndarray, when: np.ndarray) -> np.ndarray:
    """For each query k: the smallest point in [low[k], high[k]] whose interval is live at
    event when[k] (opened <= when < closed), -1 if none. Intervals at one point do not
    overlap in time, so the one that can be live is the last opened by then: a bisection
    over (point, opened)."""
    out = np.full(len(low), -1, dtype=np.int64)
    if not len(points) or not len(low):
        return out
    distinct, rank = np.unique(points, return_inverse=True)
    span = int(max(opened.max(), when.max())) + 3
    key = rank.astype(np.int64) * span + (opened + 1)
    order = np.argsort(key, kind="stable")
    key, rank, closed = key[order], rank[order], closed[order]
    first = np.searchsorted(distinct, low, "left")
    count = np.searchsorted(distinct, high, "right") - first
    bounds = np.cumsum(count)
    k0 = 0
    while k0 < len(low):
        k1 = max(int(np.searchsorted(bounds, bounds[k0] - count[k0] + _PAIRS_AT_ONCE,
                                     "right")), k0 + 1)
        n = count[k0:k1]
        query = np.repeat(np.arange(k0, k1), n)
        offset = np.arange(len(query)) - np.repeat(np.cumsum(n) - n, n)
        d = first[query] + offset
        j = np.searchsorted(key, d * span + (when[query] + 1), "right") - 1
        ok = (j >= 0) & (rank[np.maximum(j, 0)] == d) & (closed[np.maximum(j, 0)] > when[query])
        hit, at = np.unique(query[ok], return_index=True)  # points ascend within a query
        out[hit] = distinct[d[ok][at]]
        k0 = k1
    return out


def replay(capture: Capture, device: int) -> DeviceReplay:
    """Pair the trace's events into lifetimes and check them against the final segments."""
    events = capture.device_events(device)
    n = events.height
    gran = size_rounding(capture.source)

    # Lifetimes: trace sizes are the requested bytes; the block holds them as the capture's
    # allocator rounds them (`SizeRules`: 512 bytes, or its roundup_power2_divisions, after
    # its pad; exact for final blocks, which take their size from the segments).
    seg_intervals, reserved, reserved_delta, seg_mismatches = _segment_intervals(
        capture, device, events)
    conf = alloc_conf.recorded(capture.allocator_settings)
    rules: SizeRules | None = None
    if gran > 1:
        divisions = conf.roundup_divisions or ()
        pad = rounding_pad(capture.device_blocks(device),
                           pool_witnesses(events, seg_intervals, divisions), divisions)
        rules = SizeRules(divisions, pad)
    cols, clashes = _pair_lifetimes(events, rules)
    mismatches = [msg for _, msg in sorted(clashes)]
    ooms = [
        OomEvent(int(k), size, dev_free, stream, stack, t)
        for k, size, dev_free, stream, stack, t in events.with_row_index("k")
        .filter(pl.col("action") == "oom")
        .select("k", "size", "device_free", "stream", "stack_id", "time_us").iter_rows()
    ]

    # Final blocks: live ones must match the trace's open blocks exactly.
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
            # No allocator segments (profiler traces, memory timelines): reserved is what
            # the source recorded after each event, else the live blocks (nothing is known
            # to be cached; a pending-free block still occupies memory).
            series = capture.metadata.get("reserved_timeline", {}).get(device)
            if series is not None and len(series) == n:
                reserved = np.maximum(np.asarray(series, dtype=np.int64), live)
            else:
                reserved = live.copy()
            reserved_delta = np.diff(reserved, prepend=live_before)
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


SEGMENT_INTERVAL_SCHEMA = {"address": pl.Int64, "total_size": pl.Int64, "pool": pl.Utf8,
                           "stream": pl.Int64, "open_idx": pl.Int64, "close_idx": pl.Int64,
                           "segment_type": pl.Utf8, "expandable": pl.Boolean,
                           "vseg": pl.Int64}


class _Row:
    """One segment interval while the trace is read: a whole segment (`segment_alloc` ..
    `segment_free`), or one mapped piece of an expandable segment (`segment_map` ..
    `segment_unmap`, split when part of it is unmapped)."""

    __slots__ = ("address", "size", "pool", "stream", "open_idx", "close_idx", "segment_type",
                 "expandable")

    def __init__(self, address: int, size: int, stream: int, open_idx: int,
                 expandable: bool, close_idx: int = NEVER) -> None:
        self.address, self.size, self.stream = address, size, stream
        self.open_idx, self.close_idx = open_idx, close_idx
        self.pool = "0,0"
        self.segment_type: str | None = None
        self.expandable = expandable

    @property
    def end(self) -> int:
        return self.address + self.size


class _Mapped:
    """The mapped pieces of expandable segments open at the current event, by address."""

    def __init__(self) -> None:
        self.starts: list[int] = []
        self.rows: dict[int, _Row] = {}

    def add(self, row: _Row) -> None:
        bisect.insort(self.starts, row.address)
        self.rows[row.address] = row

    def remove(self, row: _Row) -> None:
        del self.starts[bisect.bisect_left(self.starts, row.address)]
        del self.rows[row.address]

    def overlapping(self, lo: int, hi: int) -> list[_Row]:
        j = max(bisect.bisect_right(self.starts, lo) - 1, 0)
        out = []
        while j < len(self.starts) and self.starts[j] < hi:
            row = self.rows[self.starts[j]]
            if row.end > lo:
                out.append(row)
            j += 1
        return out


def _gaps(lo: int, hi: int, covered: list[_Row]) -> list[tuple[int, int]]:
    """The parts of [lo, hi) that no row in `covered` (sorted by address) covers."""
    out, cursor = [], lo
    for r in covered:
        if r.address > cursor:
            out.append((cursor, min(r.address, hi)))
        cursor = max(cursor, r.end)
    if cursor < hi:
        out.append((cursor, hi))
    return [(a, b) for a, b in out if b > a]


def _segment_intervals(
    capture: Capture, device: int, events: pl.DataFrame,
) -> tuple[pl.DataFrame, np.ndarray, np.ndarray, list[str]]:
    """Segment lifetimes (for fragmentation at a moment), the reserved-bytes timeline (their
    sum after each event) and the places where the trace disagrees with the final segments.

    A segment from `segment_alloc` lives until its `segment_free`. An expandable segment
    (PyTorch's ExpandableSegment: one virtual range, pages mapped on demand) is the pieces
    its `segment_map` events map, each alive until a `segment_unmap` takes it (or part of it)
    away; reserved is the mapped bytes, unmapped address space is neither reserved nor free.
    Touching pieces of one virtual range are one segment at a moment, as PyTorch's snapshot
    reports one segment per contiguous mapped range.
    """
    n = events.height
    final = capture.device_segments(device)
    rows: list[_Row] = []
    mismatches: list[str] = []
    open_segs: dict[int, _Row] = {}
    mapped = _Mapped()
    seg_events = events.with_row_index("i").filter(
        pl.col("action").is_in(["segment_alloc", "segment_free", "segment_map",
                                "segment_unmap"])
    ).select("i", "action", "addr", "size", "stream")
    for i, act, addr, size, stream in seg_events.iter_rows():
        addr, size, stream = addr or 0, size or 0, stream or 0
        if act == "segment_alloc":
            if addr in open_segs:
                mismatches.append(f"event {i}: segment_alloc at 0x{addr:x} which is "
                                  "already allocated")
                open_segs.pop(addr).close_idx = i
            row = _Row(addr, size, stream, i, False)
            rows.append(row)
            open_segs[addr] = row
        elif act == "segment_free":
            closed = open_segs.pop(addr, None)
            if closed is None:  # allocated before recording began
                closed = _Row(addr, size, stream, -1, False)
                rows.append(closed)
            closed.close_idx = i
        elif act == "segment_map":
            if mapped.overlapping(addr, addr + size):
                mismatches.append(f"event {i}: segment_map at 0x{addr:x} maps memory that "
                                  "is already mapped")
            else:
                row = _Row(addr, size, stream, i, True)
                rows.append(row)
                mapped.add(row)
        else:  # segment_unmap: close what it covers; what was mapped before recording too
            lo, hi = addr, addr + size
            hit = mapped.overlapping(lo, hi)
            for a, b in _gaps(lo, hi, hit):
                rows.append(_Row(a, b - a, stream, -1, True, close_idx=i))
            for row in hit:
                mapped.remove(row)
                row.close_idx = i
                for a, b in ((row.address, lo), (hi, row.end)):
                    if b > a:  # the part of the piece that stays mapped
                        rest = _Row(a, b - a, row.stream, i, True)
                        rows.append(rest)
                        mapped.add(rest)

    # The final segments are ground truth: pieces and segments open at the end must be them.
    final_rows = list(final.select("address", "total_size", "pool", "stream", "segment_type",
                                   "is_expandable").iter_rows())
    runs: list[tuple[int, int, str, int, str]] = []
    for a, total, pool, stream, seg_type, expandable in final_rows:
        if expandable:
            runs.append((a, a + total, pool, stream, seg_type))
            inside = mapped.overlapping(a, a + total)
            for row in inside:
                if row.address < a or row.end > a + total:
                    mismatches.append(f"mapped range 0x{row.address:x} (+{row.size}) crosses "
                                      f"the end of segment 0x{a:x}")
            for lo, hi in _gaps(a, a + total, inside):  # mapped before recording began
                rows.append(_Row(lo, hi - lo, stream, -1, True))
            for row in inside:
                mapped.remove(row)
            continue
        found = open_segs.pop(a, None)
        if found is None:
            found = _Row(a, total, stream, -1, False)
            rows.append(found)
        found.size, found.pool, found.stream, found.segment_type = total, pool, stream, seg_type
    for row in list(open_segs.values()) + [mapped.rows[a] for a in mapped.starts]:
        kind = "mapped range" if row.expandable else "segment"
        mismatches.append(f"{kind} 0x{row.address:x} is open in the trace but not in the "
                          "segments")
        row.close_idx = n  # alive to the end, as the trace says
    vseg = _virtual_segments(rows, runs)
    seg_df = pl.DataFrame(
        [[r.address, r.size, r.pool, r.stream, r.open_idx, r.close_idx,
          r.segment_type or ("small" if r.size == SMALL_PAGE else "large"), r.expandable, v]
         for r, v in zip(rows, vseg, strict=True)],
        schema=SEGMENT_INTERVAL_SCHEMA, orient="row",
    )
    if n == 0:
        return seg_df, np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64), mismatches
    size = seg_df["total_size"].to_numpy()
    o_idx = seg_df["open_idx"].to_numpy()
    c_idx = seg_df["close_idx"].to_numpy()
    delta = np.zeros(n, dtype=np.int64)
    opened = (o_idx >= 0) & (o_idx < n)
    np.add.at(delta, o_idx[opened], size[opened])
    ended = (c_idx >= 0) & (c_idx < n)
    np.add.at(delta, c_idx[ended], -size[ended])
    baseline = int(size[o_idx < 0].sum())
    reserved = baseline + np.cumsum(delta)
    return seg_df, reserved, delta, mismatches


def _virtual_segments(rows: list[_Row], runs: list[tuple[int, int, str, int, str]]) -> list[int]:
    """An id per row: whole segments their own, the pieces of one expandable segment one.

    Pieces that ever touch or overlap belong to one virtual range (a range is reserved at
    1 1/8 of the device, so two ranges' pieces never meet); the range takes pool, stream and
    segment type from a final segment inside it, else the default pool and the page size
    its mappings are multiples of.
    """
    ids = [0] * len(rows)
    order = sorted((r.address, k) for k, r in enumerate(rows) if r.expandable)
    clusters: list[list[int]] = []
    end = -1
    for a, k in order:
        if not clusters or a > end:
            clusters.append([])
            end = a
        clusters[-1].append(k)
        end = max(end, rows[k].end)
    finals = sorted(runs)
    starts = [f[0] for f in finals]
    for c, members in enumerate(clusters):
        lo = min(rows[k].address for k in members)
        hi = max(rows[k].end for k in members)
        j = bisect.bisect_left(starts, lo)
        owner = finals[j] if j < len(finals) and finals[j][0] < hi else None
        if owner is None:
            large = all(rows[k].size % LARGE_PAGE == 0 for k in members)
            seg_type, pool = ("large" if large else "small"), "0,0"
        else:
            pool, seg_type = owner[2], owner[4]
        for k in members:
            rows[k].pool, rows[k].segment_type = pool, seg_type
            if owner is not None:
                rows[k].stream = owner[3]
            ids[k] = c
    nxt = len(clusters)
    for k, r in enumerate(rows):
        if not r.expandable:
            ids[k] = nxt
            nxt += 1
    return ids
