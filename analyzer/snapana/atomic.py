"""A file written whole or not at all: a temp file in the target's folder, renamed over the
target when complete, removed on any error; never over an input this process read, nor over
a device, a FIFO or a folder. Every file snapana writes goes through here, a report as much
as the renderers' own cache (`render.assets`): it stands below them all and imports no
stage (a lazy look at `sources._io`'s record of the inputs read)."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from snapana.errors import SnapanaError


class OutputError(SnapanaError):
    """The output path cannot be written."""


def refuse_input(path: Path) -> None:
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


def umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextmanager
def atomic_path(path: Path | str) -> Iterator[Path]:
    """Yield a temp path in the target's folder; on success it replaces the target, on any
    error it is removed. Every file snapana writes goes through here."""
    path = Path(path)
    folder = path.parent if str(path.parent) else Path(".")
    refuse_input(path)
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
        os.chmod(tmp, 0o666 & ~umask())  # mkstemp makes 0600; outputs are ordinary files
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
