"""snapana's folder in the user's cache (``$XDG_CACHE_HOME/snapana``, else
``~/.cache/snapana``): what costs time to make and comes out the same on every run (plotly.js
compressed, compiled page templates, the built-in packs' parsed TOML) is kept there between
runs, each file named by what it was made from, so a change to its source gets a file of its
own. The cache only ever saves time: a folder that cannot be written, or a file that cannot
be read, costs the making and nothing else; a file is written whole or not at all
(`atomic`), so a run beside another never reads half of one, and its first line is the
SHA-256 of the rest, so one changed since (damaged on disk, edited by hand: still valid
JSON, but other packs) is made again, never used."""

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
    where another user could leave a file for snapana to read."""
    base = os.environ.get("XDG_CACHE_HOME")
    if not base:
        try:
            base = str(Path.home() / ".cache")
        except (RuntimeError, KeyError, OSError):
            return None
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
    what was written (its digest, the first line, does not match the rest). Only a regular
    file is read: opened without blocking, so a FIFO (or a link to a device) at its name is
    passed over, not waited on by every run."""
    path = folder(_SEALED, name)
    if path is None:
        return None
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except (OSError, ValueError):
        return None
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
        where.mkdir(parents=True, exist_ok=True, mode=0o700)
        write_atomic(where / name, _digest(body) + b"\n" + body)
    except (OSError, SnapanaError):
        return
    for old in where.glob(replaces) if replaces else ():
        if old.name != name:
            with suppress(OSError):
                old.unlink(missing_ok=True)


def _digest(body: bytes) -> bytes:
    return hashlib.sha256(body).hexdigest().encode("ascii")
