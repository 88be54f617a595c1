"""Rich tables for the terminal."""

from __future__ import annotations

from rich.console import Console
from rich.panel import Panel
from rich.table import Table

from snapana.diagnosis import DeviceReport
from snapana.render.text import (
    device_text,
    headline_rows,
    knob_rows,
    moment_text,
    verdict,
    what_if_rows,
)
from snapana.units import fmt_bytes


def render(reports: list[DeviceReport], console: Console, top: int = 12) -> None:
    for r in reports:
        if r.diagnosis is not None:
            console.print(Panel(verdict(r), title=f"verdict — {device_text(r)}",
                                border_style="red" if r.oom else "blue"))
        head = Table(title=f"{device_text(r)} — {moment_text(r)}", show_header=False)
        head.add_column("what")
        head.add_column("bytes", justify="right")
        for k, v in headline_rows(r):
            head.add_row(k, v)
        console.print(head)
        groups = Table(title="what holds memory")
        for col, just in (("group", "left"), ("bytes", "right"), ("blocks", "right"),
                          ("share", "right"), ("top site", "left")):
            groups.add_column(col, justify=just)  # type: ignore[arg-type]
        for g in r.groups[:top]:
            share = g.bytes / r.allocated_bytes if r.allocated_bytes else 0.0
            site = g.sites[0]["site"] if g.sites else ""
            groups.add_row(g.name, fmt_bytes(g.bytes), str(g.blocks), f"{share:.1%}", site)
        console.print(groups)
        _simple(console, "what if a family were gone", ("family", "bytes", "result", "can go"),
                what_if_rows(r))
        _simple(console, "knobs", ("knob", "acts on", "effect", "caveat"), knob_rows(r)[:4])
        for w in r.warnings:
            console.print(f"[yellow]warning:[/yellow] {w}")


def _simple(console: Console, title: str, header: tuple[str, ...],
            rows: list[tuple[str, ...]]) -> None:
    if not rows:
        return
    table = Table(title=title)
    for h in header:
        table.add_column(h)
    for row in rows:
        table.add_row(*row)
    console.print(table)


def render_explain(items: list, console: Console) -> None:
    """Print ExplainedSite items: the decision, the matched frames marked, near misses."""
    from snapana.units import fmt_bytes

    for it in items:
        d = it.explanation.decision
        console.print(f"[bold]{it.site}[/bold]: {it.blocks} block(s), {fmt_bytes(it.bytes)}"
                      f" — e.g. {', '.join(hex(a) for a in it.addresses)}", highlight=False)
        console.print(str(it.explanation), markup=False, highlight=False)
        marked = set(d.matched_frames)
        for i, (fname, name, line) in enumerate(it.stack):
            if not (fname.endswith(".py") or i in marked):
                continue
            arrow = "=>" if i in marked else "  "
            console.print(f"  {arrow} {fname}:{line} {name}", markup=False, highlight=False)
        console.print()
