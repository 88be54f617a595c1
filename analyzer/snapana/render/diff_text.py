"""A before/after diff as text: a verdict line, then the totals, families and sites.

`text` is for a terminal, `markdown` for a ticket or PR, `json` for scripts (plain ints).
Formatting only: every number is a field of the CaptureDiff.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from snapana.compare import CaptureDiff, FamilyChange, Side, SiteChange
from snapana.units import fmt_bytes

TOP_FAMILIES = 3  # families named in the verdict


def _signed(n: int) -> str:
    return fmt_bytes(n, signed=True) if n else "±0"


def _oom_phrase(d: CaptureDiff) -> str:
    b, a = d.before, d.after
    if b.has_oom and not a.has_oom:
        return "no OOM after"
    if b.has_oom and a.has_oom:
        return "still OOM after"
    if a.has_oom:
        return "OOM after (none before)"
    return "no OOM either side"


def verdict(d: CaptureDiff) -> str:
    """One line: the families that moved most, the peak, and whether the OOM is gone —
    e.g. 'saved_logprob_softmax -3.32 GiB (gone); peak -2.44 GiB; no OOM after'."""
    if d.is_empty:
        return "no change: same families, sites and peak"
    moved = [f for f in d.families if f.change_bytes][:TOP_FAMILIES]
    parts = []
    if moved:
        parts.append(", ".join(f"{f.family} {_signed(f.change_bytes)}"
                               + {"vanished": " (gone)", "new": " (new)"}.get(f.status, "")
                               for f in moved))
    else:
        parts.append("families unchanged")
    parts.append(f"peak {_signed(d.peak_change_bytes)}")
    parts.append(_oom_phrase(d))
    return "; ".join(parts)


def _side_text(s: Side) -> str:
    where = {"oom": "at the OOM", "peak": "at the peak", "snapshot": "at the snapshot"}.get(
        s.moment_kind, s.moment_kind)
    req = f", failed request {fmt_bytes(s.request_bytes)}" if s.request_bytes else ""
    return f"{Path(s.path).name} (device {s.device}, {where}, event {s.moment_idx}{req})"


def _totals(d: CaptureDiff) -> list[tuple[str, int, int, int]]:
    b, a = d.before, d.after
    return [
        ("peak allocated", b.peak_allocated_bytes, a.peak_allocated_bytes, d.peak_change_bytes),
        ("allocated at the moment", b.allocated_bytes, a.allocated_bytes,
         d.allocated_change_bytes),
        ("reserved at the moment", b.reserved_bytes, a.reserved_bytes,
         d.reserved_change_bytes),
    ]


def family_rows(d: CaptureDiff, all_rows: bool = False) -> list[tuple[str, ...]]:
    return [(f.family, fmt_bytes(f.before_bytes), fmt_bytes(f.after_bytes),
             _signed(f.change_bytes), f.status)
            for f in d.families if all_rows or f.status != "same"]


def site_rows(d: CaptureDiff, limit: int = 20) -> list[tuple[str, ...]]:
    moved = [s for s in d.sites if s.status != "same"][:limit]
    return [(s.family, s.site, fmt_bytes(s.before_bytes), fmt_bytes(s.after_bytes),
             _signed(s.change_bytes), _chunk_note(s) or s.status) for s in moved]


def _chunk_note(s: SiteChange) -> str:
    if s.before_chunks and not s.after_chunks:
        return f"{s.status}: {s.before_chunks} chunks gone"
    if s.after_chunks and not s.before_chunks:
        return f"{s.status}: {s.after_chunks} chunks"
    return ""


def render_text(d: CaptureDiff) -> str:
    out = [f"before: {_side_text(d.before)}", f"after:  {_side_text(d.after)}", "",
           f"Verdict: {verdict(d)}", ""]
    rows = [(k, fmt_bytes(b), fmt_bytes(a), _signed(c)) for k, b, a, c in _totals(d)]
    out += _columns(("", "before", "after", "change"), rows)
    fam = family_rows(d)
    if fam:
        out += ["", *_columns(("family", "before", "after", "change", ""), fam)]
    sites = site_rows(d)
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


def render_markdown(d: CaptureDiff) -> str:
    out = ["### GPU memory: before vs after", "",
           f"- before: `{_side_text(d.before)}`", f"- after: `{_side_text(d.after)}`", "",
           f"**Verdict.** {verdict(d)}", "", "| | before | after | change |",
           "|---|---:|---:|---:|"]
    out += [f"| {k} | {fmt_bytes(b)} | {fmt_bytes(a)} | {_signed(c)} |"
            for k, b, a, c in _totals(d)]
    fam = family_rows(d)
    if fam:
        out += ["", "| family | before | after | change | |", "|---|---:|---:|---:|---|"]
        out += [f"| `{f}` | {b} | {a} | {c} | {s} |" for f, b, a, c, s in fam]
    sites = site_rows(d)
    if sites:
        out += ["", "| family | site | before | after | change | |",
                "|---|---|---:|---:|---:|---|"]
        out += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in sites]
    return "\n".join(out) + "\n"


def _family_dict(f: FamilyChange) -> dict[str, Any]:
    return {"family": f.family, "label": f.label, "before_bytes": f.before_bytes,
            "after_bytes": f.after_bytes, "change_bytes": f.change_bytes,
            "before_blocks": f.before_blocks, "after_blocks": f.after_blocks,
            "status": f.status}


def _site_dict(s: SiteChange) -> dict[str, Any]:
    return {"family": s.family, "site": s.site, "before_bytes": s.before_bytes,
            "after_bytes": s.after_bytes, "change_bytes": s.change_bytes,
            "before_blocks": s.before_blocks, "after_blocks": s.after_blocks,
            "before_chunks": s.before_chunks, "after_chunks": s.after_chunks,
            "status": s.status}


def to_dict(d: CaptureDiff) -> dict[str, Any]:
    return {
        "verdict": verdict(d),
        "before": vars(d.before),
        "after": vars(d.after),
        "peak_change_bytes": d.peak_change_bytes,
        "allocated_change_bytes": d.allocated_change_bytes,
        "reserved_change_bytes": d.reserved_change_bytes,
        "oom_gone": d.oom_gone,
        "families": [_family_dict(f) for f in d.families],
        "sites": [_site_dict(s) for s in d.sites],
        "new_sites": [[s.family, s.site] for s in d.new_sites],
        "vanished_sites": [[s.family, s.site] for s in d.vanished_sites],
    }


def render_json(d: CaptureDiff) -> str:
    return json.dumps(to_dict(d), indent=2) + "\n"


def render(d: CaptureDiff, fmt: str = "text") -> str:
    """'text', 'markdown' or 'json'."""
    renderers = {"text": render_text, "markdown": render_markdown, "json": render_json}
    if fmt not in renderers:
        raise ValueError(f"unknown diff format {fmt!r} (text, markdown, json)")
    return renderers[fmt](d)
