"""A ticket or PR body: the verdict and the tables, pasteable into any tracker."""

from __future__ import annotations

from collections.abc import Sequence

from snapana.render import Options
from snapana.render.views import CaptureView, DiffView, RanksView
from snapana.render.wording import inferred_note
from snapana.units import fmt_bytes

TOP_GROUPS = 10  # families listed, the rest summed in one row
TOP_SITES = 20  # changed sites in a diff


def capture(view: CaptureView, options: Options) -> str:
    out: list[str] = []
    for d in view.devices:
        r = d.report
        out.append(f"### Memory on {d.name} — {d.moment}")
        out.append("")
        out.append(f"**Verdict.** {d.verdict}")
        out.append("")
        out.append("| | |")
        out.append("|---|---:|")
        out.extend(f"| {k} | {v} |" for k, v in d.headline)
        out.append("")
        out.append("| what holds memory | bytes | blocks | share | evidence |")
        out.append("|---|---:|---:|---:|---|")
        for g in r.groups[:TOP_GROUPS]:
            share = g.bytes / r.allocated_bytes if r.allocated_bytes else 0.0
            out.append(f"| `{g.name}` | {fmt_bytes(g.bytes)} | {g.blocks} | {share:.1%} | "
                       f"{inferred_note(g)} |")
        if len(r.groups) > TOP_GROUPS:
            rest = r.groups[TOP_GROUPS:]
            out.append(f"| {len(rest)} more | {fmt_bytes(sum(g.bytes for g in rest))} | "
                       f"{sum(g.blocks for g in rest)} | | |")
        _table(out, ("without family", "bytes", "would the request fit?", "can go"),
               d.what_ifs)
        _table(out, ("knob", "acts on", "effect", "caveat"), d.knobs)
        _table(out, ("cause", "holds", "numbers"), d.causes)
        for w in r.warnings:
            out.append(f"\n> warning: {w}")
        out.append("")
    return "\n".join(out) + "\n"


def _table(out: list[str], header: tuple[str, ...], rows: Sequence[Sequence[str]]) -> None:
    if not rows:
        return
    out.append("")
    out.append("| " + " | ".join(header) + " |")
    out.append("|" + "---|" * len(header))
    out.extend("| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in rows)


def diff(view: DiffView, options: Options) -> str:
    out = ["### GPU memory: before vs after", "",
           f"- before: `{view.before}`", f"- after: `{view.after}`", "",
           f"**Verdict.** {view.verdict}", "", "| | before | after | change |",
           "|---|---:|---:|---:|"]
    out += [f"| {k} | {b} | {a} | {c} |" for k, b, a, c in view.totals]
    if view.families:
        out += ["", "| family | before | after | change | |", "|---|---:|---:|---:|---|"]
        out += [f"| `{f}` | {b} | {a} | {c} | {s} |" for f, b, a, c, s in view.families]
    sites = view.sites[:TOP_SITES]
    if sites:
        out += ["", "| family | site | before | after | change | |",
                "|---|---|---:|---:|---:|---|"]
        out += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in sites]
    return "\n".join(out) + "\n"


def ranks(view: RanksView, options: Options) -> str:
    out = [f"**{view.headline}**", "", "| " + " | ".join(view.columns) + " |",
           "|" + "---|" * len(view.columns)]
    out += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in view.rows]
    return "\n".join(out) + "\n"
