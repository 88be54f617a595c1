"""snapana's folder in the user's cache (``$XDG_CACHE_HOME/snapana``, else
``~/.cache/snapana``): what costs time to make and comes out the same on every run (plotly.js
compressed, the built-in packs' parsed TOML) is kept there between runs, each file named by
what it was made from, so a change to its source gets a file of its own. It holds data only,
never code (nothing marshalled, pickled or compiled): whoever reads an entry back checks it
against its source and makes it again where it differs. The cache only ever saves time: a
folder that cannot be written, or is not the user's alone, or a file that cannot be read,
costs the making and nothing else; a file is written whole or not at all (`atomic`), so a
run beside another never reads half of one, and its first line is the SHA-256 of the rest,
so one damaged since is made again, never used."""

from __future__ import annotations

import hashlib
import os
import stat
from contextlib import suppress
from pathlib import Path

from snapana.atomic import write_atomic
from snapana.errors import SnapanaError

#: Bytes a kept file may hold: anything larger is not snapana's and is not read.
_MOST = 64 << 20
#: The subfolder of the files kept with their digest, apart from those an earlier snapana
#: kept bare under the same names: one that reads a sealed copy of plotly.js as bare base64
#: would inline a broken script, so neither reads the other's.
_SEALED = "sealed"


def folder(*part: str) -> Path | None:
    """snapana's folder in the user's cache, or a path in it (neither may exist yet); None
    where the user has none: no XDG_CACHE_HOME, no HOME and no account entry (a container
    run under a bare uid), where `Path.home()` raises. Never a shared folder such as /tmp,
    where another user could leave a file for snapana to read, nor one relative to the
    working folder, where a checked-out tree could: a relative XDG_CACHE_HOME is ignored, as
    the XDG Base Directory spec says, and a relative HOME (`HOME=.`) means no cache."""
    base = os.environ.get("XDG_CACHE_HOME")
    if not base or not os.path.isabs(base):
        try:
            home = Path.home()
        except (RuntimeError, KeyError, OSError):
            return None
        if not home.is_absolute():
            return None
        base = str(home / ".cache")
    return Path(base, "snapana", *part)


def read_text(name: str) -> str | None:
    """The kept file `name` as text (UTF-8), or None (`read_bytes`)."""
    data = read_bytes(name)
    try:
        return None if data is None else data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def read_bytes(name: str) -> bytes | None:
    """The kept file `name`, or None where there is none, it cannot be read or it is not
    what was written (its digest, the first line, does not match the rest: damage, not
    tampering, since anyone can recompute it; what reads it checks it against its source).
    Only a regular file in the user's own folders (`_sealed_fd`) is read: opened without
    blocking or following a link, so a FIFO (or a link to a device) at its name is passed
    over, not waited on by every run."""
    where = _sealed_fd()
    if where is None:
        return None
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW, dir_fd=where)
    except (OSError, ValueError):
        return None
    finally:
        os.close(where)
    try:
        with os.fdopen(fd, "rb") as fh:
            if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
                return None
            data = fh.read(_MOST + 1)
        digest, _, body = data.partition(b"\n")
        if len(data) > _MOST or digest != _digest(body):
            return None
        return body
    except OSError:
        return None


def write_text(name: str, text: str, replaces: str | None = None) -> None:
    """`write_bytes` of `text` in UTF-8 (one UTF-8 cannot hold is not kept)."""
    try:
        body = text.encode("utf-8")
    except ValueError:
        return
    write_bytes(name, body, replaces)


def write_bytes(name: str, body: bytes, replaces: str | None = None) -> None:
    """Keep `body` as `name`, after its digest; `replaces`: a glob of the files it makes
    stale (those an earlier version of its source made), removed once it is written. Any
    failure is silent: the next run makes it again."""
    where = folder(_SEALED)
    if where is None:
        return
    try:
        where.parent.parent.mkdir(parents=True, exist_ok=True)
        for private in (where.parent, where):  # snapana's own: the user's alone
            with suppress(FileExistsError):
                private.mkdir(mode=0o700)
        fd = _sealed_fd()
        if fd is None:
            return
        os.close(fd)
        write_atomic(where / name, _digest(body) + b"\n" + body)
    except (OSError, SnapanaError):
        return
    for old in where.glob(replaces) if replaces else ():
        if old.name != name:
            with suppress(OSError):
                old.unlink(missing_ok=True)


def _sealed_fd() -> int | None:
    """The sealed folder, open (the caller closes it), or None where it is missing or not
    the user's alone (`_own_folder`): snapana's folder and its sealed subfolder both. Where
    the system has no owners or no folder handles (not POSIX), there is no cache."""
    top = folder()
    if top is None or not hasattr(os, "getuid") or os.open not in os.supports_dir_fd:
        return None
    try:
        outer = _own_folder(str(top))
    except (OSError, ValueError):
        return None
    try:
        return _own_folder(_SEALED, outer)
    except (OSError, ValueError):
        return None
    finally:
        os.close(outer)


def _own_folder(name: str, dir_fd: int | None = None) -> int:
    """`name` (in `dir_fd`) opened as a folder, refused (PermissionError) unless it is one,
    not a link to one, owned by the user and writable by no one else: otherwise another
    account (or whoever shares the folder above) could leave entries for snapana to
    trust."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_NONBLOCK
    fd = os.open(name, flags, dir_fd=dir_fd)
    st = os.fstat(fd)
    if st.st_uid != os.getuid() or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        os.close(fd)
        raise PermissionError(f"{name}: not the user's own folder")
    return fd


def _digest(body: bytes) -> bytes:
    return hashlib.sha256(body).hexdigest().encode("ascii")
