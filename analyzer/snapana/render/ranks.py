"""Renderers for several inputs: the rank table (text, markdown, JSON) and its figure."""

from __future__ import annotations

import json
from typing import Any

import plotly.graph_objects as go
from rich.console import Console
from rich.table import Table

from snapana.ranks import MultiReport, RankSummary
from snapana.units import GiB, fmt_bytes

COLUMNS = ("rank", "file", "OOM", "reserved", "allocated", "top family", "note")


def _note(m: MultiReport, r: RankSummary) -> str:
    if r.error:
        return f"failed: {r.error}"
    notes = []
    if m.first_oom is r:
        notes.append("FIRST OOM")
    fams = [o["family"] for o in m.outliers if o["file"] == r.file]
    if fams:
        notes.append("outlier: " + ", ".join(fams))
    return "; ".join(notes)


def rows(m: MultiReport) -> list[tuple[str, ...]]:
    out = []
    for r in m.ranks:
        oom = "-" if r.error else (f"yes, {fmt_bytes(r.oom['requested_bytes'])} request"
                                   if r.oom else "no")
        out.append((str(r.rank) if r.rank is not None else "?", r.file.rsplit("/", 1)[-1],
                    oom, fmt_bytes(r.reserved_bytes) if not r.error else "-",
                    fmt_bytes(r.allocated_bytes) if not r.error else "-",
                    r.top_family or "-", _note(m, r)))
    return out


def headline(m: MultiReport) -> str:
    n_ok, n = len(m.ok), len(m.ranks)
    parts = [f"{n} inputs, {n_ok} analysed."]
    if m.first_oom is not None:
        r = m.first_oom
        parts.append(f"First to run out of memory: rank {r.rank} ({r.file.rsplit('/', 1)[-1]}),"
                     f" a {fmt_bytes(r.oom['requested_bytes'])} request.")
    else:
        parts.append("No input recorded an OOM.")
    if m.outliers:
        o = m.outliers[0]
        parts.append(f"{len(m.outliers)} outlier(s), e.g. rank {o['rank']}: {o['family']} "
                     f"{fmt_bytes(o['bytes'])} vs median {fmt_bytes(o['median_bytes'])}.")
    if not m.one_job:
        parts.append("These files do not look like one job (" + "; ".join(m.why_not_one_job)
                     + "): compare them with care.")
    return " ".join(parts)


def terminal(m: MultiReport, console: Console) -> None:
    console.print(headline(m))
    table = Table(title="ranks")
    for c in COLUMNS:
        table.add_column(c)
    for row in rows(m):
        table.add_row(*row)
    console.print(table)


def markdown(m: MultiReport) -> str:
    out = [f"**{headline(m)}**", "", "| " + " | ".join(COLUMNS) + " |",
           "|" + "---|" * len(COLUMNS)]
    out += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in rows(m)]
    return "\n".join(out) + "\n"


def to_json(m: MultiReport) -> str:
    entries: list[dict[str, Any]] = []
    for r in m.ranks:
        entries.append({
            "file": r.file, "rank": r.rank, "error": r.error, "device": r.device,
            "oom": r.oom, "reserved_bytes": r.reserved_bytes if not r.error else None,
            "allocated_bytes": r.allocated_bytes if not r.error else None,
            "peak_allocated_bytes": r.peak_allocated_bytes if not r.error else None,
            "top_family": r.top_family, "families": r.families,
            "first_oom": m.first_oom is r,
            "outlier_families": [o["family"] for o in m.outliers if o["file"] == r.file],
        })
    return json.dumps({"inputs": entries, "one_job": m.one_job,
                       "why_not_one_job": m.why_not_one_job, "outliers": m.outliers},
                      indent=2) + "\n"


def heatmap(m: MultiReport) -> go.Figure:
    ok = m.ok
    labels = [f"rank {r.rank}" if r.rank is not None else r.file.rsplit("/", 1)[-1][:24]
              for r in ok]
    z = [[r.families.get(f, 0) / GiB for r in ok] for f in m.families]
    text = [[fmt_bytes(r.families.get(f, 0)) for r in ok] for f in m.families]
    fig = go.Figure(go.Heatmap(z=z, x=labels, y=m.families, text=text, colorscale="Reds",
                               hovertemplate="%{y} on %{x}: %{text}<extra></extra>",
                               colorbar=dict(title="GiB")))
    fig.update_layout(title="Families × ranks (GiB at each rank's OOM or peak)",
                      height=max(300, 28 * len(m.families) + 120),
                      margin=dict(l=10, r=10, t=40, b=40), yaxis=dict(autorange="reversed"))
    return fig
