"""The words a snapshot uses of PyTorch's caching allocator: the block states it spells and
the settings it records. Its sizes and rounding rules are `allocator_model.rules`' (one place:
the simulator, the replay, placement and the what-if all size blocks there).
"""

from __future__ import annotations

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


#: A frame whose file path holds this ran torch_npu: the capture is an Ascend NPU's.
NPU_FRAME_MARK = "torch_npu/"
#: Final blocks that must show a pad (and none contradict it) before the replay uses it.
MIN_PAD_WITNESSES = 3


#: The settings a snapshot records under ``allocator_settings`` (PyTorch's
#: ``CUDAAllocatorConfig``, parsed from ``PYTORCH_CUDA_ALLOC_CONF``) that a knob may turn on.
#: PyTorch's defaults of those settings that are not off / zero (a value equal to its default
#: is not "set"); max_split_size's "unlimited" is -1 or SIZE_MAX.
ALLOCATOR_DEFAULTS = {"pinned_num_register_threads": 1}
ALLOCATOR_SETTINGS = ("expandable_segments", "max_split_size", "garbage_collection_threshold",
                      "roundup_power2_divisions", "release_lock_on_cudamalloc",
                      "pinned_use_cuda_host_register", "pinned_num_register_threads")
