"""Segment lifetimes from a trace, and the reserved-bytes timeline they sum to (the replay's
segment step).

A `segment_alloc` lives until its `segment_free`. An expandable segment
(`expandable_segments:True`: one virtual range whose pages are mapped on demand) lives as the
pieces its `segment_map` events map, each until a `segment_unmap` takes it or part of it; at
a moment, the touching pieces of one range are one segment, as PyTorch's snapshot reports one
segment per contiguous mapped range.
"""

from __future__ import annotations

import bisect

import numpy as np
import polars as pl

from snapana.allocator_model.rules import LARGE_PAGE, SMALL_PAGE
from snapana.analysis.replay_pairs import NEVER
from snapana.model import Capture

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


def segment_intervals(
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
    rows: list[_Row] = []
    mismatches: list[str] = []
    open_segs: dict[int, _Row] = {}
    mapped = _Mapped()
    seg_events = events.with_row_index("i").filter(
        pl.col("action").is_in(["segment_alloc", "segment_free", "segment_map",
                                "segment_unmap"])
    ).select("i", "action", "addr", "size", "stream")
    for i, act, addr, size, stream in seg_events.iter_rows():
        _read_event(i, act, addr or 0, size or 0, stream or 0, rows, open_segs, mapped,
                    mismatches)
    runs = _match_final(capture.device_segments(device), rows, open_segs, mapped, mismatches)
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
    return (seg_df, *_reserved_timeline(seg_df, n), mismatches)


def _read_event(i: int, act: str, addr: int, size: int, stream: int, rows: list[_Row],
                open_segs: dict[int, _Row], mapped: _Mapped, mismatches: list[str]) -> None:
    """One segment event applied to the intervals read so far: `rows` every interval,
    `open_segs` the whole segments open by address, `mapped` the expandable pieces."""
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


def _match_final(final: pl.DataFrame, rows: list[_Row], open_segs: dict[int, _Row],
                 mapped: _Mapped, mismatches: list[str]) -> list[tuple[int, int, str, int, str]]:
    """The final segments are ground truth: pieces and segments open at the end must be
    them. Each final segment takes (and removes from `open_segs` / `mapped`) what the trace
    left open of it, or is added as alive before recording; returns the final expandable
    ranges (start, end, pool, stream, segment type)."""
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
    return runs


def _reserved_timeline(seg_df: pl.DataFrame, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Reserved bytes after each of the `n` events (the intervals' sum), and its change at
    each."""
    size = seg_df["total_size"].to_numpy()
    o_idx = seg_df["open_idx"].to_numpy()
    c_idx = seg_df["close_idx"].to_numpy()
    delta = np.zeros(n, dtype=np.int64)
    opened = (o_idx >= 0) & (o_idx < n)
    np.add.at(delta, o_idx[opened], size[opened])
    ended = (c_idx >= 0) & (c_idx < n)
    np.add.at(delta, c_idx[ended], -size[ended])
    baseline = int(size[o_idx < 0].sum())
    return baseline + np.cumsum(delta), delta


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
