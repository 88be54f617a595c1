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
from snapana.attribution.assign import Attributor
from snapana.attribution.engine import RuleSet
from snapana.model import Capture, Frame
from snapana.replay import DeviceReplay, Moment, replay

TIMELINE_POINTS = 2000
CHUNK_MIN_BYTES = 16 << 20  # repeated blocks smaller than this are not worth calling chunks
SEGMENT_MAP_LIMIT = 60  # segments drawn per pool in the segment map


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

    @property
    def total_blocks(self) -> int:
        return sum(g.blocks for g in self.groups)


def analyse(capture: Capture, device: int | None = None, rules: RuleSet | None = None
            ) -> list[DeviceReport]:
    """One DeviceReport per device of the capture (or just the one asked for)."""
    devices = capture.devices if device is None else [device]
    if device is not None and device not in capture.devices:
        from snapana.errors import InputError

        raise InputError(f"{capture.path}: no device {device} (devices: {capture.devices})")
    rules = rules or load_rules()
    return [device_report(capture, replay(capture, d), Attributor(capture, d, rules))
            for d in devices]


def device_report(capture: Capture, dr: DeviceReplay, attributor: Attributor) -> DeviceReport:
    moment = dr.moment_of_interest()
    live = dr.blocks_at(moment)
    held = attributor.attribute(live.filter(pl.col("state") == "active_allocated"))
    reserved = dr.reserved_at(moment)
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
    return DeviceReport(
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
                mine.select("site", "family", "size", "alloc_idx").iter_rows(), min_count=2
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
    bands = _annotation_bands(capture, dr.device) if x_is_time else []
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


def _annotation_bands(capture: Capture, device: int) -> list[dict[str, Any]]:
    """Pair START/END external annotations into phase bands."""
    open_: dict[str, list[int]] = {}
    bands = []
    for a in capture.annotations:
        if int(a.get("device", device) or 0) != device or a.get("time_us") is None:
            continue
        name = str(a.get("name", ""))
        if a.get("stage") == "START":
            open_.setdefault(name, []).append(int(a["time_us"]))
        elif a.get("stage") == "END" and open_.get(name):
            bands.append({"name": name, "start": open_[name].pop(), "end": int(a["time_us"])})
    return bands


def _segment_map(dr: DeviceReplay, moment: Moment, held: pl.DataFrame) -> list[dict[str, Any]]:
    """Largest segments per pool with their blocks, to show fragmentation."""
    segs = dr.segments_at(moment).sort("total_size", descending=True)
    label_col = "family"
    live = dr.blocks_at(moment).join(
        held.select("address", label_col), on="address", how="left"
    )
    out = []
    for pool in sorted(segs["pool"].unique().to_list()):
        for address, total, stream in (
            segs.filter(pl.col("pool") == pool)
            .head(SEGMENT_MAP_LIMIT)
            .select("address", "total_size", "stream")
            .iter_rows()
        ):
            blocks = live.filter(pl.col("segment_address") == address).sort("address")
            out.append({
                "pool": pool,
                "stream": stream,
                "address": address,
                "size": total,
                "blocks": [
                    {"offset": a - address, "size": s, "state": st, "label": lab or ""}
                    for a, s, st, lab in blocks.select(
                        "address", "size", "state", label_col
                    ).iter_rows()
                ],
            })
    return out
