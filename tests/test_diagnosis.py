"""Diagnosis on the seed incidents: cause, excess family, knob, and what-if arithmetic checked
against the allocator simulator re-run without the family."""

from __future__ import annotations

import json
import pickle

import pytest
from snapana.render.wording import verdict
from snapana.session import analyse
from snapana.sources import load
from snapana.synth import CachingAllocatorSim, SimulatedOOM

from .conftest import SAMPLES, raw_load

MiB, GiB = 2**20, 2**30


def _sample(name):
    path = SAMPLES / f"{name}.pickle"
    truth = json.loads((SAMPLES / f"{name}.truth.json").read_text())
    (r,) = analyse(load(path), capacity=truth["capacity_bytes"])
    return path, truth, r


def _raw_oom(path):
    raw = raw_load(path)
    (oom,) = [e for e in raw["device_traces"][0] if e["action"] == "oom"]
    reserved = sum(s["total_size"] for s in raw["segments"])
    allocated = sum(b["size"] for s in raw["segments"] for b in s["blocks"]
                    if b["state"] == "active_allocated")
    return oom, reserved, allocated


def test_s1_3_chunked_logprob_is_real_demand_and_the_saved_softmax_can_go():
    path, truth, r = _sample("slime-tp2-chunked-logprob-oom")
    d = r.diagnosis
    oom, reserved, allocated = _raw_oom(path)
    assert d.request_bytes == oom["size"] and r.oom.device_free_bytes == oom["device_free"]
    assert r.cached_unallocated_bytes == reserved - allocated  # the OOM is the last event
    assert d.cause("real_demand").holds and not d.cause("fragmentation").holds
    assert d.excess_family == "saved_logprob_softmax"
    w = next(w for w in d.what_ifs if w.family == "saved_logprob_softmax")
    assert w.fits and w.spare_bytes > 0
    assert {x.family: x.removable for x in d.what_ifs}.get("optimizer_state") != "yes"
    assert d.knobs[0].knob == "--recompute-loss-function"
    chunk_caveat = next(k for k in d.knobs if k.knob == "--log-probs-chunk-size").caveat
    assert "does not lower what is saved" in chunk_caveat
    text = verdict(r)
    assert "not fragmentation" in text and "--recompute-loss-function" in text
    assert f"{truth['chunks']['saved_chunks']} chunks" in text


def test_s1_1_fp32_logits_copy_names_tp_and_max_tokens():
    path, _, r = _sample("slime-tp1-logits-fp32-oom")
    d = r.diagnosis
    oom, _, _ = _raw_oom(path)
    assert d.request_bytes == oom["size"]
    assert d.request_family == "logits" and "float16_to_fp32" in d.request_label
    assert not d.cause("fragmentation").holds
    top = [k.knob for k in d.knobs[:4]]
    assert any("tensor-model-parallel" in k for k in top)
    assert any("max-tokens-per-gpu" in k for k in top)


def test_s2_colocated_vllm_is_not_fragmentation():
    path, truth, r = _sample("swift-vllm-colocate-oom")
    d = r.diagnosis
    oom, reserved, allocated = _raw_oom(path)
    assert r.cached_unallocated_bytes == reserved - allocated
    assert round(r.cached_unallocated_bytes / MiB, 2) == 66.45
    assert not d.cause("fragmentation").holds and d.cause("real_demand").holds
    assert d.outside_pytorch_bytes == truth["capacity_bytes"] - reserved - oom["device_free"]
    held = {g.name for g in r.groups[:4]}
    assert {"parameters", "kv_cache"} <= held  # the colocated vLLM engine
    assert d.excess_family in ("grad_buffer", "param_buffer")  # the un-offloaded buffers
    assert "offload" in d.knobs[0].knob


def test_no_oom_diagnoses_the_peak_and_says_so():
    _, _, r = _sample("slime-tp2-recompute-loss-ok")
    assert r.oom is None and r.diagnosis.kind == "peak"
    assert r.allocated_bytes == r.peak_allocated_bytes
    assert "No OOM recorded: this diagnoses the peak" in verdict(r)


# ----- what-if arithmetic against the simulator ------------------------------------------
SITE = "/usr/lib/python3.10/site-packages"
STACKS = {
    "parameters": [(f"{SITE}/torch/nn/modules/module.py", "_apply", 930),
                   ("/job/train.py", "main", 10)],
    "saved_activations": [("/job/model.py", "forward", 54),
                          (f"{SITE}/torch/nn/modules/module.py", "_call_impl", 1790),
                          ("/job/train.py", "main", 30)],
    "saved_logprob_softmax": [(f"{SITE}/slime/utils/ppo_utils.py", "vocab_parallel_softmax", 371),
                              (f"{SITE}/slime/utils/ppo_utils.py",
                               "calculate_log_probs_and_entropy", 402),
                              ("/job/train.py", "main", 40)],
}
REQUEST_STACK = STACKS["saved_logprob_softmax"]


def _program(capacity, skip=None):
    """A step: parameters, activations (some freed), saved softmax chunks, then a request."""
    sim = CachingAllocatorSim(capacity=capacity, outside_pytorch=512 * MiB)

    def malloc(size, family):
        if family != skip:
            return sim.malloc(size, [(f, ln, n) for f, n, ln in STACKS[family]],
                              family=family)
        return None

    for _ in range(6):
        malloc(700 * MiB, "parameters")
    acts = [malloc(s, "saved_activations") for s in (300 * MiB, 5 * MiB, 96 * MiB, 3 * MiB)]
    for a in acts[1::2]:
        if a is not None:
            sim.free(a)
    for _ in range(4):
        malloc(256 * MiB, "saved_logprob_softmax")
    try:
        sim.malloc(900 * MiB, [(f, ln, n) for f, n, ln in REQUEST_STACK],
                   family="saved_logprob_softmax")
    except SimulatedOOM:
        return sim, False
    return sim, True


@pytest.mark.parametrize("capacity_mib", [6300, 6600, 7000])
def test_what_if_agrees_with_rerunning_the_simulator(tmp_path, capacity_mib):
    sim, fitted = _program(capacity_mib * MiB)
    assert not fitted
    path = tmp_path / "s.pickle"
    path.write_bytes(pickle.dumps(sim.snapshot(), protocol=4))
    (r,) = analyse(load(path))
    by_family = {w.family: w for w in r.diagnosis.what_ifs}
    assert set(by_family) == set(STACKS)
    outcomes = set()
    for family in STACKS:
        _, fits_without = _program(capacity_mib * MiB, skip=family)
        assert by_family[family].fits == fits_without, family
        outcomes.add(fits_without)
    if capacity_mib == 6600:
        assert outcomes == {True, False}  # the cases really discriminate


def test_a_user_pack_knob_reaches_the_diagnosis(tmp_path) -> None:
    """Knobs and markers from a --rules file count like a built-in pack's."""
    import snapana

    pack = tmp_path / "mine.toml"
    pack.write_text(
        '[pack]\nname = "mine"\nmarkers = ["slime/"]\n\n'
        '[[knob]]\nid = "mine.smaller_chunks"\nknob = "--my-chunks"\n'
        'families = ["saved_logprob_softmax"]\ndirection = "lowers"\ncost = "free"\n'
        'effect = "keeps fewer chunks"\n')
    sample = SAMPLES / "slime-tp2-chunked-logprob-oom.pickle"
    ids = [k.id for k in snapana.load(sample, rules=[pack]).diagnosis.knobs]
    assert "mine.smaller_chunks" in ids
    assert "mine.smaller_chunks" not in [k.id for k in snapana.load(sample).diagnosis.knobs]
