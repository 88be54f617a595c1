"""What `snapana record` costs a job, measured on this CPU machine side by side with the same
job unrecorded (ratios, not seconds: these machines are shared).

PyTorch's own history recording runs inside the CUDA allocator and needs a GPU; here the CUDA
entry points are a stand-in that does nothing, so what is measured is snapana's part: the
optimizer-step hook on every step, and at a dump the tensor inventory walk and the writing
of snapshot + sidecar.

    python benchmarks/record_overhead.py [--steps 300] [--layers 64]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from snapana.record.cuda import CudaBackend
from snapana.record.recorder import Options, Recorder


class NoGpu(CudaBackend):
    """The CUDA calls, doing nothing: isolates snapana's own cost."""

    def available(self) -> bool:
        return True

    def start_history(self, max_entries: int, stacks: str) -> None:
        pass

    def snapshot(self) -> dict[str, Any]:
        return {"segments": [], "device_traces": [[]]}

    def attach_oom_observer(self, observer: Any) -> None:
        pass

    def mem_get_info(self, device: int) -> tuple[int, int]:
        return 0, 0

    def current_device(self) -> int:
        return 0

    def device_name(self, device: int) -> str:
        return "none"

    def versions(self) -> dict[str, str | None]:
        return {"torch": torch.__version__, "cuda": None}


def job(layers: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(layers)])
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


def train(model: torch.nn.Module, opt: torch.optim.Optimizer, steps: int) -> float:
    x = torch.randn(8, 64)
    start = time.perf_counter()
    for _ in range(steps):
        opt.zero_grad()
        model(x).sum().backward()
        opt.step()
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--layers", type=int, default=64)
    args = ap.parse_args()
    model, opt = job(args.layers)
    train(model, opt, 20)  # warm up
    bases, recordeds = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(5):  # interleaved, so load on the machine hits both alike
            bases.append(train(model, opt, args.steps))
            rec = Recorder(Options(Path(tmp), inventory_device="cpu", job="bench"), NoGpu())
            rec.start()
            recordeds.append(train(model, opt, args.steps))
            rec.close()
        t0 = time.perf_counter()
        rec.dump("exit")
        dump = time.perf_counter() - t0
    base, recorded = statistics.median(bases), statistics.median(recordeds)
    tensors = 4 * args.layers * 2  # weight + bias, each with a gradient and two Adam states
    print(f"{args.steps} steps of a {args.layers}-layer MLP on CPU")
    print(f"  unrecorded           {base:.3f} s")
    print(f"  with snapana record  {recorded:.3f} s   ratio {recorded / base:.3f}")
    print(f"  one dump (inventory of ~{tensors} tensors + files) {dump * 1000:.1f} ms "
          f"= {dump / (base / args.steps):.1f} training steps")


if __name__ == "__main__":
    main()
