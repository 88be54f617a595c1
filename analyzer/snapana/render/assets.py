"""What pages embed besides their data: plotly.js, inlined once per page (gzip + base64,
inflated in the browser), so a report opens offline with no URL to any network resource,
and plotly's default template, once per page for all its figures.

Compressing plotly.min.js costs ~0.3 s (a fifth of a small report), so the compressed copy
is kept in the user's cache (``$XDG_CACHE_HOME/snapana`` or ``~/.cache/snapana``), once per
plotly version. This module is the only one in render/ that touches a file.
"""

from __future__ import annotations

import base64
import gzip
import importlib.util
import json
import os
from functools import lru_cache
from pathlib import Path

from snapana.errors import SnapanaError
from snapana.io.output import write_atomic


def cache_file() -> Path:
    """Where the compressed plotly.js of the installed plotly version is kept."""
    import plotly

    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "snapana" / f"plotly-{plotly.__version__}.js.gz.b64"


@lru_cache(maxsize=1)
def plotly_js_gzip_b64() -> str:
    """plotly.min.js, gzip + base64 (mtime=0 keeps reports byte-stable)."""
    cache = cache_file()
    try:
        return cache.read_text(encoding="ascii")
    except OSError:
        pass
    from plotly.offline import get_plotlyjs  # only when compressing: its import costs ~7 ms

    raw = get_plotlyjs().encode()
    text = base64.b64encode(gzip.compress(raw, compresslevel=9, mtime=0)).decode("ascii")
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(cache, text)
    except (OSError, SnapanaError):
        pass  # a read-only home only costs the recompression
    return text


@lru_cache(maxsize=1)
def plotly_template_json() -> str:
    """plotly's default template ("plotly") as JSON, read from the installed plotly package's
    data without importing plotly (its import and validators cost a third of a second). A
    page embeds it once and applies it to each figure, as plotly's own JSON would per figure."""
    spec = importlib.util.find_spec("plotly")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("plotly is not installed: its template and plotly.js draw the charts")
    path = Path(spec.submodule_search_locations[0]) / "package_data" / "templates" / "plotly.json"
    text = path.read_text(encoding="utf-8")
    json.loads(text)  # a broken install is an error here, not a blank page
    return text.replace("</", "<\\/")
