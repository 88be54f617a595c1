"""Read a directory written by `snapana export` back into the common model.

An export is a folder of Parquet tables (frames, stacks, segments, blocks, events) plus a
JSON file, `snapana-export.json`, that marks the folder and holds everything that is not a
table (devices, allocator settings, annotations, warnings, capacity, source metadata). It is
made for DuckDB/polars/pandas users, and reading it back must give the report the original
gives: so the JSON keeps Python types JSON cannot (int dict keys, tuples, numpy arrays) with
small tags, and the block table keeps the capture's own final blocks, marked `at = 'final'`.

The codec lives here, with the reader, because sources come first in the pipeline: the
writer (`snapana.export_tables`) imports it from here, never the other way round.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from snapana.errors import InputError
from snapana.model import (
    BLOCK_SCHEMA,
    EVENT_SCHEMA,
    SEGMENT_SCHEMA,
    Capture,
    ReadProgress,
    StackTable,
)

#: The file that makes a folder an export (and holds its metadata).
MARKER = "snapana-export.json"
FORMAT = "snapana-export"
VERSION = 1
TABLES = ("frames", "stacks", "segments", "blocks", "events")
#: `blocks.parquet` rows of the capture's final state; the other rows (`at =
#: 'moment_of_interest'`) are the attributed blocks live at each device's OOM or peak.
FINAL = "final"
AT_MOMENT = "moment_of_interest"


# ----- JSON codec for metadata: lossless for the Python types sources put there ---------------
def encode(value: Any) -> Any:
    """JSON-ready form of `value`; `decode` gives the value back (types included)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, np.ndarray):
        return {"$ndarray": value.tolist(), "dtype": str(value.dtype),
                "shape": list(value.shape)}
    if isinstance(value, np.generic):
        return {"$npscalar": value.item(), "dtype": str(value.dtype)}
    if isinstance(value, dict):
        if all(isinstance(k, str) and not k.startswith("$") for k in value):
            return {k: encode(v) for k, v in value.items()}
        return {"$map": [[encode(k), encode(v)] for k, v in value.items()]}
    if isinstance(value, tuple):
        return {"$tuple": [encode(v) for v in value]}
    if isinstance(value, list):
        return [encode(v) for v in value]
    if isinstance(value, (bytes, bytearray)):
        return {"$bytes": base64.b64encode(bytes(value)).decode("ascii")}
    if isinstance(value, (set, frozenset)):
        return {"$set": [encode(v) for v in value]}
    return {"$repr": repr(value)}  # not a builtin: keep what it said, not what it was


def decode(value: Any) -> Any:
    """Inverse of `encode`."""
    if isinstance(value, list):
        return [decode(v) for v in value]
    if not isinstance(value, dict):
        return value
    if "$ndarray" in value:
        arr = np.asarray(value["$ndarray"], dtype=np.dtype(value["dtype"]))
        return arr.reshape(value["shape"])
    if "$npscalar" in value:
        return np.dtype(value["dtype"]).type(value["$npscalar"])
    if "$map" in value:
        return {_hashable(decode(k)): decode(v) for k, v in value["$map"]}
    if "$tuple" in value:
        return tuple(decode(v) for v in value["$tuple"])
    if "$bytes" in value:
        return base64.b64decode(value["$bytes"])
    if "$set" in value:
        return {_hashable(decode(v)) for v in value["$set"]}
    if "$repr" in value:
        return value["$repr"]
    return {k: decode(v) for k, v in value.items()}


def _hashable(v: Any) -> Any:
    return tuple(_hashable(x) for x in v) if isinstance(v, list) else v


# ----- reader ---------------------------------------------------------------------------------
def is_export(path: Path) -> bool:
    return path.is_dir() and (path / MARKER).is_file()


def read_meta(path: Path) -> dict[str, Any]:
    """The marker file, checked: an unknown format or newer version is refused clearly."""
    try:
        meta = json.loads((path / MARKER).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(f"{path}: unreadable {MARKER}: {exc}") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise InputError(f"{path}: {MARKER} is not a snapana export marker")
    if meta.get("version") != VERSION:
        raise InputError(f"{path}: export version {meta.get('version')!r}; this snapana reads "
                         f"version {VERSION} (export it again)")
    return meta


def _table(path: Path, name: str) -> pl.DataFrame:
    f = path / f"{name}.parquet"
    try:
        return pl.read_parquet(f)
    except FileNotFoundError:
        raise InputError(f"{path}: export lacks {f.name}") from None
    except Exception as exc:  # noqa: BLE001 - polars raises several unrelated types
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise InputError(f"{f}: not a readable Parquet file: {first}") from None


def _typed(df: pl.DataFrame, schema: dict[str, Any], what: str, path: Path) -> pl.DataFrame:
    missing = [c for c in schema if c not in df.columns]
    if missing:
        raise InputError(f"{path}: {what}.parquet lacks columns {missing}")
    return df.select([pl.col(c).cast(t) for c, t in schema.items()])


def _stack_table(frames: pl.DataFrame, stacks: pl.DataFrame, path: Path) -> StackTable:
    """Rebuild the interned table with the same ids the exported tables refer to."""
    table = StackTable()
    for fid, fname, name, line in frames.sort("frame_id").select(
        "frame_id", "filename", "name", "line"
    ).iter_rows():
        if table.frame_id((fname, name, int(line))) != fid:
            raise InputError(f"{path}: frames.parquet ids are not 0..n-1 distinct frames")
    for sid, fids in stacks.sort("stack_id").select("stack_id", "frame_ids").iter_rows():
        if sid == 0:
            continue  # the empty stack is always id 0
        if table.stack_id(tuple(fids or ())) != sid:
            raise InputError(f"{path}: stacks.parquet ids are not 1..n-1 distinct stacks")
    return table


def load(path: Path | str, progress: ReadProgress | None = None) -> Capture:
    """Read an export directory into a Capture equal to the one that was exported."""
    path = Path(path)
    meta = read_meta(path)
    tables = {}
    for i, name in enumerate(TABLES):
        tables[name] = _table(path, name)
        if progress is not None:
            progress(i + 1, len(TABLES))
    blocks = tables["blocks"]
    if "at" in blocks.columns:
        blocks = blocks.filter(pl.col("at") == FINAL)
    cap = decode(meta.get("capacity_bytes") or {})
    return Capture(
        source=str(meta["source"]),
        path=str(path),
        stacks=_stack_table(tables["frames"], tables["stacks"], path),
        segments=_typed(tables["segments"], SEGMENT_SCHEMA, "segments", path),
        blocks=_typed(blocks, BLOCK_SCHEMA, "blocks", path),
        events=_typed(tables["events"], EVENT_SCHEMA, "events", path),
        devices=[int(d) for d in meta["devices"]],
        allocator_settings=decode(meta.get("allocator_settings")),
        annotations=decode(meta.get("annotations") or []),
        warnings=list(meta.get("warnings") or []),
        has_trace=bool(meta.get("has_trace")),
        has_time=bool(meta.get("has_time")),
        capacity_bytes={int(k): int(v) for k, v in cap.items()},
        metadata=decode(meta.get("metadata") or {}),
    )
