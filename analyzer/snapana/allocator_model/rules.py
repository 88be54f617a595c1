"""Size rules of PyTorch's CUDA caching allocator (c10/cuda/CUDACachingAllocator.cpp), the
one place snapana writes them: the simulator, the report's replay of a capture, the placement
question ("would this request fit") and the what-if re-run all size blocks and segments here.

Kept apart from the simulator so tests can check each rule on small direct cases.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # numpy loads only where arrays are rounded (the CLI sets its threads first)
    import numpy as np

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB

MIN_BLOCK_SIZE = 512  # kMinBlockSize: every request is rounded up to this
SMALL_SIZE = 1 * MiB  # kSmallSize: largest request served from the small pool
SMALL_BUFFER = 2 * MiB  # kSmallBuffer: segment size of the small pool
LARGE_BUFFER = 20 * MiB  # kLargeBuffer: segment size for large requests < 10 MiB
MIN_LARGE_ALLOC = 10 * MiB  # kMinLargeAlloc
ROUND_LARGE = 2 * MiB  # kRoundLarge: larger segments are rounded up to this
#: Pages of an expandable segment: kSmallBuffer in the small pool, kLargeBuffer in the large.
SMALL_PAGE = SMALL_BUFFER
LARGE_PAGE = LARGE_BUFFER

#: Bytes torch_npu's caching allocator (Ascend) adds to each request in its round_size,
#: before rounding it.
NPU_REQUEST_PAD = 32
#: Bytes an allocator adds to a request before rounding it: 0 for CUDA's caching allocator;
#: torch_npu's, which writes the same snapshot format with devices named cuda:N, adds
#: NPU_REQUEST_PAD. The replay takes the one the final blocks show
#: (`analysis.replay_sizes.rounding_pad`).
ROUNDING_PADS = (0, NPU_REQUEST_PAD)


#: roundup_power2_divisions has one entry per power-of-two interval, from 1 MiB up to 64 GiB
#: (CUDAAllocatorConfig::roundup_power2_divisions(size)): the last one serves all larger
ROUNDUP_INTERVALS = 16
#: log2 of the first interval's start (1 MiB): a size's interval is log2(size) - this
_INTERVAL_START_LOG2 = 20


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
    index = min(max(size.bit_length() - 1 - _INTERVAL_START_LOG2, 0), ROUNDUP_INTERVALS - 1)
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


def segment_size_for(request: int) -> int:
    """Bytes malloc asks the driver for when no cached block holds a request an OOM entry
    records (`params.size()`: rounded already, pad and divisions included; round_size leaves
    a size it has rounded as it is, whatever the divisions)."""
    return allocation_size(round_size(request))


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


def round_sizes(sizes: np.ndarray, divisions: Sequence[int] = ()) -> np.ndarray:
    """`round_size` over an array of requests (int64): a mask where no division applies (the
    same numbers as a division per row), the power-of-two steps where one does."""
    import numpy as np

    sizes = np.asarray(sizes, dtype=np.int64)
    if sizes.size and sizes.min() >= 0:
        out = sizes + (MIN_BLOCK_SIZE - 1)
        out &= -MIN_BLOCK_SIZE
        np.maximum(out, MIN_BLOCK_SIZE, out=out)
    else:
        out = np.maximum(MIN_BLOCK_SIZE, -(-sizes // MIN_BLOCK_SIZE) * MIN_BLOCK_SIZE)
    if not divisions or not sizes.size or max(divisions) <= 1:
        return out
    table = np.asarray([*divisions[:ROUNDUP_INTERVALS]] + [divisions[-1]] * max(
        0, ROUNDUP_INTERVALS - len(divisions)), dtype=np.int64)
    big = sizes >= MIN_BLOCK_SIZE
    log2 = np.zeros(sizes.shape, dtype=np.int64)
    log2[big] = _floor_log2(sizes[big])
    n = table[np.clip(log2 - _INTERVAL_START_LOG2, 0, ROUNDUP_INTERVALS - 1)]
    steps = big & (n > 1) & (sizes > MIN_BLOCK_SIZE * n)
    if steps.any():
        s, floor = sizes[steps], np.left_shift(1, log2[steps])
        step = floor >> _floor_log2(n[steps])
        below = s & ~(np.maximum(step, 1) - 1)
        up = np.where(below == s, s, below + step)
        up = np.where(step == 0, floor << 1, up)
        out[steps] = np.where(s == floor, s, up)
    return out


def _floor_log2(values: np.ndarray) -> np.ndarray:
    """floor(log2(v)) of positive int64s, exactly (a float's guess, corrected by one)."""
    import numpy as np

    guess = np.floor(np.log2(values.astype(np.float64))).astype(np.int64)
    guess -= np.left_shift(1, guess) > values
    guess += np.left_shift(1, guess + 1) <= values
    return guess


@dataclass(frozen=True)
class SizeRules:
    """How one capture's allocator sized its blocks: PyTorch's rules with the capture's
    roundup_power2_divisions (per interval from 1 MiB; () when off) and the bytes its
    allocator adds to a request before rounding (`ROUNDING_PADS`)."""

    divisions: tuple[int, ...] = ()
    pad: int = 0

    def block(self, request: int) -> int:
        """What a block for a recorded `request` holds (malloc's round_size)."""
        return round_size(request + self.pad, self.divisions)

    def blocks(self, requests: np.ndarray) -> np.ndarray:
        """`block` over an array of recorded requests."""
        return round_sizes(requests + self.pad if self.pad else requests, self.divisions)


#: CUDA's caching allocator with no setting that changes sizes.
PLAIN = SizeRules()
