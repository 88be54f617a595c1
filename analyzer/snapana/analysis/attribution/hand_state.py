"""Parameters and optimizer state that the program made itself, found by size and lifetime.

Why: a program that writes its own modules (``nn.Parameter(torch.empty(...))`` in its own
``__init__``) and its own optimizer (``torch.zeros_like(p)`` in its own ``step``) leaves no
library frame on those allocations, so the rules call them the program's own tensors. Their
structure still shows what they are: the backward allocates one gradient per parameter, of
the parameter's bytes; what the program made before the first gradient and keeps, one per
gradient of a size, is the parameters; what it made after (in its step) and keeps, the same
number per parameter for every size, is the optimizer's state. The conclusions and words are
data (``inference.toml`` ``[hand_state]``); this module only counts.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

from snapana.analysis.attribution.inference import _raw


@dataclass(frozen=True)
class Spec:
    """The ``[hand_state]`` table of inference.toml."""

    from_families: frozenset[str]
    min_share: float
    min_sizes: int
    param_method: str
    param_why: str
    state_method: str
    state_why: str
    per_parameter: dict[int, str]


@lru_cache(maxsize=1)
def spec() -> Spec:
    """The hand-written state's signature, read once."""
    t = _raw()["hand_state"]
    return Spec(frozenset(t["from_families"]), float(t["min_share"]), int(t["min_sizes"]),
                t["param_method"], t["param_why"], t["state_method"], t["state_why"],
                {int(k): v for k, v in t["per_parameter"].items()})


@dataclass(frozen=True)
class Row:
    """What the matcher reads of one live block."""

    size: int  # the requested size (the tensor's bytes)
    family: str  # what the rules (and earlier inference) gave it
    born: int  # its allocation event, -1: none (before recording)
    kept: bool  # the window never frees it


@dataclass(frozen=True)
class Found:
    family: str
    method: str
    why: str


def find(rows: Sequence[Row], gradients: Counter[int], first: int) -> dict[int, Found]:
    """Row index -> the conclusion, for the program's own blocks that are parameters or
    optimizer state; `gradients`: the most gradients of each size alive at once in the
    window, `first`: the event of its first gradient allocation (-1: none)."""
    s = spec()
    total = sum(gradients.values())
    if first < 0 or not total:
        return {}
    mine = [i for i, r in enumerate(rows) if r.family in s.from_families and r.kept
            and r.born >= 0 and r.size in gradients]
    named = Counter(r.size for r in rows if r.family == "parameters")
    out: dict[int, Found] = {}
    early: dict[int, list[int]] = {}
    for i in mine:
        if rows[i].born < first:
            early.setdefault(rows[i].size, []).append(i)
    params = {size: found for size, found in early.items()
              if len(found) <= gradients[size] - named[size]}
    matched = sum(len(v) for v in params.values())
    if len(params) >= s.min_sizes and matched >= s.min_share * total:
        why = s.param_why.format(first=first, matched=matched, sizes=len(params),
                                 gradients=total)
        out |= {i: Found("parameters", s.param_method, why)
                for found in params.values() for i in found}
    late: dict[int, list[int]] = {}
    for i in mine:
        if rows[i].born > first:
            late.setdefault(rows[i].size, []).append(i)
    per = {len(found) / gradients[size] for size, found in late.items()}
    if len(per) != 1:
        return out  # no one count per parameter: not one optimizer's state
    k = per.pop()
    matched = sum(len(v) for v in late.values())
    covered = sum(gradients[size] for size in late)
    if (k not in s.per_parameter or len(late) < s.min_sizes
            or covered < s.min_share * total):
        return out
    why = s.state_why.format(per=int(k), matched=matched, sizes=len(late), params=covered,
                             first=first, what=s.per_parameter[int(k)])
    return out | {i: Found("optimizer_state", s.state_method, why)
                  for found in late.values() for i in found}
