"""Would a request fit in a given allocator state? The caching allocator's own rules, applied to
a replayed state, so a what-if ("without family X") is more than a subtraction.

Rules (c10/cuda/CUDACachingAllocator.cpp, written once in `allocator_model.rules`): requests
round up to 512 bytes (or by the capture's roundup_power2_divisions); requests of at most 1 MiB
use the small pool (2 MiB segments), larger ones the large pool (a 20 MiB segment below 10 MiB,
else the request rounded up to 2 MiB). A request is served from a cached free block of
its pool and stream when one is large enough; otherwise the allocator asks the driver for a new
segment, and when that fails it releases every fully free cached segment and asks again.

With expandable segments (`expandable_segments:True`) a segment is one virtual range whose
pages (2 MiB small, 20 MiB large) are mapped on demand: reserved is the mapped bytes. When no
free block is large enough the allocator maps the missing pages after the free space at the
end of a segment (`segment_map`), so it needs device memory, never one contiguous cached
block; before failing it unmaps the whole free pages of every segment (`segment_unmap`) and
tries again.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from snapana.allocator_model.rules import (
    LARGE_PAGE,
    SMALL_BUFFER,
    SMALL_PAGE,
    is_small,
    round_size,
    segment_size_for,
)

#: How a request is placed (Fit.how): a cached free block, a new cudaMalloc'd segment, more
#: pages mapped into an expandable segment, or not at all.
CACHED_BLOCK = "cached block"
NEW_SEGMENT = "new segment"
MAP_PAGES = "maps pages at the end of an expandable segment"
NO_FIT = "no"


#: The terms of a spare, each (what, bytes, sign): the sum a report spells out.
SpareTerms = tuple[tuple[str, int, int], ...]


@dataclass(frozen=True)
class Fit:
    fits: bool
    how: str  # CACHED_BLOCK | NEW_SEGMENT | MAP_PAGES | NO_FIT
    #: Free space left once the request is placed: how much larger it could have been and
    #: still fit (negative: short by). The one definition; `spare_terms` adds up to it.
    spare_bytes: int
    largest_free_block: int
    releasable_bytes: int  # what the allocator would give back to the device before failing
    expandable: bool = False  # placed by the expandable-segments rule
    map_bytes: int = 0  # pages it maps (expandable) or the segment it asks for
    spare_terms: SpareTerms = ()


def _spare(*terms: tuple[str, int, int]) -> tuple[int, SpareTerms]:
    """A spare and its terms (zero terms other than the first two dropped)."""
    kept = tuple(t for i, t in enumerate(terms) if t[1] or i == 0 or t[2] < 0)
    return sum(n * sign for _, n, sign in kept), kept


def _grow(device_free: int, releasable: int, largest: int, r: int, need: int,
          remnant: int | None) -> tuple[int, SpareTerms]:
    """Spare after placing the request, one way for every placement: the larger of what the
    largest free cached block leaves (when it holds the request) and what the device could
    still hand out — device free plus the cached memory the allocator releases before
    failing, minus what the request takes from them (its new segment, or with expandable
    segments its pages beyond the sub-page free end it starts in, `remnant`)."""
    if remnant is None:
        grown = _spare(("device free", device_free, 1),
                       ("releasable cached", releasable, 1), ("new segment", need, -1))
    else:
        grown = _spare(("device free", device_free, 1), ("releasable cached", releasable, 1),
                       ("partial free page", remnant, 1), ("request", r, -1))
    if largest >= r and largest - r > grown[0]:
        return _spare(("largest free block", largest, 1), ("request", r, -1))
    return grown


def would_fit(
    request: int,
    device_free: int,
    segments: pl.DataFrame,
    live: pl.DataFrame,
    pool: str = "0,0",
    stream: int = 0,
) -> Fit:
    """Place `request` in the state given by `segments` (address, total_size, pool, stream,
    and when known segment_type and expandable) and `live` blocks (address, size,
    segment_address).

    Without expandable segments a request needs one free cached block of its pool and stream
    at least as large, else a new segment from the driver (after releasing every fully free
    segment when the driver has too little). With expandable segments (its pool's segments
    are expandable) it never needs one contiguous cached block: the allocator maps more pages
    after the free space at the end of a segment, when the device has the memory, and before
    failing it unmaps the whole free pages of every segment and tries again.

    `request` is as an OOM entry records it (`params.size()`), which malloc has rounded
    already, by the capture's roundup_power2_divisions and pad: `round_size` leaves it.
    """
    r = round_size(request)
    small = is_small(r)
    page = SMALL_PAGE if small else LARGE_PAGE
    segs = _with_kind(segments)
    by_seg: dict[int, list[tuple[int, int]]] = {}
    for a, s, sa in live.select("address", "size", "segment_address").iter_rows():
        by_seg.setdefault(sa, []).append((a, s))
    releasable = 0
    for address, total, seg_pool, seg_type, expandable in segs.select(
        "address", "total_size", "pool", "segment_type", "expandable"
    ).iter_rows():
        if seg_pool != "0,0":
            continue  # private pools are released only when their owner is gone
        if not expandable:
            releasable += 0 if by_seg.get(address) else total
            continue
        seg_page = SMALL_PAGE if seg_type == "small" else LARGE_PAGE
        releasable += sum(_whole_pages(address, lo, hi, seg_page)
                          for lo, hi in _free_ranges(address, total, by_seg.get(address, [])))
    own = segs.filter((pl.col("pool") == pool) & (pl.col("stream") == stream)
                      & ((pl.col("segment_type") == "small") == small)).sort("address")
    runs = [(a, t, _free_ranges(a, t, by_seg.get(a, [])))
            for a, t in own.select("address", "total_size").iter_rows()]
    largest = max((hi - lo for _, _, free in runs for lo, hi in free), default=0)
    available = device_free + releasable
    expandable_pool = (bool(own["expandable"].any()) if own.height
                       else _pool_expandable(segs, pool))
    if largest >= r and not expandable_pool:
        spare, terms = _grow(device_free, releasable, largest, r,
                             segment_size_for(request), None)
        return Fit(True, CACHED_BLOCK, spare, largest, releasable, False, 0, terms)
    if expandable_pool:
        # Map after the free end of a segment when the unmapped space there (up to the next
        # mapped range) has room; the last range of a segment has its whole unmapped rest.
        tails = [0]  # a new expandable segment (or a range ending in a block) maps it all
        remnants = [0]
        for k, (a, t, free) in enumerate(runs):
            tail = free[-1][1] - free[-1][0] if free and free[-1][1] == a + t else 0
            if tail and _room(runs, k, tail) >= r:
                tails.append(tail)
                remnants.append(tail - _whole_pages(a, a + t - tail, a + t, page))
        need_now = _pages(r - max(tails), page)
        need_after = _pages(r - max(remnants), page)  # once whole free pages are unmapped
        spare, terms = _grow(device_free, releasable, largest, r, 0, max(remnants))
        if largest >= r:
            return Fit(True, CACHED_BLOCK, spare, largest, releasable, True, 0, terms)
        if need_now <= device_free:
            return Fit(True, MAP_PAGES, spare, largest, releasable, True, need_now, terms)
        if need_after <= available:
            return Fit(True, MAP_PAGES, spare, largest, releasable, True, need_after, terms)
        short, terms = _spare(("device free", device_free, 1),
                              ("releasable cached", releasable, 1),
                              ("pages to map", need_after, -1))
        return Fit(False, NO_FIT, short, largest, releasable, True, need_after, terms)
    need = segment_size_for(request)
    spare, terms = _grow(device_free, releasable, largest, r, need, None)
    return Fit(need <= available, NEW_SEGMENT if need <= available else NO_FIT, spare,
               largest, releasable, False, need, terms)


def _room(runs: list[tuple[int, int, list[tuple[int, int]]]], k: int, tail: int) -> int:
    """Address space a request can take from the free end of run `k` on: the free end, the
    unmapped gap to the next mapped range and what is free at its start (a fully free range
    continues the chain); unbounded after the last range."""
    room = tail
    for j in range(k + 1, len(runs)):
        a, t, free = runs[j]
        room += a - (runs[j - 1][0] + runs[j - 1][1])
        head = free[0][1] - a if free and free[0][0] == a else 0
        room += head
        if head < t:
            return room
    return 1 << 62


def _with_kind(segments: pl.DataFrame) -> pl.DataFrame:
    """Segments with segment_type and expandable, inferred when a caller's table lacks them
    (only small-pool segments of the plain allocator are 2 MiB)."""
    cols = []
    if "segment_type" not in segments.columns:
        cols.append(pl.when(pl.col("total_size") == SMALL_BUFFER).then(pl.lit("small"))
                    .otherwise(pl.lit("large")).alias("segment_type"))
    if "expandable" not in segments.columns:
        cols.append(pl.lit(False).alias("expandable"))
    return segments.with_columns(cols) if cols else segments


def _pool_expandable(segments: pl.DataFrame, pool: str) -> bool:
    """A pool with no segment of the request's kind yet: expandable when its others are."""
    mine = segments.filter(pl.col("pool") == pool)
    return bool(mine["expandable"].any()) if mine.height else bool(
        segments["expandable"].any()) if segments.height else False


def _free_ranges(address: int, total: int, blocks: list[tuple[int, int]]
                 ) -> list[tuple[int, int]]:
    """The free (unallocated) ranges of a segment, in address order."""
    out, cursor = [], address
    for a, s in sorted(blocks):
        if a > cursor:
            out.append((cursor, a))
        cursor = max(cursor, a + s)
    if address + total > cursor:
        out.append((cursor, address + total))
    return out


def _whole_pages(segment: int, lo: int, hi: int, page: int) -> int:
    """Bytes of whole pages inside [lo, hi) of a segment mapped from `segment` on: what
    unmapping that free range gives back (ExpandableSegment::unmap)."""
    first = segment + -(-(lo - segment) // page) * page
    last = segment + (hi - segment) // page * page
    return max(0, last - first)


def _pages(nbytes: int, page: int) -> int:
    """Bytes of the pages that map at least `nbytes` (none when nothing is missing)."""
    return 0 if nbytes <= 0 else -(-nbytes // page) * page
