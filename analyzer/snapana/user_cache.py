"""snapana's folder in the user's cache (``$XDG_CACHE_HOME/snapana``, else
``~/.cache/snapana``): what costs time to make and comes out the same on every run is kept
there between runs, each file named by what it was made from, so a change to its source gets
a file of its own. The cache only ever saves time: a folder that cannot be written, or a file
that cannot be read, costs the making and nothing else; a file is written whole or not at
all (a temporary file renamed over it), so a run beside another never reads half of one."""

from __future__ import annotations

import os
import tempfile
from contextlib import suppress
from pathlib import Path

#: Bytes a kept file may hold: anything larger is not snapana's and is not read.
_MOST = 64 << 20


def folder() -> Path:
    """snapana's folder in the user's cache (it may not exist yet)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "snapana"


def read_text(name: str) -> str | None:
    """The kept file `name` (UTF-8), or None where there is none or it cannot be read."""
    try:
        with open(folder() / name, "rb") as fh:
            data = fh.read(_MOST + 1)
        return data.decode("utf-8") if len(data) <= _MOST else None
    except (OSError, UnicodeDecodeError):
        return None


def write_text(name: str, text: str, replaces: str | None = None) -> None:
    """Keep `text` as `name`, whole or not at all; `replaces`: a glob of the files it makes
    stale (an earlier version's), removed once it is written. Any failure is silent."""
    where = folder()
    try:
        where.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=where)
    except OSError:
        return
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, where / name)
    except OSError:
        Path(tmp).unlink(missing_ok=True)
        return
    for old in where.glob(replaces) if replaces else ():
        if old.name != name:
            with suppress(OSError):
                old.unlink(missing_ok=True)
