"""The words of a diff of two captures (`snapana diff`), shared by every format."""

from __future__ import annotations

from pathlib import Path

from snapana.analysis.compare import SAME, CaptureDiff, GrowthChange, Side, SiteChange
from snapana.analysis.family_timeline import FamilyGrowth
from snapana.units import fmt_bytes

# ----- a diff ------------------------------------------------------------------------------

TOP_FAMILIES = 3  # families named in the verdict


def signed(n: int) -> str:
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


def diff_verdict(d: CaptureDiff) -> str:
    """One line: the families that moved most, the peak, and whether the OOM is gone —
    e.g. 'saved_logprob_softmax -3.32 GiB (gone); peak -2.44 GiB; no OOM after'."""
    if d.is_empty:
        return "no change: same families, sites and peak"
    moved = [f for f in d.families if f.change_bytes][:TOP_FAMILIES]
    parts = []
    if moved:
        parts.append(", ".join(f"{f.family} {signed(f.change_bytes)}"
                               + {"vanished": " (gone)", "new": " (new)"}.get(f.status, "")
                               for f in moved))
    else:
        parts.append("families unchanged")
    parts.append(f"peak {signed(d.peak_change_bytes)}")
    parts.append(_oom_phrase(d))
    return "; ".join(parts)


#: What the diff's growth lines say, in every format.
GROWTH_HEADING = "How the families grew, from the start of each trace to its moment"


def _grew(g: FamilyGrowth | None, s: Side) -> str:
    if g is None:
        return "never held"
    text = f"{fmt_bytes(g.start_bytes)} → {fmt_bytes(g.moment_bytes)} {_at(s)}"
    if fmt_bytes(g.max_bytes) != fmt_bytes(g.moment_bytes):
        text += f" (at most {fmt_bytes(g.max_bytes)} before it)"
    return text


def growth_change_text(d: CaptureDiff, c: GrowthChange) -> str:
    """One family's growth on each side, checkable against each side's family timeline:
    "saved_logprob_softmax: before 0 B → 3.32 GiB at the OOM; after never held"."""
    return f"{c.family}: before {_grew(c.before, d.before)}; after {_grew(c.after, d.after)}"


def growth_change_lines(d: CaptureDiff) -> list[str]:
    """A line per family whose growth differs most between the sides (`CaptureDiff.growth`)."""
    return [growth_change_text(d, c) for c in d.growth]


def history_note(d: CaptureDiff) -> str:
    """Which side has no allocation history, so no family timeline ('' when both have)."""
    missing = [f"{k} ({Path(s.path).name})" for k, s in (("before", d.before),
                                                         ("after", d.after)) if not s.history]
    if not missing:
        return ""
    which = " and ".join(missing)
    return (f"No family timelines to compare: {which} "
            f"{'has' if len(missing) == 1 else 'have'} no allocation history, only the state "
            "at the moment.")


def diff_axis(clocked: bool) -> str:
    return "seconds since each side's first event" if clocked else "event index"


def diff_axis_note(clock_before: bool, clock_after: bool) -> str:
    """Why the diff's family timelines run on the event index ('' when both have a clock)."""
    if clock_before and clock_after:
        return ""
    if clock_before or clock_after:
        return (f"{'after' if clock_before else 'before'} has no clock, so both sides run on "
                "the event index from their first event")
    return ""


def _at(s: Side) -> str:
    return {"oom": "at the OOM", "peak": "at the peak", "snapshot": "at the end"}.get(
        s.moment_kind, f"at event {s.moment_idx}")


def side_text(s: Side) -> str:
    where = {"oom": "at the OOM", "peak": "at the peak", "snapshot": "at the snapshot"}.get(
        s.moment_kind, s.moment_kind)
    req = f", failed request {fmt_bytes(s.request_bytes)}" if s.request_bytes else ""
    dev = f"cuda:{s.device}" if s.device >= 0 else "host"
    return f"{Path(s.path).name} ({dev}, {where}, event {s.moment_idx}{req})"


def totals(d: CaptureDiff) -> list[tuple[str, int, int, int]]:
    b, a = d.before, d.after
    return [
        ("peak allocated", b.peak_allocated_bytes, a.peak_allocated_bytes, d.peak_change_bytes),
        ("allocated at the moment", b.allocated_bytes, a.allocated_bytes,
         d.allocated_change_bytes),
        ("reserved at the moment", b.reserved_bytes, a.reserved_bytes,
         d.reserved_change_bytes),
    ]


def total_rows(d: CaptureDiff) -> list[tuple[str, str, str, str]]:
    return [(k, fmt_bytes(b), fmt_bytes(a), signed(c)) for k, b, a, c in totals(d)]


def family_rows(d: CaptureDiff, all_rows: bool = False) -> list[tuple[str, str, str, str, str]]:
    return [(f.family, fmt_bytes(f.before_bytes), fmt_bytes(f.after_bytes),
             signed(f.change_bytes), f.status)
            for f in d.families if all_rows or f.status != SAME]


def site_rows(d: CaptureDiff, limit: int = 20) -> list[tuple[str, str, str, str, str, str]]:
    moved = [s for s in d.sites if s.status != SAME][:limit]
    return [(s.family, s.site, fmt_bytes(s.before_bytes), fmt_bytes(s.after_bytes),
             signed(s.change_bytes), _chunk_note(s) or s.status) for s in moved]


def _chunk_note(s: SiteChange) -> str:
    if s.before_chunks and not s.after_chunks:
        return f"{s.status}: {s.before_chunks} chunks gone"
    if s.after_chunks and not s.before_chunks:
        return f"{s.status}: {s.after_chunks} chunks"
    return ""
