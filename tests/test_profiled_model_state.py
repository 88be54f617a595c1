"""Issue 67 on a capture made here: a hand-written optimizer's state, profiled with
torch.profiler (profile_memory, record_shapes, with_stack) on the CPU build of torch and read
back by snapana from the exported chrome trace.

The ground truth is the program's own: the storages its tensors own (`data_ptr` of the
weights and moments it made), and sizes computed from the shapes it asked for, never from
snapana's output.

- A program that makes its weights with torch.randn(..., requires_grad=True) and steps its
  own Adam (moments by torch.zeros_like in its own code): the weights are parameters and the
  moments optimizer state, by structure; the program's inputs and targets (one of them the
  size of a bias) are neither.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import polars as pl
import pytest
import snapana

from .conftest import invoke, require

PROFILE = {"profile_memory": True, "record_shapes": True, "with_stack": True}


def _storage(t: Any) -> int:
    """The address of the allocation a tensor's storage lives in (what the trace records)."""
    return int(t.untyped_storage().data_ptr())


def _profiled(tmp: Path, name: str, work: Any) -> tuple[Path, Any]:
    """Run `work()` under torch.profiler on the CPU; the chrome trace and what work returned."""
    profiler = require("torch.profiler")
    with profiler.profile(activities=[profiler.ProfilerActivity.CPU], **PROFILE) as prof:
        got = work()
    path = tmp / f"{name}.json"
    prof.export_chrome_trace(str(path))
    return path, got


def _live_at_peak(path: Path) -> set[int]:
    """Independently of snapana: the CPU allocations live when the trace's own Total
    Allocated is highest."""
    events = [e for e in json.loads(path.read_text())["traceEvents"]
              if e.get("name") == "[memory]" and e["args"].get("Device Type") == 0]
    live: set[int] = set()
    peak, at_peak = -1, set()
    for e in sorted(events, key=lambda e: e["ts"]):
        (live.add if e["args"]["Bytes"] > 0 else live.discard)(e["args"]["Addr"])
        if e["args"]["Total Allocated"] > peak:
            peak, at_peak = e["args"]["Total Allocated"], set(live)
    return at_peak


def _summary_groups(path: Path) -> dict[str, dict]:
    run = invoke("summary", str(path), "--format", "json")
    assert run.returncode == 0, run.stderr
    (device,) = json.loads(run.stdout)["devices"]
    assert device["device_name"] == "cpu"
    return {g["family"]: g for g in device["groups"]}


# --- a hand-written Adam over hand-made weights --------------------------------------------

#: three layers' weights and biases; the batch's targets (16 x 8 fp32) are 512 bytes, the
#: size of no weight, and the backward's activation gradients of that shape are freed
#: inside it
SHAPES = [(256, 96), (96,), (96, 48), (48,), (48, 8), (8,)]


@pytest.mark.torch
def test_hand_written_adam_state(tmp_path: Path) -> None:
    """Weights made by torch.randn(requires_grad=True) inside the window and an Adam whose
    moments the program makes with torch.zeros_like in its own step: at the peak (the first
    step's update), the blocks named parameters are the weights' storages and those named
    optimizer_state the moments', two per weight; the inputs and targets are neither."""
    torch = require("torch")
    torch.manual_seed(0)

    def train() -> dict[str, list[Any]]:
        ws = [torch.randn(*s, requires_grad=True) for s in SHAPES]
        x, y = torch.randn(16, 256), torch.randn(16, 8)
        moments: list[Any] = []
        for t in range(1, 4):
            h = x
            for i in range(0, len(ws), 2):
                h = h @ ws[i] + ws[i + 1]
                h = torch.tanh(h) if i < len(ws) - 2 else h
            ((h - y) ** 2).mean().backward()
            if not moments:
                moments = [(torch.zeros_like(w), torch.zeros_like(w)) for w in ws]
            with torch.no_grad():
                for w, (m, v) in zip(ws, moments, strict=True):
                    m.mul_(0.9).add_(w.grad, alpha=0.1)
                    v.mul_(0.999).addcmul_(w.grad, w.grad, value=0.001)
                    step = (m / (1 - 0.9 ** t)) / ((v / (1 - 0.999 ** t)).sqrt() + 1e-8)
                    w.sub_(1e-3 * step)
            for w in ws:
                w.grad = None
        # the job holds its model, optimizer and data past the profiled window
        return {"parameters": ws, "optimizer_state": [s for pair in moments for s in pair],
                "inputs": [x, y]}

    path, held = _profiled(tmp_path, "adam", train)
    truth = {k: {_storage(t) for t in ts} for k, ts in held.items()}
    assert truth["parameters"] | truth["optimizer_state"] <= _live_at_peak(path)

    a = snapana.load(path)
    b = a.blocks
    for family, method in (("parameters", "size-mirror:hand-parameters"),
                           ("optimizer_state", "size-mirror:hand-optimizer")):
        got = b.filter(pl.col("family") == family)
        assert set(got["address"].to_list()) == truth[family], family
        assert set(got["method"].to_list()) == {method}
    inputs = b.filter(pl.col("address").is_in(list(truth["inputs"])))
    assert not set(inputs["family"].to_list()) & {"parameters", "optimizer_state"}

    weight_bytes = sum(4 * (s[0] * s[1] if len(s) == 2 else s[0]) for s in SHAPES)
    groups = _summary_groups(path)
    assert (groups["parameters"]["blocks"], groups["parameters"]["bytes"]) == (
        len(SHAPES), weight_bytes)
    assert (groups["optimizer_state"]["blocks"], groups["optimizer_state"]["bytes"]) == (
        2 * len(SHAPES), 2 * weight_bytes)
