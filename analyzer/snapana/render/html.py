"""One self-contained HTML file: data embedded once, plotly.js inlined (gzip + base64, inflated
in the browser), no URL to any network resource, so it opens offline from a ticket."""

from __future__ import annotations

import base64
import gzip
import json
import os
from functools import lru_cache
from pathlib import Path

import jinja2
from plotly.offline import get_plotlyjs

from snapana.diagnosis import DeviceReport
from snapana.errors import SnapanaError
from snapana.output import write_atomic
from snapana.render import figures
from snapana.render.text import (
    cause_rows,
    device_text,
    headline_rows,
    knob_rows,
    moment_text,
    verdict,
    what_if_rows,
)
from snapana.units import fmt_bytes

_TEMPLATES = Path(__file__).parent / "templates"


def _cache_file() -> Path:
    import plotly

    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "snapana" / f"plotly-{plotly.__version__}.js.gz.b64"


@lru_cache(maxsize=1)
def plotly_js_gzip_b64() -> str:
    """plotly.min.js, gzip + base64: compressed once per plotly version and kept in the user's
    cache (it costs ~0.3 s, a fifth of a small report); mtime=0 keeps reports byte-stable."""
    cache = _cache_file()
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


def _env() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(_TEMPLATES)),
        autoescape=jinja2.select_autoescape(["html", "j2"]),
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["bytes"] = fmt_bytes
    env.filters["short"] = _short_frame
    return env


def _short_frame(frame: tuple[str, str, int]) -> str:
    return f"{frame[0]}:{frame[2]} {frame[1]}"


def _figure_json(fig) -> str:
    # Escape '</' so the JSON cannot close its <script> element.
    return fig.to_json(engine="json").replace("</", "<\\/")


def render(reports: list[DeviceReport], title: str, multi=None) -> str:
    """The report; with `multi` (a MultiReport), the rank table and heatmap come first and
    `reports` are the devices of the rank to read in full (the first to OOM)."""
    devices = []
    for r in reports:
        figs = {name: _figure_json(make(r)) for name, make in figures.FIGURES.items()}
        devices.append({"r": r, "figs": figs, "headline": headline_rows(r),
                        "name": device_text(r),
                        "moment": moment_text(r), "verdict": verdict(r),
                        "what_ifs": what_if_rows(r), "knobs": knob_rows(r),
                        "causes": cause_rows(r)})
    together = None
    sources = {r.path for r in reports}
    if len(sources) > 1:
        together = {"shared": figures.common_clock(reports), "figure": None}
        if together["shared"]:
            together["figure"] = _figure_json(figures.combined_timeline(reports))
    multi_ctx = None
    if multi is not None:
        from snapana.render import ranks as multi_render

        multi_ctx = {"m": multi, "headline": multi_render.headline(multi),
                     "rows": multi_render.rows(multi), "columns": multi_render.COLUMNS,
                     "heatmap": _figure_json(multi_render.heatmap(multi))}
    return _env().get_template("report.html.j2").render(
        title=title,
        multi=multi_ctx,
        together=together,
        devices=devices,
        plotly_b64=plotly_js_gzip_b64(),
        fmt_bytes=fmt_bytes,
        json=json,
    )
