"""Knobs: which setting changes which family or cause, and which frameworks a capture uses.

Knobs and detection markers are data in the framework packs (``[[knob]]`` entries and
``[pack] markers`` of ``attribution/packs/<framework>.toml``), read by the same pack loader
as the rules; which families are transient or a working set is the vocabulary's
(``lifetime`` in ``attribution/packs/vocabulary.toml``). Every function takes an optional
:class:`~snapana.attribution.RuleSet`: given one (``load_rules(["mine.toml"])``), the knobs
and markers of its user packs count too; without one, the built-in packs.
"""

from __future__ import annotations

from snapana.attribution.engine import RuleSet, builtin_packs, markers_of
from snapana.attribution.families import families_with_lifetime
from snapana.attribution.rules import KNOB_COSTS, Knob

__all__ = [
    "KNOB_COSTS",
    "Knob",
    "can_release",
    "framework_markers",
    "frameworks_in",
    "knobs_for",
    "load_knobs",
    "transient_families",
    "working_set_families",
]

_ALWAYS = ("pytorch", "any")
"""Knobs of these frameworks apply to every capture (and rank after a framework's own)."""


def working_set_families() -> frozenset[str]:
    """Families of the operation in flight: they cannot go, only shrink."""
    return families_with_lifetime("working_set")


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
    paths = [f.replace("\\", "/") for f in filenames]
    return {name for name, parts in markers.items()
            if any(part in p for p in paths for part in parts)}


def can_release(family: str, frameworks: set[str], rules: RuleSet | None = None) -> bool:
    """A family of model state can go only if a knob of a framework in use moves it off the
    GPU (offload); resharding (TP) shrinks it but does not make it go."""
    allowed = frameworks | set(_ALWAYS)
    return any(family in k.families and k.framework in allowed and k.direction == "releases"
               for k in load_knobs(rules))


def knobs_for(families: list[str], causes: list[str], frameworks: set[str],
              phase: str | None, rules: RuleSet | None = None) -> list[Knob]:
    """Knobs acting on the given families (in that order of importance) or causes."""
    allowed = frameworks | set(_ALWAYS)
    chosen: list[Knob] = []
    for knob in load_knobs(rules):
        if knob.framework not in allowed:
            continue
        if knob.phases and phase not in knob.phases:
            continue
        if set(knob.families) & set(families) or set(knob.causes) & set(causes):
            chosen.append(knob)

    def rank(k: Knob) -> tuple[int, int, int, int]:
        """Most important family first; then a framework's own knob before a generic one,
        a knob that lowers before one that only bounds, and a targeted knob first."""
        fam = min((families.index(f) for f in k.families if f in families), default=99)
        cause = min((causes.index(c) for c in k.causes if c in causes), default=99)
        return (min(fam, cause), k.framework in _ALWAYS, k.direction == "bounds",
                len(k.families))

    return sorted(chosen, key=rank)
