"""The answer first: a verdict's headline (one or two sentences: what failed or peaked, what
holds the memory, the first fix and what it buys) and at most three short evidence lines.

Every format shows these two above everything else; the arithmetic, the rules and the
caveats stay in the sections below (the full verdict paragraph, `wording.verdict`, among
them). Worded once here from the findings, read by the view-model (`views.DeviceView`).
"""

from __future__ import annotations

from snapana.analysis.diagnosis.causes import HEADLINE_ORDER, Fragmentation
from snapana.analysis.diagnosis.findings import DeviceReport, Group, WhatIf
from snapana.analysis.knobs import Knob
from snapana.render import wording as w
from snapana.units import fmt_bytes

#: Evidence lines a verdict shows under its headline.
EVIDENCE_LINES = 3


def _site(g: Group) -> str:
    """Where the family was allocated (a site without frames says why in brackets)."""
    if not g.sites:
        return ""
    site = str(g.sites[0]["site"])
    return f" ({site.strip('<>')})" if site.startswith("<") else f" at {site}"


def _holder(r: DeviceReport) -> Group | None:
    """The family the headline names as holding the memory: the excess the diagnosis would
    take away first, else the largest."""
    d = r.diagnosis
    named = d.excess_family if d.at_oom else None
    return next((g for g in r.groups if g.name == named), r.groups[0] if r.groups else None)


def _buys(r: DeviceReport, k: Knob) -> str:
    """What the first knob buys, in the words of the finding that shows it."""
    d = r.diagnosis
    replay = d.replays.get(k.id)
    if replay is not None and replay.oom_gone:
        return w.replay_gone_words(replay)
    first = next((x for x in d.what_ifs if x.family == d.excess_family), None)
    copies = d.without_copies
    if k is d.excess_knob and d.accumulating is not None and copies is not None \
            and copies.fits:
        return (f"it stops the accumulation of {d.excess_family} "
                f"({w.repeat_text(d.accumulating)} live from one site); without those copies "
                f"the request fits with {fmt_bytes(copies.spare_bytes)} to spare")
    if k is d.excess_knob and first is not None and first.fits:
        return (f"it acts on {first.family}; without {first.family} the request fits with "
                f"{fmt_bytes(first.spare_bytes)} to spare")
    return k.effect


def _fix(r: DeviceReport, lead: str) -> str:
    """The second sentence: the first knob and what it buys; or why none is given."""
    d = r.diagnosis
    if r.oom is None and w.is_host(r):
        return "This is host memory: no GPU knob applies."
    if r.oom is None and d.failed_elsewhere is not None:
        return (f"The job ran out of memory on {w.other_device_text(r, d.failed_elsewhere)}: "
                "this device is shown for comparison.")
    if r.oom is None and (d.small or not d.prescribe):
        return "Nothing needs to shrink."
    if not d.knobs:
        if d.at_oom and d.request_family:
            return (f"No knob of a framework in use applies: the request itself "
                    f"({d.request_family}) must shrink.")
        return "No knob of a framework in use applies."
    k = d.knobs[0]
    return f"{lead}: {k.knob} ({w.cost_text(k)}) — {_buys(r, k)}."


def headline(r: DeviceReport) -> tuple[str, str]:
    """Two sentences: what failed (or peaked) and what holds the memory (family, bytes,
    site); the first fix and what it buys ('' where there is nothing to diagnose)."""
    d = r.diagnosis
    dev = w.device_text(r)
    if d.empty:
        return f"{dev} holds nothing {w.moment_text(r)}: there is nothing to diagnose.", ""
    g = _holder(r)
    if d.at_oom and r.oom is not None:
        phase = ("Out of memory while reloading offloaded state" if d.reloading else
                 "Out of memory" if not d.phase_known else
                 f"Out of memory in the {w.PHASE_NAMES.get(d.phase, d.phase)} phase")
        what = d.request_family if d.request_family not in (None, "unknown") else \
            "an unattributed tensor"
        opening = f"{phase} on {dev}: a {fmt_bytes(r.oom.requested_bytes)} request for {what}"
        if r.oom.gap_bytes is not None and r.oom.gap_bytes > 0:
            opening += f" was short by {fmt_bytes(r.oom.gap_bytes)}"
        else:
            opening += " failed"
        if g is not None:
            fits = next((x.fits for x in d.what_ifs if x.family == g.name), None)
            role = ("the most is held by" if g.name != d.excess_family else
                    "the excess that can go is" if fits else "the excess to release is")
            opening += f"; {role} {g.name}, {fmt_bytes(g.bytes)}{_site(g)}"
        return f"{opening}.", _fix(r, "First fix")
    if r.source.row.host_heap and r.at is None:
        opening = (f"At the heap's high-water mark {fmt_bytes(r.allocated_bytes)} of host "
                   "memory was held")
    elif r.at is not None:
        opening = f"On {dev} {w.moment_text(r)}: {fmt_bytes(r.allocated_bytes)} allocated"
    elif not d.history and d.oom_named:
        opening = (f"Written at an OOM ({d.oom_named}), but with no history on {dev} the "
                   f"failed request is not known: {fmt_bytes(r.allocated_bytes)} allocated at "
                   "the snapshot")
    elif not d.history:
        opening = (f"No OOM or history recorded on {dev}: {fmt_bytes(r.allocated_bytes)} "
                   "allocated at the snapshot")
    else:
        opening = (f"No OOM recorded on {dev}: the peak is {fmt_bytes(r.peak_allocated_bytes)} "
                   f"allocated at event {r.peak.idx}")
    if g is not None:
        opening += f"; {g.name} holds the most, {fmt_bytes(g.bytes)}{_site(g)}"
    lead = "To make it fit" if d.oom_named and not d.history else \
        "If this peak must shrink" if d.history else "If this state must shrink"
    return f"{opening}.", _fix(r, lead)


#: The headline figures the evidence line shows (`wording.headline_rows`), in short words.
_FIGURES = (("requested (failed allocation)", "requested"),
            ("device free at the OOM", "device free"), ("short by", "short by"),
            ("reserved by PyTorch", "reserved"), ("allocated", "allocated"),
            ("heap at the high-water mark", "heap"), ("device capacity", "capacity"),
            ("outside PyTorch", "outside PyTorch"))


def _figures(r: DeviceReport) -> str:
    """The headline figures in one line (the peak first where no OOM is recorded)."""
    rows = dict(w.headline_rows(r))
    peak = (("peak allocated", "peak allocated"),) if r.oom is None and r.diagnosis.history \
        else ()
    return "; ".join(f"{short} {rows[k]}" for k, short in (*peak, *_FIGURES) if k in rows)


def _cause(r: DeviceReport) -> str:
    """The cause that holds, short (the cause checks below say it in full)."""
    d = r.diagnosis
    said = next((said for kind in HEADLINE_ORDER
                 if (c := d.cause(kind)) is not None and (said := c.short(r))), "")
    if said:
        return said
    placed = _placement(r)
    frag = d.cause(Fragmentation)
    if frag is not None and r.has_segments and r.cached_unallocated_bytes is not None:
        demand = f"only {fmt_bytes(r.cached_unallocated_bytes)} is cached but unallocated"
        return (f"real demand ({demand}), yet {placed}" if placed else
                f"real demand, not fragmentation: {demand}")
    return placed


def _placement(r: DeviceReport) -> str:
    """The allocator setting the replay shows removing the OOM, with its margin (the cause
    checks' "allocator's placement" row, short)."""
    d = r.diagnosis
    k = next((k for k in d.knobs if k.id in d.replays and d.replays[k.id].oom_gone), None)
    if k is None:
        return ""
    margin = w.replay_margin(d.replays[k.id])
    spare = f", {fmt_bytes(margin)} to spare" if margin is not None else ""
    return f"with {', '.join(k.simulate)} the replay runs past the OOM{spare}"


def _removal(r: DeviceReport) -> str:
    """Whether taking the named family away makes the request fit."""
    d = r.diagnosis
    first: WhatIf | None = next((x for x in d.what_ifs if x.family == d.excess_family), None)
    if first is not None and first.fits:
        return (f"without {first.family} the request fits: {w.spare_sum(first)} to spare"
                if first.spare_terms else
                f"without {first.family} the request fits with "
                f"{fmt_bytes(first.spare_bytes)} to spare")
    if first is not None and first.private_pool_bytes:
        return f"{first.family}: {w.pool_words(first)}"
    if first is not None:
        return (f"without {first.family} the request is still short by "
                f"{fmt_bytes(-(first.spare_bytes or 0))}")
    if d.request_family:
        return ("no single family that can go makes it fit: the request itself "
                f"({d.request_family}) must shrink")
    return ""


def _largest(r: DeviceReport) -> str:
    return "largest: " + ", ".join(f"{g.name} {fmt_bytes(g.bytes)}" for g in r.groups[:3])


def evidence(r: DeviceReport) -> list[str]:
    """At most `EVIDENCE_LINES` short lines under the headline: the figures, the cause that
    holds (or the largest families), whether the named family's removal makes it fit."""
    d = r.diagnosis
    if d.empty:
        return []
    lines = [_figures(r)]
    if d.at_oom and r.oom is not None:
        lines += [_cause(r), _removal(r)]
        if not lines[1] and r.groups:
            lines[1] = _largest(r)
    elif r.groups:
        lines.append(_largest(r))
        if d.history and r.timeline.growth:
            lines.append(w.growth_text(r, r.timeline.growth[0]))
    return [x for x in lines if x][:EVIDENCE_LINES]
