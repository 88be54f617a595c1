"""The capture side's one object: arm PyTorch's history recording and OOM observer, and dump
snapshot + sidecar (capacity, rank, versions, inventory) on OOM, at step N and at exit.

Dumps are atomic and never overwrite an earlier file (another rank's, an earlier step's),
and a failing dump is one line on stderr: it never masks the job's own OOM traceback.
"""

from __future__ import annotations

import atexit
import json
import os
import pickle
import re
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from snapana.record import inventory, sidecar
from snapana.record.cuda import CudaBackend, backend


@dataclass(frozen=True)
class Options:
    out_dir: Path
    max_entries: int = 100_000
    stacks: str = "python"  # "python" | "all" (with C++ frames: slower)
    dump_at_step: int | None = None
    job: str | None = None
    inventory: bool = True
    inventory_deadline_s: float = 3.0
    inventory_device: str = "cuda"  # the device type whose tensors are listed


def notice(message: str) -> None:
    print(f"snapana record: {message}", file=sys.stderr, flush=True)


def job_name(argv: list[str]) -> str:
    """A short name for the files: the script's stem (train.py -> train), else 'job'."""
    for arg in argv:
        stem = Path(arg).stem
        if arg.endswith(".py") and stem:
            return re.sub(r"[^A-Za-z0-9_.-]+", "-", stem)
    return "job"


class Recorder:
    """Recording for this process; at most one is active."""

    def __init__(self, options: Options, cuda: CudaBackend | None = None) -> None:
        self.options = options
        self.cuda = cuda or backend()
        self.steps = 0
        self.explicit_steps = False
        self.dumped: list[Path] = []
        self.oom_dumped = False
        self.job = options.job or job_name(sys.argv)
        self._step_hook: Any = None
        self.closed = False

    def start(self) -> bool:
        """Arm recording; False (with one notice) when this process has no CUDA."""
        if not self.cuda.available():
            notice("CUDA is not available in this process; the job runs unrecorded")
            return False
        self.options.out_dir.mkdir(parents=True, exist_ok=True)
        self.cuda.start_history(self.options.max_entries, self.options.stacks)
        self.cuda.attach_oom_observer(self.on_oom)
        self._hook_optimizer_steps()
        atexit.register(self.on_exit)
        return True

    # ----- triggers ---------------------------------------------------------------------------
    def on_oom(self, device: int, requested: int, device_allocated: int, device_free: int
               ) -> None:
        """PyTorch's OOM observer: dump once per process (later OOMs are retries)."""
        if self.oom_dumped or self.closed:
            return
        self.oom_dumped = True
        self.dump("oom", device)

    def step(self) -> None:
        """One training step done (explicit calls replace counting optimizer.step)."""
        self.explicit_steps = True
        self._count_step()

    def _count_step(self) -> None:
        self.steps += 1
        if self.options.dump_at_step is not None and self.steps == self.options.dump_at_step:
            self.dump(f"step{self.steps}")

    def _hook_optimizer_steps(self) -> None:
        try:
            from torch.optim.optimizer import register_optimizer_step_post_hook
        except ImportError:  # an old torch: explicit snapana.record.step() still works
            return

        def counted(optimizer: Any, args: Any, kwargs: Any) -> None:
            if not self.explicit_steps:
                self._count_step()

        self._step_hook = register_optimizer_step_post_hook(counted)

    def close(self) -> None:
        """Stop counting optimizer steps and dumping at exit (history stays recorded)."""
        if self._step_hook is not None:
            self._step_hook.remove()
            self._step_hook = None
        atexit.unregister(self.on_exit)
        self.closed = True

    def on_exit(self) -> None:
        if not self.oom_dumped:
            self.dump("exit")

    # ----- writing ----------------------------------------------------------------------------
    def dump(self, reason: str, device: int | None = None) -> Path | None:
        """Write `<job>-rank<R>-<reason>.pickle` and its `.meta.json`; never raises."""
        try:
            return self._dump(reason, device)
        except Exception as exc:  # noqa: BLE001 - the job's own error must stay the story
            notice(f"could not write the {reason} snapshot: {type(exc).__name__}: {exc}")
            return None

    def _dump(self, reason: str, device: int | None) -> Path:
        dev = self.cuda.current_device() if device is None else device
        snap = self.cuda.snapshot()
        inv = None
        if self.options.inventory:
            inv = inventory.take(self.options.inventory_device,
                                 self.options.inventory_deadline_s)
            if not inv["complete"]:
                notice(f"tensor inventory stopped early ({inv['stopped']}); it is partial")
        meta = sidecar.build(self.cuda, dev, reason.rstrip("0123456789"), self.steps or None,
                             inv)
        rank = meta["rank"] if meta["rank"] is not None else 0
        base = f"{self.job}-rank{rank}-{reason}"
        pickle_path = _publish(self.options.out_dir, base, ".pickle",
                               pickle.dumps(snap, protocol=4))
        stem = pickle_path.name.removesuffix(".pickle")
        meta["snapshot"] = pickle_path.name
        meta_bytes = (json.dumps(meta, indent=1) + "\n").encode()
        _publish(self.options.out_dir, stem, ".meta.json", meta_bytes, exact=True)
        self.dumped.append(pickle_path)
        notice(f"wrote {pickle_path} ({reason})")
        return pickle_path


def _publish(folder: Path, base: str, suffix: str, data: bytes, exact: bool = False) -> Path:
    """Write atomically under `base + suffix`, or `base-2 + suffix`, ... when taken: a link
    to the finished temp file either creates the name or fails, so nothing is overwritten."""
    fd, tmp = tempfile.mkstemp(prefix=f".{base}.", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        for n in range(1, 10_000):
            target = folder / (f"{base}{suffix}" if n == 1 else f"{base}-{n}{suffix}")
            try:
                os.link(tmp, target)
                return target
            except FileExistsError:
                if exact:
                    raise
        raise FileExistsError(f"{folder / base}{suffix}: 10,000 earlier dumps")
    finally:
        os.unlink(tmp)
