"""Read memray captures (host memory of the Python process) into the common model.

A memray `.bin` is only readable by the memray release that wrote its format: the reader
refuses any other header version. So the header is parsed here without memray (it sits, LZ4
compressed when `memray run` compressed the file, at the start), to say which release reads
the file; memray itself reads the records when the installed release matches. When it does
not, `snapana convert` run under the right release writes a version-independent Parquet that
this module loads anywhere (see `snapana.convert`).

The model gets the high-water mark: one block per aggregated allocation site alive at the
peak (memray's `get_high_watermark_allocation_records`), with its Python stack, on the host
pseudo-device -2. The RSS/heap series over time goes into `metadata['memray_snapshots']`.

Header layout (records.h `HeaderRecord`, record_writer.cpp `writeHeaderCommon`, format 12):
magic "memray\\0", int32 version, int32 python_version (PY_VERSION_HEX), bool native_traces,
uint8 file_format (0 all allocations, 1 aggregated), stats {uint64 n_allocations, n_frames,
int64 start_time_ms, end_time_ms}, command line (NUL-terminated), int32 pid, uint64 main_tid,
uint64 skipped_frames_on_main_tid, uint8 python_allocator, bool trace_python_allocators,
bool track_object_lifetimes.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from snapana.errors import InputError
from snapana.limits import MAX_BYTES, MAX_STRING
from snapana.model import (
    EVENT_SCHEMA,
    SEGMENT_SCHEMA,
    Capture,
    ReadProgress,
    StackTable,
    unsegmented_blocks,
)
from snapana.sources._io import (
    MetaError,
    check_regular,
    first_line,
    open_regular,
    read_parquet,
    sanitize,
)

HOST_DEVICE = -2
#: Seconds memray may take to read a capture, plus one per MiB of it.
MEMRAY_SECONDS = 5.0
MAGIC = b"memray\x00"
LZ4_MAGIC = b"\x04\x22\x4d\x18"
PARQUET_MAGIC = b"PAR1"
#: Key of the Parquet file metadata that holds the capture's metadata as JSON.
PARQUET_META_KEY = "snapana.memray"
PARQUET_LAYOUT = 1
#: Capture format (header version) -> memray releases that read it. Checked by writing and
#: reading captures with each release: 1.18.0 rejects format 12, 1.19.0 and 1.19.3 read it,
#: 1.20.0 writes 13 and rejects 12.
READERS = {11: "1.18.x", 12: "1.19.x", 13: "1.20.x"}
_ALLOCATORS = {1: "pymalloc", 2: "pymalloc_debug", 3: "malloc", 4: "other", 5: "mimalloc",
               6: "mimalloc_debug"}
FRAME_STRUCT = pl.Struct({"filename": pl.Utf8, "name": pl.Utf8, "line": pl.Int64})
RECORD_SCHEMA: dict[str, pl.DataType | type[pl.DataType]] = {
    "size": pl.Int64,
    "n_allocations": pl.Int64,
    "allocator": pl.Utf8,
    "tid": pl.Int64,
    "thread_name": pl.Utf8,
    "frames": pl.List(FRAME_STRUCT),
}


@dataclass
class MemrayHeader:
    """What the header says, enough to name the release that reads the file."""

    format_version: int
    compressed: bool
    python_version: str | None = None
    native_traces: bool | None = None
    file_format: str | None = None
    n_allocations: int | None = None
    n_frames: int | None = None
    start_time_ms: int | None = None
    end_time_ms: int | None = None
    command_line: str | None = None
    pid: int | None = None
    python_allocator: str | None = None

    @property
    def readers(self) -> str | None:
        return READERS.get(self.format_version)


def _lz4_length(block: bytes, i: int, nibble: int) -> tuple[int, int]:
    """An LZ4 literal or match length: the token's nibble, extended by bytes while 255."""
    length = nibble
    if nibble == 15:
        while True:
            b = block[i]
            i += 1
            length += b
            if b != 255:
                break
    return length, i


def lz4_frame_prefix(data: bytes, limit: int) -> bytes:
    """Decompress the start of an LZ4 frame (first block, up to `limit` bytes).

    Only the header is needed, and lz4 is not a dependency, so this decodes the block format
    directly: sequences of literals and (offset, length) back-references.
    """
    if len(data) < 7 or data[:4] != LZ4_MAGIC:
        raise ValueError("not an LZ4 frame")
    flg = data[4]
    pos = 6 + (8 if flg & 0x08 else 0) + (4 if flg & 0x01 else 0) + 1
    if pos + 4 > len(data):
        raise ValueError("LZ4 frame ends in its header")
    (bsize,) = struct.unpack_from("<I", data, pos)
    pos += 4
    if bsize == 0:
        return b""
    if bsize & 0x80000000:  # stored uncompressed
        return data[pos:pos + min(bsize & 0x7FFFFFFF, limit)]
    block = data[pos:pos + bsize]
    out = bytearray()
    i, n = 0, len(block)
    while i < n and len(out) < limit:
        token = block[i]
        i += 1
        lit, i = _lz4_length(block, i, token >> 4)
        out += block[i:i + lit]
        i += lit
        if i >= n:
            break
        offset = block[i] | (block[i + 1] << 8)
        i += 2
        mlen, i = _lz4_length(block, i, token & 15)
        mlen += 4
        if offset == 0 or offset > len(out):
            raise ValueError("corrupt LZ4 block")
        start = len(out) - offset
        for k in range(mlen):  # may overlap itself, so byte by byte
            out.append(out[start + k])
    return bytes(out[:limit])


def _head(path: Path, size: int = 1 << 16) -> bytes:
    try:
        with open_regular(path) as fh:
            return fh.read(size)
    except OSError as exc:
        raise InputError(f"{path}: cannot read: {exc.strerror or exc}") from None


def read_header(path: Path) -> MemrayHeader:
    """Parse the header without memray; InputError when the file is not a memray capture."""
    raw = _head(path)
    compressed = raw[:4] == LZ4_MAGIC
    if compressed:
        try:
            raw = lz4_frame_prefix(raw, 1 << 16)
        except (ValueError, IndexError):
            raise InputError(f"{path}: LZ4-compressed, but not a readable memray capture "
                             "(truncated or corrupt)") from None
    if not raw.startswith(MAGIC):
        raise InputError(f"{path}: not a memray capture (no 'memray' magic at the start)")
    if len(raw) < len(MAGIC) + 4:
        raise InputError(f"{path}: memray capture truncated inside its header")
    (version,) = struct.unpack_from("<i", raw, len(MAGIC))
    header = MemrayHeader(version, compressed)
    if version in (12, 13):  # layouts checked against captures of memray 1.19 and 1.20
        try:
            _parse_rest(raw, len(MAGIC) + 4, header)
        except (struct.error, UnicodeDecodeError, ValueError):
            pass  # the version is what matters; the rest is informative
    return header


def _parse_rest(raw: bytes, pos: int, h: MemrayHeader) -> None:
    (pyver,) = struct.unpack_from("<i", raw, pos)
    h.python_version = f"{(pyver >> 24) & 0xFF}.{(pyver >> 16) & 0xFF}.{(pyver >> 8) & 0xFF}"
    native, fmt = struct.unpack_from("<?B", raw, pos + 4)
    h.native_traces = native
    h.file_format = {0: "all_allocations", 1: "aggregated_allocations"}.get(fmt, str(fmt))
    n_alloc, n_frames, t0, t1 = struct.unpack_from("<QQqq", raw, pos + 6)
    h.n_allocations, h.n_frames, h.start_time_ms, h.end_time_ms = n_alloc, n_frames, t0, t1
    pos += 6 + 32
    end = raw.index(b"\x00", pos)
    h.command_line = raw[pos:end].decode("utf-8")
    pos = end + 1
    (h.pid,) = struct.unpack_from("<i", raw, pos)
    (alloc,) = struct.unpack_from("<B", raw, pos + 4 + 16)
    h.python_allocator = _ALLOCATORS.get(alloc, str(alloc))


def convert_hint(path: Path | str) -> str:
    """The command that turns a capture into a Parquet snapana reads with any memray."""
    p = Path(path)
    return f"snapana convert {p} -o {p.with_suffix('.parquet')}"


def incompatible_error(path: Path, header: MemrayHeader, why: str) -> InputError:
    """One line: the format, the releases that read it, and exactly what to run."""
    rel = header.readers
    pin = f"memray=={rel[:-1]}*" if rel else None
    if pin:
        return InputError(
            f"{path}: memray capture format {header.format_version} ({why}); it is read by "
            f"memray {rel}: run pip install '{pin}' && {convert_hint(path)}"
        )
    return InputError(
        f"{path}: memray capture format {header.format_version} ({why}); install the memray "
        f"release that wrote it, then run {convert_hint(path)}"
    )


def _installed_memray() -> str | None:
    try:
        from importlib.metadata import version

        return version("memray")
    except Exception:  # noqa: BLE001 - any failure means "not usable"
        return None


def release_format(release: str) -> int | None:
    """The capture format a memray release writes and reads, when this module knows it."""
    minor = ".".join(release.split(".")[:2]) + ".x"
    return next((fmt for fmt, rel in READERS.items() if rel == minor), None)


#: Run by `read_records` in a child process as `python -c _CHILD CAPTURE OUT.json`: memray's
#: native reader may crash on a corrupt capture, and must not take snapana with it. Plain
#: Python and memray only; writes {"records": columns, "meta": {...}} or {"error": text}.
_CHILD = r"""
import json, sys
path, out = sys.argv[1], sys.argv[2]
def done(doc):
    with open(out, "w") as fh:
        json.dump(doc, fh)
    sys.exit(0)
try:
    import memray
except ImportError:
    done({"error": "memray cannot be imported"})
try:
    reader = memray.FileReader(path)
    cols = {k: [] for k in ("size", "n_allocations", "allocator", "tid", "thread_name",
                            "frames")}
    for rec in reader.get_high_watermark_allocation_records(merge_threads=True):
        cols["size"].append(int(rec.size))
        cols["n_allocations"].append(int(rec.n_allocations))
        alloc = rec.allocator
        cols["allocator"].append(str(getattr(alloc, "name", alloc)).lower())
        cols["tid"].append(int(rec.tid))
        cols["thread_name"].append(str(getattr(rec, "thread_name", "") or ""))
        try:
            stack = rec.stack_trace()
        except (NotImplementedError, RuntimeError, ValueError):
            stack = []
        cols["frames"].append([[str(f), str(fn), int(ln)] for fn, f, ln in stack])
    md = reader.metadata
    snaps = list(reader.get_memory_snapshots())
    meta = {
        "peak_memory": int(md.peak_memory),
        "total_allocations": int(md.total_allocations),
        "total_frames": int(md.total_frames),
        "command_line": str(md.command_line),
        "pid": int(md.pid),
        "python_allocator": str(md.python_allocator),
        "has_native_traces": bool(md.has_native_traces),
        "trace_python_allocators": bool(md.trace_python_allocators),
        "file_format": str(getattr(md.file_format, "name", md.file_format)),
        "start_time": md.start_time.isoformat(),
        "end_time": md.end_time.isoformat(),
        "snapshots": {"time_ms": [int(s.time) for s in snaps], "rss": [int(s.rss) for s in snaps],
                      "heap": [int(s.heap) for s in snaps]},
    }
    close = getattr(reader, "close", None)
    if close is not None:
        close()
except (OSError, RuntimeError, ValueError, OverflowError) as exc:
    done({"error": str(exc)})
done({"records": cols, "meta": meta})
"""


def _check_readable(path: Path) -> MemrayHeader:
    """The header, when the installed memray reads this capture's format; InputError (saying
    what to run) otherwise."""
    header = read_header(path)
    installed = _installed_memray()
    if installed is None:
        raise incompatible_error(path, header, "memray is not installed")
    own = release_format(installed)
    if own is not None and own != header.format_version:
        raise incompatible_error(path, header, f"installed memray {installed} reads format "
                                 f"{own}")
    return header


def _memray_error(path: Path, header: MemrayHeader, text: str) -> InputError:
    if "incompatible" in text:
        return incompatible_error(path, header, f"installed memray {_installed_memray()} "
                                  "cannot read it")
    if "cannot be imported" in text:
        return incompatible_error(path, header, "memray cannot be imported")
    lines = [ln for ln in text.splitlines() if ln.strip() and "Memray ERROR" not in ln]
    first = first_line(lines[0]) if lines else "unreadable"
    return InputError(f"{path}: memray could not read the capture (truncated or corrupt?): "
                      f"{first}")


def read_records(path: Path) -> tuple[pl.DataFrame, dict[str, Any]]:
    """The high-water-mark records and metadata of a `.bin`, read by the installed memray in a
    child process under a time and memory limit (for `load` and for `snapana convert`): a
    corrupt capture that crashes memray's native reader is refused, never a crash here."""
    path = Path(path)
    check_regular(path)
    header = _check_readable(path)
    size = path.stat().st_size
    with tempfile.TemporaryDirectory(prefix="snapana-memray-") as tmp:
        out = Path(tmp) / "records.json"
        memory = (2 << 30) + 64 * size

        def limits() -> None:
            try:
                import resource

                resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
                resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
            except (ImportError, ValueError, OSError):
                pass

        seconds = MEMRAY_SECONDS + size / (1 << 20)
        try:
            proc = subprocess.run([sys.executable, "-c", _CHILD, str(path), str(out)],
                                  capture_output=True, timeout=seconds, check=False,
                                  preexec_fn=limits if os.name == "posix" else None)
        except subprocess.TimeoutExpired:
            raise InputError(f"{path}: memray did not finish reading the capture in "
                             f"{seconds:.0f} s (corrupt?)") from None
        if proc.returncode != 0 or not out.is_file():
            sig = -proc.returncode if proc.returncode < 0 else 0
            err = proc.stderr.decode("utf-8", "replace")
            if "MemoryError" in err or "bad_alloc" in err:
                raise InputError(f"{path}: reading the capture needs more memory than a "
                                 "capture of its size can (corrupt?)")
            how = f"signal {sig}" if sig else f"exit {proc.returncode}"
            raise InputError(f"{path}: memray's reader failed on the capture ({how}): "
                             "truncated or corrupt")
        try:
            doc = json.loads(out.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise InputError(f"{path}: memray's reader gave no result ({first_line(exc)})"
                             ) from None
    if "error" in doc:
        raise _memray_error(path, header, str(doc["error"]))
    records = _records_frame(path, doc.get("records") or {})
    meta = doc.get("meta") or {}
    meta = {"layout": PARQUET_LAYOUT, "memray_version": _installed_memray(),
            "header": asdict(header), **meta}
    check_meta(path, meta)
    return records, meta


def _records_frame(path: Path, cols: dict[str, list[Any]]) -> pl.DataFrame:
    """The child's columns as RECORD_SCHEMA, validated."""
    n = len(cols.get("size") or [])
    if any(len(cols.get(k) or []) != n for k in RECORD_SCHEMA):
        raise InputError(f"{path}: memray's reader gave ragged records")
    frames = [[{"filename": f, "name": fn, "line": ln} for f, fn, ln in fr]
              for fr in cols["frames"]]
    df = pl.DataFrame({**{k: cols[k] for k in RECORD_SCHEMA if k != "frames"},
                       "frames": frames}, schema=RECORD_SCHEMA) if n else \
        pl.DataFrame(schema=RECORD_SCHEMA)
    check_records(path, df)
    return df


def check_records(path: Path | str, records: pl.DataFrame) -> None:
    """Sizes and counts in [0, 2**62), their total too, lines and thread ids inside int64,
    strings bounded: what a corrupt capture or an edited Parquet can get wrong."""
    for col in ("size", "n_allocations"):
        s = records[col]
        if s.null_count() or (s.len() and (s.min() < 0 or s.max() >= MAX_BYTES)):  # type: ignore[operator]
            raise InputError(f"{path}: invalid memray records: `{col}` holds a null, negative "
                             "or out-of-range value")
    if records.height and float(records["size"].cast(pl.Float64).sum()) >= MAX_BYTES:
        raise InputError(f"{path}: invalid memray records: the sizes add up to more than "
                         "2**62 bytes")
    for col in ("allocator", "thread_name"):
        if records.height and (records[col].str.len_chars().max() or 0) > 4096:  # type: ignore[operator]
            raise InputError(f"{path}: invalid memray records: `{col}` holds an over-long "
                             "string")
    frames = records["frames"].explode().struct.unnest() if records.height else None
    if frames is not None and frames.height:
        for col in ("filename", "name"):
            if (frames[col].str.len_chars().max() or 0) > MAX_STRING:  # type: ignore[operator]
                raise InputError(f"{path}: invalid memray records: a frame `{col}` is "
                                 "over-long")


def check_meta(path: Path | str, meta: dict[str, Any]) -> None:
    """The capture's metadata: byte figures and the snapshot series are integers in range."""
    for key in ("peak_memory", "total_allocations", "total_frames"):
        v = meta.get(key)
        if v is not None and (not isinstance(v, int) or isinstance(v, bool)
                              or not 0 <= v < MAX_BYTES):
            raise InputError(f"{path}: invalid memray metadata: `{key}` is not a byte count")
    snaps = meta.get("snapshots")
    if snaps is not None:
        if not isinstance(snaps, dict):
            raise InputError(f"{path}: invalid memray metadata: `snapshots` is not a table")
        for key in ("time_ms", "rss", "heap"):
            vals = snaps.get(key, [])
            if not isinstance(vals, list) or not all(
                    isinstance(v, int) and not isinstance(v, bool) and -MAX_BYTES < v < MAX_BYTES
                    for v in vals):
                raise InputError(f"{path}: invalid memray metadata: `snapshots.{key}` holds "
                                 "a value that is not an integer in range")
    for key, v in meta.items():
        if isinstance(v, str) and len(v) > MAX_STRING:
            raise InputError(f"{path}: invalid memray metadata: `{key}` is over-long")


def from_records(path: Path | str, records: pl.DataFrame, meta: dict[str, Any]) -> Capture:
    """The Capture for a high-water mark: one live block per record on the host device."""
    try:
        return _from_records(path, records, meta)
    except MetaError as exc:
        raise InputError(f"{path}: invalid memray metadata: {exc}") from None


def _from_records(path: Path | str, records: pl.DataFrame, meta: dict[str, Any]) -> Capture:
    table = StackTable()
    live: dict[int, tuple[int, int]] = {}
    for i, (size, frames) in enumerate(records.select("size", "frames").iter_rows()):
        ids = tuple(table.frame_id((f["filename"] or "", f["name"] or "", int(f["line"] or 0)))
                    for f in frames or [] if f is not None)
        # memray aggregates by site: there is no address to keep, so number the sites
        live[i + 1] = (int(size), table.stack_id(ids))
    snaps = meta.get("snapshots") or {}
    warnings = ["memray capture: the state shown is the high-water mark of the process's "
                "heap (host memory), not the end of the run"]
    total = sum(size for size, _ in live.values())
    if meta.get("peak_memory") is not None and total != meta["peak_memory"]:
        warnings.append(f"the high-water-mark records add up to {total} bytes but memray "
                        f"reports a peak of {meta['peak_memory']}")
    return Capture(
        source="memray",
        path=str(path),
        stacks=table,
        segments=pl.DataFrame(schema=SEGMENT_SCHEMA),
        blocks=unsegmented_blocks(HOST_DEVICE, live),
        events=pl.DataFrame(schema=EVENT_SCHEMA),
        devices=[HOST_DEVICE],
        warnings=warnings,
        has_trace=False,
        has_time=False,
        metadata={
            "device_names": {HOST_DEVICE: "host process"},
            "moment": "high_water_mark",
            "memray": sanitize({k: v for k, v in meta.items() if k != "snapshots"}, "memray"),
            "memray_snapshots": {k: np.asarray(snaps.get(k, []), dtype=np.int64)
                                 for k in ("time_ms", "rss", "heap")},
            "size_rounding": 1,
        },
    )


def load_parquet(path: Path) -> Capture:
    """Load what `snapana convert` wrote (any memray, or none, installed)."""
    records, kv = read_parquet(path)
    raw = kv.get(PARQUET_META_KEY)
    if raw is None:
        raise InputError(f"{path}: a Parquet file, but not one written by snapana convert")
    try:
        meta = json.loads(raw)
    except (ValueError, RecursionError):
        raise InputError(f"{path}: snapana convert metadata is not valid JSON") from None
    if not isinstance(meta, dict):
        raise InputError(f"{path}: snapana convert metadata is not an object")
    if meta.get("layout") != PARQUET_LAYOUT:
        raise InputError(f"{path}: converted with an unknown layout {meta.get('layout')!r}; "
                         "convert it again with this snapana")
    missing = set(RECORD_SCHEMA) - set(records.columns)
    if missing:
        raise InputError(f"{path}: converted capture lacks columns {sorted(missing)}")
    try:
        records = records.select([pl.col(c).cast(t) for c, t in RECORD_SCHEMA.items()])
    except (Exception, pl.exceptions.PanicException) as exc:  # noqa: BLE001 - polars
        raise InputError(f"{path}: converted capture has columns of the wrong type: "
                         f"{first_line(exc)}") from None
    check_records(path, records)
    check_meta(path, meta)
    return from_records(path, records, meta)


def load(path: Path | str, progress: ReadProgress | None = None) -> Capture:
    """Read a memray `.bin` (with a matching memray) or its converted Parquet."""
    path = Path(path)
    if _head(path, 4) == PARQUET_MAGIC:
        return load_parquet(path)
    records, meta = read_records(path)
    return from_records(path, records, meta)
