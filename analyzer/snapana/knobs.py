"""The knob table (data/knobs.toml): which setting changes which family or cause."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

KNOBS_FILE = Path(__file__).parent / "data" / "knobs.toml"


@dataclass(frozen=True)
class Knob:
    id: str
    framework: str
    knob: str
    families: tuple[str, ...]
    causes: tuple[str, ...]
    direction: str
    effect: str
    caveat: str
    phases: tuple[str, ...]


@lru_cache(maxsize=1)
def _table() -> dict:
    with KNOBS_FILE.open("rb") as fh:
        return tomllib.load(fh)


def working_set_families() -> frozenset[str]:
    return frozenset(_table().get("families", {}).get("working_set", ()))


def transient_families() -> frozenset[str]:
    return frozenset(_table().get("families", {}).get("transient", ()))


def load_knobs() -> tuple[Knob, ...]:
    raw = _table()
    return tuple(
        Knob(
            id=k["id"], framework=k["framework"], knob=k["knob"],
            families=tuple(k.get("families", ())), causes=tuple(k.get("causes", ())),
            direction=k.get("direction", ""), effect=k.get("effect", ""),
            caveat=k.get("caveat", ""), phases=tuple(k.get("phases", ())),
        )
        for k in raw["knob"]
    )


_ALWAYS = ("pytorch", "any")


def frameworks_in(filenames: list[str]) -> set[str]:
    """The frameworks a capture's frames come from (so only their knobs are suggested)."""
    markers = _table().get("frameworks", {})
    paths = [f.replace("\\", "/") for f in filenames]
    return {name for name, parts in markers.items()
            if any(part in p for p in paths for part in parts)}


def can_release(family: str, frameworks: set[str]) -> bool:
    """A family of model state can go only if a knob of a framework in use moves it off the
    GPU (offload); resharding (TP) shrinks it but does not make it go."""
    allowed = frameworks | set(_ALWAYS)
    return any(family in k.families and k.framework in allowed and k.direction == "releases"
               for k in load_knobs())


def knobs_for(families: list[str], causes: list[str], frameworks: set[str],
              phase: str | None) -> list[Knob]:
    """Knobs acting on the given families (in that order of importance) or causes."""
    allowed = frameworks | set(_ALWAYS)
    chosen: list[Knob] = []
    for knob in load_knobs():
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
