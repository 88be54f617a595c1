"""A ticket body: the headline and what held the memory, pasteable into any tracker."""

from __future__ import annotations

from snapana.diagnosis import DeviceReport
from snapana.render.text import headline_rows, moment_text
from snapana.units import fmt_bytes


def render(reports: list[DeviceReport], top: int = 10) -> str:
    out: list[str] = []
    for r in reports:
        out.append(f"### GPU memory on device {r.device} — {moment_text(r)}")
        out.append("")
        out.append("| | |")
        out.append("|---|---:|")
        out.extend(f"| {k} | {v} |" for k, v in headline_rows(r))
        out.append("")
        out.append("| what holds memory | bytes | blocks | share |")
        out.append("|---|---:|---:|---:|")
        for g in r.groups[:top]:
            share = g.bytes / r.allocated_bytes if r.allocated_bytes else 0.0
            out.append(f"| `{g.name}` | {fmt_bytes(g.bytes)} | {g.blocks} | {share:.1%} |")
        if len(r.groups) > top:
            rest = r.groups[top:]
            out.append(f"| {len(rest)} more | {fmt_bytes(sum(g.bytes for g in rest))} | "
                       f"{sum(g.blocks for g in rest)} | |")
        for w in r.warnings:
            out.append(f"\n> warning: {w}")
        out.append("")
    return "\n".join(out) + "\n"
