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
def load_knobs() -> tuple[Knob, ...]:
    with KNOBS_FILE.open("rb") as fh:
        raw = tomllib.load(fh)
    return tuple(
        Knob(
            id=k["id"], framework=k["framework"], knob=k["knob"],
            families=tuple(k.get("families", ())), causes=tuple(k.get("causes", ())),
            direction=k.get("direction", ""), effect=k.get("effect", ""),
            caveat=k.get("caveat", ""), phases=tuple(k.get("phases", ())),
        )
        for k in raw["knob"]
    )


#: Frameworks whose knobs apply wherever their rule pack matched. Megatron knobs also apply
#: to the RL frameworks built on it.
_IMPLIES = {"slime": ("megatron",), "ms_swift": ("megatron", "vllm", "ms-swift"),
            "verl": ("megatron", "fsdp"), "areal": ("sglang",)}
_ALWAYS = ("pytorch", "any")


def frameworks_from_rules(rule_ids: set[str]) -> set[str]:
    """The frameworks present in a capture, from the packs of the rules that matched."""
    found = {r.split(".", 1)[0] for r in rule_ids if r and "." in r}
    for f in list(found):
        found.update(_IMPLIES.get(f, ()))
    if "ms_swift" in found:
        found.add("ms-swift")
    return found


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

    def rank(k: Knob) -> tuple[int, int]:
        fam = min((families.index(f) for f in k.families if f in families), default=99)
        cause = min((causes.index(c) for c in k.causes if c in causes), default=99)
        return (min(fam, cause), 0 if k.direction != "bounds" else 1)

    return sorted(chosen, key=rank)
