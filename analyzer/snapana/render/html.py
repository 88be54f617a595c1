"""One self-contained HTML page per view: data embedded once, plotly.js inlined by
`assets.py`, no URL to any network resource, so it opens offline from a ticket."""

from __future__ import annotations

import base64
import json
import math
import re
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jinja2
import numpy as np
from markupsafe import Markup, escape

from snapana.limits import MAX_FRAME_TEXT
from snapana.render import Options, figures
from snapana.render.assets import plotly_js_gzip_b64, plotly_template_json
from snapana.render.views import CaptureView, DeviceView, DiffView, RanksView
from snapana.render.wording import GROWTH_HEADING, evidence_note
from snapana.units import fmt_bytes, plural, shown_name

if TYPE_CHECKING:  # a text log's page: its modules are imported when there is a log
    from snapana.render.text_log import TextLogView

_TEMPLATES = Path(__file__).parent / "templates"
_FIGURE = re.compile(r"(\d) (B|KiB|MiB|GiB|TiB)\b")
#: The figures a device section draws, by their public names (`figures.FIGURES`).
PAGE_FIGURES: tuple[figures.FigureName, ...] = ("families", "timeline", "families_over_time",
                                                "allocations", "segments")


@cache
def _template(name: str) -> jinja2.Template:
    """A page template, compiled once per process (never read compiled from a file: that
    would run whatever code the file holds)."""
    return _env().get_template(name)


def warm() -> None:
    """What a report costs before its data exists: the report template compiled and
    plotly.js and its template read. The CLI calls it while a snapshot decodes."""
    _template("report.html.j2")
    plotly_js_gzip_b64()
    plotly_template_json()


def _env() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(_TEMPLATES)),
        autoescape=jinja2.select_autoescape(["html", "j2"]),
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["bytes"] = fmt_bytes
    env.filters["evidence"] = evidence_note
    env.filters["short"] = _short_frame
    env.filters["whole"] = _whole_words
    return env


def _whole_words(text: str) -> Markup:
    """Escaped text whose hyphenated words (knob flags: --recompute-loss-function) never
    break at a hyphen: the line wraps at spaces only."""
    glued = _FIGURE.sub("\\1\u00a0\\2", str(text))  # "24.84 GiB" stays on one line
    return Markup(" ").join(
        Markup('<span class="w">{}</span>').format(w) if "-" in w else escape(w)
        for w in glued.split(" "))


def _short_frame(frame: tuple[str, str, int]) -> str:
    """A frame of a shown stack, each name bounded (`units.shown_name`): one long name in
    every stack must not multiply into every stack the page shows."""
    return (f"{shown_name(frame[0], MAX_FRAME_TEXT)}:{frame[2]} "
            f"{shown_name(frame[1], MAX_FRAME_TEXT)}")


#: numpy dtypes plotly.js reads as typed arrays, by its short names.
_TYPED = {"int8": "i1", "uint8": "u1", "int16": "i2", "uint16": "u2", "int32": "i4",
          "uint32": "u4", "float32": "f4", "float64": "f8"}


def _figure_json(fig: figures.Figure) -> str:
    """A figure spec as JSON for its <script> element: numpy arrays as plotly.js typed arrays
    (base64 of their bytes, as plotly's own serializer writes them; a NaN there is a gap),
    NaN and infinities elsewhere as null (as plotly writes them), and '</' and '<!--' escaped
    so the JSON cannot close or confuse its <script> element."""
    try:
        text = json.dumps(fig, separators=(",", ":"), default=_json_default, allow_nan=False)
    except ValueError:  # a NaN or an infinity somewhere: null, as plotly.js expects
        text = json.dumps(_finite(fig), separators=(",", ":"), default=_json_default)
    return _in_script(text)


def _in_script(text: str) -> str:
    """JSON text safe inside a <script> element: '</' and '<!--' escaped, so it can neither
    close nor confuse the element."""
    return text.replace("</", "<\\/").replace("<!--", "\\u003c!--")


def _json_default(o: Any) -> Any:
    """What `json.dumps` cannot write itself: numpy arrays and scalars."""
    if isinstance(o, np.ndarray):
        code = _TYPED.get(o.dtype.name)
        if code is None or o.size == 0 or o.ndim != 1:
            return _finite(o.tolist())
        raw = np.ascontiguousarray(o, dtype=o.dtype.newbyteorder("<")).tobytes()
        return {"dtype": code, "bdata": base64.b64encode(raw).decode("ascii")}
    if isinstance(o, np.generic):
        return _finite(o.item())
    raise TypeError(f"not JSON serializable: {type(o).__name__}")


def _finite(o: Any) -> Any:
    """`o` with every NaN or infinite float (at any depth) as None."""
    if isinstance(o, float | np.floating):
        return float(o) if math.isfinite(o) else None
    if isinstance(o, dict):
        return {k: _finite(v) for k, v in o.items()}
    if isinstance(o, list | tuple):
        return [_finite(v) for v in o]
    return o


def _always(d: DeviceView) -> bool:
    return True


#: What a figure draws from: one with nothing to draw is left off the page.
_HAS_DATA: dict[str, Callable[[DeviceView], bool]] = {
    "segments": lambda d: bool(d.segments),
    "timeline": lambda d: bool(d.timeline.x),
    "families": lambda d: bool(d.report.groups),
    "families_over_time": lambda d: bool(d.timeline.families),
    "allocations": lambda d: d.allocations is not None,
}


def _device(d: DeviceView) -> tuple[DeviceView, dict[str, str]]:
    """The device's figures; none drawn empty (no segment map for a source without
    segments, no timeline without history)."""
    drawn = [name for name in PAGE_FIGURES if _HAS_DATA.get(name, _always)(d)]
    out: dict[str, str] = {name: _figure_json(figures.FIGURES[name](d)) for name in drawn}
    # the explorer's data: moments picked on the family timeline, or the snapshot's one
    if d.explorer is not None and ("families_over_time" in out or d.explorer.get("no_history")):
        out["explorer"] = _in_script(json.dumps(d.explorer, separators=(",", ":")))
    return d, out


def _ranks(v: RanksView | None) -> dict[str, Any] | None:
    if v is None:
        return None
    return {"v": v, "heatmap": _figure_json(figures.heatmap(v))}


def _page(title: str, devices: tuple[DeviceView, ...], ranks: RanksView | None,
          together: dict[str, Any] | None, device_table: CaptureView | None = None) -> str:
    hosts = {d.host for d in devices}
    heading = ("host memory report" if hosts == {True} else
               "GPU and host memory report" if hosts == {True, False} else "GPU memory report")
    return _template("report.html.j2").render(
        title=title,
        heading=heading,
        multi=_ranks(ranks),
        device_table=device_table if device_table is not None and device_table.device_rows
        else None,
        together=together,
        devices=[_device(d) for d in devices],
        log_checks=device_table.log_checks if device_table is not None else (),
        plotly_b64=plotly_js_gzip_b64(),
        plotly_template=plotly_template_json(),
    )


def capture(view: CaptureView, options: Options) -> str:
    """The report; under a rank table (`view.ranks`), the devices are those of the rank to
    read in full (the first to OOM)."""
    together: dict[str, Any] | None = None
    if view.several_sources:
        shared = view.common_clock
        together = {"shared": shared,
                    "figure": _figure_json(figures.together(view.devices)) if shared else None}
    return _page(view.title, view.devices, view.ranks, together, view)


def ranks(view: RanksView, options: Options) -> str:
    """The rank table and its heatmap alone."""
    return _page(plural(len(view.report.ranks), "input"), (), view, None)


def diff(view: DiffView, options: Options) -> str:
    return _template("diff.html.j2").render(
        title=view.title,
        d=view.diff,
        verdict=view.verdict,
        before=view.before,
        after=view.after,
        totals=view.totals,
        families=view.families,
        sites=view.sites,
        fig=_figure_json(figures.change(view)),
        growth=view.growth,
        growth_heading=GROWTH_HEADING,
        history_note=view.history_note,
        over_time=(_figure_json(figures.families_before_after(view))
                   if view.timelines is not None else None),
        plotly_b64=plotly_js_gzip_b64(),
        plotly_template=plotly_template_json(),
    )


def text_log(view: TextLogView, options: Options) -> str:
    """A text log's OOM messages as one page (no figures: the text has no timeline)."""
    return _template("text_log.html.j2").render(v=view)
