"""`snapana export`: a capture as a folder of Parquet tables, for DuckDB, polars and pandas.

The folder holds `frames`, `stacks` (with the frames as text), `segments`, `events`,
`blocks` (the capture's final blocks, `at = 'final'`, and the blocks live at each device's
moment of interest, `at = 'moment_of_interest'`, both with family, label, rule, phase,
reason and site), `families` (the report's groups) and `snapana-export.json` (the marker
and every non-table field of the capture). `snapana.load(folder)` reads it back into the same
capture, so the report made from an export is the report made from the original.

The folder is written next to its target and renamed into place: a reader never sees half an
export, and an interrupted export leaves nothing behind.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import polars as pl
from snapana.api import Analysis, RulesLike, _ruleset
from snapana.model import Capture
from snapana.output import atomic_dir, check_dir_target
from snapana.sources.parquet_dir import AT_MOMENT, FINAL, FORMAT, MARKER, VERSION, encode


def export_capture(path: Path, out_dir: Path, device: int | None = None,
                   rules: RulesLike = None, capacity: int | None = None) -> Path:
    """Load `path` and write its export to `out_dir` (the CLI's `snapana export`)."""
    from snapana import sources

    return export(sources.load(Path(path)), Path(out_dir), device=device, rules=rules,
                  capacity=capacity)


def export(capture: Capture, out_dir: Path, device: int | None = None,
           rules: RulesLike = None, capacity: int | None = None) -> Path:
    """Write `capture` as an export folder. All devices' tables are written; `device` limits
    the attributed moment-of-interest rows and families to one device. `capacity` (bytes) is
    recorded for the exported devices, as `--capacity` would give it."""
    out_dir = Path(out_dir)
    check_dir_target(out_dir, MARKER, "export")
    ruleset = _ruleset(rules)
    devices = capture.devices if device is None else [device]
    analyses = [Analysis(capture, device=d, rules=ruleset, capacity=capacity) for d in devices]
    caps = dict(capture.capacity_bytes)
    if capacity is not None:
        caps.update({d: int(capacity) for d in devices})
    tables = {
        "frames": capture.stacks.frames_df(),
        "stacks": _stacks(analyses[0]) if analyses else capture.stacks.stacks_df(),
        "segments": capture.segments,
        "events": capture.events,
        "blocks": _blocks(capture, analyses),
        "families": pl.concat([a.families.select(pl.lit(a.device, dtype=pl.Int64)
                                                 .alias("device"), pl.all())
                               for a in analyses], how="vertical") if analyses else
        pl.DataFrame(),
    }
    meta = {
        "format": FORMAT,
        "version": VERSION,
        "source": capture.source,
        "path": capture.path,
        "devices": list(capture.devices),
        "allocator_settings": encode(capture.allocator_settings),
        "annotations": encode(capture.annotations),
        "warnings": list(capture.warnings),
        "has_trace": capture.has_trace,
        "has_time": capture.has_time,
        "capacity_bytes": encode(caps),
        "metadata": encode(capture.metadata),
        "moments": {str(a.device): {"kind": a.moment.kind, "event_index": a.moment.idx}
                    for a in analyses},
        "tables": {name: f"{name}.parquet" for name in tables},
    }
    _write_dir(out_dir, tables, meta)
    return out_dir


def _stacks(a: Analysis) -> pl.DataFrame:
    return a.stacks  # stack_id, depth, site, frames (text), frame_ids


def _blocks(capture: Capture, analyses: list[Analysis]) -> pl.DataFrame:
    """Final blocks (every state, attributed where live) and the blocks at each moment."""
    parts = []
    for a in analyses:
        end = a.at(moment="end").blocks
        attributed = end.select("address", "alloc_idx", "pool", "segment_stream", "family",
                                "label", "rule_id", "phase", "reason", "site")
        final = capture.device_blocks(a.device).with_row_index("row").join(
            attributed, on="address", how="left"
        ).sort("row").drop("row")
        parts.append(final.with_columns(pl.lit(FINAL).alias("at"),
                                        pl.lit("end").alias("moment"),
                                        pl.lit(a.replay.final.idx).alias("moment_idx")))
        moi = a.blocks
        parts.append(moi.with_columns(pl.lit(AT_MOMENT).alias("at"),
                                      pl.lit(a.moment.kind).alias("moment"),
                                      pl.lit(a.moment.idx).alias("moment_idx")))
    # final blocks of devices not analysed still belong to the capture
    done = {a.device for a in analyses}
    rest = capture.blocks.filter(~pl.col("device").is_in(list(done)))
    if not rest.is_empty():
        parts.append(rest.with_columns(pl.lit(FINAL).alias("at")))
    if not parts:
        return capture.blocks.with_columns(pl.lit(FINAL).alias("at"))
    out = pl.concat(parts, how="diagonal_relaxed")
    first = ["at", "moment", "moment_idx", "device", "address", "size", "requested_size",
             "state", "family", "label", "site", "phase", "rule_id", "reason", "stack_id"]
    return out.select([c for c in first if c in out.columns]
                      + [c for c in out.columns if c not in first])


def _write_dir(out_dir: Path, tables: dict[str, pl.DataFrame], meta: dict[str, Any]) -> None:
    with atomic_dir(out_dir, MARKER, "export") as tmp:
        for name, df in tables.items():
            df.write_parquet(tmp / f"{name}.parquet", statistics=True)
        # the marker last: a folder without it is not an export
        (tmp / MARKER).write_text(json.dumps(meta, indent=1) + "\n", encoding="utf-8")
