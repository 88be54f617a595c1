"""The inference stage: families for blocks that no frame rule decides, from evidence other
than their stack. It runs after the rules, only on blocks they leave `unknown` for lack of
frames, and never overrules a rule; when the evidence is weak the block stays `unknown`.

Methods (conclusions and wording in packs/inference.toml):
- size mirror: in a training capture, gradients are allocated during recording with exactly
  the sizes of the parameters, and AdamW-style optimizer state has two tensors per parameter
  of the same size. Blocks alive before recording whose requested sizes match the gradients'
  one for one are the parameters (and, two more per size, the optimizer state).
- state mirror: in a window with a backward, the optimizer state that frames name counts
  the parameters (its distinct allocation stacks per size are its tensors per parameter);
  frameless blocks never freed, of those sizes, as many as the parameters or twice as many,
  are the parameters (and their gradients, kept since before recording: a backward that
  accumulates into an existing .grad keeps no gradient of its own to mirror).
- lifetime: in a capture with no gradients (inference), blocks alive before recording that
  the whole recorded window never frees are the model's weights and buffers, when they
  repeat in size like a layered model's weights (a standalone op's kept inputs and cuBLAS
  workspace do not) or the source records them only as one total.
Only blocks that the recorded window never frees are candidates: a window with gradients in
it holds a backward, which frees the activations saved before recording began; what
survives it is model state. A size with more such blocks than a parameter and two states
per gradient could explain is left unknown.
- window: blocks alive before recording that no gradient mirrors are named by what the
  window does with them. A window with no backward and no optimizer step whose stacks show
  it runs without autograd (`[[no_grad]]` in the table) saved nothing for a backward, so the
  blocks it inherited and keeps are the model's weights; so are they in a recorded forward
  window that allocates none of their sizes (a forward it continued would allocate its
  activations' sizes again in later layers); a window with a backward frees the
  activations saved before it, so what survives it unmirrored is frozen weights. Both name
  only sizes that repeat like a layered model's weights and that the window never allocates
  for another family; the same sizes with the same lifetimes get the same family whatever
  the precision or the moment recording began.
- autograd thread: allocations without Python frames (the autograd thread) in a window with
  a backward, never freed, whose sizes mirror blocks held since before recording, are the
  gradients; they join the gradient evidence the mirror uses.
Every candidate no method names keeps `unknown`, labelled with what is known about it
(persistent since before recording, freed in the window, likely the model's weights, ...).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import Any

import msgspec
import polars as pl

from snapana.analysis.attribution.families import parameter_mirrors
from snapana.analysis.attribution.inference_schema import inference_file
from snapana.analysis.replay import NEVER


@dataclass(frozen=True)
class Method:
    id: str
    family: str
    strength: int
    why: str
    freed_in_phase: str | None = None  # lifetime methods: the freeing stack's phase ("any")
    if_function: tuple[str, ...] = ()  # ... with one of these functions on it
    unless_function: tuple[str, ...] = ()  # ... with none of these on it
    in_window: bool = False  # lifetime methods: also for frameless allocations of the window


@dataclass(frozen=True)
class Inferred:
    """The conclusion for one block: family, the method and the evidence in words. Family
    `unknown` with no method is a label: what is known about a block no method names."""

    family: str
    method: str
    why: str


@lru_cache(maxsize=1)
def _table() -> tuple[dict[str, Method], dict[str, Any]]:
    raw = inference_file()
    methods = {m.id: Method(m.id, m.family, m.strength, m.why, m.freed_in_phase,
                            m.if_function, m.unless_function, m.in_window)
               for m in raw.method}
    return methods, msgspec.structs.asdict(raw.limits)


def _labels() -> dict[str, str]:
    return dict(inference_file().label)


@dataclass(frozen=True)
class Transient:
    """A family whose blocks, when freed in the same run of `phase` that allocated them, are
    that phase's working set: they become `becomes`, and `why` says so."""

    family: str
    phase: str
    becomes: str
    label: str
    why: str


@lru_cache(maxsize=1)
def transient_rules() -> tuple[Transient, ...]:
    return tuple(Transient(t.family, t.phase, t.becomes, t.label, t.why)
                 for t in inference_file().transient)


def engines() -> dict[str, str]:
    """Serving engines: pack name -> the engine's name (inference.toml `[engines]`)."""
    return dict(inference_file().engines)


def no_grad_markers() -> tuple[tuple[str, str], ...]:
    """(file suffix, function) of frames that show a stack runs without autograd."""
    return tuple((m.file, m.function) for m in inference_file().no_grad)


@dataclass(frozen=True)
class Evidence:
    """What the recorded window of one device says about the candidates' sizes."""

    gradient_sizes: Counter[int]  # requested bytes of gradient allocations
    other_sizes: frozenset[int]  # sizes frame rules gave to any other family
    recorded_allocs: int  # all allocations in the recorded window
    freed_share: float  # bytes the window frees / bytes it allocates: ~1 for a steady loop
    backward: bool = False  # the window shows a backward or an optimizer step
    no_grad_site: str = ""  # a site whose stack runs without autograd ("" when none)
    other_family: Mapping[int, str] = field(default_factory=dict)  # size -> a family it got
    #: the optimizer created its state while recording (framed optimizer_state blocks): a
    #: block held since before recording began is none of it
    state_in_window: bool = False
    #: (requested size, family) -> blocks at the moment that rules or frames already give a
    #: model-state family (parameters, optimizer_state, gradients)
    named: Counter[tuple[int, str]] = field(default_factory=Counter)
    #: requested size -> distinct stacks of the optimizer_state blocks frames name at the
    #: moment: the state tensors per parameter (Adam: exp_avg, exp_avg_sq)
    state_stacks: Mapping[int, int] = field(default_factory=dict)
    #: requested size -> blocks held since before recording that the window's optimizer
    #: steps freed (`lifetime:freed-by-optimizer-step`), all of them, not only those left at
    #: the moment: the state from before recording, which a step that updates out of place
    #: replaces one parameter at a time
    replaced_state: Counter[int] = field(default_factory=Counter)
    #: the serving engine whose frames the capture holds (inference.toml `engines`), "" none:
    #: what it held before recording is its weights and its pre-sized KV-cache pool
    engine: str = ""
    #: the event of the window's first gradient allocation (its first backward), -1: none;
    #: what the program's own code made before it and keeps is made at or before the model
    first_gradient: int = -1
    #: the source records what was live before recording as one total (a profiler trace's
    #: `Total Allocated`), not tensor by tensor: no sizes to read a model's shape from
    held_as_total: bool = False
    #: sizes of gradients the window made and freed inside the backward run that made them,
    #: none of that size kept past it (`gradient_sizes` counts only kept ones): an
    #: activation's gradient, or one added in place to a .grad that exists; none is a
    #: parameter's .grad to mirror
    freed_gradient_sizes: frozenset[int] = frozenset()


def gather(gradients: dict[int, int], others: list[tuple[int, str]], recorded_allocs: int,
           freed_share: float, backward: bool = False, no_grad_site: str = "",
           state_in_window: bool = False) -> Evidence:
    """Evidence from recorded allocations of the candidates' sizes: how many gradients of
    each size were alive at once, and the (size, family) of the other allocations (live
    blocks with frames whose allocation fell out of the trace count as allocations too)."""
    mirrors = parameter_mirrors()
    other = {size: family for size, family in others if family not in mirrors}
    return Evidence(Counter(gradients), frozenset(other), recorded_allocs, freed_share,
                    backward or bool(gradients), no_grad_site, other, state_in_window)


@dataclass(frozen=True)
class Freed:
    """How a candidate was freed in the recorded window: the freeing stack's phase, its
    function names and its site."""

    phase: str
    functions: frozenset[str]
    site: str


def infer(candidates: pl.DataFrame, evidence: Evidence,
          freed: dict[int, Freed] | None = None, label: bool = True) -> dict[int, Inferred]:
    """Conclusions by address for `candidates`: blocks the rules left unknown for lack of
    frames (columns address, requested_size, alloc_idx, free_req_idx); `freed` tells, by
    address, how the window freed those it frees. With `label` (a capture that recorded a
    trace), candidates no method names get a label (family `unknown`, no method); without a
    trace the rules' "no allocation history was recorded" is all there is to say."""
    methods, limits = _table()
    out = _by_freeing_stack(candidates, freed or {}, methods)
    # alive before recording and never freed in the recorded window: model state, when the
    # window holds a backward (gradients) that freed the step's own activations
    before = candidates.filter((pl.col("alloc_idx") < 0) & (pl.col("free_req_idx") == NEVER))
    if not before.is_empty():
        grads = _autograd_persistent(candidates, before, evidence, methods)
        out |= grads
        if grads:
            more = Counter(int(s) for s in candidates.filter(
                pl.col("address").is_in(list(grads)))["requested_size"].to_list())
            evidence = replace(evidence, gradient_sizes=evidence.gradient_sizes + more,
                               backward=True)
        out |= _model_state(before, evidence, methods, limits)
    if not label:
        return out | _no_history(before, evidence, limits)
    return out | _label(candidates, out, evidence, freed or {}, limits)


def _no_history(before: pl.DataFrame, ev: Evidence,
                limits: dict[str, Any]) -> dict[int, Inferred]:
    """Without a trace nothing says what a block was; when the blocks repeat in size like a
    layered model's weights, their label says so (they stay unknown)."""
    sizes, words = _layered(before, ev, limits, by_bytes=True)
    if not sizes:
        return {}
    why = _labels()["no_history_layered"].format(**words)
    return {int(a): Inferred("unknown", "", why) for a in before.filter(
        pl.col("requested_size").is_in(list(sizes)))["address"].to_list()}


def _model_state(before: pl.DataFrame, ev: Evidence, methods: dict[str, Method],
                 limits: dict[str, Any]) -> dict[int, Inferred]:
    """Parameters (and optimizer state) among the blocks alive since before recording."""
    kept = _kept_gradients(before, ev, methods) if ev.backward else {}
    if kept:  # the rest is decided without them
        before = before.filter(~pl.col("address").is_in(list(kept)))
    named = _more_model_state(before, ev, methods, limits)
    if ev.backward:  # what the window's gradients leave unexplained, the named state may
        rest = before.filter(~pl.col("address").is_in(list(named)))
        named |= _state_mirror(rest, ev, methods, limits)
    return kept | named


def _state_mirror(before: pl.DataFrame, ev: Evidence, methods: dict[str, Method],
                  limits: dict[str, Any]) -> dict[int, Inferred]:
    """In a window with a backward, frameless blocks of the sizes of the optimizer state that
    frames name: per size, the state's distinct stacks are its tensors per parameter
    (exp_avg, exp_avg_sq: two), so the state counts the parameters; as many blocks are the
    parameters, twice as many the parameters and their gradients, kept since before
    recording (the backward accumulates into an existing .grad and allocates none that
    lives). Any other count says nothing."""
    by_size = _by_size(before)
    found: dict[int, tuple[int, list[int]]] = {}
    # one optimizer keeps as many tensors per parameter for every size: a size whose state
    # only the replaced blocks show takes the count its named state shows for the others
    per_parameter = max(ev.state_stacks.values(), default=0)
    for size, addrs in by_size.items():
        replaced = ev.replaced_state[size]
        stacks = ev.state_stacks.get(size, 0) or (per_parameter if replaced else 0)
        state = max(ev.named[(size, "optimizer_state")], replaced)
        if not stacks or state % stacks:
            continue
        params = state // stacks - ev.named[(size, "parameters")]
        # gradients frames already name leave fewer of the size to be kept gradients
        kept = max(0, params - ev.named[(size, "gradients")])
        if params > 0 and len(addrs) in (params, params + kept):
            found[size] = (params, addrs)
    matched = sum(len(a) for _, a in found.values())
    if (matched < limits["min_mirror_share"] * before.height
            or len(found) < limits["min_distinct_sizes"]):
        return {}
    param, grad = methods["state-mirror:parameters"], methods["state-mirror:gradients"]
    labels = _labels()
    out: dict[int, Inferred] = {}
    for size, (params, addrs) in found.items():
        named = ev.named[(size, "optimizer_state")]
        replaced = ev.replaced_state[size] > named
        words = {"state": max(named, ev.replaced_state[size]),
                 "per": ev.state_stacks.get(size, 0) or per_parameter, "params": params,
                 "whence": labels["state_replaced" if replaced else "state_named"]}
        for i, a in enumerate(addrs):
            m = param if i < params else grad
            out[a] = Inferred(m.family, m.id, m.why.format(**words))
    return out


def _more_model_state(before: pl.DataFrame, ev: Evidence, methods: dict[str, Method],
                      limits: dict[str, Any]) -> dict[int, Inferred]:
    if ev.engine and not ev.backward:
        # a serving engine sized its KV cache at start-up, in per-layer tensors that repeat
        # and persist like weights: nothing here tells one from the other (a label says so)
        return {}
    if ev.gradient_sizes:
        frozen = _window(before, ev, methods, limits, "lifetime:frozen-weights")
        rest = before.filter(~pl.col("address").is_in(list(frozen)))
        return frozen | _mirror(rest, ev, methods, limits)
    if ev.backward:
        return {}  # parameters, kept gradients and optimizer state look alike: a label
    steady = _persistent(before, ev, methods, limits)
    if steady:
        return steady
    if ev.no_grad_site:
        return _window(before, ev, methods, limits, "lifetime:persistent-no-grad")
    if ev.recorded_allocs >= limits["min_forward_allocs"]:
        return _window(before, ev, methods, limits, "lifetime:persistent-forward")
    return {}


def freed_as(how: Freed, window: bool, methods: dict[str, Method] | None = None
             ) -> Method | None:
    """The lifetime method that names a frameless block from the stack that freed it
    (`window`: allocated in the recorded window, else before it); None: none does."""
    for m in (methods or _table()[0]).values():
        if (m.freed_in_phase in (how.phase, "any") and (m.in_window or not window)
                and (not m.if_function or how.functions & set(m.if_function))
                and not how.functions & set(m.unless_function)):
            return m
    return None


def _by_freeing_stack(candidates: pl.DataFrame, freed: dict[int, Freed],
                      methods: dict[str, Method]) -> dict[int, Inferred]:
    lifetime = {k: m for k, m in methods.items() if m.freed_in_phase is not None}
    words = _labels()
    out: dict[int, Inferred] = {}
    for address, alloc_idx in candidates.select("address", "alloc_idx").iter_rows():
        how = freed.get(int(address))
        if how is None:
            continue
        window = alloc_idx is not None and alloc_idx >= 0
        origin = words["origin_window" if window else "origin_before"]
        m = freed_as(how, window, lifetime)
        if m is not None:
            out[int(address)] = Inferred(m.family, m.id,
                                         m.why.format(site=how.site, origin=origin))
    return out


def _mirror(before: pl.DataFrame, ev: Evidence, methods: dict[str, Method],
            limits: dict[str, Any]) -> dict[int, Inferred]:
    by_size = _by_size(before)
    usable = {s: addrs for s, addrs in by_size.items()
              if s in ev.gradient_sizes and len(addrs) <= 3 * ev.gradient_sizes[s]}
    matched = sum(len(a) for a in usable.values())
    if (matched < limits["min_mirror_share"] * before.height
            or len(usable) < limits["min_distinct_sizes"]):
        return {}
    words = {"matched": matched, "candidates": before.height,
             "gradients": sum(ev.gradient_sizes.values())}
    param, state = methods["size-mirror:gradients"], methods["size-mirror:optimizer"]
    if ev.state_in_window:  # the extra blocks of a size predate the state: buffers
        state = methods["size-mirror:buffers"]
    out: dict[int, Inferred] = {}
    for size, addrs in usable.items():
        # per gradient of this size a parameter, then (Adam-like) state; parameters that
        # frames already name are not missing
        params = max(0, ev.gradient_sizes[size] - ev.named[(size, "parameters")])
        for i, a in enumerate(addrs):
            m = param if i < params else state
            out[a] = Inferred(m.family, m.id, m.why.format(**words))
    return out


def _by_size(before: pl.DataFrame) -> dict[int, list[int]]:
    """Requested size -> the addresses of the blocks of that size, in address order."""
    out: dict[int, list[int]] = {}
    for address, size in before.sort("address").select("address", "requested_size").iter_rows():
        out.setdefault(int(size), []).append(int(address))
    return out


def _kept_gradients(before: pl.DataFrame, ev: Evidence,
                    methods: dict[str, Method]) -> dict[int, Inferred]:
    """In a window with a backward: frameless blocks of a size whose parameters and their
    optimizer state (two per parameter) frames already name are those parameters'
    gradients, kept from a backward before recording (a ring buffer that lost their
    allocations), at most one per parameter."""
    m = methods["size-mirror:kept-gradients"]
    out: dict[int, Inferred] = {}
    by_size = _by_size(before)
    for size, addrs in by_size.items():
        params = ev.named[(size, "parameters")]
        room = params - ev.named[(size, "gradients")]
        if not params or ev.named[(size, "optimizer_state")] < 2 * params or \
                len(addrs) > room:
            continue
        out |= {a: Inferred(m.family, m.id, m.why.format(params=params)) for a in addrs}
    return out


def _layered(before: pl.DataFrame, ev: Evidence, limits: dict[str, Any],
             by_bytes: bool = False) -> tuple[frozenset[int], dict[str, Any]]:
    """The sizes among `before` that repeat like a layered model's weights (and that no
    gradient or other allocation of the window has), with the words that describe them;
    nothing when they do not make up such a model."""
    sizes = before["requested_size"].cast(pl.Int64).to_list()
    counts = Counter(sizes)
    # a half-precision parameter's fp32 master copy and optimizer state are `master_copy_ratio`
    # times its gradient's size: model state, but not a weight without a gradient
    doubled = {limits["master_copy_ratio"] * g for g in ev.gradient_sizes}
    repeated = frozenset(s for s, n in counts.items()
                         if n >= limits["min_layer_repeats"] and s not in doubled
                         and s <= limits["max_layer_weight"]
                         and s not in ev.gradient_sizes and s not in ev.other_sizes
                         and s not in ev.freed_gradient_sizes)
    held = sum(counts[s] for s in repeated)
    # of the blocks no gradient can mirror (those that can are the mirror's to explain)
    unmirrored = sum(n for s, n in counts.items() if s not in ev.gradient_sizes)
    # without history (`by_bytes`) nothing else weighs in, so the bytes must agree too: a few
    # repeated small sizes beside GiBs of others say nothing about the GiBs
    held_bytes = sum(s * counts[s] for s in repeated)
    unmirrored_bytes = sum(s * n for s, n in counts.items() if s not in ev.gradient_sizes)
    if (len(repeated) < limits["min_layer_sizes"]
            or held < limits["min_layer_share"] * max(unmirrored, 1)
            or (by_bytes and held_bytes < limits["min_layer_byte_share"]
                * max(unmirrored_bytes, 1))):
        return frozenset(), {}
    return repeated, {"sizes": len(repeated), "blocks": held, "share": held / unmirrored,
                      "site": ev.no_grad_site, "recorded": ev.recorded_allocs}


def _window(before: pl.DataFrame, ev: Evidence, methods: dict[str, Method],
            limits: dict[str, Any], method: str) -> dict[int, Inferred]:
    sizes, words = _layered(before, ev, limits)
    if not sizes:
        return {}
    m = methods[method]
    why = m.why.format(**words)
    return {int(a): Inferred(m.family, m.id, why) for a in before.filter(
        pl.col("requested_size").is_in(list(sizes)))["address"].to_list()}


def _autograd_persistent(candidates: pl.DataFrame, before: pl.DataFrame, ev: Evidence,
                         methods: dict[str, Method]) -> dict[int, Inferred]:
    """Frameless allocations of a window with a backward that it never frees, in sizes of
    blocks held since before recording: the gradients the autograd thread created."""
    if not ev.backward:
        return {}
    held = set(before["requested_size"].to_list())
    made = candidates.filter((pl.col("alloc_idx") >= 0) & (pl.col("free_req_idx") == NEVER)
                             & pl.col("requested_size").is_in(list(held)))
    if made.is_empty():
        return {}
    m = methods["lifetime:autograd-thread-persistent"]
    why = m.why.format(matched=made.height)
    return {int(a): Inferred(m.family, m.id, why) for a in made["address"].to_list()}


def _label(candidates: pl.DataFrame, named: dict[int, Inferred], ev: Evidence,
           freed: dict[int, Freed], limits: dict[str, Any]) -> dict[int, Inferred]:
    """What is known about each candidate no method names."""
    words = _labels()
    out: dict[int, Inferred] = {}
    # whether what the window keeps from before recording repeats in size like a layered
    # model's weights, whatever else the window allocates in those sizes
    before = candidates.filter((pl.col("alloc_idx") < 0) & (pl.col("free_req_idx") == NEVER))
    layered = bool(_layered(before, replace(ev, other_sizes=frozenset()), limits)[0])
    for address, size, alloc_idx, free_idx in candidates.select(
            "address", "requested_size", "alloc_idx", "free_req_idx").iter_rows():
        if int(address) in named:
            continue
        if alloc_idx is not None and alloc_idx >= 0:
            if not ev.backward:  # the rules' "a thread without a Python stack" says more
                out[int(address)] = Inferred("unknown", "", words["window_no_backward"])
            continue
        if free_idx is not None and free_idx < 0:
            continue  # freed before the first event (pending on a stream): the rules' words
        if free_idx is not None and free_idx != NEVER:
            how = freed.get(int(address))
            why = words["freed_in_window"].format(
                event=free_idx, site=how.site if how else "by a stack without frames")
        else:
            why = _persistent_words(candidates, int(size), ev, words, limits, layered)
        out[int(address)] = Inferred("unknown", "", why)
    return out


def _persistent_words(candidates: pl.DataFrame, size: int, ev: Evidence,
                      words: dict[str, str], limits: dict[str, Any], layered: bool) -> str:
    """The label of a block held since before recording and never freed, no method naming
    it: what the window did around it, and why it is not named (`layered`: the blocks held
    since before recording repeat in size like a layered model's weights; where they do
    not, nothing says they are weights rather than inputs the program keeps)."""
    if ev.engine and not ev.backward:
        return words["persistent_engine"].format(engine=ev.engine)
    other = ev.other_family.get(size)
    caveat = words["caveat_other_sizes"].format(family=other) if other is not None else ""
    if ev.backward and not ev.gradient_sizes and not ev.freed_gradient_sizes:
        return words["persistent_model_state"]
    if ev.backward:
        # a gradient of its size was kept: say why it does not mirror this block one for one
        # before any other caveat, or the words would deny that gradient
        mirrored = _mirror_caveat(candidates, size, ev, words)
        return words["persistent_training"].format(
            mirror=words["mirror_freed_inside" if size in ev.freed_gradient_sizes
                         else "mirror_none"],
            caveat=mirrored + caveat if size in ev.gradient_sizes else caveat or mirrored)
    if not ev.recorded_allocs and not ev.no_grad_site:
        return words["persistent_no_window"]
    if not layered:
        return words["persistent_kept"].format(caveat=caveat)
    if not caveat and ev.recorded_allocs and ev.freed_share < limits["min_freed_share"]:
        caveat = words["caveat_forward_keeps"].format(freed=ev.freed_share)
    return words["persistent_forward"].format(caveat=caveat or words["caveat_not_repeated"])


def _mirror_caveat(candidates: pl.DataFrame, size: int, ev: Evidence,
                   words: dict[str, str]) -> str:
    """Why a block held since before recording through a backward is not mirrored."""
    if size not in ev.gradient_sizes:
        return words["caveat_not_repeated"]
    same = candidates.filter((pl.col("requested_size") == size) & (pl.col("alloc_idx") < 0))
    if same.height > 3 * ev.gradient_sizes[size]:
        return words["caveat_too_many"]
    return words["caveat_mirror_thin"]


def _persistent(before: pl.DataFrame, ev: Evidence, methods: dict[str, Method],
                limits: dict[str, Any]) -> dict[int, Inferred]:
    # a steady loop (inference) frees what it allocates; a window that ends mid-forward keeps
    # its activations, and then "never freed" says nothing about being a weight
    if (ev.recorded_allocs < limits["min_recorded_allocs"]
            or ev.freed_share < limits["min_freed_share"]):
        return {}
    # never freed says "kept", not "a model": the kept blocks must repeat in size as a layered
    # model's weights do (a standalone op's inputs and its cuBLAS workspace, kept by the
    # program around a loop, do not), unless the source records what was live before it
    # began only as one total, whose size no tensor has (a profiler trace's baseline)
    sizes, words = _layered(before, ev, limits)
    if not sizes and not ev.held_as_total:
        return {}
    shape = _labels()["shape_layered" if sizes else "shape_total"].format(**words)
    m = methods["lifetime:persistent"]
    why = m.why.format(recorded=ev.recorded_allocs, shape=shape)
    return {int(a): Inferred(m.family, m.id, why) for a in before["address"].to_list()}
