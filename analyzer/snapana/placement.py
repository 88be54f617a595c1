"""Would a request fit in a given allocator state? The caching allocator's own rules, applied to
a replayed state, so a what-if ("without family X") is more than a subtraction.

Rules (c10/cuda/CUDACachingAllocator.cpp): requests round up to 512 bytes; requests of at most
1 MiB use the small pool (2 MiB segments), larger ones the large pool (a 20 MiB segment below
10 MiB, else the request rounded up to 2 MiB). A request is served from a cached free block of
its pool and stream when one is large enough; otherwise the allocator asks the driver for a new
segment, and when that fails it releases every fully free cached segment and asks again.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from snapana.replay import round_size

MiB = 1 << 20
SMALL_REQUEST = 1 * MiB
SMALL_SEGMENT = 2 * MiB
LARGE_SEGMENT = 20 * MiB
MIN_LARGE_ALLOC = 10 * MiB
ROUND_LARGE = 2 * MiB


def round_request(size: int) -> int:
    """What a block for this request holds: the one rounding rule (replay's)."""
    return round_size(size)


def segment_size_for(request: int) -> int:
    """Bytes the allocator asks the driver for when no cached block fits."""
    r = round_request(request)
    if r <= SMALL_REQUEST:
        return SMALL_SEGMENT
    if r < MIN_LARGE_ALLOC:
        return LARGE_SEGMENT
    return (r + ROUND_LARGE - 1) // ROUND_LARGE * ROUND_LARGE


@dataclass(frozen=True)
class Fit:
    fits: bool
    how: str  # "cached block" | "new segment" | "no"
    spare_bytes: int  # headroom left after placing the request (negative: short by)
    largest_free_block: int
    releasable_bytes: int  # fully free cached segments the allocator would give back


def would_fit(
    request: int,
    device_free: int,
    segments: pl.DataFrame,
    live: pl.DataFrame,
    pool: str = "0,0",
    stream: int = 0,
) -> Fit:
    """Place `request` in the state given by `segments` (address, total_size, pool, stream)
    and `live` blocks (address, size, segment_address).
    """
    r = round_request(request)
    small = r <= SMALL_REQUEST
    used = live.group_by("segment_address").agg(pl.col("size").sum().alias("used"))
    segs = segments.join(used, left_on="address", right_on="segment_address", how="left")
    segs = segs.with_columns(pl.col("used").fill_null(0))
    largest = 0
    own = segs.filter((pl.col("pool") == pool) & (pl.col("stream") == stream))
    by_seg: dict[int, list[tuple[int, int]]] = {}
    for a, s, sa in live.select("address", "size", "segment_address").iter_rows():
        by_seg.setdefault(sa, []).append((a, s))
    for address, total in own.select("address", "total_size").iter_rows():
        if (total == SMALL_SEGMENT) != small:
            continue  # only small-pool segments are 2 MiB; pools never serve each other
        cursor = address
        for a, s in sorted(by_seg.get(address, [])):
            largest = max(largest, a - cursor)
            cursor = max(cursor, a + s)
        largest = max(largest, address + total - cursor)
    releasable = int(
        segs.filter((pl.col("used") == 0) & (pl.col("pool") == "0,0"))["total_size"].sum()
    )
    need = segment_size_for(request)
    available = device_free + releasable
    # Headroom after placing it: the bigger of what is left of the block it lands in and
    # what the driver could still hand out.
    if largest >= r:
        return Fit(True, "cached block", max(largest - r, available), largest, releasable)
    if need <= available:
        return Fit(True, "new segment", available - need, largest, releasable)
    return Fit(False, "no", available - need, largest, releasable)
