"""Text for a terminal: rich tables for a capture, the ranks and explanations, plain aligned
columns for a diff (which also reads well in a CI log). Formatting only."""

from __future__ import annotations

import io
from collections.abc import Sequence

from rich.console import Console
from rich.panel import Panel
from rich.table import Table

from snapana.render import Options
from snapana.render.views import CaptureView, DiffView, ExplainView, RanksView
from snapana.render.wording import inferred_note
from snapana.units import fmt_bytes

TOP_GROUPS = 12  # families in the "what holds memory" table
TOP_KNOBS = 4
TOP_SITES = 20  # changed sites in a diff


def _console(options: Options) -> Console:
    """A console that writes into a string, `options.width` columns, styled or not."""
    if options.color:
        return Console(file=io.StringIO(), width=options.width, force_terminal=True,
                       force_jupyter=False)
    # force_jupyter=False: in a notebook rich would display the output instead of writing it
    return Console(file=io.StringIO(), width=options.width, color_system=None,
                   force_terminal=False, force_jupyter=False, highlight=False)


def _text(console: Console) -> str:
    out = console.file
    assert isinstance(out, io.StringIO)
    return out.getvalue()


def capture(view: CaptureView, options: Options) -> str:
    console = _console(options)
    for d in view.devices:
        r = d.report
        console.print(Panel(d.verdict, title=f"verdict — {d.name}",
                            border_style="red" if r.oom else "blue"))
        head = Table(title=f"{d.name} — {d.moment}", show_header=False)
        head.add_column("what")
        head.add_column("bytes", justify="right")
        for k, v in d.headline:
            head.add_row(k, v)
        console.print(head)
        groups = Table(title="what holds memory")
        groups.add_column("group", justify="left")
        groups.add_column("bytes", justify="right")
        groups.add_column("blocks", justify="right")
        groups.add_column("share", justify="right")
        groups.add_column("evidence", justify="left")
        groups.add_column("top site", justify="left")
        for g in r.groups[:TOP_GROUPS]:
            share = g.bytes / r.allocated_bytes if r.allocated_bytes else 0.0
            site = g.sites[0]["site"] if g.sites else ""
            groups.add_row(g.name, fmt_bytes(g.bytes), str(g.blocks), f"{share:.1%}",
                           inferred_note(g), site)
        console.print(groups)
        _simple(console, "what if a family were gone", ("family", "bytes", "result", "can go"),
                d.what_ifs)
        _simple(console, "knobs", ("knob", "acts on", "effect", "caveat"),
                d.knobs[:TOP_KNOBS])
        for w in r.warnings:
            console.print(f"[yellow]warning:[/yellow] {w}")
    return _text(console)


def _simple(console: Console, title: str, header: tuple[str, ...],
            rows: Sequence[Sequence[str]]) -> None:
    if not rows:
        return
    table = Table(title=title)
    for h in header:
        table.add_column(h)
    for row in rows:
        table.add_row(*row)
    console.print(table)


def ranks(view: RanksView, options: Options) -> str:
    console = _console(options)
    console.print(view.headline)
    table = Table(title="ranks")
    for c in view.columns:
        table.add_column(c)
    for row in view.rows:
        table.add_row(*row)
    console.print(table)
    return _text(console)


def explain(view: ExplainView, options: Options) -> str:
    """Each explained site: the decision, the matched frames marked, near misses."""
    console = _console(options)
    for it in view.items:
        d = it.explanation.decision
        console.print(f"[bold]{it.site}[/bold]: {it.blocks} block(s), {fmt_bytes(it.bytes)}"
                      f" — e.g. {', '.join(hex(a) for a in it.addresses)}", highlight=False)
        console.print(str(it.explanation), markup=False, highlight=False)
        if it.evidence == "inventory":
            console.print(f"named by the recording's tensor inventory: {it.family} — "
                          f"{it.why}", markup=False, highlight=False)
        elif it.evidence == "inferred" and it.method and it.family != d.family:
            console.print(f"inferred by the inference stage: {it.family} "
                          f"({it.method}) — {it.why}", markup=False, highlight=False)
        marked = set(d.matched_frames)
        for i, (fname, name, line) in enumerate(it.stack):
            if not (fname.endswith(".py") or i in marked):
                continue
            arrow = "=>" if i in marked else "  "
            console.print(f"  {arrow} {fname}:{line} {name}", markup=False, highlight=False)
        console.print()
    return _text(console)


def diff(view: DiffView, options: Options) -> str:
    out = [f"before: {view.before}", f"after:  {view.after}", "",
           f"Verdict: {view.verdict}", ""]
    out += _columns(("", "before", "after", "change"), view.totals)
    if view.families:
        out += ["", *_columns(("family", "before", "after", "change", ""), view.families)]
    sites = view.sites[:TOP_SITES]
    if sites:
        out += ["", *_columns(("family", "site", "before", "after", "change", ""), sites)]
    return "\n".join(out) + "\n"


def _columns(header: tuple[str, ...], rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    numeric = {"before", "after", "change"}

    def line(row: Sequence[str]) -> str:
        return "  ".join(str(c).rjust(w) if h in numeric else str(c).ljust(w)
                         for c, w, h in zip(row, widths, header, strict=True)).rstrip()

    return [line(header), *(line(r) for r in rows)]
