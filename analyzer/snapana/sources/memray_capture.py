"""Read memray captures (host memory of the Python process) into the common model.

A memray `.bin` is only readable by the memray release that wrote its format: the reader
refuses any other header version. So the header is parsed here without memray (it sits, LZ4
compressed when `memray run` compressed the file, at the start), to say which release reads
the file; memray itself reads the records when the installed release matches. When it does
not, `snapana convert` run under the right release writes a version-independent Parquet that
this module loads anywhere (see `snapana.io.convert`).

The model gets the high-water mark: one block per aggregated allocation site alive at the
peak (memray's `get_high_watermark_allocation_records`), with its Python stack, on the host
pseudo-device -2. The RSS/heap series over time goes into `metadata['memray_snapshots']`.

Header layout (records.h `HeaderRecord`, record_writer.cpp `writeHeaderCommon`): magic
"memray\\0", int32 version, [format >= 12: int32 python_version (PY_VERSION_HEX)], bool
native_traces, uint8 file_format (0 all allocations, 1 aggregated), stats {uint64
n_allocations, n_frames, int64 start_time_ms, end_time_ms}, command line (NUL-terminated),
int32 pid, uint64 main_tid, uint64 skipped_frames_on_main_tid, uint8 python_allocator,
[format >= 11: bool trace_python_allocators], [format >= 12: bool track_object_lifetimes].
"""

from __future__ import annotations

import functools
import json
import os
import re
import shlex
import signal
import struct
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from snapana.capture_kinds import CaptureKind
from snapana.children import DIE_WITH_PARENT, child_env
from snapana.errors import InputError
from snapana.limits import (
    MAX_BYTES,
    MAX_STRING,
    memray_cpu_seconds,
    memray_read_seconds,
    memray_stall_seconds,
)
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
MAGIC = b"memray\x00"
LZ4_MAGIC = b"\x04\x22\x4d\x18"
PARQUET_MAGIC = b"PAR1"
#: Key of the Parquet file metadata that holds the capture's metadata as JSON.
PARQUET_META_KEY = "snapana.memray"
PARQUET_LAYOUT = 1
#: Capture format (header version) -> the first and last memray release that writes and reads
#: it. memray's reader accepts only its own `CURRENT_HEADER_VERSION` (record_reader.cpp
#: `readHeader`); the values are that constant in records.h at each release tag.
FORMAT_RELEASES: dict[int, tuple[str, str]] = {
    6: ("1.0.0", "1.0.3"), 7: ("1.1.0", "1.1.0"), 8: ("1.2.0", "1.3.1"),
    9: ("1.4.0", "1.6.0"), 10: ("1.7.0", "1.10.0"), 11: ("1.11.0", "1.18.0"),
    12: ("1.19.0", "1.19.3"), 13: ("1.20.0", "1.20.0"),
}
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
        """The memray releases that read this capture, e.g. "1.11.0 to 1.18.0"."""
        span = FORMAT_RELEASES.get(self.format_version)
        if span is None:
            return None
        return span[0] if span[0] == span[1] else f"{span[0]} to {span[1]}"

    @property
    def pin(self) -> str | None:
        """The newest release that reads this capture, as a pip requirement."""
        span = FORMAT_RELEASES.get(self.format_version)
        return f"memray=={span[1]}" if span else None


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
    if 10 <= version <= 13:  # layouts checked against captures of memray 1.10 to 1.20
        try:
            _parse_rest(raw, len(MAGIC) + 4, header)
        except (struct.error, UnicodeDecodeError, ValueError):
            pass  # the version is what matters; the rest is informative
    return header


def _parse_rest(raw: bytes, pos: int, h: MemrayHeader) -> None:
    if h.format_version >= 12:
        (pyver,) = struct.unpack_from("<i", raw, pos)
        h.python_version = (f"{(pyver >> 24) & 0xFF}.{(pyver >> 16) & 0xFF}."
                            f"{(pyver >> 8) & 0xFF}")
        pos += 4
    native, fmt = struct.unpack_from("<?B", raw, pos)
    h.native_traces = native
    h.file_format = {0: "all_allocations", 1: "aggregated_allocations"}.get(fmt, str(fmt))
    n_alloc, n_frames, t0, t1 = struct.unpack_from("<QQqq", raw, pos + 2)
    h.n_allocations, h.n_frames, h.start_time_ms, h.end_time_ms = n_alloc, n_frames, t0, t1
    pos += 2 + 32
    end = raw.index(b"\x00", pos)
    h.command_line = raw[pos:end].decode("utf-8")
    pos = end + 1
    (h.pid,) = struct.unpack_from("<i", raw, pos)
    (alloc,) = struct.unpack_from("<B", raw, pos + 4 + 16)
    h.python_allocator = _ALLOCATORS.get(alloc, str(alloc))


def convert_hint(path: Path | str, out: Path | str | None = None) -> str:
    """The command that turns a capture into a Parquet snapana reads with any memray: the
    user's own output path when they gave one."""
    p = Path(path)
    target = Path(out) if out is not None else p.with_suffix(".parquet")
    return f"snapana convert {shlex.quote(str(p))} -o {shlex.quote(str(target))}"


def incompatible_error(path: Path, header: MemrayHeader, why: str,
                       out: Path | str | None = None) -> InputError:
    """One line: the format, the releases that read it, and exactly what to run."""
    if header.pin:
        return InputError(
            f"{path}: memray capture format {header.format_version} ({why}); it is read by "
            f"memray {header.readers}: install '{header.pin}' in a separate environment "
            f"(memray alone is enough there) and run here: {convert_hint(path, out)} "
            "--memray-python ENV/bin/python (that environment's python)"
        )
    return InputError(
        f"{path}: memray capture format {header.format_version} ({why}); no memray release "
        f"this snapana knows reads it: install the memray release that wrote it, then run "
        f"{convert_hint(path, out)}"
    )


def _installed_memray() -> str | None:
    try:
        from importlib.metadata import version

        return version("memray")
    except Exception:  # noqa: BLE001 - any failure means "not usable"
        return None


def _release_key(release: str) -> tuple[int, int, int]:
    """(major, minor, patch) of a release string such as "1.19.3" or "1.20.0rc1"."""
    nums = [int(m.group()) if (m := re.match(r"\d+", part)) else 0
            for part in release.split(".")[:3]]
    return (nums + [0, 0, 0])[0], (nums + [0, 0, 0])[1], (nums + [0, 0, 0])[2]


def release_format(release: str) -> int | None:
    """The capture format a memray release writes and reads, when this module knows it
    (None for a release newer than the table: its reader decides)."""
    key = _release_key(release)
    for fmt, (first, last) in FORMAT_RELEASES.items():
        if _release_key(first) <= key <= _release_key(last):
            return fmt
    return None


#: Run by `read_records` in a child process as `python -c _CHILD CAPTURE OUT.json`: memray's
#: native reader may crash on a corrupt capture, and must not take snapana with it. Plain
#: Python and memray only (it may run under another interpreter, the one where the release
#: that reads the capture is installed); writes {"records": columns, "meta": {...}} or
#: {"error": text, "version": memray's}. Every attribute of memray's objects is read by
#: capability: releases differ (1.10's Metadata has no `trace_python_allocators` nor
#: `file_format`). Anything else that goes wrong leaves its traceback on stderr.
#: The reader child runs isolated (``python -I``): nothing from the current directory (a
#: capture's folder from a ticket may hold an ``inspect.py``), the user's ``PYTHON*``
#: variables or user site-packages is imported; the interpreter's own site-packages, where
#: its memray is installed, still are.

_CHILD = r"""
import json, sys
path, out = sys.argv[1], sys.argv[2]
def done(doc):
    with open(out, "w") as fh:
        json.dump(doc, fh)
    sys.exit(0)
try:
    import memray
except ImportError as exc:
    done({"error": "memray cannot be imported: %s" % exc, "version": None})
version = str(getattr(memray, "__version__", "") or "")
if path == "--version":
    done({"version": version})
def attr(obj, name, default=None):
    value = getattr(obj, name, default)
    return default if value is None else value
def text(value):
    return str(getattr(value, "name", value))
try:
    reader = memray.FileReader(path)
    cols = {k: [] for k in ("size", "n_allocations", "allocator", "tid", "thread_name",
                            "frames")}
    try:
        records = reader.get_high_watermark_allocation_records(merge_threads=True)
    except TypeError:  # a release whose method takes no keyword
        records = reader.get_high_watermark_allocation_records()
    for rec in records:
        cols["size"].append(int(rec.size))
        cols["n_allocations"].append(int(attr(rec, "n_allocations", 1)))
        cols["allocator"].append(text(attr(rec, "allocator", "")).lower())
        cols["tid"].append(int(attr(rec, "tid", 0)))
        cols["thread_name"].append(str(attr(rec, "thread_name", "")))
        try:
            stack = rec.stack_trace()
        except (NotImplementedError, RuntimeError, ValueError):
            stack = []
        cols["frames"].append([[str(f), str(fn), int(ln)] for fn, f, ln in stack])
    md = reader.metadata
    try:
        snaps = list(reader.get_memory_snapshots())
    except (AttributeError, NotImplementedError):
        snaps = []
    meta = {"memray_version": version}
    for key in ("peak_memory", "total_allocations", "total_frames", "pid"):
        value = attr(md, key)
        if value is not None:
            meta[key] = int(value)
    for key in ("command_line", "python_allocator", "file_format"):
        value = attr(md, key)
        if value is not None:
            meta[key] = text(value)
    for key in ("has_native_traces", "trace_python_allocators"):
        value = attr(md, key)
        if value is not None:
            meta[key] = bool(value)
    for key in ("start_time", "end_time"):
        value = attr(md, key)
        if value is not None:
            meta[key] = value.isoformat() if hasattr(value, "isoformat") else str(value)
    meta["snapshots"] = {"time_ms": [int(s.time) for s in snaps],
                         "rss": [int(s.rss) for s in snaps],
                         "heap": [int(attr(s, "heap", 0)) for s in snaps]}
    close = getattr(reader, "close", None)
    if close is not None:
        close()
except (OSError, RuntimeError, ValueError, OverflowError) as exc:
    done({"error": str(exc), "version": version})
done({"records": cols, "meta": meta})
"""


def _installed_release(python: str | None) -> str | None:
    """The memray release the reader will use: this interpreter's (from its metadata, no
    import) or, for another interpreter, what its memray says."""
    return _installed_memray() if python is None else _release_of(python)


@functools.lru_cache(maxsize=8)
def _release_of(python: str) -> str | None:
    """What `python`'s memray says its release is (asked once per interpreter)."""
    with tempfile.TemporaryDirectory(prefix="snapana-memray-") as tmp:
        out = Path(tmp) / "version.json"
        try:
            subprocess.run([python, "-I", "-c", _CHILD, "--version", str(out)],
                           capture_output=True, timeout=120, check=False)
            doc = json.loads(out.read_text(encoding="utf-8"))
        except (OSError, ValueError, subprocess.TimeoutExpired):
            raise InputError(f"{python}: cannot run it to read memray captures") from None
    return doc.get("version") or None


def _check_readable(path: Path, python: str | None = None,
                    out: Path | str | None = None) -> MemrayHeader:
    """The header, when the reading release (this interpreter's memray, or `python`'s) reads
    this capture's format; InputError (saying what to run) otherwise."""
    header = read_header(path)
    installed = _installed_release(python)
    if installed is None:
        raise incompatible_error(path, header, "memray is not installed", out)
    own = release_format(installed)
    if own is not None and own != header.format_version:
        raise incompatible_error(path, header, f"installed memray {installed} reads format "
                                 f"{own}", out)
    return header


def _memray_error(path: Path, header: MemrayHeader, text: str, installed: str | None,
                  out: Path | str | None) -> InputError:
    if "incompatible" in text:
        return incompatible_error(path, header, f"installed memray {installed} cannot read "
                                  "it", out)
    if "cannot be imported" in text:
        return incompatible_error(path, header, "memray cannot be imported", out)
    lines = [ln for ln in text.splitlines() if ln.strip() and "Memray ERROR" not in ln]
    first = first_line(lines[0]) if lines else "unreadable"
    return InputError(f"{path}: memray {installed} could not read the capture (truncated or "
                      f"corrupt?): {first}")


def _child_failure(stderr: str) -> str:
    """What failed in the reader child, in one line: the exception its traceback ends with,
    else the last line it printed that is not memray's own log noise."""
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    for ln in reversed(lines):
        if re.match(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit)\b", ln):
            return first_line(ln)
    return first_line(lines[-1]) if lines else "no message"


def _read_position(pid: int, path: Path) -> int | None:
    """How far the child has read the capture: the furthest offset of its descriptors on the
    file (Linux /proc; memray opens it more than once); None where that cannot be seen."""
    try:
        target = str(path.resolve())
        fds = list(Path(f"/proc/{pid}/fd").iterdir())
    except OSError:
        return None
    best = None
    for fd in fds:
        try:
            if os.readlink(fd) != target:
                continue
            info = (Path(f"/proc/{pid}/fdinfo") / fd.name).read_text()
        except (OSError, ValueError):
            continue
        for line in info.splitlines():
            if line.startswith("pos:"):
                pos = int(line.split()[1])
                best = pos if best is None else max(best, pos)
    return best


def _run_reader(cmd: list[str], path: Path, size: int, progress: ReadProgress | None,
                preexec: Any) -> tuple[int, str]:
    """Run the reader child with hang protection proportional to the capture: at most
    `memray_cpu_seconds(size)` of CPU (RLIMIT_CPU), it must keep reading (a stall of
    `memray_stall_seconds` before the end of the file stops it), and finish within
    `memray_read_seconds(size)`. Progress is its read offset in the file."""
    limit, stall, cpu = memray_read_seconds(size), memray_stall_seconds(), memray_cpu_seconds(size)

    def bounded() -> None:
        try:
            import resource

            resource.setrlimit(resource.RLIMIT_CPU, (int(cpu) + 1, int(cpu) + 6))
        except (ImportError, ValueError, OSError):
            pass
        if preexec is not None:
            preexec()

    with tempfile.TemporaryFile() as errf:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=errf, env=child_env(),
                                preexec_fn=bounded if os.name == "posix" else None)
        start = last_move = time.monotonic()
        best = -1
        try:
            while True:
                try:
                    rc = proc.wait(timeout=0.25)
                    break
                except subprocess.TimeoutExpired:
                    pass
                now = time.monotonic()
                pos = _read_position(proc.pid, path)
                if pos is not None and pos > best:
                    best, last_move = pos, now
                    if progress is not None:
                        progress(min(pos, size), size)
                reading = pos is not None and pos < size
                if now - start > limit or (reading and now - last_move > stall):
                    proc.kill()
                    proc.wait()
                    why = (f"stopped reading at byte {best} of {size} for {stall:.0f} s"
                           if reading and now - last_move > stall else
                           f"did not finish in {limit:.0f} s, the bound for a capture of "
                           f"this size")
                    raise InputError(f"{path}: memray's reader {why} (corrupt? raise "
                                     "SNAPANA_MEMRAY_SECONDS_PER_MIB for a genuine one)")
        except BaseException:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            raise
        if rc in (-getattr(signal, "SIGXCPU", 24), -signal.SIGKILL) and \
                time.monotonic() - start >= cpu:
            raise InputError(f"{path}: memray's reader used more than {cpu:.0f} s of CPU, the "
                             "bound for a capture of this size (corrupt? raise "
                             "SNAPANA_MEMRAY_SECONDS_PER_MIB for a genuine one)")
        if progress is not None:
            progress(size, size)
        errf.seek(0)
        return rc, errf.read(1 << 20).decode("utf-8", "replace")


def read_records(path: Path, progress: ReadProgress | None = None, python: str | None = None,
                 out: Path | str | None = None) -> tuple[pl.DataFrame, dict[str, Any]]:
    """The high-water-mark records and metadata of a `.bin`, read by memray in a child
    process (this interpreter's, or `python`'s: one where the release that reads the capture
    is installed) under a memory limit and a time bound proportional to the capture (for
    `load` and for `snapana convert`, whose output `out` any advice names): a corrupt
    capture that crashes memray's native reader is refused, never a crash here."""
    path = Path(path)
    check_regular(path)
    header = _check_readable(path, python, out)
    installed = _installed_release(python)
    size = path.stat().st_size
    with tempfile.TemporaryDirectory(prefix="snapana-memray-") as tmp:
        result = Path(tmp) / "records.json"
        memory = (2 << 30) + 64 * size

        def limits() -> None:
            try:
                import resource

                resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
                resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
            except (ImportError, ValueError, OSError):
                pass

        rc, err = _run_reader([python or sys.executable, "-I", "-c",
                               DIE_WITH_PARENT + _CHILD, str(path), str(result)],
                              path, size, progress, limits if os.name == "posix" else None)
        if rc != 0 or not result.is_file():
            if "MemoryError" in err or "bad_alloc" in err:
                raise InputError(f"{path}: reading the capture needs more memory than a "
                                 "capture of its size can (corrupt?)", detail=err)
            how = f"signal {-rc}" if rc < 0 else f"exit {rc}"
            what = _child_failure(err) if rc > 0 else "it crashed (truncated or corrupt?)"
            raise InputError(f"{path}: memray {installed}'s reader failed on the capture "
                             f"({how}): {what}", detail=err)
        try:
            doc = json.loads(result.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise InputError(f"{path}: memray's reader gave no result ({first_line(exc)})"
                             ) from None
    if "error" in doc:
        raise _memray_error(path, header, str(doc["error"]), installed, out)
    records = _records_frame(path, doc.get("records") or {})
    meta = doc.get("meta") or {}
    meta = {"layout": PARQUET_LAYOUT, "memray_version": installed,
            "header": asdict(header), **meta}
    check_meta(path, meta)
    return records, meta


def _records_frame(path: Path, cols: dict[str, list[Any]]) -> pl.DataFrame:
    """The child's columns as RECORD_SCHEMA, validated."""
    n = len(cols.get("size") or [])
    if any(len(cols.get(k) or []) != n for k in RECORD_SCHEMA):
        raise InputError(f"{path}: memray's reader gave ragged records")
    for k, dtype in RECORD_SCHEMA.items():  # before polars: a value past int64 is refused
        if dtype == pl.Int64 and any(not isinstance(v, int) or not -(1 << 63) <= v < 1 << 63
                                     for v in cols[k]):
            raise InputError(f"{path}: invalid memray records: `{k}` holds a value that is not "
                             "a 64-bit integer")
    if any(not isinstance(ln, int) or not -(1 << 63) <= ln < 1 << 63
           for fr in cols["frames"] for _, _, ln in fr):
        raise InputError(f"{path}: invalid memray records: a frame's line is not a 64-bit "
                         "integer")
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
        source=CaptureKind.MEMRAY,
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
        },
    )


def load_parquet(path: Path, progress: ReadProgress | None = None) -> Capture:
    """Load what `snapana convert` wrote (any memray, or none, installed); read whole, no
    progress to report."""
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
    records, meta = read_records(path, progress)
    return from_records(path, records, meta)
