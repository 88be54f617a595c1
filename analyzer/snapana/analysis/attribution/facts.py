"""Facts a capture's frames show about the job (an optimizer stepped, a backward ran, a
serving engine or a process group is in use), each with the workload it speaks for. The facts
are data (``evidence.toml`` beside this module), read once; a knob's ``requires`` / ``unless``
name them (checked when a pack loads), and `analysis.evidence` decides the workload from them.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

import msgspec

from snapana import data_file
from snapana.model import Frame, is_python_file


class FactPattern(data_file.Table, frozen=True, kw_only=True):
    """A frame that shows a fact (an entry of `frames` / `of_blocks`)."""

    file: str = ""  # a path fragment ("" : any file)
    functions: tuple[str, ...] = ()  # glob patterns on the function name (empty: any)
    user_code: bool = False  # only frames outside installed libraries


class FactSpec(data_file.Table, frozen=True, kw_only=True):
    """One fact of ``evidence.toml``: frames that show it, and the workload it speaks for."""

    id: str
    says: Literal["training", "inference", "autograd", ""] = ""  # "" : none
    words: str
    frames: tuple[FactPattern, ...]
    annotations: tuple[str, ...] = ()  # glob patterns on annotation names
    weak: bool = False  # speaks for a workload only where no other fact does
    #: frames of the blocks the fact speaks for: it holds only when most of their bytes show
    #: it in their own frames (a no_grad decorator speaks for the forward that ran inside it,
    #: not for another one); empty: the fact is the capture's
    of_blocks: tuple[FactPattern, ...] = ()
    seen_as: str = ""  # with `of_blocks`: what a frame showing it is, in words
    #: facts of which one must hold too before this one speaks for its workload (it says
    #: only what it adds to them); empty: it speaks alone
    only_with: tuple[str, ...] = ()
    #: facts of which none may hold for this one to speak (zero_grad says nothing of a graph
    #: the window dropped unused)
    unless_with: tuple[str, ...] = ()


class FactLimits(data_file.Table, frozen=True, kw_only=True):
    """``[limits]``: the weak facts' thresholds (comments in the file) and the path
    fragments of installed libraries."""

    long_life_events: int
    forward_allocations: int
    kept_share: float
    freed_allocations: int
    freed_share_max: float
    dropped_share: float
    of_blocks_share: float
    library_paths: tuple[str, ...]


class HalfWeights(data_file.Table, frozen=True, kw_only=True):
    """``[half_weights]``: the C++ frames that name the dtype a matmul ran in, and the
    autocast cast that would make a 16-bit matmul of fp32 weights (comments in the file)."""

    half_gemm: str  # regex on a C++ frame's function: a 16-bit cuBLAS matmul
    other_gemm: str  # ... one in 32 or 64 bits
    autocast: str  # ... autocast's cast of an operand
    autocast_file: str  # a Python frame's path fragment: autocast's own module
    min_allocations: int  # recorded allocations under 16-bit matmuls, at least


class WorkloadWords(data_file.Table, frozen=True, kw_only=True):
    """``[workload]``: what the workload statement adds in words of its own."""

    autograd_only: str


@data_file.schema("analysis/attribution/evidence.toml")
class EvidenceFile(data_file.Table, frozen=True, kw_only=True):
    workload: WorkloadWords
    #: workload -> facts that, where the workload is not decided, rule out its knobs
    workload_rules_out: dict[str, tuple[str, ...]]
    fact: tuple[FactSpec, ...]
    limits: FactLimits
    half_weights: HalfWeights


@lru_cache(maxsize=1)
def _file() -> EvidenceFile:
    return data_file.packaged("analysis/attribution/evidence.toml", EvidenceFile)


def half_weights() -> HalfWeights:
    """What shows a window's matmuls ran 16-bit weights (``[half_weights]``)."""
    return _file().half_weights


def _spec() -> tuple[tuple[FactSpec, ...], tuple[str, ...]]:
    return _file().fact, _file().limits.library_paths


@lru_cache(maxsize=1)
def fact_limits() -> dict[str, float]:
    """The numeric limits of ``evidence.toml`` (the weak facts' thresholds)."""
    return {k: v for k, v in msgspec.structs.asdict(_file().limits).items()
            if isinstance(v, int | float)}


@dataclass(frozen=True)
class ComputedFact:
    """A fact computed from the allocator state, not matched on frames: `analysis.evidence`
    sets it by this object's ``id`` (never by a literal), so the list a knob's
    `requires` / `unless` is checked against and documented from is the code's own."""

    id: str
    means: str


FREE_SEGMENTS = ComputedFact(
    "free_segments", "a segment holds no live block, so empty_cache() has something to give "
    "back")
SEVERAL_DEVICES = ComputedFact(
    "several_devices", "more than one device of the process holds memory")
OPTIMIZER_STATE = ComputedFact(
    "optimizer_state", "an optimizer, torch.optim's or the program's own, keeps state on the "
    "device: blocks of that family")
STRANDED_CACHE = ComputedFact(
    "stranded_cache", "most of the cached-but-unallocated bytes lie inside segments that also "
    "hold live blocks: what expandable segments avoid, and what empty_cache() cannot give back")
LAYERED_ACTIVATIONS = ComputedFact(
    "layered_activations", "saved activations held from at least two sites: there is a block "
    "boundary to checkpoint at (one op's output is its own checkpoint)")
SCOPED_ELSEWHERE = ComputedFact(
    "scoped_elsewhere", "a fact scoped to blocks (`of_blocks`, such as a no_grad decorator) "
    "was seen, but not in the frames of most of the blocks it would speak for: it does not "
    "hold, and this says where it was seen")
OWN_OPTIMIZER_STEP = ComputedFact(
    "own_optimizer_step", "the optimizer update temporaries held were made by the program's "
    "own code, not a library's")

SCORE_MATRICES = ComputedFact(
    "score_matrices", "blocks held at the moment are the [batch, heads, seq, seq] score "
    "matrices of an unfused attention, found as `whatif --scale` finds them (scaling.toml "
    "[[scores]]): what fused attention never materialises")

RETURNED_KV_CACHE = ComputedFact(
    "returned_kv_cache", "blocks held at the moment are the key / value pairs a forward made "
    "one per layer (the attention's own tensors, or a cache layer's own update) and returns "
    "as past_key_values (inference.toml [kv_pairs]), or one fused query/key/value "
    "projection output per layer whose key and value views it returns ([kv_pairs.fused]), "
    "and nothing "
    "shows a decoding loop (`decoding_facts`: generate()) that would grow them: a forward "
    "that does not generate need not keep them")

HALF_PRECISION_WEIGHTS = ComputedFact(
    "half_precision_weights", "the recorded window's cuBLAS matmuls all ran in 16 bits (their "
    "C++ frames name the dtype: evidence.toml [half_weights]) and no autocast frame shows: "
    "without autocast a matmul runs in its weight's dtype, so the weights are 16-bit already")

AUTOGRAD_RAN = ComputedFact(
    "autograd_ran", "a backward ran or torch.autograd.grad was called (a fact, a family or a "
    "phase that speaks for autograd, not only a forward that kept its graph): the job needs "
    "autograd, so inference_mode would break it")

COMPUTED_FACTS: tuple[ComputedFact, ...] = (
    FREE_SEGMENTS, SEVERAL_DEVICES, OPTIMIZER_STATE, STRANDED_CACHE, LAYERED_ACTIVATIONS,
    SCOPED_ELSEWHERE, OWN_OPTIMIZER_STEP, SCORE_MATRICES, RETURNED_KV_CACHE,
    HALF_PRECISION_WEIGHTS, AUTOGRAD_RAN)


def workload_words() -> dict[str, str]:
    """What a workload statement adds in words of its own (``[workload]`` of
    ``evidence.toml``)."""
    return msgspec.structs.asdict(_file().workload)


def workload_rules_out() -> dict[str, frozenset[str]]:
    """Workload -> the facts that, where the workload is not decided, rule out the knobs made
    for it (``[workload_rules_out]`` of ``evidence.toml``)."""
    return {k: frozenset(v) for k, v in _file().workload_rules_out.items()}


def fact_ids() -> tuple[str, ...]:
    """Every fact a knob's `requires` / `unless` may name: those of ``evidence.toml`` and
    the ones computed from the allocator state (`COMPUTED_FACTS`)."""
    return tuple(f.id for f in _spec()[0]) + tuple(f.id for f in COMPUTED_FACTS)


def _matches(p: FactPattern, frame: Frame, library: tuple[str, ...]) -> bool:
    path = frame[0].replace("\\", "/")
    if not is_python_file(path):
        return False
    if p.file and p.file not in path:
        return False
    if p.user_code and any(lib in path for lib in library):
        return False
    return not p.functions or any(fnmatch.fnmatchcase(frame[1], g) for g in p.functions)


def is_library(path: str) -> bool:
    """The file is an installed library's (or the standard library's), not the program's."""
    return any(lib in path for lib in _spec()[1])


def frame_place(frame: Frame) -> str:
    path = frame[0].replace("\\", "/")
    for cut in ("site-packages/", "dist-packages/"):
        if cut in path:
            path = path.split(cut, 1)[1]
    return f"{path}:{frame[1]}"


def shown_at(patterns: tuple[FactPattern, ...], stack: tuple[Frame, ...]) -> str | None:
    """Where `stack` (innermost first) shows one of `patterns`: the frame the matching one
    called (a decorator's wrapper calls the decorated function), else the match; None: it
    does not."""
    library = _spec()[1]
    for i, frame in enumerate(stack):
        if any(_matches(p, frame, library) for p in patterns):
            return frame_place(stack[i - 1] if i else frame)
    return None


def seen_facts(frames: Iterable[Frame], annotations: Iterable[str] = ()) -> dict[str, str]:
    """Fact id -> the first frame (or annotation) that shows it."""
    specs, library = _spec()
    out: dict[str, str] = {}
    seen: set[tuple[str, str]] = set()
    for frame in frames:
        key = (frame[0], frame[1])  # the line plays no part: each (file, function) once
        if key in seen:
            continue
        seen.add(key)
        for f in specs:
            if f.id not in out and any(_matches(p, frame, library) for p in f.frames):
                out[f.id] = frame_place(frame)
    for name in dict.fromkeys(annotations):
        for f in specs:
            if f.id not in out and any(fnmatch.fnmatchcase(name, g) for g in f.annotations):
                out[f.id] = f"annotation {name!r}"
    return out

def fact_specs() -> tuple[FactSpec, ...]:
    return _spec()[0]
