"""PyTorch's caching allocator as snapana models it, in one place: its sizes
(c10/cuda/CUDACachingAllocator.cpp) and the block states a snapshot spells. Replay, placement,
attribution, the sources and the tables read them from here. The allocator model
(`allocator_model/`: the simulator the samples are written with and captures are re-run in)
keeps its own copy of the rules, written apart from these, so that each checks the other.
"""

from __future__ import annotations

MiB = 1 << 20
#: Every block holds its request rounded up to a multiple of this (kMinBlockSize).
ROUND_BYTES = 512
#: Requests of at most this use the small pool (kSmallSize).
SMALL_REQUEST = 1 * MiB
#: A small-pool segment (kSmallBuffer); a large-pool one below MIN_LARGE_ALLOC (kLargeBuffer).
SMALL_SEGMENT = 2 * MiB
LARGE_SEGMENT = 20 * MiB
#: From this request size on, a new segment is the request rounded up to ROUND_LARGE.
MIN_LARGE_ALLOC = 10 * MiB
ROUND_LARGE = 2 * MiB
#: Pages of an expandable segment: kSmallBuffer in the small pool, kLargeBuffer in the large.
SMALL_PAGE = SMALL_SEGMENT
LARGE_PAGE = LARGE_SEGMENT

#: Block states, as snapshots spell them: in use, freed but waiting on another stream (still
#: in its segment, not reusable), and cached free space.
ACTIVE_ALLOCATED = "active_allocated"
ACTIVE_PENDING_FREE = "active_pending_free"
INACTIVE = "inactive"
#: The states that hold memory (a live block is in one of them).
ACTIVE_STATES = (ACTIVE_ALLOCATED, ACTIVE_PENDING_FREE)
BLOCK_STATES = (*ACTIVE_STATES, INACTIVE)
#: `active_awaiting_free` is the spelling of PyTorch's docstring; the code writes pending.
STATE_ALIASES = {"active_awaiting_free": ACTIVE_PENDING_FREE}


def normalize_state(state: str) -> str:
    """Fold the documented alias of ``active_pending_free`` onto the code's spelling."""
    return STATE_ALIASES.get(state, state)


#: Bytes torch_npu's caching allocator (Ascend) adds to each request before rounding it.
NPU_REQUEST_PAD = 32
#: Bytes an allocator adds to a request before rounding it: 0 for CUDA's caching allocator;
#: torch_npu's, which writes the same snapshot format with devices named cuda:N, adds
#: NPU_REQUEST_PAD. The replay takes the one the final blocks show
#: (`analysis.replay.rounding_pad`).
ROUNDING_PADS = (0, NPU_REQUEST_PAD)
#: A frame whose file path holds this ran torch_npu: the capture is an Ascend NPU's.
NPU_FRAME_MARK = "torch_npu/"
#: Final blocks that must show a pad (and none contradict it) before the replay uses it.
MIN_PAD_WITNESSES = 3


def round_size(requested: int, granularity: int = ROUND_BYTES) -> int:
    """The caching allocator's minimum rounding: up to a multiple of 512 bytes.

    Sources whose sizes are already exact (profiler traces, memory timelines, memray) have
    a rounding of 1 in their row of `capture_kinds.SOURCES`.
    """
    if granularity <= 1:
        return requested
    return max(granularity, -(-requested // granularity) * granularity)


def segment_size_for(request: int) -> int:
    """Bytes the allocator asks the driver for when no cached block fits (`malloc`'s
    `get_allocation_size`: a small pool segment, the 20 MiB one for requests under
    MIN_LARGE_ALLOC, else the rounded request up to 2 MiB)."""
    r = round_size(request)
    if r <= SMALL_REQUEST:
        return SMALL_SEGMENT
    if r < MIN_LARGE_ALLOC:
        return LARGE_SEGMENT
    return (r + ROUND_LARGE - 1) // ROUND_LARGE * ROUND_LARGE

#: The settings a snapshot records under ``allocator_settings`` (PyTorch's
#: ``CUDAAllocatorConfig``, parsed from ``PYTORCH_CUDA_ALLOC_CONF``) that a knob may turn on.
#: PyTorch's defaults of those settings that are not off / zero (a value equal to its default
#: is not "set"); max_split_size's "unlimited" is -1 or SIZE_MAX.
ALLOCATOR_DEFAULTS = {"pinned_num_register_threads": 1}
ALLOCATOR_SETTINGS = ("expandable_segments", "max_split_size", "garbage_collection_threshold",
                      "roundup_power2_divisions", "release_lock_on_cudamalloc",
                      "pinned_use_cuda_host_register", "pinned_num_register_threads")
