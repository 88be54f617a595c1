"""Regression gates on a before/after comparison (issue 47): `snapana diff BEFORE AFTER
--fail-on EXPR`, for a baseline capture kept as a CI artefact. Each expression is a limit on
growth from before to after, checked as a budget line (`budget.Check`):

    peak_allocated>+5%         the peak grew by more than 5% of the baseline's
    reserved>+2GiB             reserved at the moment grew by more than 2 GiB
    family:kv_cache>+512MiB    one family grew by more than 512 MiB
    new_family                 a family held nothing before and something after
    oom                        the after capture ran out of memory
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from snapana.analysis.attribution.families import family_ids
from snapana.analysis.budget import Check
from snapana.analysis.compare import CaptureDiff
from snapana.errors import InputError
from snapana.units import fmt_bytes, parse_bytes, quote

#: The largest growth a share may allow (x1000): more is no limit at all.
MAX_GROWTH = 1000.0
#: The figures a growth limit may name, and how a comparison gives (before, after).
FIGURES = ("peak_allocated", "allocated", "reserved")
_EXPR = re.compile(r"(?P<figure>[a-z_]+(?::[a-z0-9_]+)?)>\+(?P<limit>[0-9.]+%|[0-9.]+\s*[A-Za-z]+)")


@dataclass(frozen=True)
class Gate:
    """One parsed --fail-on expression."""

    text: str
    figure: str  # a FIGURES name, "family", "new_family" or "oom"
    family: str = ""
    percent: float | None = None  # growth limit as a share of before
    bytes: int | None = None  # growth limit in bytes


def parse_gate(text: str) -> Gate:
    """A --fail-on expression; InputError saying the forms it takes."""
    forms = ("peak_allocated>+5%, reserved>+2GiB, family:kv_cache>+512MiB, new_family, oom")
    if text in ("new_family", "oom"):
        return Gate(text, text)
    m = _EXPR.fullmatch(text.strip()) if text.isascii() else None
    if m is None:
        raise InputError(f"--fail-on {quote(text)}: expected one of the forms {forms}")
    figure, limit = m.group("figure"), m.group("limit")
    family = ""
    if figure.startswith("family:"):
        figure, family = "family", figure.partition(":")[2]
        if family not in family_ids():
            raise InputError(f"--fail-on {quote(text)}: {quote(family)} is not a family")
    elif figure not in FIGURES:
        raise InputError(f"--fail-on {quote(text)}: {quote(figure)} is not one of "
                         f"{', '.join(FIGURES)} or family:NAME")
    if limit.endswith("%"):
        try:
            share = float(limit[:-1]) / 100
        except ValueError:
            share = -1.0
        if not 0 <= share <= MAX_GROWTH:
            raise InputError(f"--fail-on {quote(text)}: {quote(limit)} is not a share from "
                             f"0% to {MAX_GROWTH:.0%}")
        return Gate(text, figure, family, percent=share)
    try:
        return Gate(text, figure, family, bytes=parse_bytes(limit.replace(" ", "")))
    except ValueError as exc:
        raise InputError(f"--fail-on {quote(text)}: {exc}") from None


def evaluate(gates: list[Gate], d: CaptureDiff) -> list[Check]:
    """Each gate against the comparison: holds when the growth stays within its limit."""
    out = []
    for g in gates:
        if g.figure == "oom":
            out.append(Check("oom", "no OOM in the after capture",
                             "ran out of memory" if d.after.has_oom else "no OOM",
                             not d.after.has_oom))
            continue
        if g.figure == "new_family":
            new = [f.family for f in d.families if f.before_bytes == 0 and f.after_bytes > 0]
            out.append(Check("new_family", "no family appears",
                             ", ".join(f"{n} ({fmt_bytes(d.family(n).after_bytes)})"  # type: ignore[union-attr]
                                       for n in new) or "none", not new))
            continue
        before, after, name = _figures(g, d)
        growth = after - before
        allowed = g.bytes if g.bytes is not None else int((g.percent or 0.0) * before)
        limit = (f"grows by at most {fmt_bytes(g.bytes)}" if g.bytes is not None else
                 f"grows by at most {(g.percent or 0.0):.1%} ({fmt_bytes(allowed)})")
        out.append(Check(name, limit, f"{fmt_bytes(before)} → {fmt_bytes(after)} "
                                      f"({'+' if growth >= 0 else '−'}{fmt_bytes(abs(growth))})",
                         growth <= allowed, "", float(allowed), float(growth)))
    return out


def _figures(g: Gate, d: CaptureDiff) -> tuple[int, int, str]:
    if g.figure == "family":
        f = d.family(g.family)
        return (f.before_bytes, f.after_bytes, f"family {g.family}") if f is not None \
            else (0, 0, f"family {g.family}")
    side = {"peak_allocated": "peak_allocated_bytes", "allocated": "allocated_bytes",
            "reserved": "reserved_bytes"}[g.figure]
    return getattr(d.before, side), getattr(d.after, side), g.figure
