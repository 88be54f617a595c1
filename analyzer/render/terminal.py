"""Rich tables for the terminal."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table
from snapana.diagnosis import DeviceReport
from snapana.render.text import headline_rows, moment_text
from snapana.units import fmt_bytes


def render(reports: list[DeviceReport], console: Console, top: int = 12) -> None:
    for r in reports:
        head = Table(title=f"device {r.device} — {moment_text(r)}", show_header=False)
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
        for w in r.warnings:
            console.print(f"[yellow]warning:[/yellow] {w}")
