"""A forward's returned KV cache, found by its shape in the allocation record.

Why: a causal LM called with ``use_cache=True`` keeps each decoder layer's key and value
states and returns them as ``past_key_values``. Where transformers' cache does not allocate
them itself (``cache_utils.py`` ``DynamicCache.update`` up to 4.55 appends the tensors it is
given on a layer's first call; older modeling files return ``present = (key, value)``), the
blocks are made by the attention's own projections and rotary embedding, so their frames
say "an activation of the forward". What tells them apart is the pattern: two sites each keep
one block per layer, of one size, made alternately, held together and freed together when
the output is dropped. From 4.56 the cache layer makes them itself (``DynamicLayer.update``:
``torch.cat``), its frame names them kv_cache, and `returned_by_update` says whether a forward
that does not generate returns them. Older modeling files of models with one fused
query/key/value projection (transformers 4.44 GPT-2's ``c_attn``, MPT's ``Wqkv``) return key
and value *views* of its output, so the cache is one block per layer, its query part
included: `find_fused` names those. The conclusions and their words are data
(``inference.toml`` ``[kv_pairs]``, ``[kv_pairs.fused]``); this module only matches the
patterns.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

from snapana.analysis.attribution.families import workload_marks
from snapana.analysis.attribution.inference_schema import PairSpec, inference_file


def spec() -> PairSpec:
    """The KV-pair signature, read once."""
    return inference_file().kv_pairs


@dataclass(frozen=True)
class Row:
    """What the matcher reads of one live block."""

    size: int  # the requested size (the tensor's bytes)
    family: str
    phase: str
    site: str  # '' where the stack has no Python frame: no site to count layers by
    alloc_idx: int  # -1: made before recording
    free_idx: int  # -1: not freed in the window
    #: its stack's code frames (the same for every layer's call of one module from the
    #: model's layer loop), as an id; -1 where not known
    path: int = -1


#: (first, last) event index -> how many allocations the device made strictly between them
AllocsBetween = Callable[[int, int], int]
#: (first, last) event index -> the sizes the device allocated strictly between them
SizesBetween = Callable[[int, int], Collection[int]]


def _alternate(a: list[int], b: list[int]) -> bool:
    """Allocation indices of two sites made one of each in turn (a pair per layer; the last
    layer's second block may be missing at a moment inside it)."""
    merged = sorted([(i, 0) for i in a] + [(i, 1) for i in b])
    first = merged[0][1]
    return all(s == (first + k) % 2 for k, (_, s) in enumerate(merged))


def _layered(rows: Sequence[Row]) -> dict[str, list[int]]:
    """Site -> its rows, for each site of the forward that keeps one block per layer (one
    size, one call path, at least `min_layers`); nothing when a backward's or a step's
    blocks are held or more sites keep a block per layer than a returned cache explains."""
    s = spec()
    families, phases = workload_marks()
    if any(r.family in families or r.phase in phases for r in rows):
        # a backward's or a step's blocks are held: the forward's kept pairs are what
        # autograd (or activation checkpointing) saved for it, not a returned cache
        return {}
    by_site: dict[str, list[int]] = {}
    for i, r in enumerate(rows):
        if (r.site and r.family in s.from_families and r.phase in s.phases
                and r.alloc_idx >= 0 and r.size > 0):
            by_site.setdefault(r.site, []).append(i)
    # one block per layer: every block of a site made by one call path (the layer loop's
    # line, the same in each layer); a site reached from two lines of a layer (a module
    # called twice per layer, as a norm before the attention and before the MLP) makes two
    # blocks per layer, which is no K or V
    layered = {site: idx for site, idx in by_site.items()
               if len(idx) >= s.min_layers and len({rows[i].size for i in idx}) == 1
               and len({rows[i].path for i in idx}) == 1}
    return layered if len(layered) <= s.max_kept_sites else {}


def _freed_words(rows: Sequence[Row], found: list[int],
                 allocs_between: AllocsBetween) -> str | None:
    """How the found blocks went: '' when the window records no free of them, the words
    of one burst when all were freed together (the returned output dropped), None when
    some went and some stayed, or others were allocated among their frees."""
    freed = [rows[i].free_idx for i in found]
    if all(f < 0 for f in freed):
        return ""
    if min(freed) < 0:  # some dropped, some kept: not one returned output
        return None
    lo, hi = min(freed), max(freed)
    if allocs_between(lo, hi):
        return None
    return spec().freed_words.format(span=hi - lo + 1)


def find(rows: Sequence[Row], allocs_between: AllocsBetween) -> dict[int, str]:
    """Row index -> the reason, for each block of a forward's returned K/V pairs; nothing
    when the live blocks do not show exactly one such pair of sites."""
    s = spec()
    layered = _layered(rows)
    sites = sorted(layered)
    pairs = [(a, b) for n, a in enumerate(sites) for b in sites[n + 1:]
             if rows[layered[a][0]].size == rows[layered[b][0]].size
             and abs(len(layered[a]) - len(layered[b])) <= 1
             and _alternate([rows[i].alloc_idx for i in layered[a]],
                            [rows[i].alloc_idx for i in layered[b]])]
    if len(pairs) != 1:  # none, or which two are K and V is not known
        return {}
    a, b = pairs[0]
    found = layered[a] + layered[b]
    words = _freed_words(rows, found, allocs_between)
    if words is None:
        return {}
    first, second = sorted((a, b), key=lambda site: min(rows[i].alloc_idx
                                                         for i in layered[site]))
    why = s.why.format(pairs=min(len(layered[a]), len(layered[b])), size=rows[found[0]].size,
                       first=first, second=second, freed=words, sites=len(layered))
    return dict.fromkeys(found, why)


def find_fused(rows: Sequence[Row], allocs_between: AllocsBetween,
               sizes_between: SizesBetween) -> dict[int, str]:
    """Row index -> the reason, for each block of a fused query/key/value projection's
    output that a forward keeps one per layer through its key and value views
    (``[kv_pairs.fused]``); nothing unless exactly one kept site shows it. Why: older
    modeling files return `present = (key, value)` as views of that one block, so no K / V
    pair of blocks exists for `find`."""
    f = spec().fused
    layered = _layered(rows)
    size_of = {site: rows[idx[0]].size for site, idx in layered.items()}
    fused = []
    for site, idx in layered.items():
        part, rest = divmod(size_of[site], f.parts)
        if rest or part in {size_of[o] for o in layered if o != site}:
            # not equal parts, or another kept site of a part's size (a separate key block,
            # or returned hidden states): which blocks are the cache is not known
            continue
        made = sorted(rows[i].alloc_idx for i in idx)
        if all(part in sizes_between(a, b) for a, b in zip(made, made[1:], strict=False)):
            fused.append(site)
    if len(fused) != 1:
        return {}
    site = fused[0]
    found = layered[site]
    words = _freed_words(rows, found, allocs_between)
    if words is None:
        return {}
    return dict.fromkeys(found, f.why.format(
        layers=len(found), size=size_of[site], site=site, parts=f.parts,
        part=size_of[site] // f.parts, freed=words, sites=len(layered)))


@dataclass(frozen=True)
class Held:
    """What `returned_by_update` reads of one held kv_cache block."""

    size: int  # the requested size
    alloc_idx: int  # -1: made before recording
    frame: tuple[str, str] | None  # its stack's innermost source file's (file, function)


def _is_update(frame: tuple[str, str] | None) -> bool:
    s = spec()
    return frame is not None and frame[1] in s.update_functions and (
        frame[0] == s.update_file or frame[0].endswith("/" + s.update_file))


def returned_by_update(held: Sequence[Held], first_free: int) -> list[int]:
    """Indices of the held blocks that a cache layer's own update made and a forward returns
    (transformers >= 4.56): an even number of one size, at least a K and a V for each of
    `min_layers` layers, none replaced yet. `first_free`: the first free of a kv_cache
    allocation of the window (-1: none); one before the last block was made is a decoding
    step's cat replacing a layer's cache, a loop that grows it."""
    s = spec()
    mine = [i for i, h in enumerate(held) if h.alloc_idx >= 0 and _is_update(h.frame)]
    if (len(mine) < 2 * s.min_layers or len(mine) % 2
            or len({held[i].size for i in mine}) != 1):
        return []
    if 0 <= first_free < max(held[i].alloc_idx for i in mine):
        return []
    return mine
