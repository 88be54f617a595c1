"""The allocations around the moment, MemoryViz style: each allocation live in the window
before the OOM (or the peak) is a band stacked on those allocated before it; when one below
is freed, the bands above it slide down.

Why: the family chart says which family grew; this says which allocations did it (the
chunks piling up, the one buffer that stayed), each one down to its stack.

The window ends at the report's moment (the OOM, else the peak) and starts at the last
trough of allocated bytes among the `WINDOW_EVENTS` events before it: the climb to the
moment. A trough closer than `MIN_WINDOW_EVENTS` to the moment is moved back to that
distance, so a last sharp step still shows what led to it.

Bounded whatever the capture, and spent on what moves: allocations held through the whole
window (parameters, optimizer state: flat rectangles that say nothing about the climb) are
one band per family at the bottom (a family with one such allocation keeps it as its own
band). Of the others, the `BAND_COUNT` largest are bands of their own (those of the families
the verdict names first, so its family is never hidden in `other`), stacked above in the
order they were allocated, and the rest are summed into `other` bands on top, one per family
for the `OTHER_FAMILIES` largest among them (in the family's colour, so what grew last is
still named), then one grey band, so the top edge is allocated bytes after every event. A
band's outline needs a point only where something below it starts or ends; when the
allocations' outlines would need more than `POINT_LIMIT` points, fewer (the largest) are
drawn. An `other` outline needs at most 4 points per event of the window, so the points in
all stay under `POINT_LIMIT` + 4 × (`OTHER_FAMILIES` + 1) × `WINDOW_EVENTS`. A stack shows
its Python frames when it has any (counting the C++ frames left out), at most
`STACK_FRAMES`; each distinct frame line and each distinct stack is kept once.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

import numpy as np
import polars as pl

from snapana.analysis.diagnosis.findings import DeviceReport
from snapana.analysis.sites import format_frame, site_of
from snapana.model import Frame, StackTable, is_python_frame
from snapana.units import address_text, fmt_bytes, plural

WINDOW_EVENTS = 1000  # the most events the window holds (the moment is the last)
MIN_WINDOW_EVENTS = 100  # the fewest, when the trace has them
BAND_COUNT = 60  # allocations drawn as bands of their own: the largest
POINT_LIMIT = 3_000  # outline points of the allocations' bands (the page stays small)
OTHER_FAMILIES = 5  # families whose smaller allocations are summed into a band of their own
STACK_FRAMES = 30  # frames shown per stack (innermost first)
TAIL_SHARE = 0.02  # the state at the moment is drawn this share of the window wide


BandKind = Literal["allocation", "held", "other"]


@dataclass(frozen=True, eq=False)
class AllocationBand:
    """One allocation over the window; or (`held`) a family's allocations held through the
    whole window; or (`other`) the allocations not drawn, summed.

    The band holds from event `events[j]` until the next (the last until `end`): bytes
    `base[j]` to `top[j]` after those events. For an allocation `top - base` is its size."""

    kind: BandKind
    name: str  # the family, or "other (k allocations)"
    family: str  # "" for other
    size: int  # bytes: the allocation's, the held allocations' together, other's most
    count: int  # allocations in the band
    evidence: str  # inventory / frames / inferred / unknown; counted for held; "" for other
    site: str  # the allocation's (held: its largest's)
    hover: str  # a short line or two
    detail: str  # what the panel shows: size, family, evidence, events, address, site
    stack: int  # entry in `AllocationsView.stacks` of its (largest's) stack; -1: no frames
    colour: str
    events: np.ndarray  # int64: its first event in the window, then where base or top move
    base: np.ndarray  # int64 bytes below it after each of `events`
    top: np.ndarray  # int64 bytes to its top edge after each of `events`
    end: int  # the event that ends it (its free; the window's end + 1 when it outlives it)
    address: int = 0  # the allocation's (held: its largest's; other: 0)
    alloc_idx: int = -1  # the event that allocated it (-1: before the recording)

    def outline(self, x: np.ndarray, start: int) -> tuple[np.ndarray, np.ndarray]:
        """Its closed outline: x (indexed by event - `start`) and bytes, the top edge left
        to right, then the bottom edge back, in steps (a value holds until the next event).
        4 points per entry of `events`."""
        ev = self.events - start
        xs = np.append(np.repeat(x[ev], 2)[1:], x[self.end - start])
        top = np.repeat(self.top, 2)
        bottom = np.repeat(self.base, 2)
        return np.concatenate([xs, xs[::-1]]), np.concatenate([top, bottom[::-1]])


@dataclass(frozen=True, eq=False)
class AllocationsView:
    """The allocations live in events `start`..`end` (the moment), drawn as bands."""

    start: int
    end: int
    moment: str  # "OOM" or "peak" (or the kind of moment asked for)
    x: np.ndarray  # float64: x of events start..end + 1 (the last: the moment's tail)
    x_is_time: bool  # x is seconds since the first event (else the event index)
    bands: tuple[AllocationBand, ...]  # bottom first: held, allocations, other
    lines: tuple[str, ...]  # the distinct lines of the stacks (frames, notes)
    stacks: tuple[tuple[int, ...], ...]  # the bands' distinct stacks: lines, innermost first
    allocations: int  # allocations live at some point of the window

    def points(self, kind: BandKind | None = None) -> int:
        """Outline points of the bands (of a kind)."""
        return sum(4 * len(b.events) for b in self.bands if kind in (None, b.kind))

    def count(self, kind: BandKind) -> int:
        """Allocations in the bands of a kind."""
        return sum(b.count for b in self.bands if b.kind == kind)


def allocations_view(r: DeviceReport, colours: Mapping[str, str], other_colour: str,
                     unknown_colour: str, count: int = BAND_COUNT,
                     point_limit: int = POINT_LIMIT) -> AllocationsView | None:
    """The window before the report's moment with its allocations as bands (None without
    a recorded history, or when the moment is before the first event). The families the
    verdict names (the excess, the failing request's) come first among the bands of their
    own, so the chart never folds them into `other`."""
    t = r.timeline
    ft = t.families
    end = r.moment.idx
    if ft is None or t.stacks is None or t.n_events == 0 or not 0 <= end < t.n_events:
        return None
    start = window_start(t.allocated, end)
    lt = ft.lifetimes.with_row_index("row").filter(
        (pl.col("alloc_idx") <= end) & (pl.col("free_req_idx") > start))
    if lt.is_empty():
        return None
    size, alloc, row = (lt[c].to_numpy() for c in ("size", "alloc_idx", "row"))
    born = np.maximum(alloc, start)
    gone = np.minimum(lt["free_req_idx"].to_numpy(), end + 1)
    family = lt["family"].to_numpy().astype(str)
    width = end - start + 1
    events = np.arange(start, end + 1)

    groups, in_group = _held_through(family, size, (born == start) & (gone == end + 1))
    base = sum(nbytes for _, _, nbytes in groups)
    candidates = np.flatnonzero(~in_group)
    named = np.isin(family, [f for f in (r.diagnosis.excess_family,
                                         r.diagnosis.request_family) if f])
    shown = candidates[np.lexsort((row[candidates], alloc[candidates], -size[candidates],
                                   ~named[candidates]))][:count]  # named, then the largest
    while True:  # fewer when their outlines would need too many points
        drawn = shown[np.lexsort((row[shown], alloc[shown]))]  # in allocation order
        live = (events[None, :] >= born[drawn, None]) & (events[None, :] < gone[drawn, None])
        held = np.where(live, size[drawn, None], 0)
        below = base + np.cumsum(held, axis=0) - held
        rest = ~in_group
        rest[drawn] = False
        total = base + held.sum(axis=0)
        points = 4 * sum(len(_breaks(below[k], live[k])) for k in range(len(drawn)))
        if points <= point_limit or len(shown) <= 1:
            break
        shown = shown[: max(1, int(len(shown) * min(0.8, point_limit / points)))]

    moment = "OOM" if r.moment.kind == "oom" else r.moment.kind
    words = _Words(lt, t.stacks, t.times_us, end, moment)
    bands = []
    under = 0
    for name, members, nbytes in groups:
        bands.append(words.held(members, size, start, end, under,
                                colours.get(name, unknown_colour)))
        under += nbytes
    bands += [words.band(int(i), live[k], below[k], start,
                         colours.get(str(family[i]), unknown_colour))
              for k, i in enumerate(drawn)]
    under_rest = total
    for name, members in _rest_by_family(family, size, rest, OTHER_FAMILIES):
        live_bytes = _live_bytes(size[members], born[members], gone[members], start, width)
        top = under_rest + live_bytes
        n = len(members)
        label = f"other {name} ({plural(n, 'allocation')})" if name else \
            f"other ({plural(n, 'allocation')})"
        most = int(live_bytes.max(initial=0))
        ev = _breaks(np.stack([under_rest, top]), np.ones(width, dtype=bool))
        bands.append(AllocationBand(
            kind="other", name=label, family=name, size=most, count=n, evidence="",
            site="", hover=f"{label}<br>up to {fmt_bytes(most)} at once",
            detail=f"{label}: the smaller allocations live in the window, summed; up to "
                   f"{fmt_bytes(most)} ({most:,} bytes) at once"
                   + words.families_at_moment(members),
            stack=-1, colour=colours.get(name, unknown_colour) if name else other_colour,
            events=ev + start, base=under_rest[ev], top=top[ev], end=end + 1))
        under_rest = top
    lines, stacks = words.stack_table()
    return AllocationsView(start, end, moment, _x(t.times_us, start, end),
                           t.times_us is not None, tuple(bands), lines, stacks, len(size))


class _Words:
    """What a band says: size, family, evidence, events, site and stack (each distinct
    stack kept once)."""

    def __init__(self, lt: pl.DataFrame, stacks: StackTable, times_us: np.ndarray | None,
                 end: int, moment: str) -> None:
        self.lt, self.stacks, self.times_us, self.end, self.moment = (
            lt, stacks, times_us, end, moment)
        self.index: dict[int, int] = {}  # stack id -> its entry in the table

    def band(self, i: int, live: np.ndarray, below: np.ndarray, start: int,
             colour: str) -> AllocationBand:
        """Allocation `i` (a row of the window's lifetimes)."""
        family, size, evidence, site, stack, about = self._one(i)
        address, alloc = self._where(i)
        ev = _breaks(below, live)
        return AllocationBand(
            kind="allocation", name=family, family=family, size=size, count=1,
            evidence=evidence, site=site, hover=f"<b>{family}</b> {fmt_bytes(size)}<br>{site}",
            detail=f"{family}: {fmt_bytes(size)} ({size:,} bytes), evidence: {evidence}\n"
                   f"{about}\nsite: {site}",
            stack=stack, colour=colour, events=ev + start, base=below[ev],
            top=below[ev] + size, end=start + int(np.flatnonzero(live)[-1]) + 1,
            address=address, alloc_idx=alloc)

    def held(self, members: np.ndarray, size: np.ndarray, start: int, end: int,
             under: int, colour: str) -> AllocationBand:
        """A family's allocations held through the window, as one band; its detail and
        stack are those of its largest."""
        total, n = int(size[members].sum()), len(members)
        largest = int(members[np.argmax(size[members])])
        family, big, _, site, stack, about = self._one(largest)
        address, alloc = self._where(largest)
        counts = self.lt[members.tolist()]["evidence"].value_counts(sort=True)
        evidence = ", ".join(f"{e} ({c:,})" for e, c in counts.iter_rows())
        what = f"{plural(n, 'allocation')} held through the window"
        return AllocationBand(
            kind="held", name=family, family=family, size=total, count=n,
            evidence=evidence, site=site,
            hover=f"<b>{family}</b> {fmt_bytes(total)}<br>{what}",
            detail=f"{family}: {what}, {fmt_bytes(total)} ({total:,} bytes), evidence: "
                   f"{evidence}\nthe largest (its stack below): {fmt_bytes(big)} "
                   f"({big:,} bytes), {about}\nsite: {site}",
            stack=stack, colour=colour, events=np.array([start]),
            base=np.array([under]), top=np.array([under + total]), end=end + 1,
            address=address, alloc_idx=alloc)

    def families_at_moment(self, rows: np.ndarray) -> str:
        """Of allocations `rows`, the bytes of each family live at the moment."""
        at = self.lt[rows.tolist()].filter(pl.col("free_req_idx") > self.end)
        if at.is_empty():
            return f"; none live at the {self.moment}"
        parts = at.group_by("family").agg(pl.col("size").sum(), pl.len()).sort(
            ["size", "family"], descending=[True, False])
        return f"\nat the {self.moment}: " + ", ".join(
            f"{f} {fmt_bytes(b)} ({n:,})" for f, b, n in parts.iter_rows())

    def _one(self, i: int) -> tuple[str, int, str, str, int, str]:
        """Allocation `i`: family, size, evidence, site, stack entry and when/where."""
        row = self.lt.row(i, named=True)
        alloc, free, sid = int(row["alloc_idx"]), int(row["free_req_idx"]), int(row["stack_id"])
        frames = self.stacks.stack(sid)
        born = f"at event {alloc}{self._when(alloc)}" if alloc >= 0 else (
            "while recording; its allocation event is not in the trace (the ring buffer "
            "wrapped or recording restarted: raise max_entries)" if frames
            else "before the recording")
        freed = f"freed at event {free}{self._when(free)}" if free <= self.end else \
            f"live at the {self.moment}"
        return (str(row["family"]), int(row["size"]), str(row["evidence"]), site_of(frames),
                self.index.setdefault(sid, len(self.index)) if frames else -1,
                f"allocated {born}, {freed}, at {address_text(int(row['address']))}")

    def _where(self, i: int) -> tuple[int, int]:
        """Allocation `i`'s address and allocating event."""
        return int(self.lt["address"][i]), int(self.lt["alloc_idx"][i])

    def _when(self, idx: int) -> str:
        if self.times_us is None:
            return ""
        return f" ({(int(self.times_us[idx]) - int(self.times_us[0])) / 1e6:.6f} s)"

    def stack_table(self) -> tuple[tuple[str, ...], tuple[tuple[int, ...], ...]]:
        """The stacks of the bands in the order they were met, as indices into their
        distinct lines."""
        lines: dict[str, int] = {}
        stacks = tuple(tuple(lines.setdefault(line, len(lines))
                             for line in _stack_lines(self.stacks.stack(sid)))
                       for sid in self.index)
        return tuple(lines), stacks


def _held_through(family: np.ndarray, size: np.ndarray, through: np.ndarray) -> tuple[
        list[tuple[str, np.ndarray, int]], np.ndarray]:
    """The families with more than one allocation held `through` the window: name, rows and
    bytes, the most bytes first; and which rows they take."""
    groups = []
    in_group = np.zeros(len(size), dtype=bool)
    for name in np.unique(family[through]):
        members = np.flatnonzero(through & (family == name))
        if len(members) > 1:  # a family's one held allocation stays a band of its own
            groups.append((str(name), members, int(size[members].sum())))
            in_group[members] = True
    groups.sort(key=lambda g: (-g[2], g[0]))
    return groups, in_group


def window_start(allocated: np.ndarray, end: int, most: int = WINDOW_EVENTS,
                 fewest: int = MIN_WINDOW_EVENTS) -> int:
    """The first event of the window ending at `end` (see the module docstring)."""
    lo = max(0, end - most + 1)
    seg = allocated[lo:end + 1]
    trough = lo + len(seg) - 1 - int(np.argmin(seg[::-1]))
    return max(lo, min(trough, end - fewest + 1))


def _rest_by_family(family: np.ndarray, size: np.ndarray, rest: np.ndarray, most: int
                    ) -> list[tuple[str, np.ndarray]]:
    """The allocations not drawn (`rest`), as the summed bands on top: one per family for
    the `most` families with the most bytes among them, then one (family "") for the rest;
    so the top of the chart still says which family grew last."""
    rows = np.flatnonzero(rest)
    if not rows.size:
        return []
    names, inverse = np.unique(family[rows], return_inverse=True)
    totals = np.bincount(inverse, weights=size[rows])
    order = sorted(range(len(names)), key=lambda k: (-totals[k], str(names[k])))
    own = order[:most] if len(order) > most + 1 else order  # never a remainder of one family
    out = [(str(names[k]), rows[inverse == k]) for k in own]
    left = rows[~np.isin(inverse, own)]
    return out + ([("", left)] if left.size else [])


def _live_bytes(size: np.ndarray, born: np.ndarray, gone: np.ndarray, start: int,
                width: int) -> np.ndarray:
    """Bytes live after each event of the window, of allocations live from event `born`
    until `gone` (both within the window, `gone` at most its end + 1)."""
    delta = np.zeros(width + 1, dtype=np.int64)
    np.add.at(delta, born - start, size)
    np.add.at(delta, gone - start, -size)
    return np.cumsum(delta[:width])


def _breaks(series: np.ndarray, live: np.ndarray) -> np.ndarray:
    """The window positions where a band that is `live` there starts or where one of its
    `series` (rows) moves."""
    at = np.flatnonzero(live)
    if not at.size:
        return at
    values = series[..., at] if series.ndim > 1 else series[at]
    moved = np.ones(len(at), dtype=bool)
    moved[1:] = np.any(np.atleast_2d(values)[:, 1:] != np.atleast_2d(values)[:, :-1], axis=0)
    return at[moved]


def _x(times_us: np.ndarray | None, start: int, end: int) -> np.ndarray:
    """x of events start..end (seconds since the first event, or the index), and a tail
    after the moment so its state has a width."""
    if times_us is None:
        x = np.arange(start, end + 1, dtype=np.float64)
    else:
        x = (np.asarray(times_us[start:end + 1], dtype=np.float64) - float(times_us[0])) / 1e6
    span = float(x[-1] - x[0])
    tail = span * TAIL_SHARE if span > 0 else (1.0 if times_us is None else 1e-6)
    return np.append(x, x[-1] + tail)


def _stack_lines(frames: tuple[Frame, ...]) -> list[str]:
    """The lines a stack shows, innermost first: its Python frames when it has any (the
    C++ ones counted), else its frames; at most `STACK_FRAMES`, the rest counted."""
    python = [f for f in frames if is_python_frame(f)]
    shown = python or list(frames)
    what = "Python frames" if python and len(python) < len(frames) else "frames"
    lines = [format_frame(f) for f in shown[:STACK_FRAMES]]
    if len(shown) > STACK_FRAMES:
        lines.append(f"... {len(shown) - STACK_FRAMES} more {what}")
    if what == "Python frames":
        lines.append(f"({len(frames) - len(python)} C++ frames not shown)")
    return lines
