"""snapana's folder in the user's cache (``$XDG_CACHE_HOME/snapana``, else
``~/.cache/snapana``): what costs time to make and comes out the same on every run (plotly.js
compressed, compiled page templates, the built-in packs' parsed TOML) is kept there between
runs, each file named by what it was made from, so a change to its source gets a file of its
own. The cache only ever saves time: a folder that cannot be written, or a file that cannot
be read, costs the making and nothing else; a file is written whole or not at all
(`atomic`), so a run beside another never reads half of one."""

from __future__ import annotations

import os
import stat
from contextlib import suppress
from pathlib import Path

from snapana.atomic import write_atomic
from snapana.errors import SnapanaError

#: Bytes a kept file may hold: anything larger is not snapana's and is not read.
_MOST = 64 << 20


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
    """The kept file `name` (UTF-8), or None where there is none or it cannot be read. Only
    a regular file is read: opened without blocking, so a FIFO (or a link to a device) at
    its name is passed over, not waited on by every run."""
    path = folder(name)
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
        return data.decode("utf-8") if len(data) <= _MOST else None
    except (OSError, UnicodeDecodeError):
        return None


def write_text(name: str, text: str, replaces: str | None = None) -> None:
    """Keep `text` as `name`; `replaces`: a glob of the files it makes stale (those an
    earlier version of its source made), removed once it is written. Any failure is
    silent: the next run makes it again."""
    where = folder()
    if where is None:
        return
    try:
        where.mkdir(parents=True, exist_ok=True, mode=0o700)
        write_atomic(where / name, text)
    except (OSError, SnapanaError):
        return
    for old in where.glob(replaces) if replaces else ():
        if old.name != name:
            with suppress(OSError):
                old.unlink(missing_ok=True)
