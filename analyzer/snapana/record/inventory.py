"""Which tensor is which, at dump time: every tensor on the device that the process can
reach through the garbage collector, keyed by its storage's address, with a name where one
exists (module parameters and buffers, their `.grad`, optimizer state by parameter name and
key). The analyzer matches these addresses to the snapshot's blocks.

Bounded: a deadline and a tensor count cap; a walk that runs out says so instead of
stalling a dying job.
"""

from __future__ import annotations

import gc
import time
from typing import Any

#: Roles the analyzer maps to families (see its sidecar reader).
ROLES = ("parameter", "buffer", "gradient", "optimizer_state", "tensor")


class _Walk:
    def __init__(self, device_type: str, deadline_s: float, max_tensors: int) -> None:
        self.device_type = device_type
        self.deadline = time.monotonic() + deadline_s
        self.max_tensors = max_tensors
        self.entries: dict[int, dict[str, Any]] = {}
        self.stopped: str | None = None

    def out_of_budget(self) -> bool:
        if self.stopped is None and time.monotonic() > self.deadline:
            self.stopped = "deadline"
        if self.stopped is None and len(self.entries) >= self.max_tensors:
            self.stopped = "tensor cap"
        return self.stopped is not None

    def add(self, t: Any, name: str | None, role: str) -> None:
        """Record tensor `t`; a named role wins over an anonymous sighting of the same
        storage, and the first name seen for a storage is kept."""
        if t is None or t.device.type != self.device_type or self.out_of_budget():
            return
        storage = t.untyped_storage()
        ptr = int(storage.data_ptr())
        if ptr == 0:
            return
        known = self.entries.get(ptr)
        if known is not None and (known["name"] is not None or name is None):
            return
        self.entries[ptr] = {
            "ptr": ptr, "nbytes": int(storage.nbytes()), "shape": list(t.shape),
            "dtype": str(t.dtype).removeprefix("torch."), "requires_grad": bool(t.requires_grad),
            "device": t.device.index, "name": name, "role": role,
        }


def _root_modules(objects: list[Any], nn: Any) -> list[Any]:
    modules = [o for o in objects if issubclass(type(o), nn.Module)]
    children = {id(c) for m in modules for c in m.children()}
    return [m for m in modules if id(m) not in children]


def take(device_type: str = "cuda", deadline_s: float = 3.0,
         max_tensors: int = 100_000) -> dict[str, Any]:
    """The inventory: {"complete", "stopped", "seconds", "tensors": [...]}."""
    import torch

    start = time.monotonic()
    walk = _Walk(device_type, deadline_s, max_tensors)
    objects = gc.get_objects()
    param_names: dict[int, str] = {}
    roots = [m for m in _root_modules(objects, torch.nn) if any(True for _ in m.parameters())]
    for root in roots:
        prefix = "" if len(roots) == 1 else f"{type(root).__name__}."  # several models
        for name, p in root.named_parameters(remove_duplicate=True):
            param_names.setdefault(id(p), prefix + name)
            walk.add(p, prefix + name, "parameter")
            walk.add(p.grad, prefix + name + ".grad", "gradient")
        for name, b in root.named_buffers(remove_duplicate=True):
            walk.add(b, prefix + name, "buffer")
        if walk.out_of_budget():
            break
    # type(o), not isinstance: isinstance asks o.__class__, which wakes lazy proxies up
    for opt in (o for o in objects if issubclass(type(o), torch.optim.Optimizer)):
        for group in opt.param_groups:
            for p in group["params"]:
                pname = param_names.get(id(p), f"param{len(param_names)}")
                for key, value in opt.state.get(p, {}).items():
                    if isinstance(value, torch.Tensor):
                        walk.add(value, f"{pname}:{key}", "optimizer_state")
        if walk.out_of_budget():
            break
    for o in objects:
        if walk.out_of_budget():
            break
        if issubclass(type(o), torch.Tensor):
            walk.add(o, None, "tensor")
    return {"complete": walk.stopped is None, "stopped": walk.stopped,
            "seconds": round(time.monotonic() - start, 3),
            "tensors": sorted(walk.entries.values(), key=lambda e: e["ptr"])}
