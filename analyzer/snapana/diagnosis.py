"""Findings for one device of a capture: the numbers every renderer shows, computed once.

Renderers only format a DeviceReport; every figure in it is a sum over replayed blocks, so a
test can recompute it from the model.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import polars as pl

from snapana.attribution import chunk_groups, family_label, load_rules
from snapana.attribution.assign import AnnotationWindows, Attributor
from snapana.attribution.engine import RuleSet
from snapana.knobs import (
    Knob,
    can_release,
    frameworks_in,
    knobs_for,
    transient_families,
    working_set_families,
)
from snapana.model import Capture, Frame
from snapana.replay import DeviceReplay, Moment, replay
from snapana.units import fmt_bytes
from snapana.whatif import round_request, segment_size_for, would_fit

TIMELINE_POINTS = 2000
CHUNK_MIN_BYTES = 16 << 20  # repeated blocks smaller than this are not worth calling chunks
SEGMENT_MAP_LIMIT = 60  # segments drawn per pool in the segment map
SEGMENT_MAP_TOTAL = 120  # segments drawn in all (a capture can have many private pools)
SEGMENT_BLOCK_LIMIT = 256  # ranges drawn per segment (merged beyond that, see _cap_blocks)
#: Fragmentation is the cause only when the cached-but-unallocated bytes are a real share of
#: what PyTorch reserved; below this the memory is genuinely in use (seed 000, S1 #3).
FRAGMENTATION_SHARE = 0.10
#: Memory outside PyTorch is a cause when it is at least this share of the device.
OUTSIDE_SHARE = 0.05
WHATIF_FAMILIES = 8


@dataclass
class PoolFree:
    pool: str
    stream: int
    reserved_bytes: int
    free_bytes: int
    largest_free_bytes: int


@dataclass
class Group:
    """Bytes held by one tensor family, with its sites and any chunk loops in it."""

    name: str
    bytes: int
    blocks: int
    label: str = ""
    sites: list[dict[str, Any]] = field(default_factory=list)
    chunks: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class Site:
    site: str
    bytes: int
    blocks: int
    stack: tuple[Frame, ...]
    family: str = ""


@dataclass
class Timeline:
    x: list[int]
    allocated: list[int]
    reserved: list[int]
    x_is_time: bool
    oom_x: int | None
    peak_x: int | None
    peak_bytes: int
    bands: list[dict[str, Any]]


@dataclass
class Cause:
    """One reason the allocation failed, with the numbers that show it (bytes as ints)."""

    id: str  # real_demand | fragmentation | outside_pytorch | private_pool | capacity_unknown
    holds: bool
    numbers: dict[str, Any]


@dataclass
class WhatIf:
    """The state at the moment without one family: would the request have fit?"""

    family: str
    bytes: int
    blocks: int
    fits: bool | None  # None at a peak: there is no failed request to place
    spare_bytes: int | None
    how: str
    removable: str  # "yes" (kept by the step) | "offload" (model state a knob moves) |
    # "shrink" (working set of the op in flight) | "no"


@dataclass
class Diagnosis:
    kind: str  # "oom" | "peak" | "snapshot"
    phase: str
    request_bytes: int | None
    request_rounded_bytes: int | None
    request_segment_bytes: int | None
    request_family: str | None
    request_label: str | None
    request_site: str | None
    capacity_bytes: int | None
    outside_pytorch_bytes: int | None
    causes: list[Cause]
    what_ifs: list[WhatIf]
    excess_family: str | None  # the family to take away first: see _excess
    knobs: list[Knob]
    frameworks: list[str]

    def cause(self, cause_id: str) -> Cause | None:
        return next((c for c in self.causes if c.id == cause_id), None)


@dataclass
class DeviceReport:
    """Everything a report shows about one device at its moment of interest."""

    path: str
    source: str
    device: int
    moment: Moment
    reserved_bytes: int
    allocated_bytes: int
    pending_free_bytes: int
    cached_unallocated_bytes: int
    largest_free_block_bytes: int
    pools: list[PoolFree]
    peak_allocated_bytes: int
    peak: Moment
    oom: dict[str, Any] | None
    groups: list[Group]
    by_pool_stream: list[dict[str, Any]]
    top_sites: list[Site]
    timeline: Timeline
    segment_map: list[dict[str, Any]]
    n_events: int
    warnings: list[str]
    before_recording_bytes: int
    diagnosis: Diagnosis | None = None
    device_name: str = ""  # e.g. "host process" (memray), "GPU 0" / "CPU" (profiler)
    at: str | None = None  # the moment the user asked for (--at); None: the default moment

    @property
    def total_blocks(self) -> int:
        return sum(g.blocks for g in self.groups)


def device_report(capture: Capture, dr: DeviceReplay, attributor: Attributor,
                  capacity: int | None = None, at: str | None = None) -> DeviceReport:
    moment = dr.resolve(at)
    live = dr.blocks_at(moment)
    held = attributor.attribute(live.filter(pl.col("state") == "active_allocated"))
    reserved = dr.reserved_at(moment)
    if capacity is not None:
        _check_capacity(capture, dr, moment, capacity, reserved)
    allocated = int(held["size"].sum())
    pending = int(live.filter(pl.col("state") == "active_pending_free")["size"].sum())
    free = dr.free_blocks_at(moment)
    pools = _pools(dr.segments_at(moment), free)
    oom = None
    if moment.kind == "oom" and dr.oom is not None:
        o = dr.oom
        oom = {
            "requested_bytes": o.requested_bytes,
            "device_free_bytes": o.device_free_bytes,
            "gap_bytes": None if o.device_free_bytes is None
            else o.requested_bytes - o.device_free_bytes,
            "stream": o.stream,
            "stack": capture.stacks.stack(o.stack_id),
            "event_index": o.idx,
            "count": len(dr.ooms),
        }
    warnings = list(capture.warnings)
    if dr.mismatches:
        warnings.append(
            f"replay disagrees with the final segments in {len(dr.mismatches)} place(s), "
            f"e.g. {dr.mismatches[0]}"
        )
    before = int(held.filter(pl.col("alloc_idx") < 0)["size"].sum())
    report = DeviceReport(
        path=capture.path,
        source=capture.source,
        device=dr.device,
        moment=moment,
        reserved_bytes=reserved,
        allocated_bytes=allocated,
        pending_free_bytes=pending,
        cached_unallocated_bytes=reserved - allocated,
        largest_free_block_bytes=max((p.largest_free_bytes for p in pools), default=0),
        pools=pools,
        peak_allocated_bytes=dr.peak_allocated_bytes,
        peak=dr.peak,
        oom=oom,
        groups=_groups(held),
        by_pool_stream=_by_pool_stream(held),
        top_sites=_top_sites(capture, held),
        timeline=_timeline(capture, dr, moment),
        segment_map=_segment_map(dr, moment, held),
        n_events=dr.n_events,
        warnings=warnings,
        before_recording_bytes=before,
    )
    report.at = at
    report.device_name = str(capture.metadata.get("device_names", {}).get(dr.device, ""))
    report.diagnosis = diagnose(capture, dr, attributor, report, held, capacity)
    return report


def _check_capacity(capture: Capture, dr: DeviceReplay, moment: Moment, capacity: int,
                    reserved: int) -> None:
    """A device capacity that contradicts the capture would make every "outside PyTorch"
    figure negative: refuse it rather than print it."""
    from snapana.errors import InputError

    where = f"device {dr.device} at event {moment.idx}"
    if capacity < reserved:
        raise InputError(f"capacity {fmt_bytes(capacity)} is less than the "
                         f"{fmt_bytes(reserved)} PyTorch itself reserved on {where}")
    if moment.kind == "oom" and dr.oom is not None and dr.oom.device_free_bytes is not None:
        floor = reserved + dr.oom.device_free_bytes
        if capacity < floor:
            raise InputError(f"capacity {fmt_bytes(capacity)} is less than reserved + device "
                             f"free at the OOM ({fmt_bytes(floor)}) on device {dr.device}")


def diagnose(capture: Capture, dr: DeviceReplay, attributor: Attributor, r: DeviceReport,
             held: pl.DataFrame, capacity: int | None) -> Diagnosis:
    """Why it failed, what would have made it fit, and which knobs change that."""
    moment = r.moment
    segments = dr.segments_at(moment)
    live = dr.blocks_at(moment)  # allocated and pending-free: both occupy their segment
    frameworks = sorted(frameworks_in(sorted({f[0] for f in capture.stacks.frames})))
    request = req_family = req_label = req_site = None
    phase = _dominant_phase(held)
    outside = None
    causes: list[Cause] = []
    what_ifs: list[WhatIf] = []
    excess = None
    if r.oom is not None and dr.oom is not None:
        o = dr.oom
        request = o.requested_bytes
        ctx = attributor.context(o.stack_id, "0,0", o.stream, "active_allocated", request,
                                 o.idx)
        decision = attributor.decide(o.stack_id, ctx)
        req_family, req_label, phase = decision.family, decision.label, decision.phase
        req_site = attributor.site(o.stack_id)
        device_free = o.device_free_bytes or 0
        if capacity is not None and o.device_free_bytes is not None:
            outside = capacity - r.reserved_bytes - o.device_free_bytes
        causes = _causes(r, request, device_free, capacity, outside)
        baseline = would_fit(request, device_free, segments, live, stream=o.stream)
        if baseline.fits:
            r.warnings.append(
                "the replayed state would have fit the request: device_free or the "
                "segments at the OOM are incomplete, so what-ifs are approximate"
            )
        for g in r.groups[:WHATIF_FAMILIES]:
            without = live.filter(
                ~pl.col("address").is_in(held.filter(pl.col("family") == g.name)["address"]
                                         .implode())
            )
            fit = would_fit(request, device_free, segments, without, stream=o.stream)
            what_ifs.append(WhatIf(g.name, g.bytes, g.blocks, fit.fits, fit.spare_bytes,
                                   fit.how, _removable(g.name, set(frameworks))))
        excess = _excess(what_ifs)
    else:
        for g in r.groups[:WHATIF_FAMILIES]:
            what_ifs.append(WhatIf(g.name, g.bytes, g.blocks, None, None, "peak lower by",
                                   _removable(g.name, set(frameworks))))
    order = ([excess] if excess else []) + ([req_family] if req_family else [])
    order += [w.family for w in what_ifs if w.removable != "no" and w.fits]
    order += [w.family for w in what_ifs if w.removable != "no"]
    order = list(dict.fromkeys(order))
    held_causes = [c.id for c in causes if c.holds]
    knobs = knobs_for(order, held_causes, set(frameworks), phase)
    return Diagnosis(
        kind=moment.kind, phase=phase, request_bytes=request,
        request_rounded_bytes=round_request(request) if request is not None else None,
        request_segment_bytes=segment_size_for(request) if request is not None else None,
        request_family=req_family, request_label=req_label, request_site=req_site,
        capacity_bytes=capacity, outside_pytorch_bytes=outside, causes=causes,
        what_ifs=what_ifs, excess_family=excess, knobs=knobs, frameworks=frameworks,
    )


def _removable(family: str, frameworks: set[str]) -> str:
    if family in transient_families():
        return "yes"
    if family in working_set_families():
        return "shrink"
    if family != "unknown" and can_release(family, frameworks):
        return "offload"
    return "no"


def _excess(what_ifs: list[WhatIf]) -> str | None:
    """The least invasive fix: the smallest step-transient family whose removal makes the
    request fit; model state (parameters, buffers, optimizer state) only when nothing
    transient would do and a knob of the framework in use can move it."""
    fitting = [w for w in what_ifs if w.fits and w.removable in ("yes", "offload")]
    transient = [w for w in fitting if w.removable == "yes"]
    pick = transient or fitting
    return min(pick, key=lambda w: w.bytes).family if pick else None


def _dominant_phase(held: pl.DataFrame) -> str:
    """At a peak there is no failing stack: name the phase most of the live bytes come from,
    ignoring blocks that predate recording."""
    recent = held.filter(pl.col("alloc_idx") >= 0)
    if recent.is_empty():
        return "unknown"
    by = recent.group_by("phase").agg(pl.col("size").sum()).sort("size", descending=True)
    return str(by["phase"][0])


def _causes(r: DeviceReport, request: int, device_free: int, capacity: int | None,
            outside: int | None) -> list[Cause]:
    rounded = round_request(request)
    default_free = [p for p in r.pools if p.pool == "0,0"]
    usable_free = sum(p.free_bytes for p in default_free)
    usable_largest = max((p.largest_free_bytes for p in default_free), default=0)
    other_free = sum(p.free_bytes for p in r.pools if p.pool != "0,0")
    cached = r.cached_unallocated_bytes
    share = cached / r.reserved_bytes if r.reserved_bytes else 0.0
    fits_if_compacted = rounded <= device_free + usable_free
    fragmentation = (fits_if_compacted and usable_largest < rounded
                     and share >= FRAGMENTATION_SHARE)
    causes = [
        Cause("real_demand", not fits_if_compacted or not fragmentation, {
            "requested_bytes": request, "device_free_bytes": device_free,
            "cached_unallocated_bytes": cached, "allocated_bytes": r.allocated_bytes,
            "shortfall_bytes": rounded - device_free - usable_free,
        }),
        Cause("fragmentation", fragmentation, {
            "cached_unallocated_bytes": cached, "cached_share": round(share, 4),
            "largest_free_block_bytes": usable_largest, "requested_bytes": rounded,
            "fits_if_compacted": fits_if_compacted,
        }),
        Cause("private_pool", other_free > 0 and rounded <= device_free + usable_free
              + other_free and not fits_if_compacted, {
            "private_pool_free_bytes": other_free, "default_pool_free_bytes": usable_free,
        }),
    ]
    if capacity is None or outside is None:
        causes.append(Cause("capacity_unknown", False, {}))
    else:
        causes.append(Cause("outside_pytorch", outside >= max(rounded, OUTSIDE_SHARE * capacity),
                            {"outside_pytorch_bytes": outside, "capacity_bytes": capacity,
                             "share": round(outside / capacity, 4) if capacity else 0.0}))
    return causes


def _pools(segments: pl.DataFrame, free: pl.DataFrame) -> list[PoolFree]:
    out = []
    seg = segments.group_by("pool", "stream").agg(pl.col("total_size").sum().alias("reserved"))
    fr = free.group_by("pool", "stream").agg(
        pl.col("size").sum().alias("free"), pl.col("size").max().alias("largest")
    )
    joined = seg.join(fr, on=["pool", "stream"], how="left").fill_null(0).sort("pool", "stream")
    for pool, stream, reserved, free_b, largest in joined.iter_rows():
        out.append(PoolFree(pool, int(stream), int(reserved), int(free_b), int(largest)))
    return out


def _groups(held: pl.DataFrame) -> list[Group]:
    """Families first, then their sites; chunk loops (one site, many equal blocks) named."""
    agg = (
        held.group_by("family")
        .agg(pl.col("size").sum().alias("bytes"), pl.len().alias("blocks"))
        .sort(["bytes", "family"], descending=[True, False])
    )
    groups = []
    for name, nbytes, blocks in agg.iter_rows():
        mine = held.filter(pl.col("family") == name)
        sub = (
            mine.group_by("site")
            .agg(pl.col("size").sum().alias("bytes"), pl.len().alias("blocks"),
                 pl.col("label").mode().first().alias("label"),
                 pl.col("rule_id").mode().first().alias("rule_id"))
            .sort(["bytes", "site"], descending=[True, False])
        )
        chunks = [
            {"site": g.site_key, "count": g.count, "chunk_size": g.chunk_size,
             "total": g.total, "uniform": g.uniform}
            for g in chunk_groups(
                # requested sizes: the tensor, not the allocator's rounding of it
                mine.select("site", "family", "requested_size", "alloc_idx").iter_rows(),
                min_count=2
            )
            if g.chunk_size >= CHUNK_MIN_BYTES
        ]
        groups.append(Group(str(name), int(nbytes), int(blocks), label=family_label(name),
                            sites=sub.to_dicts(), chunks=chunks))
    return groups


def _by_pool_stream(held: pl.DataFrame) -> list[dict[str, Any]]:
    return (
        held.group_by("pool", "stream")
        .agg(pl.col("size").sum().alias("bytes"), pl.len().alias("blocks"))
        .sort(["bytes", "pool", "stream"], descending=[True, False, False])
        .to_dicts()
    )


def _top_sites(capture: Capture, held: pl.DataFrame, limit: int = 15) -> list[Site]:
    agg = (
        held.group_by("site")
        .agg(
            pl.col("size").sum().alias("bytes"),
            pl.len().alias("blocks"),
            pl.col("stack_id").sort_by("size", descending=True).first().alias("stack_id"),
            pl.col("family").mode().first().alias("family"),
        )
        .sort(["bytes", "site"], descending=[True, False])
        .head(limit)
    )
    return [
        Site(site, int(b), int(n), capture.stacks.stack(int(sid)), family)
        for site, b, n, sid, family in agg.iter_rows()
    ]


def _timeline(capture: Capture, dr: DeviceReplay, moment: Moment) -> Timeline:
    n = dr.n_events
    x_is_time = capture.has_time and n > 0
    if n == 0:
        return Timeline([], [], [], False, None, None, dr.peak_allocated_bytes, [])
    keep = downsample_indices(dr.allocated, TIMELINE_POINTS)
    if x_is_time:
        times = capture.device_events(dr.device)["time_us"].fill_null(strategy="forward")
        times = times.fill_null(strategy="backward").to_numpy()
        xs = times[keep]
        x_of = (lambda i: int(times[i]) if i >= 0 else int(times[0]))  # noqa: E731
    else:
        xs = keep
        x_of = int
    windows = AnnotationWindows(capture, dr.device).windows if x_is_time else []
    bands = [{"name": name, "start": start, "end": end}
             for start, end, name in windows if end < AnnotationWindows.OPEN_END]
    oom_x = x_of(dr.oom.idx) if dr.oom is not None else None
    return Timeline(
        x=[int(v) for v in xs],
        allocated=[int(v) for v in dr.allocated[keep]],
        reserved=[int(v) for v in dr.reserved[keep]],
        x_is_time=x_is_time,
        oom_x=oom_x,
        peak_x=x_of(dr.peak.idx),
        peak_bytes=dr.peak_allocated_bytes,
        bands=bands,
    )


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


def _segment_map(dr: DeviceReplay, moment: Moment, held: pl.DataFrame) -> list[dict[str, Any]]:
    """Largest segments per pool with their blocks, to show fragmentation.

    Capped so a report stays small whatever the capture: SEGMENT_MAP_LIMIT segments per pool,
    SEGMENT_MAP_TOTAL in all, and at most SEGMENT_BLOCK_LIMIT drawn ranges per segment (see
    `_cap_blocks`)."""
    segs = dr.segments_at(moment).sort("total_size", descending=True)
    label_col = "family"
    chosen = []
    for pool in sorted(segs["pool"].unique().to_list()):
        chosen.extend(
            (pool, *row) for row in segs.filter(pl.col("pool") == pool)
            .head(SEGMENT_MAP_LIMIT).select("address", "total_size", "stream").iter_rows()
        )
    chosen = chosen[:SEGMENT_MAP_TOTAL]
    live = (
        dr.blocks_at(moment)
        .filter(pl.col("segment_address").is_in([c[1] for c in chosen]))
        .join(held.select("address", label_col), on="address", how="left")
        .sort("address")
    )
    by_seg: dict[int, list[dict[str, Any]]] = {}
    for a, s, st, lab, sa in live.select(
        "address", "size", "state", label_col, "segment_address"
    ).iter_rows():
        by_seg.setdefault(sa, []).append({"offset": a - sa, "size": s, "state": st,
                                          "label": lab or ""})
    return [
        {"pool": pool, "stream": stream, "address": address, "size": total,
         "blocks": _cap_blocks(by_seg.get(address, []), total)}
        for pool, address, total, stream in chosen
    ]


def _cap_blocks(blocks: list[dict[str, Any]], seg_size: int,
                limit: int = SEGMENT_BLOCK_LIMIT) -> list[dict[str, Any]]:
    """At most `limit` ranges for one segment's blocks (sorted by offset), bytes exact.

    Touching blocks in the same state merge first; if that is still too many, the segment is
    cut into `limit` equal slices and the blocks starting in one slice become one range, state
    ``mixed`` when they differ, with what it holds in its label."""
    if len(blocks) <= limit:
        return blocks
    runs: list[dict[str, Any]] = []
    for b in blocks:
        r = runs[-1] if runs else None
        if r is not None and r["state"] == b["state"] and r["offset"] + r["size"] == b["offset"]:
            r["size"] += b["size"]
            r["n"] += 1
            r["labels"].add(b["label"])
        else:
            runs.append({**b, "n": 1, "labels": {b["label"]}})
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
        entry = {"offset": r["offset"], "size": r["size"], "state": r["state"],
                 "label": label}
        if "by_state" in r:
            entry["label"] = f"{r['n']} blocks in this range"
            entry["by_state"] = r["by_state"]
        out.append(entry)
    return out
