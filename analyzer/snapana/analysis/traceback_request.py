"""The failing request named from the traceback above an OOM message (issue 57).

A traceback's frames are the Python frames of the one allocation that failed: the same
frames a snapshot records for its blocks. They go through the same rule packs (family,
phase, the deciding rule), the same owner rule (the framework whose frames made it) and the
same knob preconditions (`knobs.why_applies` on the evidence this one stack gives). What a
log cannot show is what held the rest of the card: the finding says so.
"""

from __future__ import annotations

from dataclasses import dataclass

from snapana.analysis.attribution.engine import RuleSet
from snapana.analysis.attribution.sites import format_frame
from snapana.analysis.attribution.stack import BlockContext
from snapana.analysis.evidence import stack_evidence
from snapana.analysis.knobs import frameworks_in, knobs_for, reloads_offloaded, why_applies
from snapana.sources.traceback_text import Traceback


@dataclass(frozen=True)
class RequestFinding:
    """The failing request's family, where it was made, who owns it and what acts on it."""

    traceback: Traceback
    family: str
    label: str
    rule_id: str | None
    reason: str
    phase: str
    site: str  # the frame the deciding rule matched ("" when no rule decided)
    code: str  # that frame's source line as the traceback printed it
    #: the outermost frame the rule matched, where it is another (the framework's call)
    called_from: str
    called_code: str
    owners: tuple[tuple[str, str], ...]  # (framework, the frame that shows it)
    workload: str  # the workload sentence this stack supports
    knobs: tuple[tuple[str, str], ...]  # (knob, effect — why it applies here)


def name_request(tb: Traceback, request: int | None, rules: RuleSet,
                 expandable: bool | None = None) -> RequestFinding:
    stack = tb.stack
    ctx = BlockContext(size=request or 0, has_alloc_event=None)
    explained = rules.with_sites([stack]).explain(stack, ctx)
    decision = explained.decision
    family = decision.family
    at = decision.matched_frames[0] if decision.matched_frames else None
    out = decision.matched_frames[-1] if decision.matched_frames else None
    site = format_frame(stack[at]) if at is not None else ""
    code = tb.frames[len(stack) - 1 - at].code if at is not None else ""
    called = format_frame(stack[out]) if out is not None and out != at else ""
    called_code = tb.frames[len(stack) - 1 - out].code if called and out is not None else ""
    ev = stack_evidence(stack, family, rules.markers, expandable)
    frameworks = frameworks_in([f[0] for f in stack], rules)
    workload = ev.workload.answer
    chosen = knobs_for([family], [], frameworks, decision.phase, rules, workload=workload,
                       ev=ev, offload=not reloads_offloaded(explained.phase_rule_id))
    knobs = tuple((k.knob, f"{k.effect} — {why_applies(k, ev, [family])}")
                  for k in chosen)
    owners = tuple(ev.owners.get(family, {}).items())
    return RequestFinding(tb, family, decision.label, decision.rule_id, decision.reason,
                          decision.phase, site, code, called, called_code, owners,
                          ev.workload.sentence, knobs)
