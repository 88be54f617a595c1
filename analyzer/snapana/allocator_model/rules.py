"""Size rules of PyTorch's CUDA caching allocator (c10/cuda/CUDACachingAllocator.cpp).

Kept apart from the simulator so tests can check each rule on small direct cases.
"""

from __future__ import annotations

from collections.abc import Sequence

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB

MIN_BLOCK_SIZE = 512  # kMinBlockSize: every request is rounded up to this
SMALL_SIZE = 1 * MiB  # kSmallSize: largest request served from the small pool
SMALL_BUFFER = 2 * MiB  # kSmallBuffer: segment size of the small pool
LARGE_BUFFER = 20 * MiB  # kLargeBuffer: segment size for large requests < 10 MiB
MIN_LARGE_ALLOC = 10 * MiB  # kMinLargeAlloc
ROUND_LARGE = 2 * MiB  # kRoundLarge: larger segments are rounded up to this


#: roundup_power2_divisions has one entry per power-of-two interval, from 1 MiB up to 64 GiB
#: (CUDAAllocatorConfig::roundup_power2_divisions(size)): the last one serves all larger
ROUNDUP_INTERVALS = 16


def round_size(size: int, divisions: Sequence[int] = ()) -> int:
    """Round a request up to a multiple of 512 bytes (what the block will hold), or, with
    `roundup_power2_divisions` set for its interval, up to the next of that many equal
    steps between two powers of two (round_size / roundup_power2_next_division)."""
    if size < MIN_BLOCK_SIZE:
        return MIN_BLOCK_SIZE
    n = _divisions_for(size, divisions)
    if n > 1 and size > MIN_BLOCK_SIZE * n:
        if size & (size - 1) == 0:
            return size
        floor = 1 << (size.bit_length() - 1)
        step = floor >> (n.bit_length() - 1)
        if step == 0:
            return floor << 1
        below = size & ~(step - 1)
        return size if below == size else below + step
    return MIN_BLOCK_SIZE * ((size + MIN_BLOCK_SIZE - 1) // MIN_BLOCK_SIZE)


def _divisions_for(size: int, divisions: Sequence[int]) -> int:
    """The divisions of `size`'s interval: index log2(size) - 20, within [0, 15]."""
    if not divisions:
        return 0
    index = min(max(size.bit_length() - 1 - 20, 0), ROUNDUP_INTERVALS - 1)
    return divisions[index] if index < len(divisions) else divisions[-1]


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


def should_split(block_size: int, rounded: int, small: bool,
                 max_split_size: int | None = None) -> bool:
    """Whether a free block bigger than the request is split (remainder stays cached); with
    max_split_size_mb set, a request of that size or more takes its block whole."""
    remaining = block_size - rounded
    if small:
        return remaining >= MIN_BLOCK_SIZE
    if max_split_size is not None and rounded >= max_split_size:
        return False
    return remaining > SMALL_SIZE


def expandable_page_size(small: bool) -> int:
    """Mapping granularity of an expandable segment (kSmallBuffer / kLargeBuffer)."""
    return SMALL_BUFFER if small else LARGE_BUFFER
