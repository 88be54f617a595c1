"""Live bytes per tensor family after every event: how memory got to the OOM, not only what
held it there.

Why: the treemap answers "what held the memory"; the next question is which family grew, in
which phase, step by step (the per-chunk softmax piling up until one more chunk does not
fit). The replay gives every block a lifetime and `attribution.lifetimes` gives every
lifetime a family, so each family's live bytes are a running sum of its allocations and
frees, with the same rule as the replay's allocated series (live from `alloc_idx` to
`free_req_idx`; blocks alive before the first event count from the start). The families
therefore add up to allocated bytes after every event.

Only the points where a family's bytes change are kept, so the cost and the size stay linear
in the trace; a value at any event is a search in them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import polars as pl

#: A family counts as dominant in the summary when it holds, or grew by, this share of the
#: allocated bytes at the moment.
DOMINANT_SHARE = 0.05
DOMINANT_LINES = 6  # families the summary gives a line, at most


@dataclass(frozen=True)
class FamilyGrowth:
    """One family over the recorded window, up to the moment of interest."""

    family: str
    start_bytes: int  # before the first recorded event
    peak_bytes: int  # at the peak of allocated bytes
    moment_bytes: int  # at the moment (the OOM, the peak or the end)
    max_bytes: int  # the most it held at any event up to the moment
    allocations: int  # its blocks live at the moment that were allocated in the window
    allocation_bytes: int  # their bytes
    uniform_size: int | None  # their size when all are one size (a loop's chunks)
    phase: str  # the phase most of those bytes were allocated in
    #: of its bytes at the moment from before the first event, those whose blocks have
    #: frames: allocated while recording, their allocation events lost from the trace
    #: (the ring buffer wrapped or recording restarted), not allocated before recording
    untraced_bytes: int = 0


@dataclass(frozen=True, eq=False)
class FamilyTimeline:
    """Each family's live bytes over one device's trace."""

    n_events: int
    #: family -> (events, bytes): the events (-1: before the first event) after which the
    #: family's bytes change, in order, and its bytes after each
    by_family: Mapping[str, tuple[np.ndarray, np.ndarray]]
    #: the replay's lifetimes with their `family` and `phase` (attribution.lifetimes)
    lifetimes: pl.DataFrame

    @cached_property
    def families(self) -> tuple[str, ...]:
        """Every family the trace held, the largest at its most first."""
        most = {f: int(v.max(initial=0)) for f, (_, v) in self.by_family.items()}
        return tuple(sorted(most, key=lambda f: (-most[f], f)))

    @cached_property
    def changes(self) -> pl.DataFrame:
        """family, event, bytes at every change, by family then event."""
        fams = sorted(self.by_family)
        return pl.DataFrame({
            "family": [f for f in fams for _ in range(len(self.by_family[f][0]))],
            "event": np.concatenate([self.by_family[f][0] for f in fams] or [np.zeros(0)]),
            "bytes": np.concatenate([self.by_family[f][1] for f in fams] or [np.zeros(0)]),
        }, schema={"family": pl.Utf8, "event": pl.Int64, "bytes": pl.Int64})

    @cached_property
    def spans(self) -> pl.DataFrame:
        """The lifetimes this timeline counts, each with `start` (-1: alive before the first
        event) and `end` (its free request; `n_events`: not freed in the trace): a family's
        bytes after event e are the sizes of its spans with start <= e < end."""
        return self.spans_of(self.lifetimes, self.n_events)

    @staticmethod
    def spans_of(lifetimes: pl.DataFrame, n_events: int) -> pl.DataFrame:
        """`spans` of any lifetimes of a trace of `n_events` (a replay's, before they are
        attributed: the same rows)."""
        counted, start, end = counted_spans(lifetimes, n_events)
        return lifetimes.filter(pl.Series(counted)).with_columns(
            pl.Series("start", start[counted], dtype=pl.Int64),
            pl.Series("end", end[counted], dtype=pl.Int64))

    def bytes_at(self, family: str, events: np.ndarray) -> np.ndarray:
        """The family's live bytes after each of `events` (-1: before the first event)."""
        hit = self.by_family.get(family)
        events = np.asarray(events, dtype=np.int64)
        if hit is None:
            return np.zeros(len(events), dtype=np.int64)
        at, value = hit
        k = np.searchsorted(at, events, side="right") - 1
        return np.where(k >= 0, value[np.maximum(k, 0)], 0)

    def peak_event(self, family: str) -> int:
        """The first event after which the family holds its most (-1: from the start)."""
        at, value = self.by_family.get(family, (np.zeros(1, np.int64), np.zeros(1, np.int64)))
        return int(at[int(np.argmax(value))])

    def first_held(self, family: str) -> int:
        """The first event after which the family holds memory (-1: from the start)."""
        at, value = self.by_family.get(family, (np.zeros(0, np.int64), np.zeros(0, np.int64)))
        held = at[value > 0]
        return int(held[0]) if held.size else self.n_events

    def growth(self, moment_idx: int, peak_idx: int) -> list[FamilyGrowth]:
        """How each family went from the start of the window to the moment."""
        made = self.lifetimes.filter(
            (pl.col("alloc_idx") >= 0) & (pl.col("alloc_idx") <= moment_idx)
            & (pl.col("free_req_idx") > moment_idx))
        counts = {f: (n, b, lo, hi) for f, n, b, lo, hi in made.group_by("family").agg(
            pl.len(), pl.col("size").sum(), pl.col("size").min().alias("lo"),
            pl.col("size").max().alias("hi")).iter_rows()}
        phases = dict(made.group_by("family", "phase").agg(pl.col("size").sum())
                      .sort(["size", "phase"], descending=[True, False])
                      .unique(subset="family", keep="first").select("family", "phase")
                      .iter_rows())
        untraced: dict[str, int] = {}
        if "framed" in self.lifetimes.columns:
            untraced = dict(self.lifetimes.filter(
                (pl.col("alloc_idx") < 0) & pl.col("framed")
                & (pl.col("free_req_idx") > moment_idx)).group_by("family").agg(
                pl.col("size").sum()).iter_rows())
        out = []
        for family in self.families:
            start, peak, now = (int(v) for v in self.bytes_at(family, np.array(
                [-1, peak_idx, moment_idx])))
            at, value = self.by_family[family]
            n, nbytes, lo, hi = counts.get(family, (0, 0, 0, 0))
            out.append(FamilyGrowth(
                family=family, start_bytes=start, peak_bytes=peak, moment_bytes=now,
                max_bytes=int(value[at <= moment_idx].max(initial=start)), allocations=n,
                allocation_bytes=int(nbytes), uniform_size=int(lo) if n > 1 and lo == hi
                else None, phase=str(phases.get(family, "unknown")),
                untraced_bytes=int(untraced.get(family, 0))))
        return out

    def dominant(self, moment_idx: int, peak_idx: int, allocated: int,
                 named: tuple[str, ...] = ()) -> tuple[FamilyGrowth, ...]:
        """The families that held or gained a large share of the memory by the moment (the
        ones a reader needs to know how it got there), largest at the moment first, then
        the `named` ones (those the verdict names) when they are not among them."""
        floor = DOMINANT_SHARE * max(allocated, 1)
        rows = self.growth(moment_idx, peak_idx)
        big = [g for g in rows if g.moment_bytes >= floor
               or abs(g.moment_bytes - g.start_bytes) >= floor]
        big.sort(key=lambda g: (-g.moment_bytes, g.family))
        big = big[:DOMINANT_LINES]
        big += [g for g in rows if g.family in named and g not in big]
        return tuple(big)

    def top_stacks(self) -> dict[str, int]:
        """Each family's stack that allocated the most bytes over the trace."""
        top = (self.lifetimes.group_by("family", "stack_id").agg(pl.col("size").sum())
               .sort(["size", "stack_id"], descending=[True, False])
               .unique(subset="family", keep="first"))
        return dict(zip(top["family"].to_list(), top["stack_id"].to_list(), strict=True))

    def frame(self, times_us: np.ndarray | None) -> pl.DataFrame:
        """`changes` for a notebook, in event order: event, time_us (None without a clock),
        family, bytes."""
        out = self.changes.select("event", "family", "bytes").sort("event", "family")
        if times_us is None or not len(times_us):
            return out.with_columns(pl.lit(None, pl.Int64).alias("time_us")).select(
                "event", "time_us", "family", "bytes")
        ev = out["event"].to_numpy()
        t = np.asarray(times_us, dtype=np.int64)[np.clip(ev, 0, len(times_us) - 1)]
        return out.with_columns(pl.Series("time_us", t, dtype=pl.Int64)).select(
            "event", "time_us", "family", "bytes")


def counted_spans(lifetimes: pl.DataFrame,
                  n_events: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Which lifetimes a trace of `n_events` counts, and from which event to which: a mask,
    then each lifetime's start (-1: alive before the first event, counted from the start)
    and end (its free request, or `n_events` when the trace does not free it) — the rule
    `replay` counts allocated bytes by."""
    born = lifetimes["alloc_idx"].to_numpy()
    freed = lifetimes["free_req_idx"].to_numpy()
    early = (born < 0) & (freed >= 0)
    counted = early | ((born >= 0) & (born < n_events))
    start = np.where(early, -1, born)
    end = np.where((freed >= 0) & (freed < n_events), freed, n_events)
    return counted, start, end


def family_timeline(lifetimes: pl.DataFrame, n_events: int) -> FamilyTimeline:
    """Each family's live bytes after every event, from attributed lifetimes (`family`
    column), counted exactly as `replay` counts allocated bytes."""
    names = sorted(lifetimes["family"].unique().to_list())
    code = lifetimes["family"].cast(pl.Enum(names)).to_physical().to_numpy().astype(np.int64)
    size = lifetimes["size"].to_numpy()
    counted, start, end = counted_spans(lifetimes, n_events)
    gone = counted & (end < n_events)
    fam = np.concatenate([code[counted], code[gone]])
    event = np.concatenate([start[counted], end[gone]])
    delta = np.concatenate([size[counted], -size[gone]])
    order = np.lexsort((event, fam))
    fam, event, delta = fam[order], event[order], delta[order]
    # one row per (family, event): the sum of its deltas, then a running sum per family
    first = np.ones(len(fam), dtype=bool)
    first[1:] = (fam[1:] != fam[:-1]) | (event[1:] != event[:-1])
    starts = np.flatnonzero(first)
    fam, event = fam[starts], event[starts]
    delta = np.add.reduceat(delta, starts) if len(starts) else delta[:0]
    running = np.cumsum(delta)
    new_family = np.ones(len(fam), dtype=bool)
    new_family[1:] = fam[1:] != fam[:-1]
    base = np.maximum.accumulate(np.where(new_family, np.arange(len(fam)), 0))
    before = np.where(base > 0, running[np.maximum(base - 1, 0)], 0)
    level = running - before  # each family's own running sum (once, not once per family)
    bounds = np.append(np.flatnonzero(new_family), len(fam))
    by_family = {names[int(fam[a])]: (event[a:b], level[a:b])
                 for a, b in zip(bounds[:-1], bounds[1:], strict=True)}
    return FamilyTimeline(n_events, by_family, lifetimes)
