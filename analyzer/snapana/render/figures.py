"""Plotly figures built from view-models: formatting only, no new numbers.

A figure is a plain dict, `{"data": [...], "layout": {...}}`: what plotly's
`Figure.to_plotly_json()` holds for it, less the template (the page applies plotly's default
template once; `go.Figure(spec)` applies it in a notebook). Building dicts rather than plotly
objects keeps plotly's import and its per-trace validation (a third of a second and more)
off the report's path; tests hold every spec to plotly's validation. Data arrays may be
numpy arrays (float32 where a chart is long): the page's serializer packs them as plotly.js
typed arrays, `go.Figure` takes them as they are.

One name per figure. A device's figures are `FIGURES` under their public names (what
`Analysis.figure(name)` takes and what the HTML report draws): "families" (treemap of what
holds memory), "timeline", "families_over_time", "allocations" (each allocation around the
moment), "segments" (fragmentation) and "sites" (top allocation sites).
Pages also draw `together` (several sources on one clock), a diff's `DIFF_FIGURES` ("change"
per family, "families_over_time" before above after) and `heatmap` (families × ranks).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Literal, TypeVar, get_args

import numpy as np

from snapana.analysis.diagnosis.findings import Band
from snapana.caching_allocator import ACTIVE_ALLOCATED, ACTIVE_PENDING_FREE
from snapana.render.views import (
    UNKNOWN_COLOUR,
    DeviceView,
    DiffView,
    RanksView,
    SegmentGroup,
    TimelineView,
)
from snapana.render.wording import RECORD_HISTORY, allocations_note, inferred_note, rank_label
from snapana.units import GiB, fmt_bytes, plural

#: The public names of a device's figures.
FigureName = Literal["families", "timeline", "families_over_time", "allocations", "segments",
                     "sites"]
FIGURE_NAMES: tuple[FigureName, ...] = get_args(FigureName)

#: A figure spec: plotly's figure JSON without its template (numpy arrays allowed in data).
Figure = dict[str, Any]

#: A time chart's legend: a row under the x axis title, not on it.
LEGEND_BELOW = dict(orientation="h", yanchor="top", y=-0.16)
_STATE_COLOURS = {ACTIVE_ALLOCATED: "#d62728", ACTIVE_PENDING_FREE: "#ff7f0e",
                  "free": "#c7e9c0"}
_UP, _DOWN = "#d62728", "#2ca02c"  # in a diff, more memory is bad news
#: plotly's "Reds", as plotly expands the name (plotly.js's own "Reds" differs).
_REDS = [[0.0, "rgb(255,245,240)"], [0.125, "rgb(254,224,210)"], [0.25, "rgb(252,187,161)"],
         [0.375, "rgb(252,146,114)"], [0.5, "rgb(251,106,74)"], [0.625, "rgb(239,59,44)"],
         [0.75, "rgb(203,24,29)"], [0.875, "rgb(165,15,21)"], [1.0, "rgb(103,0,13)"]]


def _figure(*traces: dict[str, Any], **layout: Any) -> Figure:
    """A figure of `traces` with `layout` (as `_update` merges it)."""
    fig: Figure = {"data": list(traces), "layout": {}}
    _update(fig, **layout)
    return fig


def _trace(kind: str, **props: Any) -> dict[str, Any]:
    """A trace of plotly type `kind`; properties left None are dropped, as plotly does."""
    out = {k: v for k, v in props.items() if v is not None}
    out["type"] = kind
    return out


def _update(fig: Figure, **props: Any) -> None:
    """`Figure.update_layout`: a dict merges into the one already there, any other value
    replaces it; a title given as a string is the title's text, at any depth."""
    _merge(fig["layout"], props)


def _merge(into: dict[str, Any], props: dict[str, Any]) -> None:
    for key, value in props.items():
        if key == "title" and isinstance(value, str):
            value = {"text": value}
        if isinstance(value, dict):
            old = into.get(key)
            if not isinstance(old, dict):
                old = into[key] = {}
            _merge(old, value)
        else:
            into[key] = value


def _vline(fig: Figure, x: float, line: dict[str, Any], text: str, row: int = 1) -> None:
    """`Figure.add_vline(x, line, annotation_text=text, annotation_position="top left")`, on
    subplot `row`: a line across the y axis's domain, its text left of its top."""
    xref, yref = _axis("x", row), _axis("y", row) + " domain"
    lo = fig["layout"]
    lo.setdefault("shapes", []).append(dict(line=dict(line), type="line", x0=x, x1=x,
                                            xref=xref, y0=0, y1=1, yref=yref))
    lo.setdefault("annotations", []).append(dict(showarrow=False, text=text, x=x,
                                                 xanchor="right", xref=xref, y=1,
                                                 yanchor="top", yref=yref))


def _hline(fig: Figure, y: float, line: dict[str, Any], text: str, row: int = 1) -> None:
    """`Figure.add_hline(y, line, annotation_text=text, annotation_position="top left")`, on
    subplot `row`: a line across the x axis's domain, its text above its left end."""
    xref, yref = _axis("x", row) + " domain", _axis("y", row)
    lo = fig["layout"]
    lo.setdefault("shapes", []).append(dict(line=dict(line), type="line", x0=0, x1=1,
                                            xref=xref, y0=y, y1=y, yref=yref))
    lo.setdefault("annotations", []).append(dict(showarrow=False, text=text, x=0,
                                                 xanchor="left", xref=xref, y=y,
                                                 yanchor="bottom", yref=yref))


def _axis(letter: str, row: int) -> str:
    """The axis of subplot `row` (one column): x, x2, ..."""
    return letter if row == 1 else f"{letter}{row}"


def families(v: DeviceView) -> Figure:
    """Treemap: groups (families, or sites before attribution), then their sites."""
    r = v.report
    ids, labels, parents, values, text = ["all"], ["allocated"], [""], [r.allocated_bytes], [
        fmt_bytes(r.allocated_bytes)]
    hover = [fmt_bytes(r.allocated_bytes)]
    for g in r.groups:
        gid = f"g:{g.name}"
        ids.append(gid)
        labels.append(g.name)
        parents.append("all")
        values.append(g.bytes)
        text.append(fmt_bytes(g.bytes))  # short, so small boxes keep a readable label
        note = f" ({inferred_note(g)})" if g.inferred_bytes else ""
        hover.append(f"{fmt_bytes(g.bytes)} in {plural(g.blocks, 'block')}{note}")
        for i, s in enumerate(g.sites[:25]):
            ids.append(f"{gid}:{i}")
            labels.append(str(s["site"]))
            parents.append(gid)
            values.append(s["bytes"])
            text.append(fmt_bytes(s["bytes"]))
            hover.append(f"{fmt_bytes(s['bytes'])} in {plural(s['blocks'], 'block')}")
        rest = g.sites[25:]
        if rest:
            ids.append(f"{gid}:rest")
            labels.append(f"{len(rest)} more sites")
            parents.append(gid)
            values.append(sum(s["bytes"] for s in rest))
            text.append("")
            hover.append(fmt_bytes(sum(s["bytes"] for s in rest)))
    colour = v.colours
    colours = [""] + [colour.get(i.split(":")[1], "") for i in ids[1:]]
    tree = _trace("treemap", ids=ids, labels=labels, parents=parents, values=values,
                  marker=dict(colors=colours),
                  text=text, customdata=hover, branchvalues="total",
                  hovertemplate="%{label}<br>%{customdata}<extra></extra>",
                  textinfo="label+text", maxdepth=2,
                  pathbar=dict(visible=True))
    # A label too small to read is hidden rather than shrunk to a smudge; the page names
    # every family with its colour under the map, linked to its table row (`DeviceView.legend`).
    return _figure(tree, margin=dict(l=4, r=4, t=30, b=4), height=460,
                   uniformtext=dict(minsize=11, mode="hide"),
                   title="What holds memory " + v.moment.split(" (")[0])


def _x_origin(v: DeviceView) -> int:
    """Where the device's time axis counts from: the clock its sources share, else its own
    first event."""
    return v.origin if v.origin is not None else v.timeline.x[0]


def _since(v: DeviceView) -> str:
    """The time axis in words."""
    if not v.timeline.x_is_time:
        return "event index"
    return ("seconds since the first event of any source" if v.origin is not None
            else "seconds since first event")


def timeline(v: DeviceView) -> Figure:
    t = v.timeline
    fig = _figure()
    x0 = _x_origin(v)
    xs: list[float] = [(x - x0) / 1e6 for x in t.x] if t.x_is_time else list(t.x)

    def x_of(value: int) -> float:
        return (value - x0) / 1e6 if t.x_is_time else value

    if t.reserved_known:  # a filled band under its own line: visible where it equals allocated
        fig["data"].append(_trace(
            "scatter", x=xs, y=[v / GiB for v in t.reserved], name="reserved", mode="lines",
            fill="tozeroy", fillcolor="rgba(158,202,225,0.35)",
            line=dict(color="#6baed6", shape="hv", width=3)))
    fig["data"].append(_trace("scatter", x=xs, y=[v / GiB for v in t.allocated],
                              name="allocated", mode="lines",
                              line=dict(color="#08519c", shape="hv", width=1.5)))
    _mark_moments(fig, t, x_of)
    _update(fig, height=400, margin=dict(l=50, r=10, t=30, b=60),
            title="Live bytes over the recorded trace", xaxis=dict(title=_since(v)),
            yaxis=dict(title="GiB"), legend=LEGEND_BELOW)
    add_bands(fig, t.bands, x_of, t.bands_left_out)
    if t.zoom is not None:  # open on the OOM / peak; the whole trace is one click away
        window = [x_of(t.zoom[0]), x_of(t.zoom[1])]
        _update(fig,
            xaxis=dict(range=window, autorange=False),
            title="Live bytes around the " + ("OOM" if t.oom_x is not None else "peak")
            + " (the trace before it is quiet)",
            updatemenus=[dict(type="buttons", direction="right", x=1, xanchor="right", y=1.12,
                              yanchor="bottom", showactive=True, buttons=[
                                  dict(label="around the " + ("OOM" if t.oom_x is not None
                                                              else "peak"),
                                       method="relayout",
                                       args=[{"xaxis.range": window,
                                              "xaxis.autorange": False}]),
                                  dict(label="full range", method="relayout",
                                       args=[{"xaxis.autorange": True}])])])
    return fig


def _mark_moments(fig: Figure, t: TimelineView, x_of: Callable[[int], float]) -> None:
    """The peak (a marker at its bytes) and the OOM (a dashed line) on a time chart."""
    if t.peak_x is not None:
        fig["data"].append(_trace("scatter", x=[x_of(t.peak_x)], y=[t.peak_bytes / GiB],
                                  mode="markers", name=f"peak {fmt_bytes(t.peak_bytes)}",
                                  marker=dict(color="#d62728", size=10, symbol="diamond")))
    if t.oom_x is not None:
        _vline(fig, x_of(t.oom_x), dict(color="#d62728", dash="dash"), "OOM")


def families_over_time(v: DeviceView) -> Figure:
    """Live bytes per family over the trace, stacked (they add up to allocated), with
    reserved and the capacity above them and the OOM and the peak marked: how memory got
    to the moment, family by family."""
    t = v.timeline
    fig = _figure()
    # float32 arrays travel as packed binary in the page: ten areas stay small at any size
    x0 = _x_origin(v)
    fx = np.asarray(t.family_x, dtype=np.float64)
    xs = ((fx - x0) / 1e6 if t.x_is_time else fx).astype(np.float32)

    def x_of(value: int) -> float:
        return (value - x0) / 1e6 if t.x_is_time else value

    for area in t.families:
        where = f"<br>most from {area.site}" if area.site else ""
        fig["data"].append(_trace(
            "scatter", x=xs, y=(np.asarray(area.bytes) / GiB).astype(np.float32),
            name=area.name, mode="lines", stackgroup="families",
            line=dict(shape="hv", width=0.5, color=area.colour), fillcolor=area.colour,
            hovertemplate=f"{area.name}: %{{y:.2f}} GiB{where}<extra></extra>"))
    if t.reserved_known:
        fig["data"].append(_trace(
            "scatter", x=xs, y=(np.asarray(t.family_reserved) / GiB).astype(np.float32),
            name="reserved", mode="lines",
            line=dict(color="#08306b", shape="hv", width=1.5, dash="dot"),
            hovertemplate="reserved: %{y:.2f} GiB<extra></extra>"))
    if t.capacity is not None:
        _hline(fig, t.capacity / GiB, dict(color="#d62728", width=1),
               f"capacity {fmt_bytes(t.capacity)}")
    _mark_moments(fig, t, x_of)
    _update(fig, height=440, margin=dict(l=50, r=10, t=30, b=60),
            title="Live bytes per family over the recorded trace",
            xaxis=dict(title=_since(v)),
            yaxis=dict(title="GiB"), legend=dict(LEGEND_BELOW, traceorder="reversed"),
            hovermode="x unified")
    add_bands(fig, t.bands, x_of, t.bands_left_out)  # the phases beneath the families
    if t.zoom is not None:
        _update(fig, xaxis=dict(range=[x_of(t.zoom[0]), x_of(t.zoom[1])], autorange=False))
    return fig


def allocations(v: DeviceView) -> Figure:
    """The allocations live in the window before the moment, MemoryViz style: one filled
    outline per allocation stacked on those allocated before it, coloured by family, the
    rest as one `other` band on top (its top edge is allocated bytes). Hover names a band;
    the report's page shows a clicked band's `meta` (its detail and stack) under the chart:
    `meta` is [detail, stack], the stack an index in `layout.meta.stacks` (-1: the
    allocation has no frames; None: the `other` band), each stack indices into
    `layout.meta.lines`."""
    a = v.allocations
    fig = _figure()
    if a is None:
        return fig
    seen: set[str] = set()
    traces = fig["data"]
    for b in a.bands:
        px, py = b.outline(a.x, a.start)
        group = b.family or b.name
        traces.append(_trace(
            "scatter", x=px.astype(np.float32), y=(py / GiB).astype(np.float32),
            mode="lines", fill="toself", hoveron="fills", hoverinfo="text",
            line=_BAND_EDGE, fillcolor=b.colour, text=b.hover, name=b.name, legendgroup=group,
            showlegend=group not in seen,
            meta=[b.detail, b.stack if b.kind != "other" else None]))
        seen.add(group)
    _vline(fig, float(a.x[-2]), dict(color="#d62728", dash="dash"), a.moment)
    _update(
        fig, height=500, margin=dict(l=50, r=10, t=64, b=60),
        hovermode="closest", legend=LEGEND_BELOW, yaxis=dict(title="GiB"),
        title=f"Allocations in the last {a.end - a.start + 1:,} events up to the {a.moment}"
              f"<br><sup>{allocations_note(a)}; click one for its stack</sup>",
        xaxis=dict(title="seconds since first event" if a.x_is_time else "event index",
                   range=[float(a.x[0]), float(a.x[-1])]),
        meta={"lines": list(a.lines), "stacks": [list(st) for st in a.stacks]})
    return fig


#: The thin white edge between allocation bands.
_BAND_EDGE = dict(color="white", width=0.5)


#: Annotation bands: lanes drawn (deeper nesting shares the last), each lane's height in
#: pixels, and how many of the longest bands carry their name on the bar.
BAND_LANES, BAND_LANE_PX, BAND_LABELS = 6, 20, 40


def add_bands(fig: Figure, bands: Sequence[Band], x_of: Callable[[int], float],
              left_out: int = 0) -> None:
    """Annotation bands (record_function ranges) in a strip under a time chart, sharing its
    x axis: one bar trace whatever their number, a lane per nesting depth (the deepest
    lanes share the last), each band's name and duration on hover, and the names of the
    `BAND_LABELS` longest on their bars where they fit at the current zoom.

    Call it after the chart's height and margins are set: the strip adds its own height
    below the plot (the chart's y axis keeps its pixels). `left_out` bands (not drawn, too
    many) are counted in a note on the strip."""
    if not bands:
        return
    lanes = [min(lane, BAND_LANES - 1) for lane in band_lanes(bands)]
    n_lanes = max(lanes) + 1
    longest = set(sorted(range(len(bands)),
                         key=lambda i: (bands[i].start - bands[i].end, i))[:BAND_LABELS])
    x0 = [x_of(b.start) for b in bands]
    fig["data"].append(_trace(
        "bar", y=lanes, base=x0, x=[x_of(b.end) - x for b, x in zip(bands, x0, strict=True)],
        orientation="h", yaxis="y2", width=0.9, name="annotations",
        marker=dict(color="rgba(253,174,107,0.55)", line=dict(color="#e6550d", width=0.5)),
        text=[b.name if i in longest else "" for i, b in enumerate(bands)],
        textposition="inside", insidetextanchor="start", textangle=0,
        textfont=dict(size=10, color="#7f2704"),
        customdata=[f"{b.name}<br>{_duration(b.end - b.start)} from {x:.6g} s"
                    for b, x in zip(bands, x0, strict=True)],
        hovertemplate="%{customdata}<extra></extra>"))
    # the strip's pixels come on top of the chart's; the x axis moves under the strip
    lo = fig["layout"]
    height = lo.get("height") or 450
    m = lo.get("margin", {})
    margin = (m["t"] if m.get("t") is not None else 100) + (
        m["b"] if m.get("b") is not None else 80)
    strip, gap = n_lanes * BAND_LANE_PX, 12
    plot = height - margin + strip + gap
    _update(
        fig, height=height + strip + gap, uniformtext=dict(minsize=8, mode="hide"),
        yaxis=dict(domain=[(strip + gap) / plot, 1]),
        yaxis2=dict(domain=[0, strip / plot], anchor="x", range=[n_lanes - 0.5, -0.5],
                    showticklabels=False, showgrid=False, zeroline=False, fixedrange=True),
        xaxis=dict(anchor="y2"))
    if left_out:
        lo.setdefault("annotations", []).append(dict(
            xref="paper", yref="paper", x=1, y=strip / plot, xanchor="right",
            yanchor="bottom", showarrow=False, font=dict(size=10, color="#7f2704"),
            text=f"the {len(bands):,} longest of {len(bands) + left_out:,} annotation bands "
                 f"({left_out:,} shorter ones not drawn)"))


def band_lanes(bands: Sequence[Band]) -> list[int]:
    """Each band's lane, 0 the outermost: in start order (outer before inner), the lowest lane
    free at its start, so a nested range lies below its parent at its depth and no two bands
    in a lane overlap."""
    lanes = [0] * len(bands)
    busy: list[tuple[int, int]] = []  # (end, lane) of the bands still open
    free: list[int] = []
    for i in sorted(range(len(bands)), key=lambda i: (bands[i].start, -bands[i].end)):
        while busy and busy[0][0] <= bands[i].start:
            heapq.heappush(free, heapq.heappop(busy)[1])
        lanes[i] = heapq.heappop(free) if free else len(busy)
        heapq.heappush(busy, (bands[i].end, lanes[i]))
    return lanes


def _duration(us: int) -> str:
    if us < 1000:
        return f"{us} µs"
    return f"{us / 1000:.1f} ms" if us < 1_000_000 else f"{us / 1e6:.2f} s"


#: The segment map's legend: what each colour says of the bytes.
_STATE_NAMES = {ACTIVE_ALLOCATED: "used (allocated)",
                ACTIVE_PENDING_FREE: "freed, pending on a stream",
                "free": "cached, unallocated", "mixed": "mixed (see hover)"}


def segment_name(g: SegmentGroup) -> str:
    """A bar's name: "31 × 692.00 MiB · pool 0,0" for alike segments, else the one's
    address."""
    if g.count > 1:
        return f"{g.count} × {fmt_bytes(g.size)} · pool {g.pool}"
    return f"pool {g.pool} · 0x{g.addresses[0]:x} ({fmt_bytes(g.size)})"


def segments(v: DeviceView) -> Figure:
    """One bar per group of alike segments: its blocks by state (used, cached) and the free
    gaps between them; the axis on top, where the first bars are, and the legend beside
    them, right of the plot: above it, the legend covered the axis' first tick labels."""
    rows: dict[str, dict[str, list[Any]]] = {}
    names: list[str] = []
    for g in v.segment_groups:
        name = segment_name(g)
        if name in names:  # two groups alike in name (not in blocks): told apart
            name += f" (from 0x{g.addresses[0]:x})"
        names.append(name)
        each = f"each of {g.count} segments: " if g.count > 1 else ""
        cursor = 0
        for b in g.blocks:
            if b.offset > cursor:
                _bar(rows, "free", name, cursor, b.offset - cursor, each + "cached, unallocated")
            if b.state:
                _bar(rows, b.state, name, b.offset, b.size, each + b.label)
            cursor = max(cursor, b.offset + b.size)
        if g.size > cursor:
            _bar(rows, "free", name, cursor, g.size - cursor, each + "cached, unallocated")
    bars = [_trace("bar", y=d["y"], x=d["x"], base=d["base"], orientation="h",
                   name=_STATE_NAMES.get(state, state),
                   marker=dict(color=_STATE_COLOURS.get(state, "#888"),
                               line=dict(width=0.5, color="white")),
                   text=d["text"], hovertemplate="%{text}<extra>%{fullData.name}</extra>",
                   textposition="none")
            for state, d in rows.items()]
    return _figure(*bars, barmode="overlay", height=max(260, 22 * len(names) + 130),
                   margin=dict(l=10, r=10, t=90, b=20), title="Segments (fragmentation)",
                   xaxis=dict(title="MiB into segment", side="top"),
                   yaxis=dict(autorange="reversed"),
                   legend=dict(orientation="v", x=1.01, xanchor="left", y=1.0,
                               yanchor="top"))


def _bar(rows: dict[str, dict[str, list[Any]]], state: str, seg: str, offset: int,
         size: int, label: str) -> None:
    d = rows.setdefault(state, {"y": [], "x": [], "base": [], "text": []})
    d["y"].append(seg)
    d["x"].append(size / 2**20)
    d["base"].append(offset / 2**20)
    d["text"].append(f"{label} {fmt_bytes(size)}".strip())


def sites(v: DeviceView) -> Figure:
    """Top allocation sites at the moment, one bar each, coloured by family."""
    r = v.report
    fig = _figure()
    by_family: dict[str, list[Any]] = {}
    for s in r.top_sites:
        by_family.setdefault(s.family, []).append(s)
    for family, shown in by_family.items():
        fig["data"].append(_trace(
            "bar", y=[s.site for s in shown], x=[s.bytes / GiB for s in shown], name=family,
            marker=dict(color=v.colours.get(family, UNKNOWN_COLOUR)), orientation="h",
            text=[f"{fmt_bytes(s.bytes)} in {plural(s.blocks, 'block')}" for s in shown],
            hovertemplate="%{y}<br>%{text}<extra>%{fullData.name}</extra>",
            textposition="none"))
    order = [s.site for s in r.top_sites]
    _update(fig, height=max(260, 26 * len(order) + 90), barmode="stack",
            margin=dict(l=10, r=10, t=30, b=40), xaxis=dict(title="GiB"),
            title="Top allocation sites " + ("at the OOM" if r.oom else "at the moment"),
            yaxis=dict(categoryorder="array", categoryarray=order[::-1]),
            legend=dict(orientation="h"))
    return fig


#: A device's figures under their public names.
FIGURES: dict[FigureName, Callable[[DeviceView], Figure]] = {
    "families": families, "timeline": timeline, "families_over_time": families_over_time,
    "allocations": allocations, "segments": segments, "sites": sites}


#: Figures drawn over the recorded trace: a capture without history has nothing to draw.
OVER_TIME: tuple[FigureName, ...] = ("timeline", "families_over_time", "allocations")


def figure(name: str, v: DeviceView) -> Figure:
    """A device's figure by its public name (ValueError for an unknown one). A figure over
    time of a capture without history is an empty chart that says so."""
    if name in OVER_TIME and not v.timeline.x:
        return _nothing_over_time("No allocation history recorded: nothing to draw over time",
                                  v.history_note)
    return _named("figure", FIGURES.items(), name, v)


def _nothing_over_time(title: str, how: str | None = None) -> Figure:
    """An empty chart for a figure over time of a capture without history: says so, and how
    to record it (`how`: the capture's own advice, else torch's history recording)."""
    return _figure(height=200, xaxis=dict(visible=False), yaxis=dict(visible=False),
                   title=title,
                   annotations=[dict(text=(how or RECORD_HISTORY).replace(" (or ", "<br>(or "),
                                     showarrow=False,
                                     xref="paper", yref="paper", x=0.5, y=0.5)])


_View = TypeVar("_View")


def _named(what: str, makers: Iterable[tuple[str, Callable[[_View], Figure]]], name: str,
           v: _View) -> Figure:
    """The figure `name` of `makers` for `v`; ValueError naming the known ones."""
    known = []
    for key, make in makers:
        if key == name:
            return make(v)
        known.append(key)
    raise ValueError(f"unknown {what} {name!r}; one of {', '.join(known)}")


def together(devices: Sequence[DeviceView]) -> Figure:
    """Every source's allocated bytes on one time axis (only for a common clock)."""
    t0 = min(_x_origin(d) for d in devices)
    lines = [_trace("scatter", x=[(x - t0) / 1e6 for x in d.timeline.x],
                    y=[v / GiB for v in d.timeline.allocated],
                    name=f"{d.report.source} · device {d.report.device}",
                    mode="lines", line=dict(shape="hv"))
             for d in devices]
    return _figure(*lines, height=360, title="All sources on one clock",
                   xaxis=dict(title="seconds"), yaxis=dict(title="GiB allocated"),
                   margin=dict(l=50, r=10, t=30, b=40), legend=dict(orientation="h"))


def change(v: DiffView) -> Figure:
    """One horizontal bar per family that changed: after minus before, in GiB."""
    moved = [f for f in v.diff.families if f.change_bytes][::-1]  # largest at the top
    bars = _trace(
        "bar", y=[f.family for f in moved], x=[f.change_bytes / GiB for f in moved],
        orientation="h", marker=dict(color=[_UP if f.change_bytes > 0 else _DOWN
                                            for f in moved]),
        text=[f"{fmt_bytes(f.before_bytes)} → {fmt_bytes(f.after_bytes)} "
              f"({fmt_bytes(f.change_bytes, signed=True)}, {f.status})" for f in moved],
        hovertemplate="%{y}<br>%{text}<extra></extra>", textposition="none")
    return _figure(bars, height=max(220, 28 * len(moved) + 90), title="Change per family",
                   margin=dict(l=10, r=10, t=30, b=40),
                   xaxis=dict(title="GiB (after − before)"))


def families_before_after(v: DiffView) -> Figure:
    """Each side's live bytes per family, stacked, the before above the after on a shared x
    axis and the same y range, a family in the same colour on both: how each run got to its
    moment. When a side has no history: an empty chart whose title says which side
    (`DiffView.history_note`), as a device's figures over time do."""
    tl = v.timelines
    if tl is None:
        return _nothing_over_time(v.history_note or "No family timelines in this diff")
    lengths = [_extent(tl.before), _extent(tl.after)]
    shared = max(lengths) <= SHARED_AXIS_RATIO * min(lengths)
    fig = _two_rows(f"before: {v.before}", f"after: {v.after}", shared)
    shown: set[str] = set()
    windows = []
    for row, (side, t) in enumerate((("before", tl.before), ("after", tl.after)), 1):
        windows.append(_side_families(fig, row, side, t, shown))
    title = f"Live bytes per family, before and after ({tl.axis})"
    notes = [tl.axis_note] if tl.axis_note else []
    if not shared:
        notes.append(f"each run on its own x axis: one is {max(lengths) / min(lengths):.0f}× "
                     "as long as the other")
    if notes:
        title += f"<br><sub>{'; '.join(notes)}</sub>"
    top = tl.top_bytes / GiB * 1.05
    gib = dict(title="GiB", range=[0, top])
    _update(fig, yaxis=gib, yaxis2=gib, xaxis2=dict(title=tl.axis))
    if not shared:
        _update(fig, xaxis=dict(title=tl.axis))
    _update(fig, height=760, margin=dict(l=50, r=10, t=90, b=40), title=title,
            legend=dict(orientation="h", traceorder="normal"), hovermode="x unified")
    if all(windows):  # both quiet before their moments: open on what both sides did
        window = [min(w[0] for w in windows if w), max(w[1] for w in windows if w)]
        top_w, bottom_w = (window, window) if shared else (list(windows[0] or window),
                                                            list(windows[1] or window))
        _update(fig, xaxis=dict(range=top_w, autorange=False),
                xaxis2=dict(range=bottom_w, autorange=False))
        _update(fig, updatemenus=[dict(
            type="buttons", direction="right", x=1, xanchor="right", y=1.06,
            yanchor="bottom", showactive=True, buttons=[
                dict(label="around the moments", method="relayout",
                     args=[{"xaxis.range": top_w, "xaxis2.range": bottom_w}]),
                dict(label="full range", method="relayout",
                     args=[{"xaxis.autorange": True, "xaxis2.autorange": True}])])])
    return fig


#: Two runs share an x axis unless one is this many times as long as the other: then the
#: shorter would be squeezed into a corner of the width, and each gets its own axis.
SHARED_AXIS_RATIO = 4


def _extent(t: TimelineView) -> float:
    """How long a side's trace is on its axis (µs or events; at least 1)."""
    return float(max(t.x[-1] - t.x[0], 1)) if t.x else 1.0


def _two_rows(top: str, bottom: str, shared: bool = True) -> Figure:
    """What `make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.1,
    subplot_titles=(top, bottom))` lays out: two rows on one x axis (the upper follows the
    lower, which carries the tick labels), each titled above its plot; not `shared`, each
    row on an x axis of its own, each with its tick labels."""
    def title(text: str, y: float) -> dict[str, Any]:
        return dict(font=dict(size=16), showarrow=False, text=text, x=0.5, xanchor="center",
                    xref="paper", y=y, yanchor="bottom", yref="paper")

    upper = dict(matches="x2", showticklabels=False) if shared else {}
    return _figure(xaxis=dict(anchor="y", domain=[0.0, 1.0], **upper),
                   yaxis=dict(anchor="x", domain=[0.55, 1.0]),
                   xaxis2=dict(anchor="y2", domain=[0.0, 1.0]),
                   yaxis2=dict(anchor="x2", domain=[0.0, 0.45]),
                   annotations=[title(top, 1.0), title(bottom, 0.45)])


def _side_families(fig: Figure, row: int, side: str, t: TimelineView,
                   shown: set[str]) -> tuple[float, float] | None:
    """One side's family areas (the bottom one carries the event of each point), reserved,
    capacity, the peak and the OOM in subplot `row`; a legend entry per name, once. Returns
    the side's window around its moments (`TimelineView.zoom`) on the drawn axis."""
    x0 = t.x[0]

    def x_of(value: int) -> float:
        return (value - x0) / 1e6 if t.x_is_time else value

    def legend(name: str) -> bool:
        new = name not in shown
        shown.add(name)
        return new

    axes = dict(xaxis=_axis("x", row), yaxis=_axis("y", row))  # add_trace(..., row=row)
    fx = np.asarray(t.family_x, dtype=np.float64)
    xs = ((fx - x0) / 1e6 if t.x_is_time else fx).astype(np.float32)
    events = np.asarray(t.family_events, dtype=np.int32)
    data = fig["data"]
    for i, area in enumerate(t.families):
        where = f"<br>most from {area.site}" if area.site else ""
        at = " (event %{customdata})" if i == 0 else ""
        data.append(_trace(
            "scatter", **axes, x=xs, y=(np.asarray(area.bytes) / GiB).astype(np.float32),
            name=area.name,
            legendgroup=area.name, showlegend=legend(area.name), mode="lines",
            stackgroup=side, line=dict(shape="hv", width=0.5, color=area.colour),
            fillcolor=area.colour, customdata=events if i == 0 else None,
            hovertemplate=f"{side} · {area.name}: %{{y:.2f}} GiB{at}{where}<extra></extra>"))
    if t.reserved_known:
        rx = np.asarray(t.x, dtype=np.float64)
        rx = ((rx - x0) / 1e6 if t.x_is_time else rx).astype(np.float32)
        data.append(_trace(
            "scatter", **axes, x=rx, y=(np.asarray(t.reserved) / GiB).astype(np.float32),
            name="reserved",
            legendgroup="reserved", showlegend=legend("reserved"), mode="lines",
            line=dict(color="#08306b", shape="hv", width=1.5, dash="dot"),
            hovertemplate=f"{side} · reserved: %{{y:.2f}} GiB<extra></extra>"))
    # plotly's add_hline / add_vline on a subplot skip one that holds no trace yet
    if t.capacity is not None and (t.families or t.reserved_known):
        _hline(fig, t.capacity / GiB, dict(color="#d62728", width=1),
               f"capacity {fmt_bytes(t.capacity)}", row)
    if t.peak_x is not None:
        data.append(_trace(
            "scatter", **axes, x=[x_of(t.peak_x)], y=[t.peak_bytes / GiB], mode="markers",
            name=f"{side}: peak {fmt_bytes(t.peak_bytes)}",
            marker=dict(color="#d62728", size=10, symbol="diamond")))
    if t.oom_x is not None and (t.families or t.reserved_known or t.peak_x is not None):
        _vline(fig, x_of(t.oom_x), dict(color="#d62728", dash="dash"), "OOM", row)
    return None if t.zoom is None else (x_of(t.zoom[0]), x_of(t.zoom[1]))


#: A diff's figures under their public names (`Comparison.figure(name)`).
DiffFigureName = Literal["change", "families_over_time"]
DIFF_FIGURES: dict[DiffFigureName, Callable[[DiffView], Figure]] = {
    "change": change, "families_over_time": families_before_after}


def diff_figure(name: str, v: DiffView) -> Figure:
    """A diff's figure by its public name (ValueError for an unknown one)."""
    return _named("diff figure", DIFF_FIGURES.items(), name, v)


def heatmap(v: RanksView) -> Figure:
    """Families × ranks: what each rank held at its OOM or peak."""
    m = v.report
    ok = m.ok
    labels = [rank_label(m, r) for r in ok]
    z = [[r.families.get(f, 0) / GiB for r in ok] for f in m.families]
    text = [[fmt_bytes(r.families.get(f, 0)) for r in ok] for f in m.families]
    cells = _trace("heatmap", z=z, x=labels, y=m.families, text=text, colorscale=_REDS,
                   hovertemplate="%{y} on %{x}: %{text}<extra></extra>",
                   colorbar=dict(title=dict(text="GiB")))
    return _figure(cells, title="Families × ranks (GiB at each rank's OOM or peak)",
                   height=max(300, 28 * len(m.families) + 120),
                   margin=dict(l=10, r=10, t=40, b=40), yaxis=dict(autorange="reversed"))
