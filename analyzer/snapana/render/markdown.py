"""A ticket body: the headline and what held the memory, pasteable into any tracker."""

from __future__ import annotations

from snapana.diagnosis import DeviceReport
from snapana.render.text import (
    cause_rows,
    device_text,
    headline_rows,
    knob_rows,
    moment_text,
    verdict,
    what_if_rows,
)
from snapana.units import fmt_bytes


def render(reports: list[DeviceReport], top: int = 10) -> str:
    out: list[str] = []
    for r in reports:
        out.append(f"### Memory on {device_text(r)} — {moment_text(r)}")
        out.append("")
        if r.diagnosis is not None:
            out.append(f"**Verdict.** {verdict(r)}")
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
        _table(out, ("without family", "bytes", "would the request fit?", "can go"),
               what_if_rows(r))
        _table(out, ("knob", "acts on", "effect", "caveat"), knob_rows(r))
        _table(out, ("cause", "holds", "numbers"), cause_rows(r))
        for w in r.warnings:
            out.append(f"\n> warning: {w}")
        out.append("")
    return "\n".join(out) + "\n"


def _table(out: list[str], header: tuple[str, ...], rows: list[tuple[str, ...]]) -> None:
    if not rows:
        return
    out.append("")
    out.append("| " + " | ".join(header) + " |")
    out.append("|" + "---|" * len(header))
    out.extend("| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in rows)
