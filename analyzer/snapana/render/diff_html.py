"""The before/after diff as one self-contained HTML file: the verdict, the totals, a bar chart
of the change per family, and the family and site tables. plotly.js is inlined the way the
report does it (`html.plotly_js_gzip_b64`), so it opens offline from a ticket too."""

from __future__ import annotations

import plotly.graph_objects as go

from snapana.compare import CaptureDiff
from snapana.render import diff_text
from snapana.render.html import _env, _figure_json, plotly_js_gzip_b64
from snapana.units import GiB, fmt_bytes

_UP, _DOWN = "#d62728", "#2ca02c"  # more memory is bad news


def figure(d: CaptureDiff) -> go.Figure:
    """One horizontal bar per family that changed: after minus before, in GiB."""
    moved = [f for f in d.families if f.change_bytes][::-1]  # largest at the top
    fig = go.Figure(go.Bar(
        y=[f.family for f in moved], x=[f.change_bytes / GiB for f in moved],
        orientation="h", marker=dict(color=[_UP if f.change_bytes > 0 else _DOWN
                                            for f in moved]),
        text=[f"{fmt_bytes(f.before_bytes)} → {fmt_bytes(f.after_bytes)} "
              f"({fmt_bytes(f.change_bytes, signed=True)}, {f.status})" for f in moved],
        hovertemplate="%{y}<br>%{text}<extra></extra>", textposition="none"))
    fig.update_layout(height=max(220, 28 * len(moved) + 90), title="Change per family",
                      margin=dict(l=10, r=10, t=30, b=40),
                      xaxis_title="GiB (after − before)")
    return fig


def render(d: CaptureDiff, title: str | None = None) -> str:
    return _env().get_template("diff.html.j2").render(
        title=title or f"{diff_text._side_text(d.before)} → {diff_text._side_text(d.after)}",
        d=d,
        verdict=diff_text.verdict(d),
        before=diff_text._side_text(d.before),
        after=diff_text._side_text(d.after),
        totals=[(k, fmt_bytes(b), fmt_bytes(a), diff_text._signed(c))
                for k, b, a, c in diff_text._totals(d)],
        families=diff_text.family_rows(d),
        sites=diff_text.site_rows(d, limit=60),
        fig=_figure_json(figure(d)),
        plotly_b64=plotly_js_gzip_b64(),
    )
