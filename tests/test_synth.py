"""The sample snapshots: real PyTorch format, internally consistent, replayable, carrying the
incident numbers of SCENARIOS.md, and up to date with the generator."""

from __future__ import annotations

import io
import json
import pickle
from pathlib import Path
from typing import Any

import pytest
from snapana.synth.scenarios import SCENARIOS, write_sample

from .conftest import require, vocabulary

SAMPLES = Path(__file__).resolve().parent.parent / "sample_snapshots"
MiB, GiB = 1024**2, 1024**3
#: the families the truth may name: the vocabulary file's (read with tomllib, not snapana)
FAMILIES = {f["id"] for f in vocabulary()["family"]}
V_HALF = 248320 // 2  # Qwen3.5-4B vocab at TP=2


class _BuiltinsOnly(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:  # noqa: D102
        raise AssertionError(f"sample pickle references {module}.{name}")


def load(name: str) -> dict[str, Any]:
    return _BuiltinsOnly(io.BytesIO((SAMPLES / f"{name}.pickle").read_bytes())).load()


def load_truth(name: str) -> dict[str, Any]:
    return json.loads((SAMPLES / f"{name}.truth.json").read_text())


def torch_format_size(n: int) -> str:
    """c10's format_size, as used in the OutOfMemoryError message."""
    if n <= 1024:
        return f"{n} bytes"
    if n <= 1024**2:
        return f"{n / 1024:.2f} KiB"
    if n <= 1024**3:
        return f"{n / 1024**2:.2f} MiB"
    return f"{n / 1024**3:.2f} GiB"


def events(d: dict[str, Any]) -> list[dict[str, Any]]:
    return d["device_traces"][0]


def oom_event(d: dict[str, Any]) -> dict[str, Any]:
    (oom,) = [e for e in events(d) if e["action"] == "oom"]
    return oom


def reserved(d: dict[str, Any]) -> int:
    return sum(s["total_size"] for s in d["segments"])


def allocated(d: dict[str, Any]) -> int:
    return sum(s["allocated_size"] for s in d["segments"])


def live_blocks(d: dict[str, Any], state: str = "active_allocated") -> list[dict[str, Any]]:
    return [b for s in d["segments"] for b in s["blocks"] if b["state"] == state]


def innermost(b: dict[str, Any]) -> str:
    return b["frames"][0]["name"] if b["frames"] else ""


def names(frames: list[dict[str, Any]]) -> list[str]:
    return [f["name"] for f in frames]


ALL = list(SCENARIOS)


# ------------------------------------------------------------------ format and consistency
@pytest.mark.parametrize("name", ALL)
def test_sample_is_small_builtin_pickle(name: str) -> None:
    path = SAMPLES / f"{name}.pickle"
    assert path.stat().st_size < 5 * 1024 * 1024
    d = load(name)
    assert set(d) == {"segments", "device_traces", "allocator_settings", "external_annotations"}
    assert 0 < len(events(d)) < 5000


@pytest.mark.parametrize("name", ALL)
@pytest.mark.torch
def test_pytorch_tools_read_the_sample(name: str) -> None:
    mv = require("torch.cuda._memory_viz")
    d = load(name)
    summary = mv.segsum(d)
    assert f"segments: {len(d['segments'])}" in summary
    text = mv.trace(d)
    assert f"{len(events(d))} entries" in text


@pytest.mark.parametrize("name", ALL)
def test_segments_are_internally_consistent(name: str) -> None:
    d = load(name)
    addrs = [s["address"] for s in d["segments"]]
    assert addrs == sorted(addrs)
    for seg in d["segments"]:
        blocks = seg["blocks"]
        assert sum(b["size"] for b in blocks) == seg["total_size"]
        assert seg["allocated_size"] == sum(
            b["size"] for b in blocks if b["state"] == "active_allocated")
        assert seg["active_size"] == sum(b["size"] for b in blocks if b["state"] != "inactive")
        addr = seg["address"]
        for b in blocks:
            assert b["address"] == addr
            assert b["size"] % 512 == 0
            addr += b["size"]
        if seg["segment_type"] == "small":
            assert seg["total_size"] == 2 * MiB or seg["is_expandable"]


@pytest.mark.parametrize("name", ALL)
def test_trace_replay_reproduces_final_state(name: str) -> None:
    """Replay device_traces forwards from an empty device (everything was recorded)."""
    d = load(name)
    live: dict[int, tuple[int, str]] = {}
    mem = 0
    for e in events(d):
        act = e["action"]
        if act == "alloc":
            assert e["addr"] not in live
            live[e["addr"]] = (e["size"], "active_allocated")
        elif act == "free_requested":
            size, state = live[e["addr"]]
            assert state == "active_allocated" and size == e["size"]
            live[e["addr"]] = (size, "active_pending_free")
        elif act == "free_completed":
            assert live.pop(e["addr"])[0] == e["size"]
        elif act in ("segment_alloc", "segment_map"):
            mem += e["size"]
        elif act in ("segment_free", "segment_unmap"):
            mem -= e["size"]
    assert mem == reserved(d)
    final = {
        b["address"]: (b["requested_size"], b["state"])
        for s in d["segments"] for b in s["blocks"] if b["state"] != "inactive"
    }
    assert final == live


@pytest.mark.parametrize("name", ALL)
def test_truth_matches_sample(name: str) -> None:
    d, t = load(name), load_truth(name)
    assert t["scenario"] == name
    assert t["reserved_bytes"] == reserved(d)
    assert t["allocated_bytes"] == allocated(d)
    pending = sum(b["size"] for b in live_blocks(d, "active_pending_free"))
    assert t["cached_unallocated_bytes"] == reserved(d) - allocated(d) - pending
    blocks = {b["address"]: b["size"] for s in d["segments"] for b in s["blocks"]
              if b["state"] != "inactive"}
    assert {b["address"]: b["size"] for b in t["blocks"]} == blocks
    assert {b["family"] for b in t["blocks"]} <= FAMILIES
    ooms = [e for e in events(d) if e["action"] == "oom"]
    if t["oom"] is None:
        assert not ooms
    else:
        assert ooms[-1]["device_free"] == t["oom"]["device_free_bytes"]
        assert ooms[-1]["device_free"] == (
            t["capacity_bytes"] - reserved(d) - t["outside_pytorch_bytes"])


@pytest.mark.parametrize("name", ALL)
def test_samples_are_up_to_date(name: str, tmp_path: Path) -> None:
    out, truth = write_sample(name, tmp_path / f"{name}.pickle")
    assert out.read_bytes() == (SAMPLES / f"{name}.pickle").read_bytes(), (
        "stale sample: run python -m snapana.synth.scenarios --all sample_snapshots/")
    assert truth.read_bytes() == (SAMPLES / f"{name}.truth.json").read_bytes()


# ------------------------------------------------------------------ SCENARIOS.md numbers
def test_s1_tp1_logits_fp32_asks_29_5_gib() -> None:
    d = load("slime-tp1-logits-fp32-oom")
    oom = oom_event(d)
    assert torch_format_size(oom["size"]) == "29.50 GiB"
    assert names(oom["frames"])[:3] == ["float_conversion", "conversion_helper",
                                        "float16_to_fp32"]
    assert oom["device_free"] < oom["size"]
    tokens = oom["size"] // (248320 * 4)
    assert tokens <= 32768  # packed into one max-tokens-per-gpu box


def test_s1_long_episode_softmax_asks_13_gib() -> None:
    d = load("slime-tp1-long-episode-softmax-oom")
    oom = oom_event(d)
    assert torch_format_size(oom["size"]) == "13.00 GiB"
    assert oom["frames"][0]["name"] == "vocab_parallel_softmax"
    tokens = oom["size"] / (248320 * 4)
    assert tokens == int(tokens) and tokens > 8192  # longer than the packing box


def test_s1_tp2_chunked_logprob_numbers() -> None:
    d = load("slime-tp2-chunked-logprob-oom")
    oom = oom_event(d)
    assert round(oom["size"] / MiB) == 464
    assert round(oom["device_free"] / MiB) == 207
    assert oom["frames"][0]["name"] == "vocab_parallel_softmax"
    unalloc = reserved(d) - allocated(d)
    assert 550 * MiB <= unalloc <= 650 * MiB  # "~600 MiB reserved-but-unallocated"
    assert round(allocated(d) / GiB, 1) == 77.3
    capacity = load_truth("slime-tp2-chunked-logprob-oom")["capacity_bytes"]
    assert round(capacity / GiB, 1) == 79.3
    softmax = [b for b in live_blocks(d) if innermost(b) == "vocab_parallel_softmax"
               and "_calculate_log_probs_and_entropy_chunk" in names(b["frames"])
               and b["requested_size"] > 100 * MiB]
    chunk = 1024 * V_HALF * 4
    saved = [b for b in softmax if b["requested_size"] == chunk]
    (last_temp,) = [b for b in softmax if b["requested_size"] != chunk]
    assert len(saved) == 7 and last_temp["requested_size"] == oom["size"]
    assert torch_format_size(chunk) == "485.00 MiB"
    last_tokens = oom["size"] // (V_HALF * 4)
    assert last_tokens * V_HALF * 4 == oom["size"]
    assert len(saved) + 1 == 8 and 7 * 1024 + last_tokens > 8000  # 8 chunks of T~8192
    # every saved chunk outlives its forward: chunking bounds the transient, not the total
    assert sum(b["requested_size"] for b in saved) + oom["size"] > 3.7 * GiB


def test_s1_recompute_loss_fits_at_its_peak() -> None:
    d = load("slime-tp2-recompute-loss-ok")
    assert not [e for e in events(d) if e["action"] == "oom"]
    assert any("checkpoint" in names(e.get("frames", [])) for e in events(d))
    forward_softmax = [b for b in live_blocks(d) if innermost(b) == "vocab_parallel_softmax"
                       and "unpack_hook" not in names(b["frames"])]
    assert forward_softmax == []
    recomputed = [b for b in live_blocks(d) if "recompute_fn" in names(b["frames"])]
    assert recomputed
    live = peak = 0
    for e in events(d):  # the snapshot is the step's peak of live requested bytes
        if e["action"] == "alloc":
            live += e["size"]
            peak = max(peak, live)
        elif e["action"] == "free_completed":
            live -= e["size"]
    assert live == peak == sum(s["requested_size"] for s in d["segments"])
    assert allocated(d) < allocated(load("slime-tp2-chunked-logprob-oom"))


def test_s2_swift_oom_message_numbers() -> None:
    d = load("swift-vllm-colocate-oom")
    oom = oom_event(d)
    t = load_truth("swift-vllm-colocate-oom")
    assert torch_format_size(oom["size"]) == "7.50 GiB"
    assert torch_format_size(oom["device_free"]) == "975.94 MiB"
    assert torch_format_size(t["capacity_bytes"]) == "79.25 GiB"
    assert torch_format_size(allocated(d)) == "77.28 GiB"
    assert torch_format_size(reserved(d) - allocated(d)) == "66.45 MiB"
    assert names(oom["frames"])[0] == "load_megatron_model_to_gpu"
    sites = {innermost(b) for b in live_blocks(d)}
    assert {"create_weights", "_allocate_kv_cache_tensors", "__init__"} <= sites
    pools = {s["segment_pool_id"] for s in d["segments"]}
    assert (0, 1) in pools and (0, 2) in pools


def test_fsdp_streams_pending_frees_and_optimizer_window() -> None:
    d = load("fsdp-train-step")
    (start, end) = d["external_annotations"]
    assert start["name"] == end["name"] == "Optimizer.step#AdamW.step"
    assert {start["stage"], end["stage"]} == {"START", "END"}
    inside = [e for e in events(d) if e["action"] == "alloc"
              and start["time_us"] <= e["time_us"] <= end["time_us"]]
    assert inside and all("wrapper" in names(e["frames"]) for e in inside)
    assert all(names(e["frames"])[0] == "_init_group" for e in inside)
    assert len({s["stream"] for s in d["segments"]}) == 3
    assert live_blocks(d, "active_pending_free")
    assert any(names(e.get("frames", []))[-1:] and "foreach_all_gather" in names(e["frames"])
               for e in events(d))


def test_expandable_segments_sample() -> None:
    d = load("expandable-segments-oom")
    assert d["allocator_settings"]["expandable_segments"] is True
    assert "expandable_segments:True" in d["allocator_settings"]["PYTORCH_CUDA_ALLOC_CONF"]
    assert all(s["is_expandable"] for s in d["segments"])
    acts = {e["action"] for e in events(d)}
    assert {"segment_map", "segment_unmap", "oom"} <= acts
    assert "segment_alloc" not in acts
    oom = oom_event(d)
    assert oom["device_free"] < oom["size"]
