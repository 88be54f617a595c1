"""Autocast's weight copies, found by their size relation to the parameters held with them.

Why: under ``torch.autocast`` each op on the lower-precision list casts its fp32 weight
through ``at::autocast::cached_cast`` (aten/src/ATen/autocast_mode.cpp), which keeps the cast
of a leaf tensor that requires grad (a parameter) until the outermost context exits
(torch/amp/autocast_mode.py ``__exit__``). A forward's stack cannot tell such a copy from an
activation (the module's forward calls the op either way), but its size can: one block per
weight, the weight's bytes over the dtype ratio. Sizes alone can coincide (batch × seq =
hidden / 2 gives every fp32 activation [b, s, n] the bytes of a bf16 copy of an [h, n]
weight), so the cast's place in the op is asked too: autocast casts an op's arguments and then
runs it in one call (autocast_mode.h ``WrapFunction_::call``), so the allocation right after a
copy is made at the same call site (the op's output, or another argument's cast). The
conclusion and its words are data (``inference.toml`` ``[weight_copies]``); this module only
matches sizes and that pairing.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from snapana.analysis.attribution.inference_schema import CopySpec, inference_file


def spec() -> CopySpec:
    """The weight-copy signature, read once."""
    return inference_file().weight_copies


@dataclass(frozen=True)
class Row:
    """What the matcher reads of one live block."""

    size: int  # the requested size (the tensor's bytes)
    family: str
    phase: str
    made_in_window: bool  # an alloc event exists: the recorded forward made it
    cpp: bool  # its stack records C++ frames
    cast: bool  # ... and the cast's own frame is among them
    follows: bool  # the device's next allocation was made at its (recorded) Python call site
    #: a trace's record of the cast that made it (op, the op's argument positions whose dims
    #: the cast's input has, that input's bytes); None where no op cast made it
    op_cast: tuple[str, tuple[int, ...], int] | None = None


def _weighs(r: Row, s: CopySpec) -> bool:
    """A block the copies are sized against: a parameter, or (`held_unknown`) a block held
    since before recording that nothing named (the weights of a model whose sizes the window
    also allocates stay unknown; a copy cast from it is what says it is a weight)."""
    return r.family in s.weight_families or (
        s.held_unknown and r.family == "unknown" and not r.made_in_window)


def _op_weight(r: Row, s: CopySpec, ratio: int) -> int:
    """The bytes of the weight a trace records this block was cast from (0 when not one):
    the cast copied the op's weight argument, no other argument of the same dims, and the
    block is the weight's bytes over `ratio`."""
    if r.op_cast is None:
        return 0
    op, at, weight = r.op_cast
    ok = len(at) == 1 and at[0] in s.op_weights.get(op, ()) and r.size * ratio == weight
    return weight if ok else 0


def _op_copies(rows: Sequence[Row], s: CopySpec, candidates: list[int]) -> dict[int, str]:
    """Copies sized against the op's own record of its weight (a trace, no parameter block):
    every candidate cast from a weight argument, at least `min_copies` of them."""
    for ratio in s.ratios:
        copies = [i for i in candidates if _op_weight(rows[i], s, ratio)]
        if len(copies) < s.min_copies:
            continue
        out = {}
        for i in copies:
            op, at, weight = rows[i].op_cast or ("", (0,), 0)
            out[i] = s.op_why.format(arg=at[0], op=op, weight=weight, ratio=ratio,
                                     matched=len(copies),
                                     follows=s.follows_words if s.op_follows else "")
        return out
    return {}


def find(rows: Sequence[Row]) -> dict[int, str]:
    """Row index -> the reason, for each block that is one of autocast's weight copies;
    nothing when the set does not show the signature (most weights' bytes copied). With no
    parameter block held (a trace made after the model was built), or where a trace records
    its casts, the trace's own record of each cast (`Row.op_cast`) sizes the copies."""
    s = spec()
    params = Counter(r.size for r in rows if _weighs(r, s))
    # a block held since before recording that nothing named weighs in the share only where
    # a copy is cast from it: optimizer moments are held unnamed too (a training step's), and
    # counted whole they would hide the copies of every weight
    named = Counter(r.size for r in rows if r.family in s.weight_families)
    candidates = [i for i, r in enumerate(rows)
                  if r.family in s.from_families and r.phase in s.phases and r.made_in_window
                  and r.size > 0 and (r.cast or not r.cpp) and (r.follows or not s.op_follows)]
    # a trace's own record of each cast is the stronger evidence: a trace whose counter
    # starts above zero (memory held before it, by the job or an earlier capture) shows a
    # held block that is no weight
    if not params or any(r.op_cast is not None for r in rows):
        by_op = _op_copies(rows, s, candidates)
        if by_op or not params:
            return by_op
    by_size: dict[int, list[int]] = {}
    for i in candidates:
        by_size.setdefault(rows[i].size, []).append(i)
    for ratio in s.ratios:
        copies: list[int] = []
        for size, found in by_size.items():
            # one copy per parameter of the size: more candidates than weights is an
            # activation of a coincidental size among them, and which one is not known
            if 0 < len(found) <= params.get(size * ratio, 0):
                copies.extend(found)
        cast_from = {rows[i].size * ratio for i in copies}
        param_bytes = sum(size * n for size, n in params.items()
                          if size in named or size in cast_from)
        covered = sum(rows[i].size * ratio for i in copies) / param_bytes \
            if param_bytes else 0.0
        if len(copies) < s.min_copies or covered < s.min_param_share:
            continue
        out: dict[int, str] = {}
        for i in copies:
            out[i] = s.why.format(ratio=ratio, matched=len(copies), covered=covered,
                                  params=sum(params.values()),
                                  cast=s.cast_words if rows[i].cast else "",
                                  follows=s.follows_words if s.op_follows else "")
        return out
    return {}
