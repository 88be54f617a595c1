"""What pages embed besides their data: plotly.js, inlined once per page (gzip + base64,
inflated in the browser), so a report opens offline with no URL to any network resource.

Compressing plotly.min.js costs ~0.3 s (a fifth of a small report), so the compressed copy
is kept in the user's cache (``$XDG_CACHE_HOME/snapana`` or ``~/.cache/snapana``), once per
plotly version. This module is the only one in render/ that touches a file.
"""

from __future__ import annotations

import base64
import gzip
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
    from plotly.offline import get_plotlyjs

    cache = cache_file()
    try:
        return cache.read_text(encoding="ascii")
    except OSError:
        pass
    raw = get_plotlyjs().encode()
    text = base64.b64encode(gzip.compress(raw, compresslevel=9, mtime=0)).decode("ascii")
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(cache, text)
    except (OSError, SnapanaError):
        pass  # a read-only home only costs the recompression
    return text
