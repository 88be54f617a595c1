"""A forward's outputs that the program keeps, with no autograd graph behind them.

Why: a block a module's forward made and that is still live is taken for an activation saved
for a backward (`pytorch.module_forward`). That holds where a graph keeps it: a forward run
with grad enabled saves, in every layer, the inputs of its linears, norms and activations, so
what it keeps comes from many sites per layer. A forward run under ``torch.no_grad`` (or with
nothing requiring grad) frees each layer's tensors once used; what survives it is what the
program itself holds: the outputs a forward hook appends to a list, a returned output. Those
come from one site, call after call, where a graph keeps at least two per layer (an op's
input is the op before it's output). So the forwards reached from one call path into the
model (the program's frames outside the outermost module call) that keep blocks of nested
modules from `max_kept_sites` site(s) only, over many blocks, kept no graph. The
conclusion and its words are data (``inference.toml`` ``[kept_outputs]``); this module only
matches the pattern.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from snapana.analysis.attribution.families import workload_marks
from snapana.analysis.attribution.inference_schema import KeptSpec, inference_file
from snapana.model import Frame


def spec() -> KeptSpec:
    """The kept-outputs signature, read once."""
    return inference_file().kept_outputs


@dataclass(frozen=True)
class Call:
    """Where a stack enters the model: its program's frames outside the outermost module
    call (as an id: one call path), the outermost module's forward, and how many module
    calls deep the allocation was made."""

    entry: tuple[Frame, ...]
    top: tuple[str, str]
    depth: int


def module_call(stack: tuple[Frame, ...]) -> Call | None:
    """The module call a stack (innermost first) was made under; None: none."""
    s = spec()
    calls = [i for i, f in enumerate(stack)
             if f[0].replace("\\", "/").endswith(s.module_file) and f[1] in s.module_calls]
    if not calls:
        return None
    outer = calls[-1]
    inner = [f for f in stack[:outer]
             if not f[0].replace("\\", "/").endswith(s.module_file)]
    if not inner:
        return None
    depth = sum(1 for i in calls if stack[i][1] == s.module_calls[0])
    return Call(tuple(f for f in stack[outer + 1:] if f[0].endswith(".py")),
                (inner[-1][0], inner[-1][1]), depth)


@dataclass(frozen=True)
class Row:
    """What the matcher reads of one live block."""

    family: str
    phase: str
    site: str
    call: Call | None


def find(rows: Sequence[Row]) -> dict[int, str]:
    """Row index -> the reason, for each block a forward made that the program keeps with no
    graph: per call path into the model, the forward's live blocks come from at most
    `max_kept_sites` sites of nested modules, and there are at least `min_blocks`."""
    s = spec()
    families, phases = workload_marks()
    if any(r.family in families or r.phase in phases for r in rows):
        # a backward's or a step's blocks are held: what a forward keeps is its graph's
        return {}
    by_entry: dict[tuple[Frame, ...], list[tuple[int, Call]]] = {}
    for i, r in enumerate(rows):
        if r.call is not None and r.phase in s.phases and r.site:
            by_entry.setdefault(r.call.entry, []).append((i, r.call))
    out: dict[int, str] = {}
    for made in by_entry.values():
        idx = [i for i, _ in made]
        sites = sorted({rows[i].site for i in idx})
        if (len(idx) < s.min_blocks or len(sites) > s.max_kept_sites
                or any(rows[i].family not in s.from_families for i in idx)
                or min(c.depth for _, c in made) < s.min_depth):
            continue
        why = s.why.format(blocks=len(idx), site=", ".join(sites))
        out.update(dict.fromkeys(idx, why))
    return out
