"""What pages embed besides their data: plotly.js, inlined once per page (gzip + base64,
inflated in the browser), so a report opens offline with no URL to any network resource,
and plotly's default template, once per page for all its figures.

Compressing plotly.min.js costs ~0.3 s (a fifth of a small report), so the compressed copy
is kept in the user's cache (`snapana.user_cache`), once per installed plotly.min.js, and
inlined only where it inflates to that file exactly (~20 ms to check). Page templates are
compiled in each run (~30 ms), never kept: compiled code read back from a file would be
run. This module is the only one in render/ that touches a file.
"""

from __future__ import annotations

import base64
import gzip
import importlib.util
import json
import zlib
from functools import lru_cache
from pathlib import Path

from snapana import user_cache

#: The names of the kept copies of plotly.min.js (`cache_name`).
_PLOTLY_COPIES = "plotly-*.js.gz.b64"


def cache_name() -> str:
    """The name the compressed copy of the installed plotly.min.js is kept under: that file's
    size and modification time, read without importing plotly (its import costs ~50 ms of a
    small report), so an upgraded or reinstalled plotly gets a copy of its own (and the
    copy of the one it replaced goes)."""
    stat = _plotly_data("plotly.min.js").stat()
    return _PLOTLY_COPIES.replace("*", f"{stat.st_size}-{stat.st_mtime_ns}")


def _plotly_data(name: str) -> Path:
    """A file of the installed plotly package's data, found without importing plotly."""
    spec = importlib.util.find_spec("plotly")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("plotly is not installed: its template and plotly.js draw the charts")
    return Path(spec.submodule_search_locations[0]) / "package_data" / name


@lru_cache(maxsize=1)
def plotly_js_gzip_b64() -> str:
    """plotly.min.js, gzip + base64 (mtime=0 keeps reports byte-stable). The kept copy is
    used only where it is exactly that (`_is_copy_of`): its digest only detects damage, and
    a copy edited with it recomputed made reports with no charts; else it is made again."""
    name = cache_name()
    raw = _plotly_data("plotly.min.js").read_bytes()
    kept = user_cache.read_text(name)
    if kept is not None and _is_copy_of(kept, raw):
        return kept
    text = base64.b64encode(gzip.compress(raw, compresslevel=9, mtime=0)).decode("ascii")
    user_cache.write_text(name, text, replaces=_PLOTLY_COPIES)  # (read-only: recompressed)
    return text


def _is_copy_of(text: str, raw: bytes) -> bool:
    """Whether `text` is strict base64 of one gzip member that inflates to `raw` and nothing
    more (inflated no further than one byte past it): what the browser will inflate."""
    try:
        packed = base64.b64decode(text, validate=True)
        inflater = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)  # gzip
        out = inflater.decompress(packed, len(raw) + 1)
    except (ValueError, zlib.error):  # (binascii.Error is a ValueError)
        return False
    return (out == raw and inflater.eof and not inflater.unused_data
            and not inflater.unconsumed_tail)


@lru_cache(maxsize=1)
def plotly_template_json() -> str:
    """plotly's default template ("plotly") as JSON, read from the installed plotly package's
    data without importing plotly (its import and validators cost a third of a second). A
    page embeds it once and applies it to each figure, as plotly's own JSON would per figure."""
    text = _plotly_data("templates/plotly.json").read_text(encoding="utf-8")
    json.loads(text)  # a broken install is an error here, not a blank page
    return text.replace("</", "<\\/")
