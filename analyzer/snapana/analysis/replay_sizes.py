"""How the capture's allocator sized the blocks the trace records only as requests: the pad
it added before rounding (`rounding_pad`, from the final blocks and the pools requests went
to) and its split rule (`taken_whole`: a block that took the whole free block it was cut
from). The replay's second step, over the lifetimes `replay_pairs` made.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from snapana.allocator_model.rules import (
    LARGE_BUFFER,
    MIN_BLOCK_SIZE,
    ROUNDING_PADS,
    SMALL_SIZE,
    SizeRules,
)
from snapana.caching_allocator import ACTIVE_STATES, MIN_PAD_WITNESSES


def rounding_pad(blocks: pl.DataFrame, pools: dict[int, int] | None = None,
                 divisions: tuple[int, ...] = ()) -> int:
    """The bytes the allocator added to each request before rounding it (`ROUNDING_PADS`),
    as the final blocks show it: a block whose request the pads round differently, sized as
    one pad rounds it, is a witness; so is each request of the trace that the pads send to
    different pools (`pool_witnesses`: a capture that ends with nothing live still shows
    it). A pad other than 0 needs `MIN_PAD_WITNESSES` and no witness of another; else
    CUDA's rule (0) is assumed. `divisions`: the capture's roundup_power2_divisions, which
    round after the pad is added."""
    witnesses = dict.fromkeys(ROUNDING_PADS, 0)
    for pad, n in (pools or {}).items():
        witnesses[pad] += n
    live = blocks.filter(pl.col("state").is_in(ACTIVE_STATES) & (pl.col("requested_size") > 0))
    if not live.is_empty():
        req = live["requested_size"].to_numpy().astype(np.int64)
        size = live["size"].to_numpy().astype(np.int64)
        sized = {pad: SizeRules(divisions, pad).blocks(req) for pad in ROUNDING_PADS}
        base = sized[ROUNDING_PADS[0]]
        differ = np.logical_or.reduce([sized[pad] != base for pad in ROUNDING_PADS])
        for pad in ROUNDING_PADS:
            witnesses[pad] += int(((size == sized[pad]) & differ).sum())
    for pad in ROUNDING_PADS[1:]:
        if witnesses[pad] >= MIN_PAD_WITNESSES and not any(
                n for p, n in witnesses.items() if p != pad):
            return pad
    return 0


def pool_witnesses(events: pl.DataFrame, segments: pl.DataFrame,
                   divisions: tuple[int, ...] = ()) -> dict[int, int]:
    """Per pad of `ROUNDING_PADS`: the recorded requests that the pads send to different
    pools and that lie in a segment of the pool this pad chooses. The allocator picks the
    pool on the padded, rounded size (torch_npu's malloc: `get_pool(round_size(orig_size))`,
    round_size adding 32 bytes: a request within 32 bytes of kSmallSize is served from the
    large pool), so the pool of the segment holding such a request shows the pad. Only
    segments cut by the caching allocator count (an expandable range's type is a guess)."""
    out = dict.fromkeys(ROUNDING_PADS, 0)
    allocs = events.with_row_index("k").filter(pl.col("action") == "alloc")
    segs = segments.filter(~pl.col("expandable"))
    if allocs.is_empty() or segs.is_empty():
        return out
    req = allocs["size"].to_numpy().astype(np.int64)
    small = {pad: SizeRules(divisions, pad).blocks(req) <= SMALL_SIZE for pad in ROUNDING_PADS}
    differ = np.logical_or.reduce([small[p] != small[ROUNDING_PADS[0]] for p in ROUNDING_PADS])
    if not differ.any():
        return out
    addr = allocs["addr"].to_numpy().astype(np.int64)[differ]
    when = allocs["k"].to_numpy().astype(np.int64)[differ]
    seg_end = (segs["address"] + segs["total_size"]).to_numpy()
    # the segment holding an address is the live one whose end is the first above it
    end = _first_live(seg_end, segs["open_idx"].to_numpy(), segs["close_idx"].to_numpy(),
                      addr + 1, addr + int(segs["total_size"].to_numpy().max()), when)
    kinds: dict[int, set[str]] = {}
    for e, kind in zip(seg_end.tolist(), segs["segment_type"].to_list(), strict=True):
        kinds.setdefault(e, set()).add(kind)
    in_small = np.array([kinds.get(e) == {"small"} for e in end.tolist()], dtype=bool)
    in_large = np.array([kinds.get(e) == {"large"} for e in end.tolist()], dtype=bool)
    for pad in ROUNDING_PADS:
        chose = small[pad][differ]
        out[pad] = int((chose & in_small).sum() + (~chose & in_large).sum())
    return out


def taken_whole(cols: dict[str, np.ndarray], exact: np.ndarray, segments: pl.DataFrame,
                max_split_size: int | None) -> np.ndarray:
    """Block sizes with the allocator's split rule (`allocator_model.rules.should_split`):
    a block of the large pool takes the whole free block it was cut from when what would
    remain is too small to split off (at most kSmallSize; with max_split_size_mb, a request
    of that size or more takes any block it is given, which is less than kLargeBuffer
    larger). The free block a request took runs from its address to the next block or
    segment end live when it was made; a block held before recording is read in the state
    before the first event. Small-pool blocks never differ: their remainders are split from 512
    bytes on, and so are every pool's with expandable segments on (not called then).
    `exact` rows (sized by the final segments) keep their size."""
    size = cols["size"].copy()
    cand = np.flatnonzero(~exact & (size > SMALL_SIZE))
    if not cand.size:
        return size
    address, start, end = cols["address"], cols["alloc_idx"], cols["free_done_idx"]
    when = start[cand]  # -1: the state before the first event
    low = address[cand] + size[cand]
    reach = np.full(cand.size, SMALL_SIZE, dtype=np.int64)
    if max_split_size is not None:
        reach[size[cand] >= max_split_size] = LARGE_BUFFER - MIN_BLOCK_SIZE
    high = low + reach
    seg_end = (segments["address"] + segments["total_size"]).to_numpy()
    opened, closed = segments["open_idx"].to_numpy(), segments["close_idx"].to_numpy()
    next_block = _first_live(address, start, end, low, high, when)
    range_end = _first_live(seg_end, opened, closed, low, high, when)
    none = np.iinfo(np.int64).max
    boundary = np.minimum(np.where(next_block >= 0, next_block, none),
                          np.where(range_end >= 0, range_end, none))
    whole = boundary < none
    rows = cand[whole]
    size[rows] = boundary[whole] - address[rows]
    return size


#: Candidate (query, address) pairs looked at in one go by `_first_live`.
_PAIRS_AT_ONCE = 1 << 22


def _first_live(points: np.ndarray, opened: np.ndarray, closed: np.ndarray,
                low: np.ndarray, high: np.ndarray, when: np.ndarray) -> np.ndarray:
    """For each query k: the smallest point in [low[k], high[k]] whose interval is live at
    event when[k] (opened <= when < closed), -1 if none. Intervals at one point do not
    overlap in time, so the one that can be live is the last opened by then: a bisection
    over (point, opened)."""
    out = np.full(len(low), -1, dtype=np.int64)
    if not len(points) or not len(low):
        return out
    distinct, rank = np.unique(points, return_inverse=True)
    span = int(max(opened.max(), when.max())) + 3
    key = rank.astype(np.int64) * span + (opened + 1)
    order = np.argsort(key, kind="stable")
    key, rank, closed = key[order], rank[order], closed[order]
    first = np.searchsorted(distinct, low, "left")
    count = np.searchsorted(distinct, high, "right") - first
    bounds = np.cumsum(count)
    k0 = 0
    while k0 < len(low):
        k1 = max(int(np.searchsorted(bounds, bounds[k0] - count[k0] + _PAIRS_AT_ONCE,
                                     "right")), k0 + 1)
        n = count[k0:k1]
        query = np.repeat(np.arange(k0, k1), n)
        offset = np.arange(len(query)) - np.repeat(np.cumsum(n) - n, n)
        d = first[query] + offset
        j = np.searchsorted(key, d * span + (when[query] + 1), "right") - 1
        ok = (j >= 0) & (rank[np.maximum(j, 0)] == d) & (closed[np.maximum(j, 0)] > when[query])
        hit, at = np.unique(query[ok], return_index=True)  # points ascend within a query
        out[hit] = distinct[d[ok][at]]
        k0 = k1
    return out
