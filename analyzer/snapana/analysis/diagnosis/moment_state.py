"""The state at the moment as a report shows it, apart from why it failed: the pools' free
bytes, the families with their sites and loops, the top sites, the bytes per pool and stream,
and the timeline of the whole trace (per family too). `diagnose.py` builds the DeviceReport
from these and the diagnosis.
"""

from __future__ import annotations

import polars as pl

from snapana.analysis.attribution import chunk_groups, family_label
from snapana.analysis.attribution.assign import AnnotationWindows, Attributor
from snapana.analysis.attribution.families import loop_families
from snapana.analysis.attribution.lifetimes import attribute_lifetimes, carry_families
from snapana.analysis.diagnosis.findings import (
    Band,
    ChunkLoop,
    Group,
    GroupSite,
    PoolFree,
    PoolStreamBytes,
    Site,
    Timeline,
)
from snapana.analysis.family_timeline import FamilyGrowth, FamilyTimeline, family_timeline
from snapana.analysis.replay import DeviceReplay, Moment
from snapana.caching_allocator import ACTIVE_ALLOCATED
from snapana.model import Capture

CHUNK_MIN_BYTES = 16 << 20  # repeated blocks smaller than this are not worth calling chunks
LOOP_SIZE_SPREAD = 16  # a loop's copies differ in size by at most this factor


def with_family(live: pl.DataFrame, held: pl.DataFrame) -> pl.DataFrame:
    """The live blocks with the family (and its evidence) of the allocated block at their
    address. One family per address (the first), so the join is one-to-one: an inconsistent
    capture can hold several live blocks at one address, and joining on a repeated key
    multiplies rows."""
    families = held.select("address", "family", "evidence").unique(
        "address", keep="first", maintain_order=True)
    return live.join(families, on="address", how="left", maintain_order="left")


def pools(segments: pl.DataFrame, free: pl.DataFrame) -> tuple[PoolFree, ...]:
    """Reserved, free and largest free block per pool and stream; they add up to the device's
    reserved and cached-but-unallocated bytes (segments are disjoint: an expandable segment
    counts its mapped ranges once)."""
    out = []
    expandable = (pl.col("expandable").any() if "expandable" in segments.columns
                  else pl.lit(False)).alias("expandable")
    seg = segments.group_by("pool", "stream").agg(pl.col("total_size").sum().alias("reserved"),
                                                  expandable)
    fr = free.group_by("pool", "stream").agg(
        pl.col("size").sum().alias("free"), pl.col("size").max().alias("largest")
    )
    joined = seg.join(fr, on=["pool", "stream"], how="left").fill_null(0).sort("pool", "stream")
    for pool, stream, reserved, exp, free_b, largest in joined.select(
            "pool", "stream", "reserved", "expandable", "free", "largest").iter_rows():
        out.append(PoolFree(pool, int(stream), int(reserved), int(free_b), int(largest),
                            bool(exp)))
    return tuple(out)


def groups(held: pl.DataFrame) -> tuple[Group, ...]:
    """Families first, then their sites; chunk loops (one site, many equal blocks) named."""
    inferred = (pl.col("evidence") == "inferred") if "evidence" in held.columns else pl.lit(False)
    agg = (
        held.group_by("family")
        .agg(pl.col("size").sum().alias("bytes"), pl.len().alias("blocks"),
             pl.col("size").filter(inferred).sum().alias("inferred"))
        .sort(["bytes", "family"], descending=[True, False])
    )
    groups = []
    for name, nbytes, blocks, inferred_bytes in agg.iter_rows():
        mine = held.filter(pl.col("family") == name)
        sub = (
            mine.group_by("site")
            .agg(pl.col("size").sum().alias("bytes"), pl.len().alias("blocks"),
                 # the most common; among equally common ones the first by name, whatever
                 # the order the source listed the blocks in
                 pl.col("label").mode().sort().first().alias("label"),
                 pl.col("rule_id").mode().sort().first().alias("rule_id"))
            .sort(["bytes", "site"], descending=[True, False])
        )
        sites = tuple(
            GroupSite(site=site, bytes=int(b), blocks=int(n), label=label, rule_id=rule_id)
            for site, b, n, label, rule_id in sub.iter_rows()
        )
        chunks = loops(str(name), mine)
        evidence = () if "evidence" not in mine.columns else tuple(
            (str(e), int(b)) for e, b in mine.group_by("evidence").agg(pl.col("size").sum())
            .sort(["size", "evidence"], descending=[True, False]).iter_rows())
        groups.append(Group(str(name), int(nbytes), int(blocks), label=family_label(name),
                            sites=sites, chunks=chunks, inferred_bytes=int(inferred_bytes or 0),
                            evidence=evidence))
    return tuple(groups)


def loops(family: str, mine: pl.DataFrame) -> tuple[ChunkLoop, ...]:
    """Repeated live blocks of one stack (same site, same loop) in a family whose repeats are
    a loop's copies (`families.loop_families`), in block bytes so they add up to the family's bytes;
    largest first. A site without a source frame (a profiler op, a timeline category, no
    frames) is not a loop, nor are blocks of wildly different sizes."""
    if family not in loop_families():
        return ()
    sites = dict(mine.select("stack_id", "site").iter_rows())
    return tuple(
        ChunkLoop(site=site, stack_id=int(str(g.site_key)), count=g.count,
                  chunk_size=g.chunk_size, total=g.total, uniform=g.uniform,
                  min_size=g.min_size, max_size=g.max_size)
        for g in chunk_groups(mine.select("stack_id", "family", "size", "alloc_idx").iter_rows(),
                              min_count=2)
        for site in [str(sites.get(g.site_key) or "")]
        if g.chunk_size >= CHUNK_MIN_BYTES and site and not site.startswith("<")
        and g.max_size <= LOOP_SIZE_SPREAD * g.min_size
    )


def by_pool_stream(held: pl.DataFrame) -> tuple[PoolStreamBytes, ...]:
    agg = (
        held.group_by("pool", "stream")
        .agg(pl.col("size").sum().alias("bytes"), pl.len().alias("blocks"))
        .sort(["bytes", "pool", "stream"], descending=[True, False, False])
    )
    return tuple(PoolStreamBytes(pool=pool, stream=stream, bytes=b, blocks=n)
                 for pool, stream, b, n in agg.iter_rows())


def top_sites(capture: Capture, held: pl.DataFrame, limit: int = 15) -> tuple[Site, ...]:
    """The sites holding the most bytes, each with its largest block's stack and its most
    common family; ties broken by the smaller stack id and the family's name, so the same
    capture always names the same ones."""
    family = (
        held.group_by("site", "family").len()
        .sort(["site", "len", "family"], descending=[False, True, False])
        .unique("site", keep="first", maintain_order=True)
        .select("site", "family")
    )
    agg = (
        held.group_by("site")
        .agg(
            pl.col("size").sum().alias("bytes"),
            pl.len().alias("blocks"),
            pl.col("stack_id").sort_by(["size", "stack_id"], descending=[True, False])
            .first().alias("stack_id"),
        )
        .join(family, on="site")
        .sort(["bytes", "site"], descending=[True, False])
        .head(limit)
    )
    return tuple(
        Site(site, int(b), int(n), capture.stacks.stack(int(sid)), family)
        for site, b, n, sid, family in agg.iter_rows()
    )


def timeline(capture: Capture, dr: DeviceReplay, peak: Moment, peak_bytes: int,
              attributor: Attributor, held: pl.DataFrame, moment: Moment,
              named: tuple[str | None, ...], lifetimes: pl.DataFrame | None) -> Timeline:
    """The live-bytes series of the whole trace, per family too (with the growth of the
    dominant families and of those the verdict `named`), the events of the OOM and the
    peak, and on a clock the annotation windows; a view downsamples it."""
    clock = (capture.device_events(dr.device)["time_us"]
             if capture.has_time and dr.n_events > 0 else None)
    if clock is not None and clock.null_count() == clock.len():
        clock = None  # no event of this device carries a time (another device's may)
    times = None
    bands: tuple[Band, ...] = ()
    if clock is not None:
        col = clock.fill_null(strategy="forward")
        times = col.fill_null(strategy="backward").to_numpy()
        bands = tuple(Band(name, start, end)
                      for start, end, name in AnnotationWindows(capture, dr.device).windows
                      if end < AnnotationWindows.OPEN_END)
    families, growth, sites = family_series(dr, attributor, lifetimes, moment, peak, named)
    return Timeline(
        allocated=dr.allocated,
        reserved=dr.reserved,
        times_us=times,
        oom_idx=dr.oom.idx if dr.oom is not None else None,
        peak_idx=peak.idx,
        peak_bytes=peak_bytes,
        bands=bands,
        families=families,
        growth=growth,
        family_sites=sites,
        stacks=capture.stacks,
        segments=None if dr.segment_intervals.is_empty() else dr.segment_intervals,
    )


def lifetimes(dr: DeviceReplay, attributor: Attributor, held: pl.DataFrame,
               moment: Moment) -> pl.DataFrame | None:
    """Every lifetime of the window with its family (None without history): those held at
    the moment take the report's, and the families inference decides among blocks held
    together (at the moment, and at the peak the report also shows) carry over to the same
    allocations and call paths (`carry_families`), so one block has one family in the
    report."""
    if not dr.n_events:
        return None
    decided = [held]
    if dr.peak.idx != moment.idx:
        decided.append(attributor.attribute(
            dr.blocks_at(dr.peak).filter(pl.col("state") == ACTIVE_ALLOCATED)))
    return carry_families(attribute_lifetimes(attributor, dr, held), decided)


def family_series(dr: DeviceReplay, attributor: Attributor, lifetimes: pl.DataFrame | None,
              moment: Moment, peak: Moment, named: tuple[str | None, ...]) -> tuple[
        FamilyTimeline | None, tuple[FamilyGrowth, ...], dict[str, str]]:
    """Each family's live bytes over the trace, the growth of the dominant and `named`
    families, and each family's top site (nothing without history)."""
    if not dr.n_events or lifetimes is None:
        return None, (), {}
    families = family_timeline(lifetimes, dr.n_events)
    growth = families.dominant(moment.idx, peak.idx, dr.allocated_at(moment),
                               tuple(f for f in named if f))
    sites = {f: attributor.site(sid) for f, sid in families.top_stacks().items()}
    return families, growth, sites
