"""The inference stage: families for blocks that no frame rule decides, from evidence other
than their stack. It runs after the rules, only on blocks they leave `unknown` for lack of
frames, and never overrules a rule; when the evidence is weak the block stays `unknown`.

Methods (conclusions and wording in packs/inference.toml):
- size mirror: in a training capture, gradients are allocated during recording with exactly
  the sizes of the parameters, and AdamW-style optimizer state has two tensors per parameter
  of the same size. Blocks alive before recording whose requested sizes match the gradients'
  one for one are the parameters (and, two more per size, the optimizer state).
- lifetime: in a capture with no gradients (inference), blocks alive before recording that
  the whole recorded window never frees are the model's weights and buffers.
Only blocks that the recorded window never frees are candidates: a window with gradients in
it holds a backward, which frees the activations saved before recording began; what
survives it is model state. A size with more such blocks than a parameter and two states
per gradient could explain is left unknown.
"""

from __future__ import annotations

import sys
from collections import Counter
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import polars as pl

from snapana.replay import NEVER

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10 needs the ``tomli`` backport
    import tomli as tomllib

INFERENCE_FILE = Path(__file__).parent / "inference.toml"
MIRROR_FAMILIES = frozenset({"gradients"})  # what the recorded window shows per parameter
MIRRORED = frozenset({"parameters", "optimizer_state", "gradients", "unknown"})


@dataclass(frozen=True)
class Method:
    id: str
    family: str
    strength: int
    why: str
    freed_in_phase: str | None = None  # lifetime methods: the phase of the freeing stack
    if_function: tuple[str, ...] = ()  # ... with one of these functions on it
    unless_function: tuple[str, ...] = ()  # ... with none of these on it


@dataclass(frozen=True)
class Inferred:
    """The conclusion for one block: family, the method and the evidence in words."""

    family: str
    method: str
    why: str


@lru_cache(maxsize=1)
def _table() -> tuple[dict[str, Method], dict[str, Any]]:
    with INFERENCE_FILE.open("rb") as fh:
        raw = tomllib.load(fh)
    methods = {m["id"]: Method(m["id"], m["family"], int(m["strength"]), m["why"],
                               m.get("freed_in_phase"), tuple(m.get("if_function", ())),
                               tuple(m.get("unless_function", ())))
               for m in raw["method"]}
    return methods, dict(raw["limits"])


@dataclass(frozen=True)
class Evidence:
    """What the recorded window of one device says about the candidates' sizes."""

    gradient_sizes: Counter[int]  # requested bytes of gradient allocations
    other_sizes: frozenset[int]  # sizes frame rules gave to any other family
    recorded_allocs: int  # all allocations in the recorded window
    freed_share: float  # bytes the window frees / bytes it allocates: ~1 for a steady loop


def gather(gradients: dict[int, int], others: list[tuple[int, str]], recorded_allocs: int,
           freed_share: float) -> Evidence:
    """Evidence from recorded allocations of the candidates' sizes: how many gradients of
    each size were alive at once, and the (size, family) of the other allocations."""
    other_sizes = {size for size, family in others if family not in MIRRORED}
    return Evidence(Counter(gradients), frozenset(other_sizes), recorded_allocs, freed_share)


@dataclass(frozen=True)
class Freed:
    """How a candidate was freed in the recorded window: the freeing stack's phase, its
    function names and its site."""

    phase: str
    functions: frozenset[str]
    site: str


def infer(candidates: pl.DataFrame, evidence: Evidence,
          freed: dict[int, Freed] | None = None) -> dict[int, Inferred]:
    """Conclusions by address for `candidates`: blocks the rules left unknown for lack of
    frames (columns address, requested_size, alloc_idx, free_req_idx); `freed` tells, by
    address, how the window freed those it frees."""
    methods, limits = _table()
    out = _by_freeing_stack(candidates, freed or {}, methods)
    # alive before recording and never freed in the recorded window: model state, when the
    # window holds a backward (gradients) that freed the step's own activations
    before = candidates.filter((pl.col("alloc_idx") < 0) & (pl.col("free_req_idx") == NEVER))
    if before.is_empty():
        return out
    if evidence.gradient_sizes:
        return out | _mirror(before, evidence, methods, limits)
    return out | _persistent(before, evidence, methods, limits)


def _by_freeing_stack(candidates: pl.DataFrame, freed: dict[int, Freed],
                      methods: dict[str, Method]) -> dict[int, Inferred]:
    lifetime = [m for m in methods.values() if m.freed_in_phase is not None]
    out: dict[int, Inferred] = {}
    for address in candidates.filter(pl.col("alloc_idx") < 0)["address"].to_list():
        how = freed.get(int(address))
        if how is None:
            continue
        for m in lifetime:
            if (m.freed_in_phase == how.phase
                    and (not m.if_function or how.functions & set(m.if_function))
                    and not how.functions & set(m.unless_function)):
                out[int(address)] = Inferred(m.family, m.id, m.why.format(site=how.site))
                break
    return out


def _mirror(before: pl.DataFrame, ev: Evidence, methods: dict[str, Method],
            limits: dict[str, Any]) -> dict[int, Inferred]:
    by_size: dict[int, list[int]] = {}
    for address, size in before.sort("address").select("address", "requested_size").iter_rows():
        by_size.setdefault(int(size), []).append(int(address))
    usable = {s: addrs for s, addrs in by_size.items()
              if s in ev.gradient_sizes and len(addrs) <= 3 * ev.gradient_sizes[s]}
    matched = sum(len(a) for a in usable.values())
    if (matched < limits["min_mirror_share"] * before.height
            or len(usable) < limits["min_distinct_sizes"]):
        return {}
    words = {"matched": matched, "candidates": before.height,
             "gradients": sum(ev.gradient_sizes.values())}
    param, state = methods["size-mirror:gradients"], methods["size-mirror:optimizer"]
    out: dict[int, Inferred] = {}
    for size, addrs in usable.items():
        n_params = min(len(addrs), ev.gradient_sizes[size])
        for i, a in enumerate(addrs):
            m = param if i < n_params else state
            out[a] = Inferred(m.family, m.id, m.why.format(**words))
    return out


def _persistent(before: pl.DataFrame, ev: Evidence, methods: dict[str, Method],
                limits: dict[str, Any]) -> dict[int, Inferred]:
    # a steady loop (inference) frees what it allocates; a window that ends mid-forward keeps
    # its activations, and then "never freed" says nothing about being a weight
    if (ev.recorded_allocs < limits["min_recorded_allocs"]
            or ev.freed_share < limits["min_freed_share"]):
        return {}
    m = methods["lifetime:persistent"]
    why = m.why.format(recorded=ev.recorded_allocs)
    return {int(a): Inferred(m.family, m.id, why) for a in before["address"].to_list()}
