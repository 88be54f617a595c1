"""The CUDA entry points the capture side uses, named in this one module.

They are private PyTorch functions (`torch.cuda.memory._record_memory_history`, `_snapshot`,
the out-of-memory observer) plus `torch.cuda.mem_get_info`; keeping them behind one small
class lets CPU tests swap in a fake that records the calls and returns simulated snapshots.
Only the standard library and torch are imported here: this runs inside the user's job.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

#: Called by the allocator when an allocation fails: (device, requested, device_allocated,
#: device_free), the signature of PyTorch's out-of-memory observer.
OomObserver = Callable[[int, int, int, int], None]

#: History entries kept around one test or one notebook cell (the pytest plugin, the cell
#: magic): a step's allocations, not a whole job's.
AROUND_ONE_STEP = 100_000


class CudaBackend:
    """The real thing: PyTorch's memory-history recorder on this process's GPUs."""

    def available(self) -> bool:
        import torch

        return bool(torch.cuda.is_available())

    def start_history(self, max_entries: int, stacks: str) -> None:
        import torch

        torch.cuda.memory._record_memory_history(enabled="all", context="all",
                                                 stacks=stacks, max_entries=max_entries)

    def stop_history(self) -> None:
        import torch

        torch.cuda.memory._record_memory_history(enabled=None)

    def snapshot(self) -> dict[str, Any]:
        import torch

        return dict(torch.cuda.memory._snapshot())

    def attach_oom_observer(self, observer: OomObserver) -> None:
        import torch

        # present only in CUDA builds of torch (mypy reads torch as Any: see pyproject.toml)
        torch._C._cuda_attach_out_of_memory_observer(observer)

    def mem_get_info(self, device: int) -> tuple[int, int]:
        """(free, total) bytes on `device`, as the driver reports them."""
        import torch

        free, total = torch.cuda.mem_get_info(device)
        return int(free), int(total)

    def current_device(self) -> int:
        import torch

        return int(torch.cuda.current_device())

    def device_name(self, device: int) -> str:
        import torch

        return str(torch.cuda.get_device_name(device))

    def versions(self) -> dict[str, str | None]:
        import torch

        return {"torch": str(torch.__version__), "cuda": torch.version.cuda}


_backend: CudaBackend = CudaBackend()


def backend() -> CudaBackend:
    return _backend


def unavailable(cuda: CudaBackend, here: str = "") -> str:
    """Why nothing can be recorded `here` ('' when it can): no PyTorch, or no CUDA. The
    pytest marker skips and the cell magic runs unrecorded on it, rather than let the
    ImportError out of a test or a cell."""
    try:
        return "" if cuda.available() else "CUDA is not available"
    except ImportError:
        return f"PyTorch is not installed{here}"

