"""The report's explorer data: every allocation of the trace as compact columns, so the page
can show what held memory after any event, find allocations by stack text and draw them,
in the browser, with no server.

Why: the report is written for one moment (the OOM, else the peak); the next questions are
about others (the end of forward, the second peak). The family timeline already counts every
allocation from `alloc_idx` to `free_req_idx` (`family_timeline`); the page gets those same
lifetimes, so its family bytes at any event are the timeline's, which add up to allocated.

Columns are integers packed small (sorted, delta-coded, divided by their common factor,
a column of few distinct values as indices into them, each byte plane apart) and gzipped
into one member, each column deflated on the thread that packed it; the page inflates them
with the browser's own `DecompressionStream`, as it does plotly.js. A stack is kept once, as
indices into its distinct frames, and a frame as indices into the distinct file and function
names (each stored once, shortened to `limits.MAX_FRAME_TEXT` as every report shows them)
and its line: the page is bounded by what it shows, not by how often a name repeats (one
long name shared by thousands of frames through a pickle's memo is one string here), and
the find box searches every frame of every allocation.
"""

from __future__ import annotations

import base64
import gzip
import json
import struct
import zlib
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl

from snapana.analysis.diagnosis.findings import DeviceReport
from snapana.analysis.diagnosis.palette import UNKNOWN
from snapana.analysis.family_timeline import FamilyTimeline
from snapana.analysis.sites import site_of
from snapana.arrays import stable_order, unique_inverse
from snapana.caching_allocator import ACTIVE_ALLOCATED
from snapana.limits import MAX_FRAME_TEXT
from snapana.model import StackTable
from snapana.units import SYNTHETIC_ADDRESSES, shown_name

#: How the page reads a packed column back: bytes per value, then (in this order undone)
#: zigzag for signed deltas, a running sum (`delta`: over all rows; `group`: over the rows
#: with the same value in that earlier column), a factor and an offset; last, under
#: `values`, each value is an index into that earlier column.
Column = dict[str, Any]


@dataclass
class _Parts:
    """Packed columns: how to read each back, each one's bytes and those bytes deflated
    (`_deflated`); parts packed apart are laid end to end with `+`."""

    specs: list[Column]
    data: list[bytes]
    deflated: list[bytes]

    def __add__(self, other: _Parts) -> _Parts:
        return _Parts(self.specs + other.specs, self.data + other.data,
                      self.deflated + other.deflated)

#: zlib level of the blob. At a million events (6.3 MB packed) level 4 takes half the time
#: of 6 for a blob 10% larger (434 vs 395 KB); 9 would take 8x as long as 6 for 5% less.
_LEVEL = 4
#: Rows a column's ways of packing are judged on.
_SAMPLE = 1 << 16
#: A gzip member's header: deflate, no flags, no time, no extra flags, unknown system.
_GZIP_HEADER = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff"
#: Rows a column's common factor is first taken from (`_common_factor`).
_GUESS = 1024


def _common_factor(v: np.ndarray) -> int:
    """The greatest common divisor of the non-negative `v`'s non-zero values (1 when none):
    that of the first few, when it divides all of them (whatever divides all of them
    divides those few), else of all; one remainder over the rows, not a gcd per row."""
    nz = v[v > 0]
    if not nz.size:
        return 1
    guess = int(np.gcd.reduce(nz[:_GUESS]))
    if guess == 1 or not (nz % guess).any():
        return guess
    return int(np.gcd.reduce(nz))


def _planes(v: np.ndarray) -> tuple[int, bytes]:
    """Non-negative integers as their low `width` bytes, each byte plane apart (the high
    planes are mostly zeros, which compress to nothing)."""
    top = int(v.max()) if v.size else 0
    width = max(1, (top.bit_length() + 7) // 8)
    planes = v.astype("<u8").view(np.uint8).reshape(-1, 8)[:, :width]
    return width, np.ascontiguousarray(planes.T).tobytes()


def _differences(v: np.ndarray, group: np.ndarray | None) -> np.ndarray:
    """Each value minus the previous one (of the rows in its group, when grouped); a
    group's first row keeps its value."""
    if group is None:
        return np.diff(v, prepend=0)
    order = stable_order(group)
    g, w = group[order], v[order]
    d = np.diff(w, prepend=0)
    first = np.ones(g.size, dtype=bool)
    first[1:] = g[1:] != g[:-1]
    d[first] = w[first]
    out = np.empty_like(d)
    out[order] = d
    return out


def _packed(name: str, values: np.ndarray, delta: bool = False,
            group: tuple[str, np.ndarray] | None = None) -> tuple[Column, bytes]:
    """One column: offset to its minimum, divided by the common factor of what is left,
    delta-coded over all rows or within a group (zigzag when a delta is negative), in byte
    planes."""
    v = np.asarray(values, dtype=np.int64)
    base = int(v.min()) if v.size else 0
    v = v - base
    factor = _common_factor(v)  # sizes share 512: stored / 512
    if factor & (factor - 1) == 0:  # a power of two (1 included): a shift, not a division
        v >>= factor.bit_length() - 1
    else:
        v //= factor
    zig = False
    if (delta or group is not None) and v.size:
        d = _differences(v, group[1] if group is not None else None)
        zig = bool((d < 0).any())
        v = np.where(d < 0, -2 * d - 1, 2 * d) if zig else d
    width, data = _planes(v)
    spec: Column = {"name": name, "n": int(v.size), "width": width, "zigzag": zig,
                    "delta": delta, "factor": factor, "base": base}
    if group is not None:
        spec["group"] = group[0]
    return spec, data


def _way(indexed: bool, grouped: bool, name: str, v: np.ndarray,
         group: tuple[str, np.ndarray] | None, choosing: bool = False
         ) -> tuple[list[Column], bytes] | None:
    """A column that is not delta-coded, packed one way: as it is, or `indexed` (its sorted
    distinct values, then an index per row); either one delta-coded within `group` when
    `grouped`. None where the way does not apply (grouped, with no group), or while
    `choosing`, is not worth trying (an index when more than a quarter of the rows are
    distinct)."""
    if grouped and group is None:
        return None
    g = group if grouped else None
    if not indexed:
        spec, data = _packed(name, v, group=g)
        return [spec], data
    distinct, index = unique_inverse(v)
    if choosing and distinct.size * 4 > v.size:
        return None
    table, table_data = _packed(f"{name}.values", distinct, delta=True)
    spec, data = _packed(name, index, group=g)
    return [table, {**spec, "values": table["name"]}], table_data + data


#: The ways tried: (indexed, grouped).
_WAYS = ((False, False), (False, True), (True, False), (True, True))


def _best(name: str, v: np.ndarray, group: tuple[str, np.ndarray] | None
          ) -> tuple[list[Column], bytes]:
    """The way of packing the column that compresses smallest, judged on its first rows
    (compressing every way in full would cost more than the choice saves), built on all."""
    head = slice(0, _SAMPLE)
    tried = {w: packed for w in _WAYS
             if (packed := _way(*w, name, v[head], None if group is None else
                                (group[0], group[1][head]), True)) is not None}
    way = min(tried, key=lambda w: len(zlib.compress(tried[w][1], 1)))
    if v.size <= _SAMPLE:
        return tried[way]
    best = _way(*way, name, v, group)
    assert best is not None  # a way tried applies to all rows
    return best


def pack(columns: Mapping[str, np.ndarray], delta: frozenset[str] = frozenset(),
         group: Mapping[str, str] | None = None) -> tuple[list[Column], str]:
    """Integer columns as one base64 gzip blob and how to read each back (see `Column`).
    `delta`: columns delta-coded over all rows (sorted or cumulative ones). `group`: a
    column whose deltas are taken within the rows sharing an earlier column's value (an
    address, per size: the caching allocator hands a freed block to the next request of
    its size). Any other column is also tried as indices into its distinct values (sizes,
    reused addresses); of the ways tried, the one that compresses smallest is kept."""
    return _blob(_pack_parts(columns, delta, group))


def _pack_parts(columns: Mapping[str, np.ndarray], delta: frozenset[str] = frozenset(),
                group: Mapping[str, str] | None = None) -> _Parts:
    """`pack`'s columns packed and deflated, not yet one blob."""
    def one(name: str) -> tuple[list[Column], bytes, bytes]:
        if name in delta:
            spec, data = _packed(name, columns[name], delta=True)
            specs = [spec]
        else:
            by = (group or {}).get(name)
            specs, data = _best(name, np.asarray(columns[name], dtype=np.int64), None if by is None
                                else (by, np.asarray(columns[by], dtype=np.int64)))
        return specs, data, _deflated(data)

    # columns are packed and deflated apart, on two threads: numpy's sorts and zlib let go of
    # the GIL
    with ThreadPoolExecutor(2) as pool:
        packed = list(pool.map(one, columns))
    return _Parts([spec for column_specs, _, _ in packed for spec in column_specs],
                  [data for _, data, _ in packed], [z for _, _, z in packed])


def _blob(parts: _Parts) -> tuple[list[Column], str]:
    """Packed columns (`_pack_parts`, laid end to end) as specs and one base64 gzip blob."""
    return parts.specs, base64.b64encode(_gzip_member(parts.data, parts.deflated)).decode(
        "ascii")


def _deflated(data: bytes) -> bytes:
    """`data` as raw deflate blocks that end on a byte (a full flush, no final block): such
    parts laid end to end are one deflate stream, so columns are compressed apart, on the
    threads that pack them."""
    z = zlib.compressobj(_LEVEL, zlib.DEFLATED, -15)
    return z.compress(data) + z.flush(zlib.Z_FULL_FLUSH)


def _gzip_member(data: list[bytes], deflated: list[bytes]) -> bytes:
    """One gzip member (no name, no time: byte-stable) of `data` deflated part by part
    (`_deflated`): its header, the parts, an empty final block, then the CRC-32 and length
    of all the data."""
    crc = 0
    for part in data:
        crc = zlib.crc32(part, crc)
    end = zlib.compressobj(_LEVEL, zlib.DEFLATED, -15).flush(zlib.Z_FINISH)
    size = sum(map(len, data)) & 0xFFFFFFFF
    return b"".join([_GZIP_HEADER, *deflated, end, struct.pack("<II", crc, size)])


@dataclass
class _Allocations:
    """The explorer's columns that no attribution changes: the counted lifetimes (a family
    timeline's `spans`) in the page's order (by alloc, then address), packed with the
    reserved bytes and the stacks (their frame lines and sites, each one's line indices)."""

    reserved: np.ndarray  # the replay's own array, which a report's timeline holds
    alloc_idx: np.ndarray  # the spans', in their order: what a report's must equal
    order: np.ndarray
    parts: _Parts
    names: list[str]  # the distinct file and function names of the frames, shortened
    sites: list[str]
    no_frames: int


def _allocations(spans: pl.DataFrame, reserved: np.ndarray, stacks: StackTable
                 ) -> _Allocations:
    """`_Allocations` of a trace's spans (`FamilyTimeline.spans`, attributed or not)."""
    alloc, free = spans["start"].to_numpy(), spans["end"].to_numpy()
    address = spans["address"].to_numpy()
    distinct, stack_row = unique_inverse(spans["stack_id"].to_numpy())
    frames_of = {int(s): stacks.stack(int(s)) for s in distinct.tolist()}
    framed = [s for s in frames_of if frames_of[s]]
    entry = {s: i for i, s in enumerate(framed)}
    stack_entry = np.array([entry.get(int(s), -1) + 1 for s in distinct.tolist()],
                           dtype=np.int64)[stack_row]  # 0: no frames
    frames: dict[tuple[str, str, int], int] = {}
    lists = [[frames.setdefault(f, len(frames)) for f in frames_of[s]] for s in framed]
    names: dict[str, int] = {}
    file_of = [names.setdefault(shown_name(f[0], MAX_FRAME_TEXT), len(names)) for f in frames]
    name_of = [names.setdefault(shown_name(f[1], MAX_FRAME_TEXT), len(names)) for f in frames]
    sites: dict[str, int] = {}
    stack_site = [sites.setdefault(site_of(frames_of[s]), len(sites)) for s in framed]
    no_frames = sites.setdefault(site_of(()), len(sites))
    order = np.lexsort((address, alloc))
    columns = {
        "alloc": alloc[order] + 1,
        "life": (free - alloc)[order],
        "size": spans["size"].to_numpy()[order],
        "stack": stack_entry[order],
        "address": address[order],
        "reserved": np.asarray(reserved, dtype=np.int64),
        # the stacks: each one's length, then all their frame indices (a capture can have
        # many); each frame its file and function (indices into the names) and its line
        "stack_len": np.array([len(st) for st in lists], dtype=np.int64),
        "stack_lines": np.array([i for st in lists for i in st], dtype=np.int64),
        "stack_site": np.array(stack_site, dtype=np.int64),
        "frame_file": np.array(file_of, dtype=np.int64),
        "frame_name": np.array(name_of, dtype=np.int64),
        "frame_line": np.array([f[2] for f in frames], dtype=np.int64),
    }
    parts = _pack_parts(columns, delta=frozenset({"alloc", "reserved"}),
                        group={"address": "size"})
    return _Allocations(reserved, spans["alloc_idx"].to_numpy(), order, parts, list(names),
                        list(sites), no_frames)


#: `_Allocations` being made ahead (`ahead`), by the identity of their replay's reserved
#: bytes (the array itself, which the made part holds, so the identity stays its own).
_AHEAD: dict[int, Future[_Allocations]] = {}


def ahead(lifetimes: pl.DataFrame, n_events: int, reserved: np.ndarray,
          stacks: StackTable) -> None:
    """Start making the explorer's `_Allocations` of a replay (its lifetimes, event count
    and reserved bytes) on a thread, while its report is diagnosed (numpy's sorts and zlib
    let go of the GIL); `explorer_data` takes them when its report's timeline holds this
    very reserved array and these lifetimes."""
    if n_events == 0 or lifetimes.is_empty():
        return
    pool = ThreadPoolExecutor(1)
    _AHEAD[id(reserved)] = pool.submit(
        lambda: _allocations(FamilyTimeline.spans_of(lifetimes, n_events), reserved, stacks))
    pool.shutdown(wait=False)


def _made_ahead(made: Future[_Allocations] | None, spans: pl.DataFrame,
                reserved: np.ndarray) -> _Allocations | None:
    """What `ahead` made (`made`, taken from `_AHEAD`) when it was made of this very
    reserved array and of these spans (the same rows, by their alloc events)."""
    if made is None:
        return None
    got = made.result()
    same = got.reserved is reserved and np.array_equal(got.alloc_idx,
                                                       spans["alloc_idx"].to_numpy())
    return got if same else None


def explorer_data(r: DeviceReport, colours: Mapping[str, str], unknown_colour: str,
                  origin: int | None) -> dict[str, Any] | None:
    """What the page's explorer needs for one device (without a recorded history, the
    snapshot's own blocks: `_snapshot_spans`): the lifetimes (alloc, free, size, stack,
    address, family, evidence), the per-event reserved bytes and clock, the distinct stacks
    (lines) and their sites, all packed; the distinct frame lines and site names, gzipped;
    the families with their colours. `origin` is where the page's time axis counts from
    (µs). None where there is nothing to explore."""
    t = r.timeline
    ft = t.families
    ahead_made = _AHEAD.pop(id(t.reserved), None)  # taken even when not shown: none left
    if not r.diagnosis.history:
        spans = _snapshot_spans(r)
        if spans is None or t.stacks is None:  # (no spans without stacks: for the type)
            return None
        made = _allocations(spans, np.array([r.reserved_bytes], dtype=np.int64), t.stacks)
        events = {"n_events": 1, "moment": 0, "moment_kind": r.moment.kind,
                  "x_is_time": False, "x0": 0, "no_history": True}
        return _page_data(r, spans, made, sorted(spans["family"].unique().to_list()), {},
                          events, colours, unknown_colour)
    if ft is None or t.stacks is None or t.n_events == 0:
        return None
    lt = ft.spans  # the lifetimes the family timeline counts, from `start` to `end`
    made = _made_ahead(ahead_made, lt, t.reserved) or _allocations(lt, t.reserved, t.stacks)
    extra = _segment_columns(t.segments, t.n_events)
    if t.times_us is not None:
        extra["time"] = np.asarray(t.times_us, dtype=np.int64)
    x0 = origin if origin is not None else (int(t.times_us[0]) if t.times_us is not None
                                            else 0)
    events = {"n_events": t.n_events, "moment": r.moment.idx, "moment_kind": r.moment.kind,
              "x_is_time": t.times_us is not None, "x0": x0}
    return _page_data(r, lt, made, list(ft.families), extra, events, colours, unknown_colour)


def _page_data(r: DeviceReport, spans: pl.DataFrame, made: _Allocations, families: list[str],
               extra: dict[str, np.ndarray], events: dict[str, Any],
               colours: Mapping[str, str], unknown_colour: str) -> dict[str, Any]:
    """The explorer's data after its `events`: the allocations' columns with their families
    and evidence (and the `extra` columns: the clock, the segments), packed; the texts; the
    families' colours."""
    evidence = sorted(spans["evidence"].unique().to_list())
    columns = {
        "family": spans["family"].cast(pl.Enum(families)).to_physical().to_numpy()
        .astype(np.int64)[made.order],
        "evidence": spans["evidence"].cast(pl.Enum(evidence)).to_physical().to_numpy()
        .astype(np.int64)[made.order],
        **extra,
    }
    specs, blob = _blob(made.parts + _pack_parts(columns,
                                                 delta=frozenset({"time", "seg_open"})))
    named = [f for f in (r.diagnosis.excess_family, r.diagnosis.request_family) if f]
    return {
        **events,
        "synthetic_from": SYNTHETIC_ADDRESSES,  # addresses made up where none was recorded
        "families": families, "colours": [colours.get(f, unknown_colour) for f in families],
        "named": named, "evidence": evidence,
        # the frames' file and function names and the site names, a JSON list each, gzipped
        "texts": base64.b64encode(gzip.compress(json.dumps(
            {"names": made.names, "sites": made.sites}).encode(), mtime=0)).decode("ascii"),
        "no_frames_site": made.no_frames,
        "columns": specs, "packed": blob,
    }


def _snapshot_spans(r: DeviceReport) -> pl.DataFrame | None:
    """A capture without history has one moment, the snapshot: its allocated blocks are the
    allocations, live from event 0 on, so find, the sites and their stacks work on the
    blocks' own frames. None when no block carries a frame (there is nothing to find)."""
    stacks = r.timeline.stacks
    blocks = r.live_blocks.filter(pl.col("state") == ACTIVE_ALLOCATED)
    if stacks is None or blocks.is_empty() or "evidence" not in blocks.columns or not any(
            stacks.stack(int(s)) for s in blocks["stack_id"].unique().to_list()):
        return None
    return blocks.select(
        pl.lit(0, pl.Int64).alias("start"), pl.lit(1, pl.Int64).alias("end"),
        pl.col("size").cast(pl.Int64), pl.col("stack_id"), pl.col("address").cast(pl.Int64),
        pl.col("family").fill_null(UNKNOWN), pl.col("evidence").fill_null(UNKNOWN),
        pl.int_range(pl.len(), dtype=pl.Int64).alias("alloc_idx"))


def _segment_columns(segments: pl.DataFrame | None, n_events: int) -> dict[str, np.ndarray]:
    """Each segment's life for the page's allocator-state and cached-segment views: its
    address and size, the event that made it (+1: 0 is before the first event), how many
    events it lived (to the end of the trace when never freed) and, for a mapped range of
    an expandable segment, which one (+1), in the order made."""
    if segments is None or segments.is_empty():
        return {}
    seg = segments.sort("open_idx", "address")
    opened = np.maximum(seg["open_idx"].to_numpy(), -1)
    closed = np.minimum(seg["close_idx"].to_numpy(), n_events)
    # an expandable segment is mapped range by range: the page joins the contiguous ranges
    # of one virtual segment, as the replay's `segments_at` does (0: not expandable)
    vseg = (seg["vseg"].fill_null(-1).to_numpy() + 1 if "vseg" in seg.columns
            else np.zeros(seg.height, dtype=np.int64))
    vseg = np.where(seg["expandable"].fill_null(False).to_numpy(), vseg, 0)
    return {"seg_address": seg["address"].to_numpy(), "seg_size": seg["total_size"].to_numpy(),
            "seg_open": opened + 1, "seg_life": closed - opened, "seg_vseg": vseg}
