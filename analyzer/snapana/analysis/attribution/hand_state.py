"""Parameters and optimizer state that the program made itself, found by size and lifetime.

Why: a program that writes its own modules (``nn.Parameter(torch.empty(...))`` in its own
``__init__``) and its own optimizer (``torch.zeros_like(p)`` in its own ``step``) leaves no
library frame on those allocations, so the rules call them the program's own tensors. Their
structure still shows what they are: the backward allocates one gradient per parameter, of
the parameter's bytes; what the program made before the first gradient and keeps, one per
gradient of a size, is the parameters; what it made after (in its step) and keeps, the same
number per parameter for every size, is the optimizer's state. A parameter re-bound every
step by an out-of-place update (``p.data = p - lr * g``) is made in the step, and the block it
replaces (a chain of such replacements that began with a block made before the first
gradient) is freed in the same step by the same function: that pair, one per gradient of a
size, is a parameter too. The conclusions and words are data (``inference.toml``
``[hand_state]``); this module only counts.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from snapana.analysis.attribution.inference_schema import HandStateSpec as Spec
from snapana.analysis.attribution.inference_schema import inference_file


def spec() -> Spec:
    """The hand-written state's signature, read once."""
    return inference_file().hand_state


@dataclass(frozen=True)
class Row:
    """What the matcher reads of one live block."""

    size: int  # the requested size (the tensor's bytes)
    family: str  # what the rules (and earlier inference) gave it
    born: int  # its allocation event, -1: none (before recording)
    kept: bool  # the window never frees it
    rule: str = ""  # the rule that named it ("" none)
    #: the allocation event of the block its chain of same-step replacements began with
    #: (`rebound_roots`; -1: before recording), None: it replaced no block
    root: int | None = None
    replaced: bool = False  # a later step made a block in its place (`rebound_roots`)


@dataclass(frozen=True)
class Event:
    """What `rebound_roots` reads of one allocation or free of the trace."""

    pos: int  # its index in the device's trace
    alloc: bool  # an allocation, else a free
    address: int
    size: int
    gradient: bool  # an allocation the rules call a gradient
    function: tuple[str, str] | None  # its stack's innermost Python (file, function)


def rebound_roots(events: Iterable[Event]) -> tuple[dict[int, int], frozenset[int]]:
    """Allocation event -> the allocation event its chain of replacements began with (-1:
    before recording), for each allocation that replaced a same-size block in one step, and
    the allocation events of the blocks so replaced. A replacement is made
    after a gradient, when a block made before that gradient (not a gradient) is freed by
    the same function with no gradient made between (an out-of-place update allocates the
    new tensor, then rebinding frees the old); each free pairs with the latest such
    allocation still alive and unpaired."""
    alive: dict[int, tuple[int, bool]] = {}  # address -> (allocation event, a gradient)
    waiting: dict[tuple[int, tuple[str, str]], dict[int, None]] = {}
    where: dict[int, tuple[int, tuple[str, str]]] = {}  # allocation event -> its key
    root: dict[int, int] = {}
    replaced: set[int] = set()
    last_gradient = -1
    for e in events:
        if e.alloc:
            alive[e.address] = (e.pos, e.gradient)
            if e.gradient:
                last_gradient = e.pos
                waiting.clear()
                where.clear()
            elif last_gradient >= 0 and e.function is not None:
                key = (e.size, e.function)
                waiting.setdefault(key, {})[e.pos] = None
                where[e.pos] = key
            continue
        born, gradient = alive.pop(e.address, (-1, False))
        if born in where:  # a temporary of the step: it replaced nothing
            waiting[where.pop(born)].pop(born, None)
            continue
        if gradient or born >= last_gradient or e.function is None:
            continue
        new = waiting.get((e.size, e.function))
        if new:
            made = next(reversed(new))
            del new[made]
            del where[made]
            root[made] = root.get(born, born) if born >= 0 else -1
            replaced.add(born)
    return root, frozenset(replaced)


@dataclass(frozen=True)
class Found:
    family: str
    method: str
    why: str


def _rebound(rows: Sequence[Row], gradients: Counter[int], first: int,
             named: Counter[int]) -> dict[int, Found]:
    """The blocks the program's step made in place of a same-size block whose chain of
    replacements began with a block made before the first gradient, kept until a later step
    replaces them in turn (or to the window's end), at most one per gradient of a size:
    parameters re-bound by an out-of-place update."""
    s = spec()
    by_size: dict[int, list[int]] = {}
    for i, r in enumerate(rows):
        if ((r.kept or r.replaced) and r.born > first and r.root is not None
                and 0 <= r.root < first
                and r.size in gradients
                and (r.family in s.from_families or r.rule in s.rebound_rules)):
            by_size.setdefault(r.size, []).append(i)
    # one per parameter: a block and the one made to replace it (both held while the
    # update runs) are one chain, one parameter
    params = {size: found for size, found in by_size.items()
              if len({rows[i].root for i in found}) <= gradients[size] - named[size]}
    matched = sum(len(v) for v in params.values())
    total = sum(gradients.values())
    if len(params) < s.min_sizes or matched < s.min_share * total:
        return {}
    out: dict[int, Found] = {}
    for found in params.values():
        for i in found:
            why = s.rebound_why.format(born=rows[i].born, root=rows[i].root, first=first,
                                       matched=matched, sizes=len(params), gradients=total)
            out[i] = Found("parameters", s.rebound_method, why)
    return out


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
    out = _rebound(rows, gradients, first, named)
    mine = [i for i in mine if i not in out]
    named += Counter(rows[i].size for i in out)
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
    per_parameter = {int(n): what for n, what in s.per_parameter.items()}
    if (k not in per_parameter or len(late) < s.min_sizes
            or covered < s.min_share * total):
        return out
    why = s.state_why.format(per=int(k), matched=matched, sizes=len(late), params=covered,
                             first=first, what=per_parameter[int(k)])
    return out | {i: Found("optimizer_state", s.state_method, why)
                  for found in late.values() for i in found}


# --- state the program's own step replaces out of place -----------------------------------

@dataclass(frozen=True)
class Made(Event):
    """What `state_updates` reads of one allocation or free of the trace: an `Event` (its
    `gradient` unused) with its whole stack's functions."""

    calls: frozenset[tuple[str, str]]  # every Python (file, function) on its stack
    own: bool  # that innermost Python frame is the program's own (not a library's)


@dataclass(frozen=True)
class Update:
    """One block the program's step made in place of an older one of its size."""

    size: int
    start: int  # the first allocation of its size in the run under the replacing function
    new: int  # the allocation event of the new block
    old: int  # the allocation event of the block it replaced (-1: before recording)
    freed: int  # the event that freed the old block
    root: int  # the allocation event its chain of replacements began with


def state_updates(events: Iterable[Made]) -> list[Update]:
    """The out-of-place updates of the trace: a function of the program's own frees a block
    of a size right after it allocated a new one of that size (no allocation of the size
    between: the rebinding `K[i] = h * K[i] + ...` frees the old tensor once the new one is
    made), and the freed block is older than the run of allocations of its size made under
    that function (so not one of the update's own temporaries)."""
    alive: dict[int, int] = {}  # address -> allocation event
    made: dict[int, list[tuple[int, frozenset[tuple[str, str]]]]] = {}  # size -> allocations
    last: dict[int, Made] = {}  # size -> its latest allocation
    root: dict[int, int] = {}
    out: list[Update] = []
    for e in events:
        if e.alloc:
            alive[e.address] = e.pos
            made.setdefault(e.size, []).append((e.pos, e.calls))
            last[e.size] = e
            continue
        born = alive.pop(e.address, -1)
        new = last.get(e.size)
        if (new is None or e.function is None or new.function != e.function or not new.own
                or not e.own or alive.get(new.address) != new.pos or born >= new.pos):
            continue
        runs = made[e.size]
        k = len(runs) - 1
        while k > 0 and e.function in runs[k - 1][1]:
            k -= 1
        start = runs[k][0]
        if born >= start:
            continue  # one of the update's temporaries
        del last[e.size]
        root[new.pos] = root.get(born, born)
        out.append(Update(e.size, start, new.pos, born, e.pos, root[new.pos]))
    return out


def update_roles(rows: Sequence[Row], updates: Sequence[Update], params: Counter[int]
                 ) -> dict[int, Found]:
    """Row index -> the conclusion, for the program's own blocks an out-of-place state
    update made: the new state (its family kept: the program's own) and the temporaries
    made in the update's run and freed by the window. Only where the updates replace, over
    at least `min_sizes` sizes of the parameters (`params`: their sizes held), at most one
    chain per parameter of a size: state kept per parameter, the optimizer's."""
    s = spec()
    chains: dict[int, set[int]] = {}
    for u in updates:
        if u.size in params:
            chains.setdefault(u.size, set()).add(u.root)
    if len(chains) < s.min_sizes or any(len(c) > params[n] for n, c in chains.items()):
        return {}
    by_size: dict[int, list[Update]] = {}
    for u in updates:
        if u.size in chains:
            by_size.setdefault(u.size, []).append(u)
    news = {u.new: u for u in updates if u.size in chains}
    out: dict[int, Found] = {}
    total = sum(len(c) for c in chains.values())
    for i, r in enumerate(rows):
        if r.family not in s.from_families or r.born < 0:
            continue
        made = news.get(r.born)
        if made is not None and made.size == r.size:
            out[i] = Found(r.family, s.update_method, s.update_new_why.format(
                born=r.born, old=made.old, freed=made.freed, sizes=len(chains), chains=total))
            continue
        hit = next((u for u in by_size.get(r.size, ()) if u.start <= r.born <= u.freed),
                   None)
        if hit is not None and not r.kept:
            out[i] = Found(s.update_family, s.update_method, s.update_temp_why.format(
                born=r.born, start=hit.start, freed=hit.freed, old=hit.old,
                sizes=len(chains), chains=total))
    return out
