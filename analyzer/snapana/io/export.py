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

from snapana.errors import OutputError
from snapana.io import tables
from snapana.io.output import atomic_dir, check_dir_target, parquet_target
from snapana.model import Capture
from snapana.session import RulesLike, Session, open_capture, sessions
from snapana.sources.parquet_dir import AT_MOMENT, FINAL, FORMAT, MARKER, VERSION, encode
from snapana.units import encodable


def export_capture(path: Path, out_dir: Path, device: int | None = None,
                   rules: RulesLike = None, capacity: int | str | None = None) -> Path:
    """Load `path` and write its export to `out_dir` (the CLI's `snapana export`)."""
    check_dir_target(Path(out_dir), MARKER, "export")  # refuse before the work, not after
    capture = open_capture(path)
    return export(sessions(capture, device, rules=rules, capacity=capacity), Path(out_dir))


def export(analysed: list[Session], out_dir: Path) -> Path:
    """Write a capture as an export folder: every device's raw tables, and the attributed
    blocks and families of each analysed session (one per device, of one capture).
    A capacity the sessions were given is recorded for their devices."""
    out_dir = Path(out_dir)
    check_dir_target(out_dir, MARKER, "export")
    if not analysed:
        raise ValueError("export: no session to write")
    capture = analysed[0].capture
    caps = dict(capture.capacity_bytes)
    caps.update({s.device: s.capacity for s in analysed if s.capacity is not None})
    written = {
        "frames": capture.stacks.frames_df(),
        "stacks": tables.stacks(analysed[0]),
        "segments": capture.segments,
        "events": capture.events,
        "blocks": _blocks(capture, analysed),
        "families": pl.concat([tables.families(s.report).select(
            pl.lit(s.device, dtype=pl.Int64).alias("device"), pl.all()) for s in analysed],
            how="vertical"),
    }
    meta = {
        "format": FORMAT,
        "version": VERSION,
        "source": capture.source,
        "path": encodable(capture.path),  # UTF-8 JSON: a byte that is not, escaped
        "devices": list(capture.devices),
        "allocator_settings": encode(capture.allocator_settings),
        "annotations": encode(capture.annotations),
        "warnings": list(capture.warnings),
        "has_trace": capture.has_trace,
        "has_time": capture.has_time,
        "capacity_bytes": encode(caps),
        "metadata": encode(capture.metadata),
        "moments": {str(s.device): {"kind": s.moment.kind, "event_index": s.moment.idx}
                    for s in analysed},
        "tables": {name: f"{name}.parquet" for name in written},
    }
    _write_dir(out_dir, written, meta)
    return out_dir


def _blocks(capture: Capture, analysed: list[Session]) -> pl.DataFrame:
    """Final blocks (every state, attributed where live) and the blocks at each moment."""
    parts = []
    for s in sorted(analysed, key=lambda s: capture.devices.index(s.device)):  # capture order
        end = s.attributed_blocks(s.replay.final)
        attributed = end.select("address", "alloc_idx", "pool", "segment_stream", "family",
                                "label", "rule_id", "phase", "reason", "site")
        # one attribution per address: a repeated key would multiply the rows
        final = capture.device_blocks(s.device).with_row_index("row").join(
            attributed.unique("address", keep="first", maintain_order=True), on="address",
            how="left").sort("row").drop("row")
        parts.append(final.with_columns(pl.lit(FINAL).alias("at"),
                                        pl.lit("end").alias("moment"),
                                        pl.lit(s.replay.final.idx).alias("moment_idx")))
        moi = tables.public_blocks(s.attributed_blocks(s.moment), s.device)
        parts.append(moi.with_columns(pl.lit(AT_MOMENT).alias("at"),
                                      pl.lit(s.moment.kind).alias("moment"),
                                      pl.lit(s.moment.idx).alias("moment_idx")))
    # final blocks of devices not analysed still belong to the capture
    done = {s.device for s in analysed}
    rest = capture.blocks.filter(~pl.col("device").is_in(list(done)))
    if not rest.is_empty():
        parts.append(rest.with_columns(pl.lit(FINAL).alias("at")))
    out = pl.concat(parts, how="diagonal_relaxed")
    first = ["at", "moment", "moment_idx", "device", "address", "size", "requested_size",
             "state", "family", "label", "site", "phase", "rule_id", "reason", "stack_id"]
    return out.select([c for c in first if c in out.columns]
                      + [c for c in out.columns if c not in first])


def _write_dir(out_dir: Path, tables: dict[str, pl.DataFrame], meta: dict[str, Any]) -> None:
    with atomic_dir(out_dir, MARKER, "export") as tmp:
        for name, df in tables.items():
            try:
                with parquet_target(tmp / f"{name}.parquet") as target:
                    df.write_parquet(target, statistics=True)
            except pl.exceptions.PolarsError as exc:  # polars wraps a failed write (a full
                # disk, a file-size limit) in its own error: the environment's, not a bug
                why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                raise OutputError(f"{out_dir}: could not write {name}.parquet ({why}): is "
                                  "the disk full?") from None
        # the marker last: a folder without it is not an export
        (tmp / MARKER).write_text(json.dumps(meta, indent=1) + "\n", encoding="utf-8")
