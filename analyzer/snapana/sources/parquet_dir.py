"""Read a directory written by `snapana export` back into the common model.

An export is a folder of Parquet tables (frames, stacks, segments, blocks, events) plus a
JSON file, `snapana-export.json`, that marks the folder and holds everything that is not a
table (devices, allocator settings, annotations, warnings, capacity, source metadata). It is
made for DuckDB/polars/pandas users, and reading it back must give the report the original
gives: so the JSON keeps Python types JSON cannot (int dict keys, tuples, numpy arrays) with
small tags, and the block table keeps the capture's own final blocks, marked `at = 'final'`.

The codec lives here, with the reader, because sources come first in the pipeline: the
writer (`snapana.io.export`) imports it from here, never the other way round.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
from pathlib import Path, PurePath
from typing import Any

import numpy as np
import polars as pl

from snapana.capture_kinds import capture_kind
from snapana.errors import InputError
from snapana.limits import (
    MAX_BYTES,
    MAX_DEVICE,
    MAX_DEVICES,
    MAX_MARKER_BYTES,
    MAX_STRING,
    MAX_TIME,
)
from snapana.model import (
    BLOCK_SCHEMA,
    EVENT_SCHEMA,
    SEGMENT_SCHEMA,
    Capture,
    ReadProgress,
    StackTable,
)
from snapana.sources._checks import first_event_outside_segments
from snapana.sources._io import (
    MetaError,
    check_regular,
    first_line,
    open_regular,
    read_parquet,
    sanitize,
)
from snapana.sources.sidecar import tensor_problem
from snapana.units import ascii_int

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


#: dtypes an encoded array may have (anything else is not something snapana wrote).
_DTYPES = {"int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
           "float32", "float64", "bool"}
_MAX_DECODE_DEPTH = 64


class CodecError(ValueError):
    """A tagged value that `encode` cannot have written; the message says where."""


def decode(value: Any, where: str = "metadata", _depth: int = 0) -> Any:
    """Inverse of `encode`; CodecError for a value it cannot have written (bounded depth,
    known array dtypes, shapes that fit)."""
    if _depth > _MAX_DECODE_DEPTH:
        raise CodecError(f"{where}: nested deeper than {_MAX_DECODE_DEPTH} levels")
    d = _depth + 1
    if isinstance(value, list):
        return [decode(v, f"{where}[{i}]", d) for i, v in enumerate(value)]
    if not isinstance(value, dict):
        return value
    try:
        if "$ndarray" in value:
            dtype = value.get("dtype")
            if dtype not in _DTYPES:
                raise CodecError(f"{where}: array dtype {str(dtype)[:20]!r} is not one snapana "
                                 "writes")
            shape = value.get("shape")
            if not (isinstance(shape, list) and len(shape) <= 4 and all(
                    isinstance(n, int) and not isinstance(n, bool) and 0 <= n < 2**40
                    for n in shape)):
                raise CodecError(f"{where}: array shape is not a list of sizes")
            flat = value["$ndarray"]
            if not isinstance(flat, list) or not all(
                    isinstance(x, (int, float, bool, list)) for x in flat):
                raise CodecError(f"{where}: array values are not numbers")
            arr = np.asarray(flat, dtype=np.dtype(dtype))
            return arr.reshape(shape)
        if "$npscalar" in value:
            dtype = value.get("dtype")
            if dtype not in _DTYPES or not isinstance(value["$npscalar"], (int, float, bool)):
                raise CodecError(f"{where}: not a numpy scalar snapana writes")
            return np.dtype(dtype).type(value["$npscalar"])
        if "$map" in value:
            pairs = value["$map"]
            if not isinstance(pairs, list) or not all(
                    isinstance(p, list) and len(p) == 2 for p in pairs):
                raise CodecError(f"{where}: $map is not a list of [key, value] pairs")
            return {_hashable(decode(k, where, d), where): decode(v, f"{where}[{i}]", d)
                    for i, (k, v) in enumerate(pairs)}
        if "$tuple" in value:
            items = value["$tuple"]
            if not isinstance(items, list):
                raise CodecError(f"{where}: $tuple is not a list")
            return tuple(decode(v, f"{where}[{i}]", d) for i, v in enumerate(items))
        if "$bytes" in value:
            raw = value["$bytes"]
            if not isinstance(raw, str):
                raise CodecError(f"{where}: $bytes is not base64 text")
            return base64.b64decode(raw, validate=True)
        if "$set" in value:
            items = value["$set"]
            if not isinstance(items, list):
                raise CodecError(f"{where}: $set is not a list")
            return {_hashable(decode(v, where, d), where) for v in items}
        if "$repr" in value:
            return value["$repr"]
    except (ValueError, TypeError, OverflowError, binascii.Error) as exc:
        if isinstance(exc, CodecError):
            raise
        raise CodecError(f"{where}: {first_line(exc)}") from None
    return {k: decode(v, f"{where}.{k}", d) for k, v in value.items()}


def _hashable(v: Any, where: str = "metadata") -> Any:
    out = tuple(_hashable(x, where) for x in v) if isinstance(v, list) else v
    try:
        hash(out)
    except TypeError:
        raise CodecError(f"{where}: a key that is not hashable") from None
    return out


# ----- reader ---------------------------------------------------------------------------------


def read_meta(path: Path) -> dict[str, Any]:
    """The marker file, checked: an unknown format or newer version is refused clearly."""
    marker = path / MARKER
    try:
        st = check_regular(marker)
        if st.st_size > MAX_MARKER_BYTES:
            raise InputError(f"{path}: {MARKER} is {st.st_size:,} bytes; a marker is small")
        with open_regular(marker) as fh:
            meta = json.loads(fh.read().decode("utf-8"))
    except InputError:
        raise
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise InputError(f"{path}: unreadable {MARKER}: {first_line(exc)}") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise InputError(f"{path}: {MARKER} is not a snapana export marker")
    if meta.get("version") != VERSION:
        raise InputError(f"{path}: export version {_short(meta.get('version'))}; this snapana "
                         f"reads version {VERSION} (export it again)")
    return meta


def _short(v: Any) -> str:
    if isinstance(v, (str, int, float, bool)) or v is None:
        return repr(v)[:40]
    return f"a {type(v).__name__}"


def _table(path: Path, name: str) -> pl.DataFrame:
    f = path / f"{name}.parquet"
    if not os.path.lexists(f):
        raise InputError(f"{path}: export lacks {f.name}")
    df, _ = read_parquet(f)
    if not isinstance(df, pl.DataFrame):
        raise InputError(f"{f}: not a table")
    return df


def _typed(df: pl.DataFrame, schema: dict[str, Any], what: str, path: Path) -> pl.DataFrame:
    missing = [c for c in schema if c not in df.columns]
    if missing:
        raise InputError(f"{path}: {what}.parquet lacks columns {missing}")
    try:
        return df.select([pl.col(c).cast(t, strict=True) for c, t in schema.items()])
    except (Exception, pl.exceptions.PanicException) as exc:  # noqa: BLE001 - polars
        raise InputError(f"{path}: {what}.parquet has a column of the wrong type: "
                         f"{first_line(exc)}") from None


def _check_range(df: pl.DataFrame, col: str, lo: int, hi: int, what: str, path: Path,
                 nulls: bool = True) -> None:
    s = df[col]
    if not nulls and s.null_count():
        raise InputError(f"{path}: {what}.parquet: `{col}` holds nulls")
    bad = df.filter((pl.col(col) < lo) | (pl.col(col) >= hi))
    if bad.height:
        row = bad.row(0, named=True)
        raise InputError(f"{path}: {what}.parquet: `{col}` = {row[col]} is out of range "
                         f"[{lo}, {hi})")


def _check_strings(df: pl.DataFrame, cols: tuple[str, ...], what: str, path: Path,
                   limit: int = MAX_STRING) -> None:
    for col in cols:
        if df.height and (df[col].str.len_chars().max() or 0) > limit:  # type: ignore[operator]
            raise InputError(f"{path}: {what}.parquet: `{col}` holds an over-long string")


def _check_totals(df: pl.DataFrame, col: str, what: str, path: Path) -> None:
    """The bytes of one device add up to less than 2**62: every sum downstream fits int64."""
    if not df.height:
        return
    over = df.group_by("device").agg(pl.col(col).cast(pl.Float64).sum().alias("t")) \
        .filter(pl.col("t") >= float(MAX_BYTES)).sort("device")  # the first device named
    if over.height:
        raise InputError(f"{path}: {what}.parquet: the `{col}` of device {over['device'][0]} "
                         "add up to more than 2**62 bytes")


#: Device numbers any source writes: -2 (host), -1 (CPU), accelerators, and
#: type * 1000 + id for a profiler trace where two device kinds share an id.
_DEVICE_RANGE = (-2, 256 * 1000 + MAX_DEVICE)


def _check_tables(segments: pl.DataFrame, blocks: pl.DataFrame, events: pl.DataFrame,
                  n_stacks: int, path: Path) -> None:
    """Ranges the pipeline relies on: byte counts in [0, 2**62) and their per-device sums
    too, addresses non-negative, times finite, stack ids that exist, devices in range."""
    lo_dev, hi_dev = _DEVICE_RANGE
    for df, what in ((segments, "segments"), (blocks, "blocks"), (events, "events")):
        _check_range(df, "device", lo_dev, hi_dev, what, path, nulls=False)
    _check_range(segments, "address", 0, 2**63 - 1, "segments", path, nulls=False)
    _check_range(segments, "total_size", 0, MAX_BYTES, "segments", path, nulls=False)
    _check_range(segments, "stream", -(2**63), 2**63 - 1, "segments", path, nulls=False)
    _check_totals(segments, "total_size", "segments", path)
    _check_strings(segments, ("pool", "segment_type"), "segments", path, 256)
    _check_range(blocks, "address", 0, 2**63 - 1, "blocks", path, nulls=False)
    _check_range(blocks, "size", 0, MAX_BYTES, "blocks", path, nulls=False)
    _check_range(blocks, "requested_size", 0, MAX_BYTES, "blocks", path, nulls=False)
    _check_range(blocks, "stack_id", 0, n_stacks, "blocks", path, nulls=False)
    _check_totals(blocks, "size", "blocks", path)
    _check_strings(blocks, ("state",), "blocks", path, 256)
    if blocks["state"].null_count() or segments["pool"].null_count():
        raise InputError(f"{path}: blocks.parquet or segments.parquet: a state or pool is null")
    _check_blocks_in_segments(blocks, segments, path)
    _check_range(events, "idx", 0, 2**62, "events", path, nulls=False)
    _check_range(events, "addr", 0, 2**63 - 1, "events", path, nulls=False)
    _check_range(events, "size", 0, MAX_BYTES, "events", path, nulls=False)
    _check_range(events, "stream", -(2**63), 2**63 - 1, "events", path, nulls=False)
    _check_range(events, "time_us", -MAX_TIME + 1, MAX_TIME, "events", path)
    _check_range(events, "stack_id", 0, n_stacks, "events", path, nulls=False)
    _check_range(events, "device_free", 0, MAX_BYTES, "events", path)
    _check_totals(events, "size", "events", path)
    _check_strings(events, ("action",), "events", path, 256)
    if events.height and events.select(pl.struct("device", "idx").is_duplicated().any()).item():
        raise InputError(f"{path}: events.parquet: an event index appears twice on a device")
    bad = first_event_outside_segments(events, segments)
    if bad is not None:
        addr = "no address" if bad["addr"] is None else f"0x{bad['addr']:x}"
        raise InputError(f"{path}: events.parquet: event {bad['idx']} of device "
                         f"{bad['device']} ({bad['action']} at {addr}) lies outside every "
                         "segment")


def _check_blocks_in_segments(blocks: pl.DataFrame, segments: pl.DataFrame,
                              path: Path) -> None:
    """Final blocks are distinct, and a block that names its segment lies inside it, with
    the blocks of one segment adding up to no more than the segment."""
    if blocks.height and blocks.select(
            pl.struct("device", "address").is_duplicated().any()).item():
        raise InputError(f"{path}: blocks.parquet: a block address appears twice on a device")
    if segments.height and segments.select(
            pl.struct("device", "address").is_duplicated().any()).item():
        raise InputError(f"{path}: segments.parquet: a segment address appears twice")
    placed = blocks.filter(pl.col("segment_address").is_not_null())
    if not placed.height:
        return
    joined = placed.join(segments.select("device", pl.col("address").alias("segment_address"),
                                         "total_size"),
                         on=["device", "segment_address"], how="left")
    outside = joined.filter(pl.col("total_size").is_null()
                            | (pl.col("address") < pl.col("segment_address"))
                            | (pl.col("address") + pl.col("size")
                               > pl.col("segment_address") + pl.col("total_size")))
    if outside.height:
        row = outside.row(0, named=True)
        raise InputError(f"{path}: blocks.parquet: block 0x{row['address']:x} lies outside "
                         "its segment (or names a segment segments.parquet lacks)")
    over = joined.group_by("device", "segment_address").agg(
        pl.col("size").sum().alias("used"), pl.col("total_size").first()) \
        .filter(pl.col("used") > pl.col("total_size")).sort("device", "segment_address")
    if over.height:
        raise InputError(f"{path}: blocks.parquet: the blocks of segment "
                         f"0x{over['segment_address'][0]:x} add up to more than the segment")


def _stack_table(frames: pl.DataFrame, stacks: pl.DataFrame, path: Path) -> StackTable:
    """Rebuild the interned table with the same ids the exported tables refer to."""
    frames = _typed(frames, {"frame_id": pl.Int64, "filename": pl.Utf8, "name": pl.Utf8,
                             "line": pl.Int64}, "frames", path)
    stacks = _typed(stacks, {"stack_id": pl.Int64, "frame_ids": pl.List(pl.Int64)}, "stacks",
                    path)
    _check_strings(frames, ("filename", "name"), "frames", path)
    table = StackTable()
    for fid, fname, name, line in frames.sort("frame_id").iter_rows():
        if table.frame_id((fname or "", name or "", int(line or 0))) != fid:
            raise InputError(f"{path}: frames.parquet ids are not 0..n-1 distinct frames")
    n_frames = len(table.frames)
    for sid, fids in stacks.sort("stack_id").iter_rows():
        if sid == 0:
            continue  # the empty stack is always id 0
        ids = tuple(fids or ())
        if any(f is None or not 0 <= f < n_frames for f in ids):
            raise InputError(f"{path}: stacks.parquet: stack {sid} refers to a frame that "
                             "frames.parquet does not have")
        if table.stack_id(ids) != sid:
            raise InputError(f"{path}: stacks.parquet ids are not 1..n-1 distinct stacks")
    return table


def _int_keys(v: Any, where: str) -> dict[int, Any]:
    if not isinstance(v, dict) or not all(isinstance(k, int) and not isinstance(k, bool)
                                          for k in v):
        raise CodecError(f"{where}: not a table keyed by device")
    return v


def _int_array(v: Any, where: str, nullable: bool = False) -> None:
    if v is None and nullable:
        return
    if not isinstance(v, np.ndarray) or v.dtype.kind not in "iu" or v.ndim != 1:
        raise CodecError(f"{where}: not an integer series")


def _check_metadata(md: Any) -> dict[str, Any]:
    """The metadata keys later stages read, of the types the sources write."""
    if not isinstance(md, dict):
        raise CodecError("metadata: not an object")
    if "reserved_timeline" in md:
        for dev, series in _int_keys(md["reserved_timeline"], "metadata.reserved_timeline") \
                .items():
            _int_array(series, f"metadata.reserved_timeline[{dev}]")
    if "kineto_totals" in md:
        for dev, totals in _int_keys(md["kineto_totals"], "metadata.kineto_totals").items():
            if not isinstance(totals, dict):
                raise CodecError(f"metadata.kineto_totals[{dev}]: not an object")
            for k, series in totals.items():
                _int_array(series, f"metadata.kineto_totals[{dev}].{k}", nullable=True)
    if "device_names" in md:
        names = _int_keys(md["device_names"], "metadata.device_names")
        if not all(isinstance(n, str) for n in names.values()):
            raise CodecError("metadata.device_names: a name that is not a string")
    if "memray_snapshots" in md:
        snaps = md["memray_snapshots"]
        if not isinstance(snaps, dict):
            raise CodecError("metadata.memray_snapshots: not an object")
        for k, series in snaps.items():
            _int_array(series, f"metadata.memray_snapshots.{k}")
    if "inventory" in md:
        for dev, tensors in _int_keys(md["inventory"], "metadata.inventory").items():
            if not isinstance(tensors, list):
                raise CodecError(f"metadata.inventory[{dev}]: not a list of tensor records")
            for i, t in enumerate(tensors):
                problem = tensor_problem(t)
                if problem:
                    raise CodecError(f"metadata.inventory[{dev}][{i}]: {problem}")
    for key in ("moment", "memory_timeline_layout"):
        if key in md and not isinstance(md[key], str):
            raise CodecError(f"metadata.{key}: not a string")
    return md


def _meta_fields(meta: dict[str, Any], path: Path) -> dict[str, Any]:
    """The marker's fields, decoded and checked; InputError naming the first bad one."""
    try:
        source = capture_kind(meta["source"]) if isinstance(meta.get("source"), str) else None
        if source is None:
            raise CodecError("source: not the kind of a capture")
        devices = meta.get("devices")
        lo, hi = _DEVICE_RANGE
        if not isinstance(devices, list) or not 0 < len(devices) <= MAX_DEVICES or not all(
                isinstance(d, int) and not isinstance(d, bool) and lo <= d < hi
                for d in devices) or len(set(devices)) != len(devices):
            raise CodecError(f"devices: not a list of 1 to {MAX_DEVICES} distinct device "
                             "numbers")
        cap = decode(meta.get("capacity_bytes") or {}, "capacity_bytes")
        if not isinstance(cap, dict) or not all(
                _device_key(k) is not None and isinstance(v, int) and not isinstance(v, bool)
                and 0 < v < MAX_BYTES for k, v in cap.items()):
            raise CodecError("capacity_bytes: not device -> bytes")
        capacity = {_device_key(k): v for k, v in cap.items()}
        warnings = meta.get("warnings") or []
        if not isinstance(warnings, list) or not all(isinstance(w, str) and len(w) < 4096
                                                     for w in warnings):
            raise CodecError("warnings: not a list of strings")
        annotations = decode(meta.get("annotations") or [], "annotations")
        if not isinstance(annotations, list) or not all(_annotation_ok(a)
                                                        for a in annotations):
            raise CodecError("annotations: not a list of record_function annotations")
        settings = decode(meta.get("allocator_settings"), "allocator_settings")
        if settings is not None and not isinstance(settings, dict):
            raise CodecError("allocator_settings: not an object")
        if settings is not None:  # free-form, as a snapshot's: bounded, finite, inert
            try:
                settings = sanitize(settings, "allocator_settings")
            except MetaError as exc:
                raise CodecError(str(exc)) from None
        for key in ("has_trace", "has_time"):
            if not isinstance(meta.get(key, False), bool):
                raise CodecError(f"{key}: not true or false")
        metadata = _check_metadata(decode(meta.get("metadata") or {}, "metadata"))
    except CodecError as exc:
        raise InputError(f"{path}: invalid {MARKER}: {exc}") from None
    except RecursionError:
        raise InputError(f"{path}: invalid {MARKER}: nested too deep") from None
    # the file it was exported from: only its name, and only plain text (it is shown)
    origin = meta.get("path")
    origin = PurePath(origin).name if isinstance(origin, str) and len(origin) < 4096 else ""
    if not origin.isprintable():
        origin = ""
    return {"source": source, "devices": devices, "capacity_bytes": capacity,
            "origin": origin,
            "warnings": list(warnings), "annotations": annotations,
            "allocator_settings": settings, "metadata": metadata,
            "has_trace": bool(meta.get("has_trace")), "has_time": bool(meta.get("has_time"))}


def _device_key(k: Any) -> int | None:
    """A device number as a dict key (an int, or the string of one as JSON keys are)."""
    if isinstance(k, str):
        k = ascii_int(k, max_chars=8)
    if isinstance(k, int) and not isinstance(k, bool) and _DEVICE_RANGE[0] <= k < \
            _DEVICE_RANGE[1]:
        return k
    return None


def _annotation_ok(a: Any) -> bool:
    if not isinstance(a, dict):
        return False
    dev, t = a.get("device"), a.get("time_us")
    return ((dev is None or (isinstance(dev, int) and not isinstance(dev, bool)
                             and 0 <= dev < MAX_DEVICE))
            and (t is None or (isinstance(t, int) and not isinstance(t, bool)
                               and -MAX_TIME < t < MAX_TIME))
            and all(isinstance(a.get(k, ""), str) for k in ("stage", "name")))


def load(path: Path | str, progress: ReadProgress | None = None) -> Capture:
    """Read an export directory into a Capture equal to the one that was exported."""
    path = Path(path)
    meta = read_meta(path)
    fields = _meta_fields(meta, path)
    tables = {}
    for i, name in enumerate(TABLES):
        tables[name] = _table(path, name)
        if progress is not None:
            progress(i + 1, len(TABLES))
    blocks = tables["blocks"]
    if "at" in blocks.columns:
        try:
            blocks = blocks.filter(pl.col("at").cast(pl.Utf8, strict=True) == FINAL)
        except (Exception, pl.exceptions.PanicException) as exc:  # noqa: BLE001 - polars
            raise InputError(f"{path}: blocks.parquet: `at` is not text: {first_line(exc)}"
                             ) from None
    stacks = _stack_table(tables["frames"], tables["stacks"], path)
    segments = _typed(tables["segments"], SEGMENT_SCHEMA, "segments", path)
    blocks = _typed(blocks, BLOCK_SCHEMA, "blocks", path)
    events = _typed(tables["events"], EVENT_SCHEMA, "events", path)
    _check_tables(segments, blocks, events, len(stacks.stacks), path)
    return Capture(
        source=fields["source"],
        path=str(path),
        stacks=stacks,
        segments=segments,
        blocks=blocks,
        events=events,
        devices=[int(d) for d in fields["devices"]],
        allocator_settings=fields["allocator_settings"],
        annotations=fields["annotations"],
        warnings=fields["warnings"],
        has_trace=fields["has_trace"],
        # as the snapshot reader counts it: some event carries a time (not the file's word)
        has_time=fields["has_time"] and events["time_us"].null_count() < events.height,
        capacity_bytes=fields["capacity_bytes"],
        metadata=fields["metadata"],
        origin=fields["origin"],
    )
