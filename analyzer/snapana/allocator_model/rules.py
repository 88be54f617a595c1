"""Size rules of PyTorch's CUDA caching allocator (c10/cuda/CUDACachingAllocator.cpp).

Kept apart from the simulator so tests can check each rule on small direct cases.
"""

from __future__ import annotations

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB

MIN_BLOCK_SIZE = 512  # kMinBlockSize: every request is rounded up to this
SMALL_SIZE = 1 * MiB  # kSmallSize: largest request served from the small pool
SMALL_BUFFER = 2 * MiB  # kSmallBuffer: segment size of the small pool
LARGE_BUFFER = 20 * MiB  # kLargeBuffer: segment size for large requests < 10 MiB
MIN_LARGE_ALLOC = 10 * MiB  # kMinLargeAlloc
ROUND_LARGE = 2 * MiB  # kRoundLarge: larger segments are rounded up to this


def round_size(size: int) -> int:
    """Round a request up to a multiple of 512 bytes (what the block will hold)."""
    if size < MIN_BLOCK_SIZE:
        return MIN_BLOCK_SIZE
    return MIN_BLOCK_SIZE * ((size + MIN_BLOCK_SIZE - 1) // MIN_BLOCK_SIZE)


def is_small(rounded: int) -> bool:
    """Whether a rounded request is served from the small pool."""
    return rounded <= SMALL_SIZE


def allocation_size(rounded: int) -> int:
    """Size of the cudaMalloc made when no cached block fits a rounded request."""
    if rounded <= SMALL_SIZE:
        return SMALL_BUFFER
    if rounded < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return ROUND_LARGE * ((rounded + ROUND_LARGE - 1) // ROUND_LARGE)


def should_split(block_size: int, rounded: int, small: bool) -> bool:
    """Whether a free block bigger than the request is split (remainder stays cached)."""
    remaining = block_size - rounded
    if small:
        return remaining >= MIN_BLOCK_SIZE
    return remaining > SMALL_SIZE


def expandable_page_size(small: bool) -> int:
    """Mapping granularity of an expandable segment (kSmallBuffer / kLargeBuffer)."""
    return SMALL_BUFFER if small else LARGE_BUFFER
