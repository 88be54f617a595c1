"""The JSON written beside every snapshot the capture side dumps: what the snapshot itself
does not record (the device's total memory, rank, step, versions, the command line) and
which tensor lives where (the inventory). Versioned, so the analyzer can refuse what it does
not understand."""

from __future__ import annotations

import os
import socket
import sys
import time
from importlib import metadata
from typing import Any

from snapana.record.cuda import CudaBackend

FORMAT = "snapana.record.sidecar"
VERSION = 1

#: Distributions whose versions decide which knobs apply (import name -> distribution names).
FRAMEWORKS = {
    "megatron": ("megatron-core", "megatron_core"),
    "vllm": ("vllm",),
    "sglang": ("sglang",),
    "deepspeed": ("deepspeed",),
    "transformers": ("transformers",),
    "verl": ("verl",),
    "slime": ("slime",),
    "areal": ("areal",),
    "ms_swift": ("ms-swift", "ms_swift"),
}

_RANK_ENV = {"rank": "RANK", "local_rank": "LOCAL_RANK", "world_size": "WORLD_SIZE"}


def env_count(text: str | None) -> int | None:
    """A count from the environment (a rank, a buffer size): ASCII digits only, else None.
    The job side's own copy of `snapana.units.ascii_int` (capture code imports nothing of
    the analyzer): '²' passes `str.isdigit` and fails `int`, which would stop the job."""
    text = (text or "").strip()
    return int(text) if text.isascii() and text.isdigit() and len(text) <= 18 else None


def launcher_ranks(env: dict[str, str] | None = None) -> dict[str, int | None]:
    """Rank, local rank and world size as torchrun, accelerate and deepspeed set them."""
    env = dict(os.environ) if env is None else env
    out: dict[str, int | None] = {}
    for key, name in _RANK_ENV.items():
        out[key] = env_count(env.get(name))
    return out


def framework_versions() -> dict[str, str]:
    """Versions of the detected frameworks that are imported in this process."""
    out = {}
    for module, dists in FRAMEWORKS.items():
        if module not in sys.modules:
            continue
        for dist in dists:
            try:
                out[module] = metadata.version(dist)
                break
            except metadata.PackageNotFoundError:
                continue
        else:
            out[module] = str(getattr(sys.modules[module], "__version__", "unknown"))
    return out


def build(cuda: CudaBackend, device: int, reason: str, step: int | None,
          inventory: dict[str, Any] | None) -> dict[str, Any]:
    """The sidecar of one dump: `reason` is 'oom', 'step' or 'exit'."""
    free = total = None
    try:
        free, total = cuda.mem_get_info(device)
    except Exception:  # noqa: BLE001 - a dying job's driver may refuse; the dump still counts
        pass
    try:
        name = cuda.device_name(device)
    except Exception:  # noqa: BLE001
        name = None
    return {
        "format": FORMAT,
        "version": VERSION,
        "reason": reason,
        "device": device,
        "device_name": name,
        "device_total_bytes": total,
        "device_free_bytes": free,
        **launcher_ranks(),
        "hostname": socket.gethostname(),
        "pid": os.getpid(),
        "step": step,
        "wall_time": time.time(),
        "pytorch_cuda_alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF"),
        "versions": cuda.versions(),
        "argv": list(sys.argv),
        "frameworks": framework_versions(),
        "inventory": inventory,
    }
