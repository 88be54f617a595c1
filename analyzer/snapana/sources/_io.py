"""Opening inputs safely, shared by every source: regular files only (a FIFO or a device is
refused before it could block `open`), decompression bounded by a ratio and an absolute cap,
and free-form metadata copied with bounded depth and size."""

from __future__ import annotations

import errno
import gzip
import io
import math
import os
import stat
import zlib
from pathlib import Path
from typing import Any, BinaryIO, cast

try:
    import fcntl
except ImportError:  # Windows: no FIFOs to worry about
    fcntl = None  # type: ignore[assignment]

from snapana.errors import InputError
from snapana.limits import (
    EXPORT_READ_FACTOR,
    MAX_BYTES,
    MAX_META_DEPTH,
    MAX_META_NODES,
    MAX_STRING,
    RATIO_FREE,
    export_bounds,
    limit_hint,
    max_decompressed,
    max_ratio,
    memory_headroom,
)
from snapana.units import fmt_bytes, inert

GZIP_MAGIC = b"\x1f\x8b"
#: Bytes a decompressing reader asks for at once (a buffer size, not a bound).
READ_BUFFER = 1 << 20


def _kind(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISDIR(mode):
        return "a directory"
    return "not a regular file"


# ----- inputs read by this process: outputs must never replace them --------------------------

_INPUTS: set[tuple[int, ...]] = set()


def _key(st: os.stat_result) -> tuple[int, ...]:
    """An input's identity: device and inode, plus what tells a reused inode apart (a file's
    size and mtime, a folder's ctime) so a long-lived process never mistakes a new file."""
    if stat.S_ISDIR(st.st_mode):
        return (st.st_dev, st.st_ino, -1, st.st_ctime_ns)
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def note_input(path: Path, st: os.stat_result | None = None) -> None:
    """Remember a file or folder this process reads as an input (by device and inode, so a
    symlink or another spelling of the path is the same input)."""
    try:
        st = st or os.stat(path)
    except OSError:
        return
    _INPUTS.add(_key(st))


def is_input(path: Path) -> bool:
    """True when writing `path` would replace or write inside an input read by this
    process: the same file (through any link), an input folder, or a path inside one."""
    if not _INPUTS:
        return False
    p = Path(os.path.abspath(path))
    for candidate in (p, *p.parents):
        try:
            st = os.stat(candidate)
        except OSError:
            continue
        if _key(st) in _INPUTS:
            return True
    return False


def check_regular(path: Path) -> os.stat_result:
    """The file's stat when it is a regular file; InputError otherwise (missing, a FIFO, a
    device, a symlink loop), without opening it."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise InputError(f"{path}: too many levels of symbolic links") from None
        raise InputError(f"{path}: cannot read: {exc.strerror or exc}") from None
    if not stat.S_ISREG(st.st_mode):
        raise InputError(f"{path}: is {_kind(st.st_mode)}, not a regular file; copy the "
                         "data into a file first")
    return st


def open_regular(path: Path) -> BinaryIO:
    """Open a regular file for reading. Opened non-blocking and checked on the open
    descriptor, so a FIFO swapped in after a check cannot block."""
    check_regular(path)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0)
                     | getattr(os, "O_NOCTTY", 0))
    except PermissionError:
        raise InputError(f"{path}: permission denied") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot read: {exc.strerror or exc}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise InputError(f"{path}: is {_kind(st.st_mode)}, not a regular file")
        note_input(path, st)
        if fcntl is not None:
            flags = fcntl.fcntl(fd, fcntl.F_GETFL)
            fcntl.fcntl(fd, fcntl.F_SETFL, flags & ~getattr(os, "O_NONBLOCK", 0))
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_small_text(path: Path, limit: int, what: str) -> str:
    """A small UTF-8 text input named on the command line (a budget, a rule pack): a regular
    file only (a FIFO would block the read), at most `limit` bytes; `what` names it in the
    one line an InputError says."""
    try:
        with open_regular(path) as fh:
            data = fh.read(limit + 1)
    except OSError as exc:
        raise InputError(f"{path}: cannot read: {first_line(exc)}") from None
    if len(data) > limit:
        raise InputError(f"{path}: over {limit >> 20} MiB: not {what}")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise InputError(f"{path}: not UTF-8 text: not {what}") from None


def decompressed_limit(compressed_size: int) -> tuple[int, str]:
    """The most bytes a compressed file of this size may expand to, and the variable that
    raises that limit."""
    absolute = max_decompressed()
    by_ratio = max(RATIO_FREE, max_ratio() * compressed_size)
    if by_ratio < absolute:
        return by_ratio, "SNAPANA_MAX_RATIO"
    return absolute, "SNAPANA_MAX_DECOMPRESSED"


class BoundedGzip(io.RawIOBase):
    """A gzip stream that refuses to expand past its limit and reports corruption as
    InputError (one line naming the file) instead of zlib/EOF errors."""

    def __init__(self, raw: BinaryIO, path: Path, compressed_size: int) -> None:
        self._gz = gzip.GzipFile(fileobj=raw)
        self._raw = raw
        self._path = path
        self._size = compressed_size
        self.limit, self._var = decompressed_limit(compressed_size)
        self.done = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buf: Any) -> int:
        try:
            n = self._gz.readinto(buf)
        except (OSError, EOFError, zlib.error) as exc:
            raise InputError(f"{self._path}: corrupt or truncated gzip data "
                             f"({first_line(exc)})") from None
        self.done += n
        # the ratio is checked as the file is read (once past the free allowance), so a
        # bomb is stopped early, not after expanding to the whole limit
        if self.done > RATIO_FREE and self._var == "SNAPANA_MAX_RATIO" \
                and self.done > max_ratio() * max(self._raw.tell(), 1):
            raise InputError(
                f"{self._path}: decompresses more than {max_ratio()}x (past "
                f"{self.done:,} bytes from {self._raw.tell():,}); "
                f"{limit_hint('SNAPANA_MAX_RATIO')}")
        if self.done > self.limit:
            raise InputError(
                f"{self._path}: decompresses to more than {self.limit:,} bytes "
                f"({self.limit // max(self._size, 1):,}x its {self._size:,} compressed bytes); "
                f"{limit_hint(self._var)}")
        return n

    def close(self) -> None:
        self._gz.close()
        super().close()


def open_input(path: Path) -> tuple[BinaryIO, BinaryIO, bool]:
    """(stream of the content, the raw file, compressed?) for a plain or gzip file."""
    raw = open_regular(path)
    try:
        head = raw.read(2)
        raw.seek(0)
        if head == GZIP_MAGIC:
            size = os.fstat(raw.fileno()).st_size
            return io.BufferedReader(BoundedGzip(raw, path, size), READ_BUFFER), raw, True
        return raw, raw, False
    except OSError as exc:
        raw.close()
        raise InputError(f"{path}: cannot read: {exc.strerror or exc}") from None


def read_head(path: Path, n: int) -> bytes:
    """The first `n` bytes of a file's content (decompressed where it is gzip), and no more
    than that asks: a kind is told from them, and a folder of thousands of compressed ranks
    would otherwise decompress a read buffer (a MiB) of each. OSError as a read's."""
    stream, raw, compressed = open_input(path)
    try:
        if not compressed:
            return raw.read(n)
        source = cast(BoundedGzip, cast(io.BufferedReader, stream).raw)
        head = bytearray()
        while len(head) < n:
            got = source.read(n - len(head))
            if not got:
                break
            head += got
        return bytes(head)
    finally:
        stream.close()
        raw.close()


def first_line(exc: BaseException | str) -> str:
    """The first line of an error's text (library messages can run over several lines)."""
    text = str(exc) if not isinstance(exc, str) else exc
    for line in text.splitlines():
        if line.strip():
            return line.strip()[:300]
    return type(exc).__name__ if not isinstance(exc, str) else ""


# ----- free-form metadata --------------------------------------------------------------------

class MetaError(ValueError):
    """A metadata value beyond the bounds; the message names where."""


def sanitize(value: Any, where: str, max_depth: int = MAX_META_DEPTH,
             max_nodes: int = MAX_META_NODES) -> Any:
    """A copy of free-form metadata (allocator settings, user metadata, trace metadata)
    with bounded depth and size, scalars only of plain types, non-finite floats spelled as
    strings; shared sub-structures are counted each time they are reached, so a "billion
    laughs" runs into the size bound instead of the memory. MetaError when out of bounds."""
    budget = [max_nodes]

    def leaf(v: Any, at: str) -> Any:
        if v is None or isinstance(v, (bool, str)):
            if isinstance(v, str) and len(v) > MAX_STRING:
                raise MetaError(f"{at}: a string of {len(v):,} characters")
            # controls and unpaired surrogates escaped once, here, for every later stage
            return inert(v, lines=False) if isinstance(v, str) else v
        if isinstance(v, int):
            if not -MAX_BYTES * 2 <= v < MAX_BYTES * 2:
                raise MetaError(f"{at}: integer out of range")
            return v
        if isinstance(v, float):
            return v if math.isfinite(v) else repr(v)
        if isinstance(v, (bytes, bytearray)):
            if len(v) > MAX_STRING:
                raise MetaError(f"{at}: {len(v):,} bytes of binary data")
            return bytes(v)
        raise MetaError(f"{at}: unexpected {type(v).__name__}")

    def walk(v: Any, at: str, depth: int) -> Any:
        budget[0] -= 1
        if budget[0] < 0:
            raise MetaError(f"{where}: more than {max_nodes:,} values")
        if depth > max_depth:
            raise MetaError(f"{at}: nested deeper than {max_depth} levels")
        if isinstance(v, dict):
            out = {}
            for k, x in v.items():
                if not (k is None or isinstance(k, (str, int, float, bool))):
                    raise MetaError(f"{at}: a key of type {type(k).__name__}")
                k = leaf(k, at)
                out[k] = walk(x, f"{at}.{k}" if isinstance(k, str) else f"{at}[{k!r}]",
                              depth + 1)
            return out
        if isinstance(v, (list, tuple, set, frozenset)):
            items = [walk(x, f"{at}[{i}]", depth + 1) for i, x in enumerate(v)]
            if isinstance(v, tuple):
                return tuple(items)
            if isinstance(v, (set, frozenset)):
                return items  # JSON and Parquet have no sets
            return items
        return leaf(v, at)

    try:
        return walk(value, where, 0)
    except RecursionError:
        raise MetaError(f"{where}: nested too deep") from None


# ----- Parquet ---------------------------------------------------------------------------------

def _bounded(path: Path, pf: Any, size: int) -> list[str]:
    """Refuse a table whose metadata says it decodes far beyond its file (`export_bounds`):
    rows, and the pages' uncompressed bytes. The text columns, returned, are read as
    dictionaries, so that values repeated by run-length encoding are counted (in
    `_plain_text`) before they are spelled out."""
    import pyarrow as pa

    rows, decoded = export_bounds(size)
    meta = pf.metadata
    if meta.num_rows > rows:
        raise InputError(f"{path}: {meta.num_rows} rows in a {size}-byte Parquet file, more "
                         f"than an export's bound for its size ({rows}): refused")
    pages = sum(meta.row_group(g).column(c).total_uncompressed_size
                for g in range(meta.num_row_groups) for c in range(meta.num_columns))
    if pages > decoded:
        raise InputError(f"{path}: its pages decode to {pages} bytes, more than an export's "
                         f"bound for a {size}-byte file ({decoded}): refused")
    # every row is at least its columns' 8-byte values once decoded, whatever the pages say
    need = EXPORT_READ_FACTOR * max(pages, meta.num_rows * meta.num_columns * 8)
    room = memory_headroom()
    if room is not None and need > room:
        raise InputError(f"{path}: reading its {meta.num_rows:,} rows needs about "
                         f"{fmt_bytes(need)} and this process may take {fmt_bytes(room)} "
                         "more (its memory limit, or the machine's free memory): refused")

    def text(t: Any) -> bool:
        if pa.types.is_dictionary(t):
            t = t.value_type
        return bool(pa.types.is_string(t) or pa.types.is_large_string(t)
                    or pa.types.is_binary(t) or pa.types.is_large_binary(t))

    return [f.name for f in pf.schema_arrow if text(f.type)]


def _plain_text(path: Path, table: Any, texts: list[str], size: int) -> Any:
    """The dictionary-read text columns of `table` spelled out, once their spelled-out size
    (each row's value length, summed) is known to stay within the bound."""
    import pyarrow as pa
    import pyarrow.compute as pc

    _, decoded = export_bounds(size)
    total = 0
    for name in texts:
        col = table.column(name)
        for chunk in col.chunks:
            if not pa.types.is_dictionary(chunk.type):
                total += chunk.nbytes
            else:
                total += _spelled_out(path, name, chunk)
            if total > decoded:
                raise InputError(f"{path}: its text columns spell out to more than an "
                                 f"export's bound for a {size}-byte file ({decoded} bytes): "
                                 "refused")
    for name in texts:
        i = table.schema.get_field_index(name)
        field = table.schema.field(i)
        if pa.types.is_dictionary(field.type):
            table = table.set_column(i, name, pc.cast(table.column(i), field.type.value_type))
    return table


def _spelled_out(path: Path, name: str, chunk: Any) -> int:
    """Bytes a dictionary-encoded text chunk takes spelled out: each value's length times
    the rows that name it."""
    import numpy as np
    import pyarrow.compute as pc

    lengths = pc.binary_length(chunk.dictionary).fill_null(0).to_numpy(
        zero_copy_only=False).astype(np.int64)
    idx = chunk.indices.drop_null().to_numpy(zero_copy_only=False).astype(np.int64)
    if not idx.size:
        return 0
    if idx.min() < 0 or idx.max() >= lengths.size:
        raise InputError(f"{path}: `{name}` indexes past its dictionary")
    return int(np.bincount(idx, minlength=lengths.size) @ lengths)


def read_parquet(path: Path) -> tuple[Any, dict[str, str]]:
    """A Parquet file as a polars DataFrame, with its key-value metadata. Read by pyarrow,
    which reports a corrupt file as an exception: polars' reader panics on some, and a Rust
    panic prints a backtrace on stderr before Python sees it. The table goes to polars
    without schema or field metadata (read here already), whose bytes polars would decode
    as UTF-8 and panic on."""
    import polars as pl
    import pyarrow as pa
    import pyarrow.parquet as pq

    check_regular(path)
    try:
        with open_regular(path) as fh:
            pf = pq.ParquetFile(fh)
            kv = pf.metadata.metadata or {}
            size = os.fstat(fh.fileno()).st_size
            texts = _bounded(path, pf, size)
            fh.seek(0)
            table = _plain_text(path, pq.ParquetFile(fh, read_dictionary=texts).read(), texts,
                                size)
        meta = {k.decode("utf-8", "replace"): v.decode("utf-8", "replace")
                for k, v in kv.items()}
        bare = pa.schema([f.remove_metadata() for f in table.schema])
        return pl.from_arrow(pa.Table.from_arrays(table.columns, schema=bare)), meta
    except InputError:
        raise
    except (OSError, ValueError, TypeError, KeyError, IndexError, pa.ArrowException,
            pl.exceptions.PolarsError, pl.exceptions.PanicException) as exc:
        raise InputError(f"{path}: not a readable Parquet file: {first_line(exc)}") from None
