"""Plotly figures built from a DeviceReport: formatting only, no new numbers."""

from __future__ import annotations

import plotly.graph_objects as go

from snapana.diagnosis import DeviceReport
from snapana.units import GiB, fmt_bytes

_STATE_COLOURS = {"active_allocated": "#d62728", "active_pending_free": "#ff7f0e",
                  "free": "#c7e9c0"}


def holders(r: DeviceReport) -> go.Figure:
    """Treemap: groups (families, or sites before attribution), then their sites."""
    ids, labels, parents, values, text = ["all"], ["allocated"], [""], [r.allocated_bytes], [
        fmt_bytes(r.allocated_bytes)]
    for g in r.groups:
        gid = f"g:{g.name}"
        ids.append(gid)
        labels.append(g.name)
        parents.append("all")
        values.append(g.bytes)
        text.append(f"{fmt_bytes(g.bytes)} in {g.blocks} blocks")
        for i, s in enumerate(g.sites[:25]):
            ids.append(f"{gid}:{i}")
            labels.append(str(s["site"]))
            parents.append(gid)
            values.append(int(s["bytes"]))
            text.append(f"{fmt_bytes(int(s['bytes']))} in {s['blocks']} blocks")
        rest = g.sites[25:]
        if rest:
            ids.append(f"{gid}:rest")
            labels.append(f"{len(rest)} more sites")
            parents.append(gid)
            values.append(sum(int(s["bytes"]) for s in rest))
            text.append("")
    fig = go.Figure(go.Treemap(ids=ids, labels=labels, parents=parents, values=values,
                               text=text, branchvalues="total",
                               hovertemplate="%{label}<br>%{text}<extra></extra>",
                               textinfo="label+text"))
    fig.update_layout(margin=dict(l=4, r=4, t=30, b=4), height=460,
                      title="What holds memory " + ("at the OOM" if r.oom else "at the snapshot"))
    return fig


def timeline(r: DeviceReport) -> go.Figure:
    t = r.timeline
    fig = go.Figure()
    xs: list[float] = [(x - t.x[0]) / 1e6 for x in t.x] if t.x_is_time else list(t.x)
    x_of = (lambda v: (v - t.x[0]) / 1e6) if t.x_is_time else (lambda v: v)  # noqa: E731
    fig.add_trace(go.Scatter(x=xs, y=[v / GiB for v in t.reserved], name="reserved",
                             mode="lines", line=dict(color="#9ecae1", shape="hv")))
    fig.add_trace(go.Scatter(x=xs, y=[v / GiB for v in t.allocated], name="allocated",
                             mode="lines", line=dict(color="#08519c", shape="hv")))
    if t.peak_x is not None:
        fig.add_trace(go.Scatter(x=[x_of(t.peak_x)], y=[t.peak_bytes / GiB], mode="markers",
                                 name=f"peak {fmt_bytes(t.peak_bytes)}",
                                 marker=dict(color="#d62728", size=10, symbol="diamond")))
    if t.oom_x is not None:
        fig.add_vline(x=x_of(t.oom_x), line=dict(color="#d62728", dash="dash"),
                      annotation_text="OOM", annotation_position="top left")
    for b in t.bands:
        fig.add_vrect(x0=x_of(b["start"]), x1=x_of(b["end"]), fillcolor="#fdd0a2",
                      opacity=0.35, line_width=0, annotation_text=b["name"],
                      annotation_position="top left")
    fig.update_layout(height=380, margin=dict(l=50, r=10, t=30, b=40),
                      title="Live bytes over the recorded trace",
                      xaxis_title="seconds since first event" if t.x_is_time else "event index",
                      yaxis_title="GiB", legend=dict(orientation="h"))
    return fig


def segments(r: DeviceReport) -> go.Figure:
    """One bar per segment: its blocks by state and the free gaps between them."""
    rows: dict[str, dict[str, list]] = {}
    names = []
    for seg in r.segment_map:
        name = f"pool {seg['pool']} · 0x{seg['address']:x} ({fmt_bytes(seg['size'])})"
        names.append(name)
        cursor = 0
        for b in seg["blocks"] + [{"offset": seg["size"], "size": 0, "state": None,
                                    "label": ""}]:
            if b["offset"] > cursor:
                _bar(rows, "free", name, cursor, b["offset"] - cursor, "cached, unallocated")
            if b["state"]:
                _bar(rows, b["state"], name, b["offset"], b["size"], b["label"])
            cursor = max(cursor, b["offset"] + b["size"])
    fig = go.Figure()
    for state, d in rows.items():
        fig.add_trace(go.Bar(y=d["y"], x=d["x"], base=d["base"], orientation="h", name=state,
                             marker=dict(color=_STATE_COLOURS.get(state, "#888"),
                                         line=dict(width=0.5, color="white")),
                             text=d["text"], hovertemplate="%{text}<extra>%{fullData.name}"
                             "</extra>", textposition="none"))
    fig.update_layout(barmode="overlay", height=max(260, 22 * len(names) + 80),
                      margin=dict(l=10, r=10, t=30, b=40), title="Segments (fragmentation)",
                      xaxis_title="MiB into segment", yaxis=dict(autorange="reversed"),
                      legend=dict(orientation="h"))
    return fig


def _bar(rows: dict, state: str, seg: str, offset: int, size: int, label: str) -> None:
    d = rows.setdefault(state, {"y": [], "x": [], "base": [], "text": []})
    d["y"].append(seg)
    d["x"].append(size / 2**20)
    d["base"].append(offset / 2**20)
    d["text"].append(f"{label} {fmt_bytes(size)}".strip())


FIGURES = {"holders": holders, "timeline": timeline, "segments": segments}


def common_clock(reports: list[DeviceReport]) -> bool:
    """Sources share an axis only when every one has absolute µs times and their recorded
    spans overlap (a snapshot and a kineto trace of one run share the profiler clock)."""
    spans = [(r.timeline.x[0], r.timeline.x[-1]) for r in reports
             if r.timeline.x_is_time and r.timeline.x]
    if len(spans) != len(reports) or len(spans) < 2:
        return False
    return max(s[0] for s in spans) <= min(s[1] for s in spans)


def combined_timeline(reports: list[DeviceReport]) -> go.Figure:
    """Every source's allocated bytes on one time axis (only called when common_clock)."""
    t0 = min(r.timeline.x[0] for r in reports)
    fig = go.Figure()
    for r in reports:
        name = f"{r.source} · device {r.device}"
        fig.add_trace(go.Scatter(x=[(x - t0) / 1e6 for x in r.timeline.x],
                                 y=[v / GiB for v in r.timeline.allocated], name=name,
                                 mode="lines", line=dict(shape="hv")))
    fig.update_layout(height=360, title="All sources on one clock",
                      xaxis_title="seconds", yaxis_title="GiB allocated",
                      margin=dict(l=50, r=10, t=30, b=40), legend=dict(orientation="h"))
    return fig
