"""A steady loop keeps what it was given, not only a model (issue 67).

A standalone op benchmarked in a loop (CS336's hand-written attention, no model) keeps its
inputs Q, K, V and the cuBLAS workspace from before recording through the whole window, as
an inference loop keeps its weights. "Never freed through a steady loop" is no evidence of
weights: the kept blocks must repeat in size as a layered model's do. Ground truth is the
simulator's; the workspace size is torch's own default (aten/src/ATen/cuda/CublasHandlePool.cpp
`:4096:2:16:8`: two 4096 KiB buffers and eight 16 KiB ones, off sm90)."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import polars as pl
import snapana
from snapana.allocator_model.simulator import CachingAllocatorSim
from snapana.synth.recording import start_late

from .conftest import invoke

KiB, MiB = 1 << 10, 1 << 20
#: CUBLAS_WORKSPACE_CONFIG's default off sm90, `:SIZE_KiB:COUNT` pairs summed
CUBLAS_DEFAULT = 4096 * KiB * 2 + 16 * KiB * 8
BATCH, SEQ, D, FP32 = 8, 256, 32, 4
INPUT = BATCH * SEQ * D * FP32  # one [8, 256, 32] fp32 input
SCORES = BATCH * SEQ * SEQ * FP32  # one [8, 256, 256] fp32 matrix
OP = (("/work/attention.py", 203, "scaled_dot_product_attention"),
      ("/work/benchmark.py", 62, "benchmark"), ("/work/benchmark.py", 300, "<module>"))
INIT = (("/work/model.py", 12, "__init__"), ("/work/benchmark.py", 290, "<module>"))
#: a small layered model's weights (embedding, 4 layers of q k v o up down and 2 norms)
LAYER = [4 * MiB] * 4 + [6 * MiB] * 2 + [16 * KiB] * 2
WEIGHTS = [8 * MiB] + LAYER * 4 + [16 * KiB]
CALLS = 60  # 3 allocations per call: a steady loop of 180, all freed


def _benchmark(tmp_path: Path, kept: list[int], name: str) -> tuple[Path, dict[int, str]]:
    """`kept` put on the device before recording (frameless once recording starts late),
    the cuBLAS workspace made by the first matmul, then the op called CALLS times, each
    call allocating and freeing its scores, probabilities and output."""
    sim = CachingAllocatorSim(80 * 1024 * MiB)
    for size in kept:
        sim.malloc(size, INIT, family="parameters" if kept is WEIGHTS else "inputs")
    sim.malloc(CUBLAS_DEFAULT, INIT, family="workspace")
    mark = len(sim.trace)
    for _ in range(CALLS):
        made = [sim.malloc(s, OP, family="activation_temporaries")
                for s in (SCORES, SCORES, INPUT)]
        for a in made:
            sim.free(a)
    truth = {b.address: b.family for b in sim.live_blocks()}
    path = tmp_path / f"{name}.pickle"
    path.write_bytes(pickle.dumps(start_late(sim.snapshot(), mark), protocol=4))
    return path, truth


def test_a_standalone_ops_kept_inputs_are_not_called_weights(tmp_path: Path) -> None:
    """Four inputs of one size and the cuBLAS workspace, kept through a steady loop: no
    parameters, labelled as what the program keeps; low-precision weights not offered."""
    path, truth = _benchmark(tmp_path, [INPUT] * 4, "op")
    blocks = snapana.load(path).blocks
    early = blocks.filter(pl.col("alloc_idx") < 0)
    assert sorted(early["requested_size"].to_list()) == sorted([INPUT] * 4 + [CUBLAS_DEFAULT])
    assert set(early["family"].to_list()) == {"unknown"}
    for reason in early["reason"].to_list():
        assert "do not repeat in size as a layered model's weights do" in reason, reason
        assert "likely the model's weights" not in reason
    assert set(truth.values()) == {"inputs", "workspace"}
    got = invoke("summary", str(path), "--format", "json")
    assert got.returncode == 0, got.stderr
    offered = [k["id"] for dev in json.loads(got.stdout)["devices"]
               for k in dev["diagnosis"]["knobs"]]
    assert "torch.low_precision_weights" not in offered, offered


def test_the_same_loop_keeping_a_layered_model_names_its_weights(tmp_path: Path) -> None:
    """The same loop keeping a layered model's weights: every weight is a parameter by the
    steady-loop lifetime, which says the sizes repeat per layer."""
    path, truth = _benchmark(tmp_path, WEIGHTS, "model")
    blocks = snapana.load(path).blocks
    params = blocks.filter(pl.col("family") == "parameters")
    assert set(params["method"].to_list()) == {"lifetime:persistent"}
    assert "repeat in size as a layered model's weights do" in params["reason"][0]
    named = {a for a in params["address"].to_list()}
    assert named >= {a for a, f in truth.items() if f == "parameters"}
