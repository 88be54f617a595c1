"""View-models: what the renderers show, shaped once from the findings.

A view holds the findings it shows plus everything display needs that is not a finding: the
words (`wording.py`), the timeline downsampled to a plottable size, the segment map capped
so a report stays small whatever the capture, the allocations before the moment as bounded
bands (`allocation_bands.py`). Every renderer of a view reads the same view,
so the terminal, markdown, JSON and HTML cannot disagree, and none of them computes.

- `capture_view(reports, title, ranks=None)`: one capture (its devices, or several sources
  of one job), optionally under the rank table of a job.
- `diff_view(diff)`: before vs after (and `diff_timelines`: both sides' family timelines).
- `ranks_view(multi)`: the ranks of a job.
- `explain_view(items)`: why blocks got their family.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import cached_property
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import polars as pl

from snapana.analysis.compare import CaptureDiff
from snapana.analysis.diagnosis.findings import Band, DeviceReport, Timeline, WhatIf
from snapana.analysis.diagnosis.palette import UNKNOWN_COLOUR, family_colour
from snapana.analysis.explain import ExplainedSite
from snapana.analysis.ranks.aggregate import MultiReport
from snapana.analysis.sites import site_of
from snapana.render import ViewKind
from snapana.render import wording as w
from snapana.render.allocation_bands import AllocationsView, allocations_view
from snapana.render.explorer import explorer_data
from snapana.render.headline import evidence, headline
from snapana.units import fmt_bytes, plural

if TYPE_CHECKING:  # a log beside the capture: its modules are imported when there is one
    from snapana.analysis.log_check import LogCheck

TIMELINE_POINTS = 2000  # points drawn per timeline (min and max of each bucket, see below)
FAMILY_POINTS = 700  # points per family area (ten areas: the page stays small)
SEGMENT_MAP_LIMIT = 60  # segments drawn per pool in the segment map
SEGMENT_MAP_TOTAL = 120  # segments drawn in all (a capture can have many private pools)
SEGMENT_BLOCK_LIMIT = 256  # ranges drawn per segment (merged beyond that, see cap_ranges)
DIFF_SITE_ROWS = 60  # changed sites a diff view holds (largest change first)
BAND_LIMIT = 2000  # annotation bands drawn per timeline (the longest; the rest counted)


# ----- the timeline -----------------------------------------------------------------------
#: Family colours: `diagnosis.palette` (one per family id, the same in every report); the
#: "other" share of a capped chart is this lighter grey.
OTHER_COLOUR = "#d9d9d9"
FAMILY_AREAS = 9  # families drawn in the family timeline; the rest are one "other" area


def family_colours(*reports: DeviceReport) -> dict[str, str]:
    """The colour of every family of the reports (`family_colour`): a family looks the same
    in the treemap, the timelines, the allocations, the sites chart and on both sides of a
    diff."""
    order = [g.name for r in reports for g in r.groups]
    order += [f for r in reports if r.timeline.families is not None
              for f in r.timeline.families.families]
    out = {f: family_colour(f) for f in dict.fromkeys(order)}
    out["unknown"] = UNKNOWN_COLOUR
    return out


@dataclass(frozen=True)
class FamilyArea:
    """One family's live bytes at the timeline's points (or several: `other`)."""

    name: str
    bytes: tuple[int, ...]
    colour: str
    site: str  # the site that allocated most of it over the trace ('' for `other`)


@dataclass(frozen=True)
class TimelineView:
    """Live bytes over the trace, downsampled: x is µs on the trace clock or event index."""

    x: tuple[int, ...]
    allocated: tuple[int, ...]
    reserved: tuple[int, ...]
    x_is_time: bool
    oom_x: int | None
    peak_x: int | None
    peak_bytes: int
    bands: tuple[Band, ...]  # at most `BAND_LIMIT`: the longest (see `cap_bands`)
    #: The window the chart opens on (x units): the OOM, the peak and the activity around
    #: them, when a long quiet stretch before them would squeeze them into a sliver.
    zoom: tuple[int, int] | None = None
    reserved_known: bool = True  # False: the source has no reserved figure (not drawn)
    #: the families' live bytes after the events `family_events` (x: `family_x`), stacked
    #: bottom first (they add up to allocated bytes at every point)
    families: tuple[FamilyArea, ...] = ()
    family_events: tuple[int, ...] = ()
    family_x: tuple[int, ...] = ()
    family_reserved: tuple[int, ...] = ()  # reserved after the same events
    capacity: int | None = None  # the device's capacity, when known
    bands_left_out: int = 0  # annotation bands of the trace not in `bands` (too many to draw)


#: A quiet gap before the OOM / peak longer than this share of the trace is cut from the
#: opening view (the full range stays one click away).
ZOOM_GAP_SHARE = 0.5


def zoom_window(times: np.ndarray | None, first: int | None) -> tuple[int, int] | None:
    """Where the activity is: after the longest quiet gap before event `first` (the earlier
    of the OOM and the peak), when that gap is more than half the trace."""
    if times is None or first is None or len(times) < 3 or first < 1:
        return None
    span = int(times[-1] - times[0])
    gaps = np.diff(times[: first + 1])
    if span <= 0 or gaps.size == 0:
        return None
    j = int(np.argmax(gaps))
    if gaps[j] <= ZOOM_GAP_SHARE * span:
        return None
    start, end = int(times[j + 1]), int(times[-1])
    margin = max(1, (end - start) // 20)
    return start - margin, end + margin


def cap_bands(bands: Sequence[Band], limit: int = BAND_LIMIT) -> tuple[tuple[Band, ...], int]:
    """At most `limit` of a trace's bands, in their order: the longest (the earlier of
    equals), and how many shorter ones were left out."""
    if len(bands) <= limit:
        return tuple(bands), 0
    keep = set(sorted(range(len(bands)),
                      key=lambda i: (bands[i].start - bands[i].end, i))[:limit])
    return tuple(b for i, b in enumerate(bands) if i in keep), len(bands) - limit


def downsample_indices(values: np.ndarray, max_points: int) -> np.ndarray:
    """Indices that keep the shape of a long series: min and max of each bucket, plus ends.

    The global maximum (the peak) is always kept, so a plot never hides it.
    """
    n = len(values)
    if n <= max_points:
        return np.arange(n)
    buckets = max_points // 2
    edges = np.linspace(0, n, buckets + 1, dtype=np.int64)
    idx = [0, n - 1, int(np.argmax(values))]
    for lo, hi in zip(edges[:-1], edges[1:], strict=True):
        if hi > lo:
            chunk = values[lo:hi]
            idx.append(lo + int(np.argmin(chunk)))
            idx.append(lo + int(np.argmax(chunk)))
    return np.unique(np.array(idx, dtype=np.int64))


def timeline_view(t: Timeline, max_points: int = TIMELINE_POINTS,
                  reserved_known: bool = True, colours: Mapping[str, str] | None = None,
                  capacity: int | None = None,
                  family_points: int = FAMILY_POINTS,
                  named: tuple[str, ...] = ()) -> TimelineView:
    """The report's timeline at most ~`max_points` points, the peak, the OOM and the ends
    kept; the family areas at ~`family_points` chosen the same way (the `named` families,
    the verdict's, each an area of its own)."""
    if t.n_events == 0:
        return TimelineView((), (), (), False, None, None, t.peak_bytes, ())
    keep = _keep(t, max_points)
    family_keep = _keep(t, family_points)
    if t.families is not None:  # each drawn family's own peak is never smoothed away either
        peaks = [t.families.peak_event(f) for f in t.families.families[:FAMILY_AREAS + 1]]
        # integers even when no family peaks inside the trace (an empty list is float64)
        family_keep = np.union1d(family_keep, np.array([i for i in peaks if i >= 0],
                                                       dtype=np.int64))
    times = t.times_us

    def x_of(i: int) -> int:
        if times is None:
            return int(i)
        return int(times[i]) if i >= 0 else int(times[0])

    xs = keep if times is None else times[keep]
    bands, left_out = cap_bands(t.bands)
    return TimelineView(
        x=tuple(int(v) for v in xs),
        allocated=tuple(int(v) for v in t.allocated[keep]),
        reserved=tuple(int(v) for v in t.reserved[keep]),
        x_is_time=times is not None,
        oom_x=x_of(t.oom_idx) if t.oom_idx is not None else None,
        peak_x=x_of(t.peak_idx),
        peak_bytes=t.peak_bytes,
        bands=bands,
        zoom=zoom_window(times, min(i for i in (t.oom_idx, t.peak_idx) if i is not None)),
        reserved_known=reserved_known,
        families=family_areas(t, family_keep, colours or {}, named),
        family_events=tuple(int(i) for i in family_keep),
        family_reserved=tuple(int(v) for v in t.reserved[family_keep]),
        family_x=tuple(int(v) for v in (family_keep if times is None else times[family_keep])),
        capacity=capacity,
        bands_left_out=left_out,
    )


def _keep(t: Timeline, max_points: int) -> np.ndarray:
    """The events a timeline of ~`max_points` draws: the shape, the peak, the ends and the
    step into the OOM (never smoothed away)."""
    keep = downsample_indices(t.allocated, max_points)
    if t.oom_idx is not None:
        keep = np.union1d(keep, [i for i in (t.oom_idx - 1, t.oom_idx) if i >= 0])
    return keep


def family_areas(t: Timeline, keep: np.ndarray, colours: Mapping[str, str],
                 named: tuple[str, ...] = ()) -> tuple[FamilyArea, ...]:
    """The families' bytes at the kept events: the `FAMILY_AREAS` that held the most at
    their largest and the `named` ones (the verdict's: never folded away), stacked in the
    order they first held memory (what was there from the start at the bottom, what grew
    on top), and the rest summed into one `other` area."""
    ft = t.families
    if ft is None:
        return ()
    values = {f: ft.bytes_at(f, keep) for f in ft.families}
    shown = list(ft.families[:FAMILY_AREAS])
    shown += [f for f in named if f in ft.families and f not in shown]
    if len(ft.families) == len(shown) + 1:  # an "other" of one family is that family
        shown = list(ft.families)
    shown.sort(key=lambda f: (ft.first_held(f), -int(values[f].max(initial=0)), f))
    areas = [FamilyArea(f, tuple(int(v) for v in values[f]),
                        colours.get(f, UNKNOWN_COLOUR), t.family_sites.get(f, ""))
             for f in shown]
    rest = [f for f in ft.families if f not in shown]
    if rest:
        total = sum((values[f] for f in rest), np.zeros(len(keep), dtype=np.int64))
        areas.append(FamilyArea(f"{len(rest)} other families", tuple(int(v) for v in total),
                                OTHER_COLOUR, ""))
    return tuple(areas)


# ----- the segment map --------------------------------------------------------------------
@dataclass(frozen=True)
class SegmentRange:
    """A drawn range of a segment: one block, or several merged (see `cap_ranges`)."""

    offset: int
    size: int
    state: str  # a block state, or "mixed" for a slice of blocks in different states
    label: str
    by_state: Mapping[str, int] | None = None  # bytes per state of a merged slice


@dataclass(frozen=True)
class SegmentView:
    pool: str
    stream: int
    address: int
    size: int
    blocks: tuple[SegmentRange, ...]  # by offset; the gaps between them are free


@dataclass(frozen=True)
class SegmentGroup:
    """Segments alike in pool, stream, size and every drawn range (offset, size, state,
    label): one bar, "31 × 692.00 MiB", instead of 31 identical ones."""

    pool: str
    stream: int
    size: int
    blocks: tuple[SegmentRange, ...]
    addresses: tuple[int, ...]  # each segment's, in the map's order

    @property
    def count(self) -> int:
        return len(self.addresses)


def group_segments(segments: Iterable[SegmentView]) -> tuple[SegmentGroup, ...]:
    """The segment map's segments, alike ones together, in the order each first appears."""
    groups: dict[tuple[Any, ...], list[SegmentView]] = {}
    for s in segments:
        key = (s.pool, s.stream, s.size,
               tuple((b.offset, b.size, b.state, b.label,
                      tuple(sorted((b.by_state or {}).items()))) for b in s.blocks))
        groups.setdefault(key, []).append(s)
    return tuple(SegmentGroup(g[0].pool, g[0].stream, g[0].size, g[0].blocks,
                              tuple(s.address for s in g)) for g in groups.values())


def segment_map(r: DeviceReport, per_pool: int = SEGMENT_MAP_LIMIT,
                total: int = SEGMENT_MAP_TOTAL,
                per_segment: int = SEGMENT_BLOCK_LIMIT) -> tuple[SegmentView, ...]:
    """Largest segments per pool with their blocks, to show fragmentation.

    Capped so a report stays small whatever the capture: `per_pool` segments per pool,
    `total` in all, and at most `per_segment` drawn ranges per segment (`cap_ranges`)."""
    segs = r.segments.sort("total_size", descending=True)
    chosen: list[tuple[str, int, int, int]] = []
    for pool in sorted(segs["pool"].unique().to_list()):
        chosen.extend(
            (pool, *row) for row in segs.filter(pl.col("pool") == pool)
            .head(per_pool).select("address", "total_size", "stream").iter_rows()
        )
    chosen = chosen[:total]
    live = (
        r.live_blocks
        .filter(pl.col("segment_address").is_in([c[1] for c in chosen]))
        .sort("address")
    )
    stacks = r.timeline.stacks
    sites: dict[int, str] = {}

    def label(family: str | None, stack_id: int) -> str:
        """The block's family and, where it has frames, its site (the bar's hover)."""
        if stacks is not None and stack_id not in sites:
            frames = stacks.stack(int(stack_id))
            sites[stack_id] = f" · {site_of(frames)}" if frames else ""
        return (family or "") + sites.get(stack_id, "")

    by_seg: dict[int, list[SegmentRange]] = {}
    for a, s, st, fam, sid, sa in live.select(
        "address", "size", "state", "family", "stack_id", "segment_address"
    ).iter_rows():
        by_seg.setdefault(sa, []).append(SegmentRange(a - sa, s, st, label(fam, sid)))
    return tuple(
        SegmentView(pool, stream, address, size,
                    tuple(cap_ranges(by_seg.get(address, []), size, per_segment)))
        for pool, address, size, stream in chosen
    )


def cap_ranges(blocks: Sequence[SegmentRange], seg_size: int,
               limit: int = SEGMENT_BLOCK_LIMIT) -> list[SegmentRange]:
    """At most `limit` ranges for one segment's blocks (sorted by offset), bytes exact.

    Touching blocks in the same state merge first; if that is still too many, the segment is
    cut into `limit` equal slices and the blocks starting in one slice become one range, state
    ``mixed`` when they differ, with what it holds in its label."""
    if len(blocks) <= limit:
        return list(blocks)
    runs: list[dict[str, Any]] = []
    for b in blocks:
        r = runs[-1] if runs else None
        if r is not None and r["state"] == b.state and r["offset"] + r["size"] == b.offset:
            r["size"] += b.size
            r["n"] += 1
            r["labels"].add(b.label)
        else:
            runs.append({"offset": b.offset, "size": b.size, "state": b.state,
                         "label": b.label, "n": 1, "labels": {b.label}})
    if len(runs) > limit:
        width = max(1, -(-seg_size // limit))
        bins: dict[int, list[dict[str, Any]]] = {}
        for r in runs:
            bins.setdefault(r["offset"] // width, []).append(r)
        runs = []
        for group in bins.values():
            if len(group) == 1:
                runs.append(group[0])
                continue
            held_by: dict[str, int] = {}
            for r in group:
                held_by[r["state"]] = held_by.get(r["state"], 0) + r["size"]
            start = group[0]["offset"]
            end = max(r["offset"] + r["size"] for r in group)
            states = sorted(held_by)
            runs.append({
                "offset": start, "size": end - start,
                "state": states[0] if len(states) == 1 else "mixed",
                "n": sum(r["n"] for r in group), "labels": set(),
                "by_state": dict(sorted(held_by.items())),  # the rest of the range is free
            })
    out = []
    for r in runs:
        labels = sorted(r["labels"] - {""})
        label = labels[0] if len(labels) == 1 else ""
        if r["n"] > 1:
            label = f"{label} ({r['n']} blocks)".strip() if len(labels) <= 1 else \
                f"{r['n']} blocks: {', '.join(labels[:3])}{'...' if len(labels) > 3 else ''}"
        if "by_state" in r:
            out.append(SegmentRange(r["offset"], r["size"], r["state"],
                                    f"{plural(r['n'], 'block')} in this range", r["by_state"]))
        else:
            out.append(SegmentRange(r["offset"], r["size"], r["state"], label))
    return out


# ----- one capture ------------------------------------------------------------------------
#: Families below this share of allocated are listed under the treemap (too small to label).
#: Headline rows about the failed request (highlighted).
OOM_ROWS = ("requested (failed allocation)", "device free at the OOM", "short by")


@dataclass(frozen=True)
class Answer:
    """The answer first (`headline.py`): what failed and what holds the memory; the first
    fix and what it buys; at most three evidence lines."""

    finding: str = ""
    fix: str = ""
    evidence: tuple[str, ...] = ()


@dataclass(frozen=True)
class JobStatements:
    """What the job was, the one statement each that every section makes of it: the
    workload and the evidence that decided it, the allocator settings recorded, and how
    much history was recorded where it was not ('' each: nothing to say)."""

    workload: str = ""
    settings: str = ""
    history: str = ""


@dataclass(frozen=True, eq=False)
class DeviceView:
    """One device's report with its words; the timeline and segment map are shaped on first
    use (a text summary never draws them)."""

    report: DeviceReport
    name: str
    moment: str
    verdict: str
    headline: tuple[tuple[str, str], ...]
    what_ifs: tuple[tuple[str, str, str, str], ...]
    #: knob, cost, acts on, effect, caveat, why it applies, what the replay predicts
    knobs: tuple[tuple[str, str, str, str, str, str, str], ...]
    causes: tuple[tuple[str, str, str], ...]  # cause, holds / rejected / not measured, why
    group_notes: Mapping[str, str]  # family -> its loop of live copies, checkable ('' none)
    growth: tuple[str, ...] = ()  # how the dominant families got to the moment, a line each
    host: bool = False  # host memory (memray, the profiler's CPU): no GPU figures or knobs
    #: what a heap capture (memray) has instead of an allocation timeline ('' otherwise)
    history_note: str = ""
    oom_rows: tuple[str, ...] = OOM_ROWS
    #: where time axes count from (µs) when sources share a clock (`clock_origin`); None:
    #: the device's own first event
    origin: int | None = None
    #: the workload, the allocator settings and the history recorded, in words
    job: JobStatements = JobStatements()
    #: without history: blocks × size, total, share, relation (wording.size_rows), and
    #: demand or fragmentation from the segments
    sizes: tuple[tuple[str, str, str, str], ...] = ()
    demand: str = ""
    #: the what-ifs `what_ifs` words, in its order (wording.shown_what_ifs)
    what_if_items: tuple[WhatIf, ...] = ()
    #: the answer first; `verdict` is the whole paragraph the sections below complete
    answer: Answer = Answer()

    def __repr__(self) -> str:
        """One line (the report and its words are attributes)."""
        return f"<snapana DeviceView {self.name} — {self.moment}>"

    @property
    def lead(self) -> str:
        """The headline: the finding and the fix, one or two sentences."""
        return " ".join(x for x in (self.answer.finding, self.answer.fix) if x)

    @cached_property
    def timeline(self) -> TimelineView:
        if not self.report.diagnosis.history:
            return timeline_view(Timeline(np.zeros(0, np.int64), np.zeros(0, np.int64), None,
                                          None, -1, self.report.peak_allocated_bytes, ()))
        r = self.report
        named = tuple(f for f in (r.diagnosis.excess_family, r.diagnosis.request_family)
                      if f)
        return timeline_view(r.timeline, reserved_known=r.reserved_known,
                             colours=self.colours, capacity=r.diagnosis.capacity_bytes,
                             named=named)

    @cached_property
    def allocations(self) -> AllocationsView | None:
        """The allocations live in the window before the moment, as bands (None without
        history)."""
        if not self.report.diagnosis.history:
            return None
        return allocations_view(self.report, self.colours, OTHER_COLOUR, UNKNOWN_COLOUR)

    @cached_property
    def explorer(self) -> dict[str, Any] | None:
        """Every allocation of the trace, packed for the page's explorer (without history,
        the snapshot's blocks when they carry frames; see `explorer.explorer_data`)."""
        return explorer_data(self.report, self.colours, UNKNOWN_COLOUR, self.origin)

    @cached_property
    def colours(self) -> dict[str, str]:
        """Each family's colour, the same in every figure of the device."""
        return family_colours(self.report)

    @cached_property
    def segments(self) -> tuple[SegmentView, ...]:
        return segment_map(self.report) if self.report.has_segments else ()

    @cached_property
    def segment_groups(self) -> tuple[SegmentGroup, ...]:
        """The segment map with alike segments as one bar each (`group_segments`)."""
        return group_segments(self.segments)

    @property
    def legend(self) -> tuple[tuple[str, str, int, float], ...]:
        """Every family of the treemap with its colour, bytes and share: the map hides a label
        that does not fit its box, so the page names every box's family here."""
        total = self.report.allocated_bytes
        return tuple((g.name, self.colours.get(g.name, UNKNOWN_COLOUR), g.bytes,
                      g.bytes / total if total else 0.0) for g in self.report.groups)


def device_view(r: DeviceReport, origin: int | None = None) -> DeviceView:
    finding, fix = headline(r)
    return DeviceView(
        report=r, name=w.device_text(r), moment=w.moment_text(r), verdict=w.verdict(r),
        headline=tuple(w.headline_rows(r)), what_ifs=tuple(w.what_if_rows(r)),
        what_if_items=tuple(w.shown_what_ifs(r)),
        knobs=tuple(w.knob_rows(r)), causes=tuple(w.cause_rows(r)),
        group_notes={g.name: w.group_note(g) for g in r.groups}, host=w.is_host(r),
        history_note=w.host_history_note(r) if r.source.row.host_heap else "",
        growth=tuple(w.growth_lines(r)) if r.diagnosis.history else (), origin=origin,
        job=JobStatements(w.workload_statement(r), w.settings_statement(r),
                          w.history_statement(r)),
        sizes=tuple(w.size_rows(r)),
        demand=w.demand_statement(r) if not r.diagnosis.history else "",
        answer=Answer(finding, fix, tuple(evidence(r))))


@dataclass(frozen=True, eq=False)
class RanksView:
    """The ranks of a job: who failed first, who is unlike the others."""

    kind: ClassVar[ViewKind] = "ranks"
    report: MultiReport
    headline: str
    columns: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]


def ranks_view(m: MultiReport) -> RanksView:
    return RanksView(m, w.ranks_headline(m), w.RANK_COLUMNS, tuple(w.rank_rows(m)))


@dataclass(frozen=True, eq=False)
class CaptureView:
    """The devices of one capture (or the sources of one job) under a title, and with
    `ranks` the rank table of the job the capture is one rank of."""

    kind: ClassVar[ViewKind] = "capture"
    title: str
    devices: tuple[DeviceView, ...]
    ranks: RanksView | None = None
    #: Several GPUs of one process: a row each (`wording.DEVICE_COLUMNS`) and their skew.
    device_rows: tuple[tuple[str, ...], ...] = ()
    device_note: str = ""
    device_columns: tuple[str, ...] = w.DEVICE_COLUMNS
    #: OOM messages of logs given beside the capture, checked against its figures
    log_checks: tuple[LogCheckView, ...] = ()

    def __repr__(self) -> str:
        """One line (a notebook saves it; the devices' views are `.devices`)."""
        return f"<snapana CaptureView {self.title!r}: {len(self.devices)} device view(s)>"

    @property
    def several_sources(self) -> bool:
        """Reports of more than one file (a snapshot with its profiler trace, ...)."""
        return len({d.report.path for d in self.devices}) > 1

    @cached_property
    def common_clock(self) -> bool:
        """Sources share an axis only when every one has absolute µs times and their recorded
        spans overlap (a snapshot and a kineto trace of one run share the profiler clock)."""
        return clock_origin([d.report for d in self.devices]) is not None


def clock_origin(reports: Sequence[DeviceReport]) -> int | None:
    """Where the clock several reports share starts (the earliest first event, µs), when
    every one has history on absolute µs times and their recorded spans overlap; else None."""
    spans = [(int(r.timeline.times_us[0]), int(r.timeline.times_us[-1])) for r in reports
             if r.diagnosis.history and r.timeline.times_us is not None and r.timeline.n_events]
    if len(spans) != len(reports) or len(spans) < 2:
        return None
    if max(s[0] for s in spans) > min(s[1] for s in spans):
        return None
    return min(s[0] for s in spans)


@dataclass(frozen=True)
class LogCheckView:
    """A log's OOM message against the snapshot's figures at its OOM: a row a figure."""

    title: str
    verdict: str
    rows: tuple[tuple[str, str, str, str], ...]  # figure, the log printed, the snapshot, agree?
    #: The verdict in one line for a one-screen summary: agrees, or disagrees on which figures
    brief: str = ""

    COLUMNS: ClassVar[tuple[str, ...]] = ("figure", "the log printed", "the snapshot", "")


def log_check_view(c: LogCheck) -> LogCheckView:
    from snapana.render.text_log import base_name

    m = c.message
    where = (f"{base_name(m.source)} line {m.line}"
             + (f" (rank {m.rank})" if m.rank is not None else ""))
    title = f"{where} against {c.path}, GPU {c.device}"
    if not c.snapshot_oom:
        return LogCheckView(title, "the snapshot records no OOM: it was dumped at another "
                            "moment than the message, so their figures are not compared", (),
                            f"log {where}: not compared (the snapshot records no OOM)")
    rows = tuple((f.what, f.printed.text, f"{fmt_bytes(f.snapshot)} ({f.how})",
                  "agrees" if f.agrees else
                  f"differs by {fmt_bytes(abs(f.printed.bytes - f.snapshot))}")
                 for f in c.figures)
    off = [f for f in c.figures if not f.agrees]
    if not c.figures:
        verdict = "the message holds none of the figures the snapshot records"
        brief = f"log {where}: holds none of the snapshot's figures, nothing to compare"
    elif not off:
        verdict = (f"the log's {len(c.figures)} figures agree with the snapshot's within their "
                   "printed rounding: the two record the same failure")
        brief = (f"log {where} agrees with the snapshot ({len(c.figures)} figures within "
                 "their printed rounding)")
    else:
        verdict = (f"{len(off)} of {len(c.figures)} figures disagree ("
                   + ", ".join(f.what for f in off) + "): the log and the snapshot do not "
                   "record the same moment (another rank's log, another step, or a snapshot "
                   "dumped after memory was freed); read each on its own")
        brief = (f"log {where} disagrees with the snapshot on "
                 + ", ".join(f"{f.what} (by {fmt_bytes(abs(f.printed.bytes - f.snapshot))})"
                             for f in off)
                 + ": not the same moment")
    return LogCheckView(title, verdict, rows, brief)


def capture_view(reports: Iterable[DeviceReport], title: str,
                 ranks: MultiReport | None = None,
                 log_checks: Sequence[LogCheck] = ()) -> CaptureView:
    """Host sections (memray, the profiler's CPU) come after the GPU ones. Sources of one
    job on a shared clock count their time axes from one origin, so they line up."""
    reports = list(reports)
    origin = clock_origin(reports) if len({r.path for r in reports}) > 1 else None
    views = sorted((device_view(r, origin) for r in reports), key=lambda v: v.host)
    gpus = [v.report for v in views if not v.host]
    one_process = len(gpus) > 1 and len({r.path for r in gpus}) == 1
    return CaptureView(title, tuple(views), ranks_view(ranks) if ranks is not None else None,
                       tuple(w.device_rows(gpus)) if one_process else (),
                       w.skew_text(gpus) if one_process else "",
                       log_checks=tuple(log_check_view(c) for c in log_checks))


# ----- a diff -----------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class DiffView:
    """Before vs after, with its verdict and the rows of its tables."""

    kind: ClassVar[ViewKind] = "diff"
    diff: CaptureDiff
    title: str
    verdict: str
    before: str
    after: str
    totals: tuple[tuple[str, str, str, str], ...]  # peak, allocated, reserved: before, after
    families: tuple[tuple[str, str, str, str, str], ...]  # families that changed
    sites: tuple[tuple[str, str, str, str, str, str], ...]  # sites that changed (capped)


    #: the families whose growth over the trace differs most, a line each
    growth: tuple[str, ...] = ()
    history_note: str = ""  # which side has no history ('' when both have)

    def __repr__(self) -> str:
        """One line: the title (the diff itself is `.diff`)."""
        return f"<snapana DiffView {self.title!r}>"

    @cached_property
    def timelines(self) -> DiffTimelines | None:
        """The two family timelines (None unless both sides have history)."""
        return diff_timelines(self.diff)


def diff_view(d: CaptureDiff, title: str | None = None) -> DiffView:
    before, after = w.side_text(d.before), w.side_text(d.after)
    return DiffView(
        diff=d, title=title or f"{before} → {after}", verdict=w.diff_verdict(d),
        before=before, after=after, totals=tuple(w.total_rows(d)),
        families=tuple(w.family_rows(d)), sites=tuple(w.site_rows(d, limit=DIFF_SITE_ROWS)),
        growth=tuple(w.growth_change_lines(d)), history_note=w.history_note(d))


@dataclass(frozen=True)
class DiffTimelines:
    """Each side's family timeline, to draw one above the other on a shared x axis: the
    same colour for a family on both sides, the same y range."""

    before: TimelineView
    after: TimelineView
    axis: str  # the x axis in words (seconds since each side's first event, or event index)
    axis_note: str  # why the axis is the event index though one side has a clock ('' none)
    top_bytes: int  # the top of both y axes: the largest peak, reserved or capacity


def diff_timelines(d: CaptureDiff, family_points: int = FAMILY_POINTS) -> DiffTimelines | None:
    """Both sides' timelines at the report's family point budget each; on the event index
    for both when either side has no clock (a clock and an index cannot share an axis)."""
    if d.reports is None or not (d.before.history and d.after.history):
        return None
    colours = family_colours(*d.reports)
    clocks = (d.reports[0].timeline.times_us is not None,
              d.reports[1].timeline.times_us is not None)
    clocked = all(clocks)

    def side(r: DeviceReport) -> TimelineView:
        t = r.timeline if clocked else replace(r.timeline, times_us=None, bands=())
        return timeline_view(t, reserved_known=r.reserved_known, colours=colours,
                             capacity=r.diagnosis.capacity_bytes, family_points=family_points)

    top = max(max(r.peak_allocated_bytes, r.timeline.peak_bytes,
                  int(r.timeline.reserved.max(initial=0)) if r.reserved_known else 0,
                  r.diagnosis.capacity_bytes or 0) for r in d.reports)
    return DiffTimelines(side(d.reports[0]), side(d.reports[1]), w.diff_axis(clocked),
                         w.diff_axis_note(*clocks), top)


# ----- explanations -----------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class ExplainView:
    """Why blocks got their family: one item per distinct stack (`Session.explain`)."""

    kind: ClassVar[ViewKind] = "explain"
    items: tuple[ExplainedSite, ...]


def explain_view(items: Iterable[ExplainedSite]) -> ExplainView:
    return ExplainView(tuple(items))
