"""Weights already in 16 bits are not offered lower precision (issue 67).

torch's cuBLAS wrappers are templates on their operands' dtype (aten/src/ATen/cuda/
CUDABlas.h: `at::cuda::blas::gemm<Dtype>`), so a recorded C++ frame names the dtype a matmul
ran in; without autocast, addmm / mm run in their weight's dtype (they refuse two dtypes),
and under autocast the fp32 weight is cast first through `at::autocast::cached_cast`. The
simulated jobs below are built with a known weight dtype (the ground truth); the expected
counts are the test's own construction."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest
from snapana.allocator_model.simulator import CachingAllocatorSim
from snapana.synth.recording import start_late

from .conftest import invoke

KiB, MiB = 1 << 10, 1 << 20
TORCH = "/usr/lib/python3/site-packages/torch"
INIT = ((f"{TORCH}/nn/modules/linear.py", 106, "__init__"), ("/work/model.py", 12, "__init__"),
        ("/work/infer.py", 8, "main"))
LINEAR = ((f"{TORCH}/nn/modules/linear.py", 125, "forward"),
          (f"{TORCH}/nn/modules/module.py", 1750, "_call_impl"),
          ("/work/model.py", 40, "forward"), ("/work/infer.py", 20, "main"))
#: a layered model's weights, fp32 bytes (embedding, 4 layers, final norm): GiBs, so that a
#: report does not call the peak too small to need shrinking
LAYER = [256 * MiB] * 4 + [384 * MiB] * 2 + [16 * KiB] * 2
WEIGHTS = [512 * MiB] + LAYER * 4 + [16 * KiB]
LINEARS = 4 * 6  # the matmuls of one forward: 6 per layer
STEPS = 10


def _gemm(dtype: str) -> tuple[str, int, str]:
    """The C++ frame of torch's cuBLAS wrapper for `dtype` (its template argument)."""
    return ("??", 0, f"void at::cuda::blas::gemm<{dtype}>(char, char, long, long, long, "
                     f"at::OpMathType<{dtype}>::type, {dtype} const*, long, {dtype} const*, "
                     f"long, at::OpMathType<{dtype}>::type, {dtype}*, long)")


CAST = ("??", 0, "at::autocast::cached_cast(c10::ScalarType, at::Tensor const&, "
                 "c10::DeviceType)")


def _job(tmp_path: Path, gemm: str, autocast: bool = False, history: bool = True) -> Path:
    """Inference with the weights loaded before recording (2 bytes per element where `gemm`
    is 16-bit, 4 where it is float), then STEPS forwards: each Linear's output made under
    its cuBLAS matmul (and, under `autocast`, the weight's cast copy made first)."""
    sim = CachingAllocatorSim(80 * 1024 * MiB)
    shrink = 1 if gemm == "float" else 2
    for size in WEIGHTS:
        sim.malloc(size // shrink, INIT, family="parameters")
    mark = len(sim.trace)
    for _ in range(STEPS):
        made = []
        for _ in range(LINEARS):
            if autocast:
                made.append(sim.malloc(2 * MiB, (CAST, *LINEAR), family="autocast_copies"))
            made.append(sim.malloc(256 * KiB, (_gemm(gemm), *LINEAR),
                                   family="activation_temporaries"))
        for a in made:
            sim.free(a)
    snap = start_late(sim.snapshot(), mark if history else len(sim.trace))
    path = tmp_path / f"{gemm.replace('::', '_')}-{autocast}-{history}.pickle"
    path.write_bytes(pickle.dumps(snap, protocol=4))
    return path


def _diagnosis(path: Path) -> dict:
    got = invoke("summary", str(path), "--format", "json")
    assert got.returncode == 0, got.stderr
    return json.loads(got.stdout)["devices"][0]["diagnosis"]


@pytest.mark.parametrize("dtype", ["c10::Half", "c10::BFloat16"])
def test_16_bit_matmuls_without_autocast_say_the_weights_are_16_bit(tmp_path, dtype):
    d = _diagnosis(_job(tmp_path, dtype))
    assert f"{STEPS * LINEARS} allocations" in d["facts"]["half_precision_weights"]
    assert dtype in d["facts"]["half_precision_weights"]
    assert "torch.low_precision_weights" not in [k["id"] for k in d["knobs"]]


def test_fp32_matmuls_leave_the_knob_offered(tmp_path):
    """The same job with fp32 weights: the weights hold most of the peak and would halve."""
    d = _diagnosis(_job(tmp_path, "float"))
    assert "half_precision_weights" not in d["facts"]
    assert "torch.low_precision_weights" in [k["id"] for k in d["knobs"]]


def test_autocast_or_no_history_says_nothing_of_the_weights_dtype(tmp_path):
    """16-bit matmuls under autocast ran fp32 weights' cast copies; a dump without history
    shows no window's matmuls: neither shows the weights are 16-bit."""
    for path in (_job(tmp_path, "c10::Half", autocast=True),
                 _job(tmp_path, "c10::Half", history=False)):
        assert "half_precision_weights" not in _diagnosis(path)["facts"], path.name
