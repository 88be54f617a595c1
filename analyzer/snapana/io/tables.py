"""The polars tables a notebook shows and an export writes, built from a Session: blocks at a
moment, families and sites at the moment of interest, stacks. One builder each, so
`a.families` in Jupyter and `families.parquet` in an export are the same table."""

from __future__ import annotations

import polars as pl

from snapana.analysis.attribution import family_label
from snapana.analysis.diagnosis.findings import DeviceReport
from snapana.analysis.replay import NEVER
from snapana.caching_allocator import ACTIVE_ALLOCATED
from snapana.session import Session

#: Replay's "never freed" sentinel, shown as null in public tables.
_IDX_COLS = ("alloc_idx", "free_req_idx", "free_done_idx")


def public_blocks(blocks: pl.DataFrame, device: int) -> pl.DataFrame:
    """A block table fit to show: device first, 'never' indices as null."""
    cols = [pl.when(pl.col(c) == NEVER).then(None).otherwise(pl.col(c)).alias(c)
            for c in _IDX_COLS if c in blocks.columns]
    return blocks.with_columns(cols).select(
        pl.lit(device, dtype=pl.Int64).alias("device"), pl.exclude("device")
    )


def families_of_blocks(blocks: pl.DataFrame) -> pl.DataFrame:
    """Bytes and blocks per family over the allocated blocks of an attributed table (what
    the report's groups count: pending-free blocks are freed tensors, not holders)."""
    held = blocks.filter(pl.col("state") == ACTIVE_ALLOCATED)
    total = int(held["size"].sum())
    out = (
        held.group_by("family")
        .agg(pl.col("size").sum().alias("bytes"), pl.len().cast(pl.Int64).alias("blocks"))
        .sort(["bytes", "family"], descending=[True, False])
    )
    return out.with_columns(
        pl.col("family").map_elements(family_label, return_dtype=pl.Utf8).alias("label"),
        (pl.col("bytes") / total if total else pl.lit(0.0)).alias("share"),
    )


def families(r: DeviceReport) -> pl.DataFrame:
    """family, bytes, blocks, label, share at the report's moment: its groups."""
    total = r.allocated_bytes
    return pl.DataFrame(
        {"family": [g.name for g in r.groups], "bytes": [g.bytes for g in r.groups],
         "blocks": [g.blocks for g in r.groups], "label": [g.label for g in r.groups],
         "share": [g.bytes / total if total else 0.0 for g in r.groups]},
        schema={"family": pl.Utf8, "bytes": pl.Int64, "blocks": pl.Int64,
                "label": pl.Utf8, "share": pl.Float64},
    )


def sites(r: DeviceReport) -> pl.DataFrame:
    """family, site, bytes, blocks, label, rule_id: the drill-down below `families`."""
    rows = [(g.name, s["site"], int(s["bytes"]), int(s["blocks"]), s["label"], s["rule_id"])
            for g in r.groups for s in g.sites]
    return pl.DataFrame(rows, orient="row", schema={
        "family": pl.Utf8, "site": pl.Utf8, "bytes": pl.Int64, "blocks": pl.Int64,
        "label": pl.Utf8, "rule_id": pl.Utf8})


def stacks(session: Session) -> pl.DataFrame:
    """stack_id, depth, site and the frames as text (innermost first, one per line)."""
    st = session.capture.stacks
    ids = list(range(len(st.stacks)))
    text = ["\n".join(f"{f}:{ln} {name}" for f, name, ln in st.stack(i)) for i in ids]
    return pl.DataFrame(
        {"stack_id": ids, "depth": [len(s) for s in st.stacks],
         "site": [session.attributor.site(i) for i in ids], "frames": text,
         "frame_ids": [list(s) for s in st.stacks]},
        schema={"stack_id": pl.Int64, "depth": pl.Int64, "site": pl.Utf8,
                "frames": pl.Utf8, "frame_ids": pl.List(pl.Int64)},
    )
