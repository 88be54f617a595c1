"""The failing request named from the traceback above an OOM message (issue 57).

A traceback's frames are the Python frames of the one allocation that failed: the same
frames a snapshot records for its blocks. They go through the same rule packs (family,
phase, the deciding rule), the same owner rule (the framework whose frames made it) and the
same knob preconditions (`knobs.why_applies` on the evidence this one stack gives). What a
log cannot show is what held the rest of the card: the finding says so.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from snapana.analysis.attribution.engine import RuleSet
from snapana.analysis.attribution.facts import fact_specs
from snapana.analysis.attribution.stack import BlockContext
from snapana.analysis.evidence import JobEvidence, stack_evidence
from snapana.analysis.knobs import (
    Knob,
    fold_twins,
    frameworks_in,
    knobs_for,
    reloads_offloaded,
    twin_words,
    why_applies,
    workload_condition,
)
from snapana.analysis.sites import format_frame
from snapana.sources.traceback_text import Traceback

#: The evidence fact (attribution/evidence.toml) of a forward-only pass in the frames.
FORWARD_ONLY_FACT = "forward_only_pass"


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
    matched: tuple[int, ...] = ()  # the stack's frames the rule matched, innermost first
    #: the words of the forward-only fact where the stack shows a forward-only pass (a
    #: reference / old-policy log-prob pass: no backward follows what it makes), else ""
    forward_only: str = ""


class RequestNamer:
    """Names failing requests from their tracebacks with one rule set. Ranks failing on the
    same line print the same stack: the rules, owners and knobs are worked out once per
    distinct stack (and what of the request's size a rule can tell apart)."""

    def __init__(self, rules: RuleSet) -> None:
        self.rules = rules
        self._memo: dict[tuple[object, ...], RequestFinding] = {}

    def name(self, tb: Traceback, request: int | None,
             expandable: bool | None = None) -> RequestFinding:
        stack = tb.stack
        ctx = BlockContext(size=request or 0, has_alloc_event=None)
        key = (stack, self.rules.context_key(ctx), expandable)
        known = self._memo.get(key)
        if known is None:
            known = self._memo[key] = _name(tb, ctx, self.rules, expandable)
        return _with_traceback(known, tb)


def _name(tb: Traceback, ctx: BlockContext, rules: RuleSet,
          expandable: bool | None) -> RequestFinding:
    stack = tb.stack
    explained = rules.with_sites([stack]).explain(stack, ctx)
    decision = explained.decision
    family = decision.family
    ev = stack_evidence(stack, family, rules.markers, expandable)
    frameworks = frameworks_in([f[0] for f in stack], rules)
    # one entry per mechanism, as a snapshot's knob list (`fold_twins`)
    chosen, folded = fold_twins(knobs_for([family], [], frameworks, decision.phase, rules,
                                          workload=ev.workload.answer, ev=ev,
                                          offload=not reloads_offloaded(
                                              explained.phase_rule_id)))
    knobs = tuple(_knob_words(k, ev, family, folded.get(k.id, ())) for k in chosen)
    owners = tuple(ev.owners.get(family, {}).items())
    matched = decision.matched_frames
    return _with_traceback(RequestFinding(
        tb, family, decision.label, decision.rule_id, decision.reason, decision.phase,
        _site(stack[matched[0]]) if matched else "", "",
        _site(stack[matched[-1]]) if len(matched) > 1 and matched[-1] != matched[0]
        else "", "", owners, ev.workload.sentence, knobs, matched,
        _fact_words(FORWARD_ONLY_FACT, ev.facts)), tb)


def _site(frame: tuple[str, str, int]) -> str:
    """'file:line function'; 'file function' for a frame read from its source line alone
    (`traceback_text`: its line number is not in the paste, 0)."""
    return format_frame(frame) if frame[2] else format_frame(frame).replace(":0 ", " ", 1)


def _knob_words(k: Knob, ev: JobEvidence, family: str,
                folded: tuple[Knob, ...] = ()) -> tuple[str, str]:
    """The knob and "effect — why it applies". A knob made for one workload, where this
    stack does not show which, says so before its effect ("only if this job is not trained:
    …"), so that no shorter listing that keeps the effect alone drops it: a forward-only knob
    (inference_mode) would break a trained one."""
    why = "; ".join(w for w in (why_applies(k, ev, [family]) or "",
                                twin_words(k, folded, ev, [family])) if w)
    cond = workload_condition(k, ev.workload.answer)
    if not cond:
        return k.knob, f"{k.effect} — {why}"
    rest = [r for r in why.split("; ") if r != cond]
    if not rest:
        rest = ["whether it trains is not recorded" + (
            f" ({ev.workload.evidence[0]})" if ev.workload.evidence else "")]
    return k.knob, f"{cond}: {k.effect} — {'; '.join(rest)}"


def _fact_words(fact: str, facts: Mapping[str, str]) -> str:
    """A fact's words and the frame that shows it ("" where the stack does not show it)."""
    if fact not in facts:
        return ""
    words = next(f.words for f in fact_specs() if f.id == fact)
    return f"{words}: {facts[fact]}"


def _with_traceback(f: RequestFinding, tb: Traceback) -> RequestFinding:
    """`f` for this traceback: the source lines its own frames printed."""
    n = len(tb.frames)
    inner, outer = (f.matched[0], f.matched[-1]) if f.matched else (None, None)
    code = tb.frames[n - 1 - inner].code if inner is not None else ""
    called = tb.frames[n - 1 - outer].code if f.called_from and outer is not None else ""
    return replace(f, traceback=tb, code=code, called_code=called)
