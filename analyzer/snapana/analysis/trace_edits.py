"""Edits of a resized window's events for what a knob or a larger size changes in *when*
memory is held, not only how much (issue 70): activation checkpointing's replay and the
chunks a chunk loop adds at a larger size.

An edit is a list of moves and insertions keyed on trace indices; `apply` places them in the
window's events (action, idx, addr, size, stream, device_free) by position, so one edit
serves every size a bisection tries: the copies take the resized sizes of the events they
copy. Inserted blocks get addresses no recorded block has (negative), so their frees pair
with them alone.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import polars as pl

from snapana.analysis.replay import NEVER


def _int(value: object) -> int:
    """An integer column's aggregate (its min or max) as an int."""
    assert isinstance(value, (int, np.integer)), value
    return int(value)

#: the first address an inserted block takes (downwards): below any recorded address
FRESH = -(1 << 52)


@dataclass(frozen=True)
class Copy:
    """Allocations `allocs` (trace indices) made again just before the event `before`, and
    freed just after the event `after` (None: held to the window's end), each at its own
    fresh address."""

    allocs: tuple[int, ...]
    before: int
    after: int | None


@dataclass(frozen=True)
class Edit:
    """Frees moved (`moves`: the free event `idx` placed right after the event `after`),
    frees added for blocks the window never frees (`frees`: the block allocated at `idx`
    freed right after the event `after`), and copies inserted."""

    moves: Mapping[int, int] = field(default_factory=dict)
    frees: Mapping[int, int] = field(default_factory=dict)
    copies: tuple[Copy, ...] = ()
    words: str = ""  # what the edit rests on, said
    caveat: str = ""  # what it leaves out ("": nothing), so that it backs no size

    def __bool__(self) -> bool:
        return bool(self.moves) or bool(self.frees) or bool(self.copies)


def apply(events: pl.DataFrame, edits: Sequence[Edit]) -> pl.DataFrame:
    """`events` with `edits` applied: each event ordered by a key (its position; a moved
    free just after its new place; a copy just before or after its anchor)."""
    edits = [e for e in edits if e]
    if not edits:
        return events
    key = np.arange(events.height, dtype=np.float64)
    at = {int(i): p for p, i in enumerate(events["idx"].to_list())}  # trace indices: unique
    extra: list[pl.DataFrame] = []
    fresh = FRESH
    for edit in edits:
        for free, after in edit.moves.items():
            if free in at and after in at:
                key[at[free]] = at[after] + 0.5
        added = [(at[a], at[after]) for a, after in edit.frees.items() if a in at and after in at]
        if added:
            extra.append(events[[r for r, _ in added]].with_columns(
                pl.lit("free_completed").alias("action"),
                pl.Series("_key", [p + 0.5 for _, p in added], dtype=pl.Float64)))
        for copy in edit.copies:
            rows = [at[a] for a in copy.allocs if a in at]
            if not rows or copy.before not in at or (copy.after is not None
                                                     and copy.after not in at):
                continue
            made = events[rows].with_columns(
                pl.Series("addr", np.arange(fresh, fresh - len(rows), -1), dtype=pl.Int64))
            fresh -= len(rows)
            step = np.arange(len(rows)) * 1e-6
            extra.append(made.with_columns(pl.Series("_key", at[copy.before] - 0.5 + step)))
            if copy.after is not None:
                extra.append(made.with_columns(pl.lit("free_completed").alias("action"),
                                               pl.Series("_key", at[copy.after] + 0.5 + step)))
    out = pl.concat([events.with_columns(pl.Series("_key", key)),
                     *(e.cast(pl.Schema({**events.schema, "_key": pl.Float64()})) for e in extra)])
    return out.sort("_key", maintain_order=True).drop("_key")


def checkpoint_edit(blocks: pl.DataFrame, saved: Sequence[str], backward: Sequence[str],
                    hidden: int | None = None, cached: Sequence[str] = ()) -> Edit:
    """Activation checkpointing of the repeated blocks (torch.utils.checkpoint, non-reentrant:
    its pack hook keeps a handle, not the tensor, and saves the block's inputs; the first
    unpack in backward reruns the block's forward). `blocks`: the growth table. Saved for
    backward: blocks of the `saved` families made in the window before the backward's start
    (the first allocation of a `backward` family) and freed after it. The layers: the lines
    of code (`code_site`) that saved the same count K ≥ 2 of them (the count most of those
    bytes share), the j-th of each line in layer j; a line that saved K·m + r counts its
    blocks up to the last layer's end where those are a multiple of K (a final norm). Each
    layer keeps its input (its first block that divides by the `hidden` size × the tokens,
    or its first) and frees the rest at its last allocation; they are made again where the
    backward reaches the layer (its first saved block freed: the recompute) and each freed
    where the recorded one was (unpacked once, then dropped). Blocks of the `cached`
    families the forward made and the backward freed are freed at the backward's start: what
    autograd saved of them the pack hook no longer holds, and their cache lets them go when
    its context exits."""
    b = blocks.with_row_index("_row")
    start = b.filter(pl.col("family").is_in(list(backward)) & (pl.col("alloc_idx") >= 0))
    # a window that ends in the forward (its OOM): what is live at its end is saved
    first = _int(start["alloc_idx"].min()) if start.height else int(NEVER - 1)
    kept = b.filter(pl.col("family").is_in(list(saved)) & (pl.col("alloc_idx") >= 0)
                    & (pl.col("alloc_idx") < first) & (pl.col("free_idx") > first)
                    & (pl.col("address") >= 0)).sort("alloc_idx")
    if kept.is_empty():
        return Edit(words="nothing made in the forward is held into the backward")
    # a site is the line of code that made the block (`code_site`), not a trace's op frame:
    # one `aten::mul` op frame holds every multiply of the model, one line each layer's
    counts = kept.group_by(pl.col("code_site").alias("site")).agg(
        pl.len().alias("k"), pl.col("requested").sum())
    k = _layer_count(counts)
    if k is None:
        return Edit(words="no site saves a tensor per layer: no repeated blocks to checkpoint")
    sites = counts.filter(pl.col("k") % k == 0)["site"]
    # a site called in each layer and once more after the last (a norm module every layer
    # and the final one share: LlamaRMSNorm): its blocks up to the last layer's end
    end = _int(kept.filter(pl.col("code_site").is_in(sites.implode()))["alloc_idx"].max())
    inside = kept.filter(~pl.col("code_site").is_in(sites.implode())
                         & (pl.col("alloc_idx") <= end))
    more = inside.group_by("code_site").len().filter(pl.col("len") % k == 0)["code_site"]
    # a site called m times per layer: its blocks m at a time, in order, are layer j's
    layered = kept.filter(pl.col("code_site").is_in(sites.implode())
                          | (pl.col("code_site").is_in(more.implode())
                             & (pl.col("alloc_idx") <= end))).with_columns(
        (pl.int_range(pl.len()).over("code_site") // (pl.len().over("code_site") // k))
        .alias("_layer")).sort("alloc_idx")
    moves: dict[int, int] = {}
    frees: dict[int, int] = {}
    again: list[Copy] = []
    if start.height:
        held = b.filter(pl.col("family").is_in(list(cached)) & (pl.col("alloc_idx") >= 0)
                        & (pl.col("alloc_idx") < first) & (pl.col("free_idx") > first)
                        & (pl.col("free_idx") < NEVER))
        moves.update({int(f): first - 1 for f in held["free_idx"]})
    for (_,), layer in layered.group_by("_layer", maintain_order=True):
        inputs = layer.filter(pl.col("requested") % hidden == 0) if hidden else layer
        keep = int((inputs if inputs.height else layer)["alloc_idx"][0])
        rest = layer.filter(pl.col("alloc_idx") != keep)
        end = _int(layer["alloc_idx"].max())
        moves.update({int(f): end for f in rest["free_idx"] if f < NEVER})
        frees.update({int(a): end for a, f in zip(rest["alloc_idx"], rest["free_idx"],
                                                    strict=True) if f >= NEVER})
        # the layer's backward starts where the backward frees its first saved tensor: its
        # forward is rerun there (the first unpack), and each tensor it saves again is
        # freed where the backward freed the recorded one (unpacked once, then dropped)
        done = layer.filter(pl.col("free_idx") < NEVER)["free_idx"]
        rerun = _int(done.min()) if done.len() else first
        again += [Copy((int(a),), rerun, int(f) if f < NEVER else None)
                  for a, f in zip(rest["alloc_idx"], rest["free_idx"], strict=True)]
    if not start.height:
        return Edit(moves, frees, (), _said(k, sites.len() + more.len(), layered.height,
                                            False),
                    caveat="the recompute of one block in the backward, which the window "
                           "ends before")
    return Edit(moves, frees, tuple(again),
                _said(k, sites.len() + more.len(), layered.height, True))


def _layer_count(counts: pl.DataFrame, share: float = 0.9) -> int | None:
    """The number of layers: of the counts (≥ 2) of tensors a site saved, the largest whose
    multiples cover at least `share` of the bytes the best count covers (an op run twice a
    layer saved twice as many; every count is a multiple of 1 and most of 2)."""
    cand = sorted(set(counts.filter(pl.col("k") >= 2)["k"].to_list()))
    if not cand:
        return None
    k, size = counts["k"].to_numpy(), counts["requested"].to_numpy()
    cover = {c: int(size[k % c == 0].sum()) for c in cand}
    best = max(cover.values())
    return max(c for c in cand if cover[c] >= share * best)


def _said(k: int, sites: int, blocks: int, backward: bool) -> str:
    """What the checkpointing replay found and did, in words."""
    out = (f"{k} repeated blocks (layers) found: {sites} sites saved {k} tensors for the "
           "backward, or a multiple of it (an op run more than once a layer; a site also called "
           "after the last layer, as a norm every layer and the final one share, counted "
           "up to the last layer's end); each layer "
           f"keeps its input and frees the other {blocks - k:,} at its end")
    if not backward:
        return out + "; the window ends before the backward"
    return out + (", and makes them again when the backward reaches it (its first saved "
                  "tensor freed), each freed where the backward freed the recorded one")



def hidden_size(blocks: pl.DataFrame, weights: Sequence[str] = ("parameters",)) -> int | None:
    """The hidden size in elements of four bytes or fewer, read from the weights: the
    smallest weight size held twice or more (a layer's norm weights and biases are
    [hidden]), over 4 bytes (fp32; a bf16 one's hidden is a multiple of it). None without
    per-weight blocks (a flat buffer)."""
    w = blocks.filter(pl.col("family").is_in(list(weights))).group_by("requested").len()
    w = w.filter((pl.col("len") >= 2) & (pl.col("requested") % 4 == 0))
    return _int(w["requested"].min()) // 4 if w.height else None


@dataclass(frozen=True)
class Loop:
    """A chunk loop (a chunked log-prob, a chunked loss): sites that each made `k` blocks in
    turn, all of `chunk` units but the last (the rest of the `seq` units), every block a unit
    count × the site's bytes per unit. The units are sequence positions where the loop was
    found by the stated seq (`over` "seq"), else the largest that divides every chunk and
    the rest, found by its sizes alone (`over` "batch": the tokens unknown; "seq tokens":
    chunks of the packed batch × seq tokens, no whole number of sequences each). `rows[j]`: the
    growth rows of iteration j; `per_token`: a row's bytes per unit; `span`: the trace
    indices [start, end) of the last full iteration (the one repeated)."""

    chunk: int
    seq: int
    rows: tuple[tuple[int, ...], ...]
    per_token: Mapping[int, int]
    span: tuple[int, int]
    tail_start: int  # trace index where the last iteration starts
    over: str = "seq"
    #: growth rows of the weight casts autocast made at a site in the first iteration
    #: (`_leading_cast`): one per loop, whatever its size, held at their recorded size
    casts: tuple[int, ...] = ()

    def count(self, seq: int) -> int:
        return -(-seq // self.chunk)

    def units(self, ratio: float) -> int:
        """The units the loop covers when the tokens it runs over are `ratio` × the
        recorded: a chunk keeps its size (slime's `calculate_log_probs_and_entropy` splits
        a packed [tokens, vocab] logits with `logits.chunk` of a fixed `chunk_size`), so a
        larger batch or seq makes more chunks."""
        return max(1, round(self.seq * ratio))


def _site_loop(size: list[int], seq: int | None, batch: int | None, in_turn: bool = False
               ) -> tuple[int, int, int, str] | None:
    """(units covered, chunk units, bytes per unit, what the units are: `Loop.over`) of one
    site's blocks in turn when they are a chunk loop: k ≥ 2, equal but the last, which is
    smaller. With `seq`, their sum is seq × a per-token size dividing each and
    k = ceil(seq / chunk); failing that, a chunk of the packed batch × seq tokens that is no
    whole number of sequences (1,024 tokens of batch 18 × seq 128) has a sum dividing by seq
    and each block freed before the next is made (`in_turn`: the loop's own chunks; layers'
    kept scores and a smaller output at one site are not). Without `seq` (`batch` alone),
    the sum divides by the batch (every sample the same tokens). Found by the sizes alone,
    k ≥ 3 and the units are the largest that divide the chunk and the rest."""
    k = len(size)
    if k < 2 or len(set(size[:-1])) != 1 or size[-1] >= size[0]:
        return None
    total = sum(size)
    if seq is not None:
        if total % seq:
            return None
        per = total // seq
        if per and not size[0] % per and not size[-1] % per:
            c = size[0] // per
            if 1 < c < seq and -(-seq // c) == k:
                return seq, c, per, "seq"
        if not in_turn:
            return None
    elif batch is None or total % batch:
        return None
    # the sizes alone must show the loop: two full chunks at least (a line that makes a
    # tensor and then a smaller one, a loss and its scalar, is two)
    if k < 3:
        return None
    per = math.gcd(size[0], size[-1])
    return total // per, size[0] // per, per, "seq tokens" if seq is not None else "batch"


def _leading_cast(size: list[int], free: list[int], weights: frozenset[int],
                  family: str | None) -> bool:
    """Whether a site's first block is autocast's cast of a weight, made by a loop's first
    iteration: an op under autocast casts its fp32 weight through `cached_cast`
    (aten/src/ATen/autocast_mode.cpp) on its first use and keeps the cast in the autocast
    cache to the context's end, so the op's site makes it once, before its first output,
    of a held weight's bytes over the dtype ratio, and holds it past the loop's chunks; or
    one the attribution named a copy (`family`: a forward's copies are dropped with its
    output, not after it)."""
    from snapana.analysis.attribution.weight_copies import spec

    cast = spec()
    return len(size) >= 2 and (family == cast.family or (
        free[0] >= max(free[1:]) and any(size[0] * r in weights for r in cast.ratios)))


def chunk_loops(blocks: pl.DataFrame, seq: int | None, batch: int | None = None
                ) -> list[Loop]:
    """The chunk loops among the window's allocations (`blocks`: the growth table) at the
    recorded `seq` (or, with no seq stated, the recorded `batch`): per site, k ≥ 2 blocks
    made in turn, equal but the last, which is smaller (the rest of the tokens), whose
    bytes sum to `seq` × a per-token size that divides each (the loop covers the sequence a
    chunk of c < seq tokens at a time, so k = ceil(seq / c)); sites of one k and chunk
    interleaved in one loop. k equal blocks are no evidence of a chunk loop: a model's L
    layers make L equal blocks at one site whose sum is seq × (L × the per-token bytes),
    and those grow with seq."""
    made = blocks.with_row_index("_row").filter(
        pl.col("alloc_idx") >= 0).sort("alloc_idx")  # a failed request: the last chunk
    weights = frozenset(blocks.filter(pl.col("alloc_idx") < 0)["requested"].to_list())
    free = "free_idx" if "free_idx" in made.columns else "alloc_idx"
    found: dict[tuple[int, int, int, str], list[tuple[int, list[int], list[int]]]] = {}
    casts: dict[tuple[int, int, int, str], list[int]] = {}
    for (_,), g in made.group_by("site", maintain_order=True):
        size, rows = g["requested"].to_list(), g["_row"].to_list()
        idx = g["alloc_idx"].to_list()
        cast: list[int] = []
        # a leading cast is no chunk: taken for one, a cast and the op's output at one site
        # pass for two chunks (the lm_head's bf16 copy of 26,810 × 1,920 and its logits
        # [128, 26,810] are 120 and 8 tokens of 857,920 bytes)
        if _leading_cast(size, g[free].fill_null(NEVER).to_list(), weights,
                         g["family"][0] if "family" in g.columns else None):
            cast, size, rows, idx = rows[:1], size[1:], rows[1:], idx[1:]
        ends = g[free].fill_null(NEVER).to_list()[len(cast):]
        site = _site_loop(size, seq, batch, free == "free_idx" and all(
            ends[j] < idx[j + 1] for j in range(len(idx) - 1)))
        if site is None:
            continue
        units, c, per, over = site
        found.setdefault((len(size), units, c, over), []).append((per, rows, idx))
        casts.setdefault((len(size), units, c, over), []).extend(cast)
    loops = []
    for (k, units, c, over), sites in found.items():
        turns = tuple(tuple(s[1][j] for s in sites) for j in range(k))
        starts = [min(s[2][j] for s in sites) for j in range(k)]
        per_row = {r: p for p, rs, _ in sites for r in rs}
        loops.append(Loop(c, units, turns, per_row, (starts[-2], starts[-1]), starts[-1],
                          over, tuple(casts[(k, units, c, over)])))
    return loops


def loop_sizes(new: np.ndarray, requested: np.ndarray, loops: Sequence[Loop],
               units: Sequence[int]) -> tuple[frozenset[int], int]:
    """Resize each loop's rows in `new` at its `units` (a chunk keeps its size; the last one
    takes the rest); the trace indices of the iterations left out at a smaller size are
    returned as growth rows to drop, with how many iterations are added in total."""
    drop: set[int] = set()
    added = 0
    for loop, seq in zip(loops, units, strict=True):
        k, k2 = len(loop.rows), loop.count(seq)
        tail = seq - (k2 - 1) * loop.chunk
        for rows in (*loop.rows[:-1], loop.casts):
            new[list(rows)] = requested[list(rows)]
        for r in loop.rows[-1]:
            new[r] = tail * loop.per_token[r]
        if k2 < k:
            drop.update(r for rows in loop.rows[k2 - 1:-1] for r in rows)
        added += max(0, k2 - k)
    return frozenset(drop), added


def repeat_iterations(events: pl.DataFrame, blocks: pl.DataFrame, loops: Sequence[Loop],
                      units: Sequence[int]) -> pl.DataFrame:
    """`events` (resized) with each loop's last full iteration made again as many times as
    more `units` add chunks, just before its last iteration: its allocations at fresh
    addresses, each freed where its own iteration frees it (inside the iteration) or right
    after the original's free (a chunk kept, as the saved softmax is)."""
    at = {int(i): p for p, i in enumerate(events["idx"].to_list())}
    key = np.arange(events.height, dtype=np.float64)
    extra: list[pl.DataFrame] = []
    fresh = FRESH
    alloc = blocks.filter(pl.col("alloc_idx") >= 0).select("alloc_idx", "free_idx")
    for loop, seq in zip(loops, units, strict=True):
        copies = loop.count(seq) - len(loop.rows)
        lo, hi = loop.span
        if copies <= 0 or lo not in at or loop.tail_start not in at:
            continue
        mine = alloc.filter((pl.col("alloc_idx") >= lo) & (pl.col("alloc_idx") < hi))
        base, n = at[loop.tail_start] - 1, hi - lo + 1
        for m in range(copies):
            def slot(i: int, m: int = m, base: float = base, n: int = n, lo: int = lo,
                     copies: int = copies) -> float:
                return base + (m * n + (i - lo) + 1) / (copies * n + 2)
            for a, f in zip(mine["alloc_idx"].to_list(), mine["free_idx"].to_list(),
                            strict=True):
                if a not in at:
                    continue
                row = events[at[a]].with_columns(pl.lit(fresh, dtype=pl.Int64).alias("addr"))
                fresh -= 1
                extra.append(row.with_columns(pl.lit(slot(a)).alias("_key")))
                if f in at:
                    end = slot(f) if f < hi else at[f] + 0.5 + (m + 1) * 1e-6
                    extra.append(row.with_columns(pl.lit("free_completed").alias("action"),
                                                  pl.lit(end).alias("_key")))
    if not extra:
        return events
    schema = pl.Schema({**events.schema, "_key": pl.Float64()})
    out = pl.concat([events.with_columns(pl.Series("_key", key)),
                     *(e.cast(schema) for e in extra)])
    return out.sort("_key", maintain_order=True).drop("_key")
