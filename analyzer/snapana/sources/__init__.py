"""Input formats. Detection is by content, never by file name: tickets rename attachments."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from snapana.capture_kinds import CaptureKind, detect
from snapana.errors import InputError
from snapana.limits import MAX_LEADING_NULS
from snapana.sources._io import check_regular, note_input, open_input, read_head

if TYPE_CHECKING:  # the model (polars) is imported by the reader that builds one
    from collections.abc import Callable

    from snapana.model import Capture, ReadProgress

    #: reads a path (reporting progress) into the common model
    Reader = Callable[[Path, ReadProgress | None], Capture]


def sniff(path: Path) -> CaptureKind:
    """The kind of an input, from its first bytes (a folder: from its marker file), by the
    rows of `capture_kinds.SOURCES`; a file no row recognises is refused, one line. Only regular
    files are opened: a FIFO or a device is refused before `open` could block on it."""
    if not os.path.lexists(path):
        raise InputError(f"{path}: no such file")
    if path.is_dir():
        from snapana.sources.parquet_dir import MARKER

        marker = path / MARKER
        if marker.is_file():
            check_regular(marker)
            note_input(path)  # nothing may be written into an input folder
            return CaptureKind.SNAPANA_EXPORT  # written by `snapana export`
        raise InputError(f"{path}: is a directory, expected a snapshot file")
    try:
        head = read_head(path, 64)
        nuls = 0
        if head and not head.strip(b"\x00"):  # NULs first (a log rotated by copytruncate)
            head, nuls = _after_leading_nuls(path)
    except OSError as exc:
        raise InputError(f"{path}: cannot read: {exc.strerror or exc}") from None
    if not head and not nuls:
        raise InputError(f"{path}: empty file")
    kind = detect(head)
    if kind is None:
        raise InputError(
            f"{path}: unrecognised format (not a torch memory snapshot pickle, profiler trace "
            "or memray capture)")
    return kind


def load(path: Path | str, progress: ReadProgress | None = None,
         kind: CaptureKind | None = None) -> Capture:
    """Read any supported artefact into the common model, by its kind's reader (a kind
    that is not a capture, a text log, is refused there saying what reads it). `kind`: the
    one `inputs.resolve` already told (None: sniffed here)."""
    path = Path(path)
    return reader(kind if kind is not None else sniff(path))(path, progress)


def reader(kind: CaptureKind) -> Reader:
    """The function its row names to read an input of this kind."""
    from importlib import import_module

    module, _, function = kind.row.reader.partition(":")
    read: Reader = getattr(import_module(module), function)
    return read


def _after_leading_nuls(path: Path) -> tuple[bytes, int]:
    """The first 64 bytes after a run of NULs (up to `MAX_LEADING_NULS`), and how many NULs
    were passed over: a log that logrotate's copytruncate cut starts with one, and is told
    by what follows it."""
    stream, raw, _ = open_input(path)
    try:
        head = stream.read(64)
        nuls = 0
        while head and not head.strip(b"\x00") and nuls < MAX_LEADING_NULS:
            nuls += len(head)
            head = stream.read(64 << 10)
        if nuls:
            head = (head.lstrip(b"\x00") + stream.read(64))[:64]
        return head, nuls
    finally:
        stream.close()
        raw.close()
