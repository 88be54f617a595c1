"""Knobs: which setting changes which family or cause, and which frameworks a capture uses.

Knobs and detection markers are data in the framework packs (``[[knob]]`` entries and
``[pack] markers`` of ``attribution/packs/<framework>.toml``), read by the same pack loader
as the rules; which families are transient or a working set is the vocabulary's
(``lifetime`` in ``attribution/packs/vocabulary.toml``). Every function takes an optional
:class:`~snapana.analysis.attribution.RuleSet`: given one (``load_rules(["mine.toml"])``), the knobs
and markers of its user packs count too; without one, the built-in packs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING

from snapana.analysis.attribution.engine import RuleSet, builtin_packs, markers_of
from snapana.analysis.attribution.facts import workload_rules_out
from snapana.analysis.attribution.families import WORKLOADS, families_with_lifetime
from snapana.analysis.attribution.pack_parser import KNOB_COSTS, Knob
from snapana.analysis.attribution.stack import import_path
from snapana.analysis.scaling_file import same_setting, same_step

#: the workloads a knob may be limited to (the vocabulary's)
TRAINING, INFERENCE = WORKLOADS

if TYPE_CHECKING:
    from snapana.analysis.evidence import JobEvidence

__all__ = [
    "COST_WORDS",
    "KNOB_COSTS",
    "Knob",
    "best_knob",
    "can_release",
    "fold_twins",
    "frees_in_phase",
    "framework_markers",
    "frameworks_in",
    "knobs_for",
    "load_knobs",
    "preference",
    "reloads_offloaded",
    "replay_candidates",
    "stop_knob",
    "transient_families",
    "twin_words",
    "working_set_families",
    "undetermined_families",
    "why_applies",
    "workload_condition",
]

_ALWAYS = ("pytorch", "any")
"""Knobs of these frameworks apply to every capture (and rank after a framework's own)."""

#: What each cost class means to the reader (KNOB_COSTS, cheapest first).
COST_WORDS = {"free": "no cost", "compute": "extra compute",
              "communication": "extra communication", "quality": "may change results"}
_COST_RANK = {c: i for i, c in enumerate(KNOB_COSTS)}


def working_set_families() -> frozenset[str]:
    """Families of the operation in flight: they cannot go, only shrink."""
    return families_with_lifetime("working_set")


def undetermined_families() -> frozenset[str]:
    """Families known by where they were made, not by what they are for."""
    return families_with_lifetime("undetermined")


def transient_families() -> frozenset[str]:
    """Families one step builds and drops again: a knob can make them go."""
    return families_with_lifetime("transient")


def load_knobs(rules: RuleSet | None = None) -> tuple[Knob, ...]:
    """Every knob of the loaded packs (the built-in ones without ``rules``), in load order."""
    if rules is not None:
        return rules.knobs
    return tuple(k for p in builtin_packs() for k in p.knobs)


def framework_markers(rules: RuleSet | None = None) -> dict[str, tuple[str, ...]]:
    """Framework -> the path fragments whose presence in a frame shows it in use."""
    return rules.markers if rules is not None else markers_of(builtin_packs())


def frameworks_in(filenames: list[str], rules: RuleSet | None = None) -> set[str]:
    """The frameworks a capture's frames come from (so only their knobs are suggested)."""
    markers = framework_markers(rules)
    paths = [import_path(f.replace("\\", "/")) for f in filenames]
    return {name for name, parts in markers.items()
            if any(part in p for p in paths for part in parts)}


def can_release(family: str, frameworks: set[str], rules: RuleSet | None = None,
                workload: str | None = None, ev: JobEvidence | None = None) -> bool:
    """A family of model state can go only if a knob of a framework in use moves it off the
    GPU (offload); resharding (TP) shrinks it but does not make it go."""
    allowed = frameworks | set(_ALWAYS)
    return any(family in k.families and k.direction == "releases" and not k.phases
               and _applies(k, allowed, None, True, workload, ev, [family])
               for k in load_knobs(rules))


def frees_in_phase(family: str, phase: str, frameworks: set[str],
                   rules: RuleSet | None = None, workload: str | None = None,
                   ev: JobEvidence | None = None) -> bool:
    """A knob meant for this phase frees the family outright (last step's gradients freed
    before the forward: ``zero_grad(set_to_none=True)``): it can go, not only by offloading."""
    allowed = frameworks | set(_ALWAYS)
    return any(family in k.families and k.direction == "releases" and phase in k.phases
               and _applies(k, allowed, phase, True, workload, ev, [family])
               for k in load_knobs(rules))


def _offloads_model_state(knob: Knob) -> bool:
    """A knob that moves model state (a family without a lifetime) off the GPU."""
    lived = transient_families() | working_set_families() | undetermined_families()
    return knob.direction == "releases" and any(f not in lived for f in knob.families)


def _applies(knob: Knob, allowed: set[str], phase: str | None, offload: bool,
             workload: str | None = None, ev: JobEvidence | None = None,
             families: list[str] | None = None) -> bool:
    """A knob of a framework in use, for this phase and what the capture does (`workload`,
    None: not known, any); with ``offload=False`` not one that offloads model state
    (releasing an engine's KV cache is still offered). Given the job's evidence `ev`, its
    declared preconditions must hold too (`why_applies`)."""
    return (knob.framework in allowed and (not knob.phases or phase in knob.phases)
            and (offload or not _offloads_model_state(knob))
            and (workload in (None, "undetermined") or not knob.workload
                 or knob.workload == workload)
            and (ev is None or why_applies(knob, ev, families or []) is not None))


def workload_condition(knob: Knob, answer: str | None) -> str:
    """The condition a knob made for one workload is offered on where the workload is not
    known ("only if this job is not trained": inference_mode would break a trained forward),
    else ""."""
    if not knob.workload or answer not in (None, "undetermined"):
        return ""
    return "only if this job " + ("trains" if knob.workload == "training" else "is not trained")


def why_applies(knob: Knob, ev: JobEvidence, families: list[str]) -> str | None:
    """Why `knob` acts on this job, from the evidence (None: a precondition fails). A
    framework's knob needs that framework in the frames of the blocks it targets (the
    `families` it is offered for, else any family it names); `requires` facts must hold,
    `unless` facts must not, `unless_set` settings must not be on already; where the
    workload is not decided, no fact may rule out the one the knob is made for
    (``[workload_rules_out]``: a backward with nothing that trains rules out training)."""
    reasons = _reasons(knob, ev, families)
    return None if reasons is None else "; ".join(r for _, r in reasons)


#: What a reason of `_reasons` says: the frames that own a targeted family, a fact, a
#: setting not on, the workload, or (none of those) the families it acts on.
Reason = tuple[str, str]


def _reasons(knob: Knob, ev: JobEvidence, families: list[str]) -> list[Reason] | None:
    """`why_applies`'s reasons, each with its kind (`Reason`); None: a precondition fails."""
    reasons: list[Reason] = []
    if knob.framework not in _ALWAYS and knob.framework in ev.marked and knob.families:
        targets = [f for f in knob.families if f in families] or list(knob.families)
        owned = [(f, ev.owners.get(f, {}).get(knob.framework)) for f in targets]
        shown = [(f, w) for f, w in owned if w]
        if not shown:
            return None
        reasons.append(("owner", f"{shown[0][0]} blocks at {shown[0][1]}"))
    for fact in knob.requires:
        if fact not in ev.facts:
            return None
        reasons.append(("fact", ev.facts[fact]))
    if any(fact in ev.facts for fact in knob.unless):
        return None
    for key in knob.unless_set:
        if ev.is_set(key):
            return None
        reasons.append(("setting", f"{key} is not set" if ev.settings is not None
                        else f"{key} not recorded as set"))
    answer = ev.workload.answer
    if knob.workload:
        if answer in (None, "undetermined"):
            if ev.facts.keys() & workload_rules_out().get(knob.workload, frozenset()):
                return None  # undecided, but the evidence rules this workload out
            reasons.append(("workload", workload_condition(knob, answer)))
        elif ev.workload.evidence:
            reasons.append(("workload", f"{answer}: {ev.workload.evidence[0]}"))
    if not reasons:
        acting = [f for f in knob.families if f in families] or list(knob.causes)
        reasons.append(("families", f"this job's {', '.join(acting)}" if acting else
                        "a family it names is held"))
    return reasons


def fold_twins(knobs: list[Knob]) -> tuple[list[Knob], dict[str, tuple[Knob, ...]]]:
    """One entry per mechanism: a generic knob whose mechanism a framework's knob of the same
    list switches on (`scaling.toml [[same_step]]`: Megatron's --recompute-granularity for
    activation checkpointing, the Trainer's use_liger_kernel for a fused cross-entropy), or
    an engine's knob that a wrapper's knob of the same list sets (`[[same_setting]]`:
    ms-swift's --vllm_gpu_memory_utilization is vLLM's gpu_memory_utilization), is
    folded into that framework's knob (the first linked one listed), which keeps its name and
    how-to and takes the better of the two places. Returns the list and, per framework knob
    id, the generic knobs folded into it."""
    link = {**same_step(), **same_setting()}
    offered = {k.id for k in knobs}
    into: dict[str, Knob] = {}  # generic id -> the framework's knob it is folded into
    for k in knobs:
        generic = link.get(k.id)
        if generic in offered and generic not in into:
            into[generic] = k
    out: list[Knob] = []
    folded: dict[str, tuple[Knob, ...]] = {}
    for k in knobs:
        entry = into.get(k.id, k)
        if entry is not k:
            folded[entry.id] = (*folded.get(entry.id, ()), k)
        if entry not in out:
            out.append(entry)
    return out, folded


def twin_words(knob: Knob, generics: tuple[Knob, ...], ev: JobEvidence,
               families: list[str]) -> str:
    """What a generic knob folded into `knob` (`fold_twins`) said that the framework's own
    reasons do not: the figures of its evidence (activation checkpointing's "saved
    activations from 8 sites") and the families of `families` it names beyond the
    framework's knob, as "the same mechanism as ID: ..."; "" where it said nothing more
    (the workload and a bare list of families are the summary's, or the framework's)."""
    own = {r for _, r in _reasons(knob, ev, families) or []}
    out = []
    for g in generics:
        extra = [r for kind, r in _reasons(g, ev, families) or []
                 if kind not in ("workload", "families") and r not in own]
        also = [f for f in g.families if f in families and f not in knob.families]
        if also:
            extra.append(f"it acts on {', '.join(also)} too")
        if extra:
            out.append(f"the same mechanism as {g.id}: {'; '.join(extra)}")
    return "; ".join(out)


def knobs_for(families: list[str], causes: list[str], frameworks: set[str],
              phase: str | None, rules: RuleSet | None = None, *,
              offload: bool = True, workload: str | None = None,
              ev: JobEvidence | None = None,
              bytes_of: Mapping[str, int] | None = None) -> list[Knob]:
    """Knobs acting on the given families (in that order of importance) or causes. With
    `bytes_of` (family -> bytes held, where no failed request orders them), a knob that
    lowers before one that only bounds, then the cheapest cost class, then the knob acting on
    the most bytes.

    ``offload=False`` leaves out knobs that offload model state: an OOM raised while
    reloading offloaded state must not be told to offload (that is the path that failed)."""
    allowed = frameworks | set(_ALWAYS)
    chosen: list[Knob] = []
    for knob in load_knobs(rules):
        if not _applies(knob, allowed, phase, offload, workload, ev, families):
            continue
        if set(knob.families) & set(families) or set(knob.causes) & set(causes):
            chosen.append(knob)

    def rank(k: Knob) -> tuple[bool | int, ...]:
        """Where the workload is not known, an inference-only knob last (it would break a
        trained forward); then the most important family first; then a framework's own
        knob before a generic one, a knob that lowers before one that only bounds, and a
        targeted knob first."""
        fam = min((families.index(f) for f in k.families if f in families), default=99)
        cause = min((causes.index(c) for c in k.causes if c in causes), default=99)
        inference_only_first = (workload in (None, "undetermined")
                                and k.workload == "inference")
        if bytes_of is not None and k.families:
            acted = sum(bytes_of.get(f, 0) for f in k.families if f in families)
            # a knob whose precondition names the bytes it removes (fused attention: the
            # score matrices) is ranked by those, not by its families' whole
            named = [ev.fact_bytes[f] for f in k.requires if ev and f in ev.fact_bytes]
            acted = min(named) if named else acted
            return (inference_only_first, k.direction == "bounds",
                    _COST_RANK.get(k.cost, len(KNOB_COSTS)), -acted, k.framework in _ALWAYS,
                    len(k.families))
        # a knob made for the very phase the request failed in (a log-prob pass's own
        # token budget) before those acting on every pass
        for_phase = bool(k.phases) and phase in k.phases
        return (inference_only_first, False, 0, min(fam, cause), not for_phase,
                k.framework in _ALWAYS, k.direction == "bounds", len(k.families))

    return sorted(chosen, key=rank)


def replay_candidates(families: list[str], frameworks: set[str], phase: str | None,
                      rules: RuleSet | None = None, *, offload: bool = True,
                      workload: str | None = None,
                      ev: JobEvidence | None = None) -> list[Knob]:
    """Knobs the replay of the recorded window decides (`Knob.replay_decides`): every
    precondition but the facts that only argue the replay's answer holds (a framework in use,
    the phase, the workload, `unless`, a setting not already on), whatever those facts and
    the causes say. Offered only where the replay shows the recorded OOM goes away."""
    allowed = frameworks | set(_ALWAYS)
    out = []
    for knob in load_knobs(rules):
        if not knob.replay_decides:
            continue
        assumed = ev if ev is None else replace(ev, facts={
            **ev.facts, **{f: "decided by the replay" for f in knob.replay_decides}})
        if _applies(knob, allowed, phase, offload, workload, assumed, families):
            out.append(knob)
    return out


def preference(k: Knob) -> tuple[bool, bool, int, int]:
    """A framework's own knob before a generic one, one that lowers (or releases) before one
    that only bounds, then the cheapest (`KNOB_COSTS` order), then a targeted one (fewer
    families)."""
    return (k.framework in _ALWAYS, k.direction == "bounds",
            _COST_RANK.get(k.cost, len(KNOB_COSTS)), len(k.families))


def reloads_offloaded(phase_rule_id: str | None) -> bool:
    """The phase rule that named the OOM's phase marks reloading offloaded state: packs name
    such rules ``<pack>.phase_reload_*`` (verl, ms-swift: load_megatron_model_to_gpu). An
    offload knob is then not offered (that is the path that failed)."""
    return phase_rule_id is not None and \
        phase_rule_id.rsplit(".", 1)[-1].startswith("phase_reload")


def best_knob(family: str, frameworks: set[str], phase: str | None,
              rules: RuleSet | None = None, *, offload: bool = True,
              workload: str | None = None, ev: JobEvidence | None = None) -> Knob | None:
    """The knob to name for `family`: of a framework in use, lowering, releasing or bounding
    it, first by `preference`."""
    allowed = frameworks | set(_ALWAYS)
    acting = [k for k in load_knobs(rules) if family in k.families
              and k.direction in ("lowers", "releases", "bounds")
              and _applies(k, allowed, phase, offload, workload, ev, [family])
              and not (workload in (None, "undetermined") and k.workload == "inference")]
    return min(acting, key=preference) if acting else None


def stop_knob(family: str, frameworks: set[str], phase: str | None,
              rules: RuleSet | None = None, *, offload: bool = True,
              workload: str | None = None, ev: JobEvidence | None = None) -> Knob | None:
    """The knob that stops a family from accumulating live copies: the cheapest one that
    lowers (or releases) it; a knob that only bounds it (chunk size, token budget) lowers
    the size of each copy, not how many are kept. None when no framework in use has one.
    First by `preference`."""
    allowed = frameworks | set(_ALWAYS)
    acting = [k for k in load_knobs(rules) if family in k.families
              and k.direction in ("lowers", "releases")
              and _applies(k, allowed, phase, offload, workload, ev, [family])
              and not (workload in (None, "undetermined") and k.workload == "inference")]
    return min(acting, key=preference) if acting else None
