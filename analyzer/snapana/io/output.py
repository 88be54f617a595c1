"""Atomic output: a report is either complete or absent, never half-written. A file's
write is `snapana.atomic`'s (here under the same names); what is added here is the policy
of outputs as a command names them: not an input nor inside one, and folders replaced
whole."""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import BinaryIO

from snapana.atomic import (
    OutputError,
    atomic_path,
    check_file_target,
    refuse_input,
    umask,
    write_atomic,
)

__all__ = ["OutputError", "append_text", "atomic_dir", "atomic_path", "check_dir_target",
           "check_file_target", "check_folder_target", "parquet_target", "refuse_inputs",
           "write_atomic"]


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return None
    return (st.st_dev, st.st_ino)


def _above(real: Path) -> set[tuple[int, int]]:
    """The identities of the folders above a resolved path."""
    return {ident for p in real.parents if (ident := _identity(p)) is not None}


def refuse_inputs(path: Path, inputs: Iterable[Path], folder: bool = False) -> None:
    """Checked before any work (atomic_path checks again, by what was read): the output is
    not an input (the same file through any link or spelling) nor inside an input folder,
    and a folder output, which replaces what is there, holds no input."""
    real = Path(os.path.realpath(path))
    own, above = _identity(real), _above(real)
    for inp in inputs:
        ident = _identity(inp)
        if ident is None:
            continue
        if ident == own:
            raise OutputError(f"{path}: is an input; choose another output path")
        if ident in above:
            raise OutputError(f"{path}: is inside the input folder {inp}; choose another "
                              "output path")
        if folder and own is not None and own in _above(Path(os.path.realpath(inp))):
            raise OutputError(f"{path}: holds the input {inp}, which replacing the folder "
                              "would delete; choose another output folder")


@contextmanager
def parquet_target(path: Path) -> Iterator[Path | BinaryIO]:
    """What to hand polars' `write_parquet` for `path`: the path itself, or, where its name
    holds a byte that is not UTF-8 (a folder the filesystem names so), the file opened
    here: polars takes a path as UTF-8 text only, and fails on any other (a TypeError)."""
    try:
        os.fspath(path).encode("utf-8")
    except UnicodeEncodeError:
        with open(path, "wb") as fh:
            yield fh
        return
    yield path


def append_text(path: Path | str, text: str) -> None:
    """Append to a file named from outside (a CI step summary): a regular file or a new one.
    Opened without blocking (a FIFO with no reader fails at once instead of waiting for one)
    and checked after opening, so a FIFO, a device or a socket is refused, never written."""
    import stat

    from snapana.sources._io import _kind

    path = Path(path)
    refuse_input(path)
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_NONBLOCK", 0)
    def refuse(mode: int) -> OutputError:
        return OutputError(f"{path}: is {_kind(mode)}, not a regular file; snapana appends "
                           "to regular files only")

    try:
        fd = os.open(path, flags, 0o666)
    except OSError as exc:
        if exc.errno in (errno.ENXIO, errno.EISDIR):  # a FIFO no one reads, a socket, a folder
            with suppress(OSError):
                raise refuse(os.stat(path).st_mode) from None
        raise OutputError(f"{path}: cannot write: {exc.strerror or exc}") from None
    with os.fdopen(fd, "w", encoding="utf-8", errors="backslashreplace") as fh:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise refuse(mode)
        os.set_blocking(fd, True)
        fh.write(text)


def check_folder_target(path: Path, replaced: bool) -> None:
    """A folder output's path holds a folder or nothing. A symbolic link there that leads
    to no folder (dangling, a loop) is refused: making the folder would fail on it after the
    work. A folder `replaced` whole (export, dataset) may not be a link at all: the rename
    would replace the link, not the folder it names, and a link to an earlier output could
    not be swapped atomically; a folder written into (ticket, record) may be a link to one."""
    from snapana.units import inert

    shown = inert(str(path), lines=False)
    if path.is_symlink():
        if replaced:
            raise OutputError(f"{shown}: is a symbolic link; name a folder of its own (the "
                              "output folder is replaced whole)")
        if not path.is_dir():
            raise OutputError(f"{shown}: is a symbolic link that leads to no folder; name a "
                              "folder")
    elif path.exists() and not path.is_dir():
        raise OutputError(f"{shown}: exists and is not a folder")


def check_dir_target(path: Path, marker: str, kind: str) -> None:
    """Only an earlier output of the same kind (it holds `marker`) or an empty folder may be
    replaced, so `-o` pointed at someone's folder cannot delete it. Callers check early,
    before the work; atomic_dir checks again."""
    parent = path.parent if str(path.parent) else Path(".")
    refuse_input(path)
    if not parent.is_dir():
        raise OutputError(f"{path}: folder {parent} does not exist")
    check_folder_target(path, replaced=True)
    if path.exists():
        if any(path.iterdir()) and not (path / marker).is_file():
            raise OutputError(f"{path}: exists and is not a snapana {kind}; not replacing it")


@contextmanager
def atomic_dir(path: Path | str, marker: str, kind: str) -> Iterator[Path]:
    """Yield an empty temp folder beside `path`; on success it takes `path`'s place, on any
    error it is removed and an earlier output there is put back. The caller writes `marker`
    into the folder last, so a folder without it is never a finished output."""
    path = Path(path)
    parent = path.parent if str(path.parent) else Path(".")
    check_dir_target(path, marker, kind)
    try:
        tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=parent))
    except OSError as exc:
        raise OutputError(f"{path}: cannot write: {exc.strerror or exc}") from None
    old: Path | None = None
    try:
        yield tmp
        os.chmod(tmp, 0o777 & ~umask())
        if path.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".old", dir=parent))
            os.replace(path, old)  # onto the empty temp folder: atomic on POSIX
        os.replace(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if old is not None and not path.exists():
            os.replace(old, path)  # put the previous output back
            old = None
        raise
    finally:
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
