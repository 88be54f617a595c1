"""An Ascend NPU's snapshot is named npu:N wherever snapana shows its device. torch_npu writes
PyTorch's snapshot format and names its devices cuda:N; what tells it apart is in the
capture: the 32 B its allocator adds to every request before rounding (the final blocks
show it) or a frame in torch_npu. A CUDA capture keeps cuda:N. The captures are simulated,
so the truth (which allocator padded, which frames ran) is the test's own."""

from __future__ import annotations

import pickle

import pytest
from snapana.synth import CachingAllocatorSim

from .conftest import corpus_params, invoke

MiB = 2**20
SITE = "/usr/lib/python3.10/site-packages"
TRAIN = [("/job/train.py", 20, "step")]
NPU_CALL = [(f"{SITE}/torch_npu/npu/memory.py", 301, "empty_cache"), *TRAIN]


def _capture(tmp_path, pad: int, frames) -> str:
    """Requests 16 B short of a 512 B multiple: rounded alone they fit it, padded by 32 B
    they take one more granule, so the final blocks witness the pad (or its absence)."""
    sim = CachingAllocatorSim(capacity=4096 * MiB, request_pad=pad)
    for i in range(1, 9):
        sim.malloc(4096 * i - 16, frames)
    sim.malloc(64 * MiB, frames)
    path = tmp_path / f"pad{pad}.pickle"
    path.write_bytes(pickle.dumps(sim.snapshot(), protocol=4))
    return str(path)


@pytest.mark.parametrize(("pad", "frames", "name"), [
    (0, TRAIN, "cuda:0"),       # CUDA's allocator, no torch_npu frame
    (32, TRAIN, "npu:0"),       # torch_npu's pad in the final blocks
    (0, NPU_CALL, "npu:0"),     # a frame in torch_npu
])
def test_the_device_is_named_by_what_the_capture_shows(tmp_path, pad, frames, name) -> None:
    out = invoke("summary", _capture(tmp_path, pad, frames), "--full").stdout
    assert out.splitlines()[0].startswith(f"── {name} "), out.splitlines()[0]
    other = "cuda:0" if name == "npu:0" else "npu:0"
    assert other not in out


@pytest.mark.parametrize("path", corpus_params("torch_snapshots", "codeasier+MemSnapDump__*"))
def test_the_corpus_npu_captures_are_named_npu(path) -> None:
    """MemSnapDump's fixtures are torch_npu captures (their reviews in tests/expectations say
    what each holds); none is shown as a CUDA device."""
    out = invoke("summary", str(path), "--full").stdout
    assert out.splitlines()[0].startswith("── npu:0 "), out.splitlines()[0]
    assert "cuda:0" not in out
