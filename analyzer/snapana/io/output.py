"""Atomic output: a report is either complete or absent, never half-written."""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from snapana.errors import SnapanaError


class OutputError(SnapanaError):
    """The output path cannot be written."""


def _refuse_input(path: Path) -> None:
    """Inputs are never modified: an output that is an input this process read (the same
    file through any link, an input folder, or a path inside one) is refused."""
    from snapana.sources._io import is_input

    if is_input(path):
        raise OutputError(f"{path}: is an input (or inside one); choose another output path")


def check_file_target(path: Path) -> None:
    """An output file replaces what is at its path: only a regular file (or nothing) may be
    there. A device, a FIFO or a socket (or a link to one: `/dev/null`, `/proc/self/fd/1`)
    would be replaced by a regular file, which for `/dev/null` run as root breaks the
    system; refused instead."""
    import stat

    from snapana.sources._io import _kind

    try:
        st = os.stat(path)
    except FileNotFoundError:
        return  # nothing there, or a dangling link: the new file takes its place
    except (OSError, ValueError) as exc:
        raise OutputError(f"{path}: cannot write: {getattr(exc, 'strerror', None) or exc}"
                          ) from None
    if stat.S_ISDIR(st.st_mode):
        raise OutputError(f"{path}: is a folder; name a file to write")
    if not stat.S_ISREG(st.st_mode):
        raise OutputError(f"{path}: is {_kind(st.st_mode)}, not a regular file; snapana "
                          "writes regular files only (a report replaces what is there)")


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


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextmanager
def atomic_path(path: Path | str) -> Iterator[Path]:
    """Yield a temp path in the target's folder; on success it replaces the target, on any
    error it is removed. Every file snapana writes goes through here."""
    path = Path(path)
    folder = path.parent if str(path.parent) else Path(".")
    _refuse_input(path)
    check_file_target(path)
    if not folder.is_dir():
        raise OutputError(f"{path}: folder {folder} does not exist")
    try:
        fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=folder)
    except OSError as exc:
        raise OutputError(f"{path}: cannot write: {exc.strerror or exc}") from None
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; outputs are ordinary files
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_atomic(path: Path | str, data: str | bytes) -> None:
    """Write text (UTF-8) or bytes so that the target is either complete or untouched."""
    with atomic_path(path) as tmp:
        if isinstance(data, bytes):
            tmp.write_bytes(data)
        else:
            # an unpaired surrogate (legal in a pickle's strings) is written escaped, never
            # a UnicodeEncodeError after the work is done
            tmp.write_text(data, encoding="utf-8", errors="backslashreplace")


def append_text(path: Path | str, text: str) -> None:
    """Append to a file named from outside (a CI step summary): a regular file or a new one.
    Opened without blocking (a FIFO with no reader fails at once instead of waiting for one)
    and checked after opening, so a FIFO, a device or a socket is refused, never written."""
    import stat

    from snapana.sources._io import _kind

    path = Path(path)
    _refuse_input(path)
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


def check_dir_target(path: Path, marker: str, kind: str) -> None:
    """Only an earlier output of the same kind (it holds `marker`) or an empty folder may be
    replaced, so `-o` pointed at someone's folder cannot delete it. Callers check early,
    before the work; atomic_dir checks again."""
    parent = path.parent if str(path.parent) else Path(".")
    _refuse_input(path)
    if not parent.is_dir():
        raise OutputError(f"{path}: folder {parent} does not exist")
    if path.exists():
        if not path.is_dir():
            raise OutputError(f"{path}: exists and is not a folder")
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
        os.chmod(tmp, 0o777 & ~_umask())
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
