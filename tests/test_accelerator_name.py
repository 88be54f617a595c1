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


#: torch_npu's allocator (torch_npu/csrc/core/npu/NPUCachingAllocator.cpp), as the test
#: states it: round_size(n) adds 32 bytes, then rounds up to 512 (kMinBlockSize); malloc
#: chooses the pool on that padded size, get_pool: small when it is at most kSmallSize
#: (1 MiB), else large; a large request under 10 MiB gets a kLargeBuffer (20 MiB) segment.
def _npu_round(n: int) -> int:
    return max(512, -(-(n + 32) // 512) * 512)


def _npu_window(req: int, count: int) -> dict:
    """A torch_npu snapshot that ends with nothing live: one 20 MiB segment, `count`
    requests of `req` bytes cut from its start one after another, all freed again."""
    base, seg = 0x12C041200000, 20 * MiB
    block = _npu_round(req)
    trace = [{"action": "segment_alloc", "addr": base, "size": seg, "stream": 0, "frames": []}]
    for i in range(count):
        trace.append({"action": "alloc", "addr": base + i * block, "size": req, "stream": 0,
                      "frames": []})
    for i in range(count):
        for action in ("free_requested", "free_completed"):
            trace.append({"action": action, "addr": base + i * block, "size": req,
                          "stream": 0, "frames": []})
    segment = {"device": 0, "address": base, "total_size": seg, "stream": 0,
               "segment_type": "large", "allocated_size": 0, "active_size": 0,
               "requested_size": 0, "blocks": [{"address": base, "size": seg,
                                                "requested_size": 0, "state": "inactive",
                                                "frames": []}]}
    return {"segments": [segment], "device_traces": [trace]}


def test_a_request_its_pad_lifts_past_the_small_pool_is_replayed_as_the_large_pools(
        tmp_path) -> None:
    """1 MiB - 16 B: CUDA's rule rounds it to 1 MiB, a small-pool block; torch_npu's pads it
    to 1 MiB + 16 B and rounds that to 1 MiB + 512 B, over kSmallSize: the large pool, which
    is where the capture holds it (a 20 MiB segment). With nothing live at the end, only the
    pool shows the pad: each block is 1 MiB + 512 B, and the peak three of them."""
    from snapana.analysis.replay import replay
    from snapana.sources import torch_snapshot

    req = MiB - 16
    assert _npu_round(req) == MiB + 512 > MiB and -(-req // 512) * 512 == MiB
    path = tmp_path / "npu.pickle"
    path.write_bytes(pickle.dumps(_npu_window(req, 3), protocol=4))
    dr = replay(torch_snapshot.load(path), 0)
    assert dr.mismatches == []
    assert dr.request_pad == 32
    assert dr.peak_allocated_bytes == 3 * _npu_round(req)


@pytest.mark.parametrize("path", corpus_params(
    "torch_snapshots", "codeasier+MemSnapDump__tests_test_data_snapshot_1768*"))
def test_the_npu_capture_that_ends_empty_is_replayed_with_its_pad(path) -> None:
    """This torch_npu capture ends with no live block, so no final block shows the pad; its
    trace puts 1 MiB requests (1 MiB + 32 B padded: large) in 20 MiB segments. The peak and
    reserved bytes are the independent replay's (tests/raw_replay.py), which reads the pad
    from the same pools by its own code; each is checked against the trace here too."""
    from snapana.analysis.replay import replay
    from snapana.sources import torch_snapshot

    from .conftest import raw_load
    from .raw_replay import final_blocks, pool_witnesses, raw_replay

    raw = raw_load(path)
    assert not final_blocks(raw, 0)  # nothing live at the end: only the pools can tell
    trace = raw["device_traces"][0]
    megs = [e for e in trace if e["action"] == "alloc" and e["size"] == MiB]
    assert megs and _npu_round(MiB) > MiB
    assert pool_witnesses(raw, 0) == {0: 0, 32: len(megs)}
    judge = raw_replay(raw, 0)
    assert judge.pad == 32
    dr = replay(torch_snapshot.load(path), 0)
    assert dr.request_pad == 32 and dr.mismatches == []
    assert dr.peak_allocated_bytes == judge.peak
    reserved = sum(e["size"] for e in trace if e["action"] == "segment_alloc") - sum(
        e["size"] for e in trace if e["action"] == "segment_free")
    assert int(dr.reserved.max()) == reserved == sum(s["total_size"] for s in raw["segments"])
