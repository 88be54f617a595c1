"""Diagnosis on the seed incidents: cause, excess family, knob, and what-if arithmetic checked
against the allocator simulator re-run without the family."""

from __future__ import annotations

import json
import pickle

import pytest
from snapana.analysis.diagnosis.causes import Demand, Fragmentation
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
    pending = sum(b["size"] for s in raw["segments"] for b in s["blocks"]
                  if b["state"] == "active_pending_free")
    return oom, reserved, allocated, pending


def test_s1_3_chunked_logprob_is_real_demand_and_the_saved_softmax_can_go():
    path, truth, r = _sample("slime-tp2-chunked-logprob-oom")
    d = r.diagnosis
    oom, reserved, allocated, pending = _raw_oom(path)
    assert d.request_bytes == oom["size"] and r.oom.device_free_bytes == oom["device_free"]
    # the OOM is the last event
    assert r.cached_unallocated_bytes == reserved - allocated - pending
    assert d.cause(Demand).holds and not d.cause(Fragmentation).holds
    assert d.excess_family == "saved_logprob_softmax"
    w = next(w for w in d.what_ifs if w.family == "saved_logprob_softmax")
    assert w.fits and w.spare_bytes > 0
    assert {x.family: x.removable for x in d.what_ifs}.get("optimizer_state") != "yes"
    assert d.knobs[0].knob == "--recompute-loss-function"
    chunk_caveat = next(k for k in d.knobs if k.knob == "--log-probs-chunk-size").caveat
    assert "does not lower what is saved" in chunk_caveat
    text = verdict(r)
    assert "not fragmentation" in text and "--recompute-loss-function" in text
    # the accumulating family first, with its count and size, then the stop knob
    n = truth["chunks"]["saved_chunks"]
    assert d.accumulating is not None and d.accumulating["count"] == n
    assert d.accumulating["count"] * d.accumulating["chunk_size"] == d.accumulating["total"]
    assert text.index("saved_logprob_softmax, already holds") < text.index("alternative")
    assert f"{n} × " in text and "stop the accumulation with --recompute-loss-function" in text
    # then the cheapest sufficient alternative, with its cost class
    alt = next(w for w in d.what_ifs if w.family == d.alternative_family)
    assert alt.fits and d.alternative_family != "saved_logprob_softmax"
    assert "(extra compute)" in text


def test_s1_1_fp32_logits_copy_names_tp_and_max_tokens():
    path, _, r = _sample("slime-tp1-logits-fp32-oom")
    d = r.diagnosis
    oom, *_ = _raw_oom(path)
    assert d.request_bytes == oom["size"]
    assert d.request_family == "logits" and "float16_to_fp32" in d.request_label
    assert not d.cause(Fragmentation).holds
    top = [k.knob for k in d.knobs[:4]]
    assert any("tensor-model-parallel" in k for k in top)
    assert any("max-tokens-per-gpu" in k for k in top)


def test_s2_colocated_vllm_is_not_fragmentation():
    path, truth, r = _sample("swift-vllm-colocate-oom")
    d = r.diagnosis
    oom, reserved, allocated, pending = _raw_oom(path)
    assert r.cached_unallocated_bytes == reserved - allocated - pending
    assert round(r.cached_unallocated_bytes / MiB, 2) == 66.45
    assert not d.cause(Fragmentation).holds and d.cause(Demand).holds
    assert d.outside_pytorch_bytes == truth["capacity_bytes"] - reserved - oom["device_free"]
    held = {g.name for g in r.groups[:4]}
    assert {"parameters", "kv_cache"} <= held  # the colocated vLLM engine
    # it failed while reloading offloaded state: no knob that offloads model state
    assert d.reloading and "reloading offloaded state" in verdict(r)
    assert not any(k.direction == "releases" and {"param_buffer", "grad_buffer"} & set(k.families)
                   for k in d.knobs)
    assert "model init" not in verdict(r)
    # the KV cache sits in vLLM's private pool: freeing its blocks helps only that pool
    kv = next(w for w in d.what_ifs if w.family == "kv_cache")
    assert not kv.fits and kv.private_pool_bytes == kv.bytes and kv.fits_if_pool_released
    assert "frees memory for that pool only" in verdict(r)
    # the un-offloaded buffers are named too: without them the request fits
    assert {d.excess_family, d.alternative_family} & {"grad_buffer", "param_buffer"}
    assert d.knobs[0].framework == "ms_swift" and "sleep_level" in d.knobs[0].knob


def test_no_oom_diagnoses_the_peak_and_says_so():
    _, _, r = _sample("slime-tp2-recompute-loss-ok")
    assert r.oom is None and r.diagnosis.kind == "peak"
    assert r.allocated_bytes == r.peak_allocated_bytes
    assert "No OOM recorded: this diagnoses the peak" in verdict(r)


def test_far_from_capacity_states_the_headroom_and_prescribes_nothing():
    _, truth, near = _sample("fsdp-train-step")
    (far,) = analyse(load(SAMPLES / "fsdp-train-step.pickle"), capacity=80 * GiB)
    d = far.diagnosis
    assert far.reserved_bytes < 0.75 * 80 * GiB
    assert not d.prescribe and d.knobs == () and d.headroom_bytes == 80 * GiB - far.reserved_bytes
    assert "headroom" in verdict(far) and "checkpoint" not in verdict(far)
    (unknown,) = analyse(load(SAMPLES / "fsdp-train-step.pickle"))
    assert unknown.diagnosis.knobs and "If this peak must shrink:" in verdict(unknown)


def test_chunk_loops_are_uniform_repeats_of_loop_families_only():
    for p in sorted(SAMPLES.glob("*.pickle")):
        (r,) = analyse(load(p))
        for g in r.groups:
            if g.name in ("parameters", "optimizer_state", "kv_cache", "grad_buffer",
                          "param_buffer", "main_params_fp32", "gradients"):
                assert g.chunks == (), (p.name, g.name)
            for c in g.chunks:
                assert c["total"] <= g.bytes
                if c["uniform"]:
                    assert c["count"] * c["chunk_size"] == c["total"]


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


# ----- the seed pattern on another framework: a chunk loop that keeps every chunk -----------
AREAL_CHUNK = [(f"{SITE}/areal/utils/functional/vocab_parallel.py", 60, "forward"),
               (f"{SITE}/torch/autograd/function.py", 575, "apply"),
               (f"{SITE}/areal/utils/functional/functional.py", 40, "gather_logprobs"),
               ("/job/train.py", 90, "main")]
FSDP_ACT = [("/job/model.py", 54, "forward"),
            (f"{SITE}/torch/nn/modules/module.py", 1790, "_call_impl"),
            (f"{SITE}/torch/distributed/fsdp/_fully_shard/_fully_shard.py", 500, "forward"),
            ("/job/train.py", 30, "main")]


def test_a_chunk_loop_that_keeps_its_chunks_is_named_before_a_smaller_sufficient_family(
        tmp_path) -> None:
    """An AReaL-style OOM: the 17th 594 MiB softmax chunk fails while 16 are kept for
    backward; removing the smaller saved activations would also fit the request, but the
    verdict names the accumulating family first, with its count and size and the knob that
    stops it, then the alternative with its cost."""
    chunk = 594 * MiB
    sim = CachingAllocatorSim(capacity=16 * chunk + 3200 * MiB + 300 * MiB)
    for _ in range(6):
        sim.malloc(512 * MiB, FSDP_ACT, family="saved_activations")
    for _ in range(16):
        sim.malloc(chunk, AREAL_CHUNK, family="saved_logprob_softmax")
    with pytest.raises(SimulatedOOM):
        sim.malloc(chunk, AREAL_CHUNK, family="saved_logprob_softmax")
    path = tmp_path / "areal.pickle"
    path.write_bytes(pickle.dumps(sim.snapshot(), protocol=4))
    (r,) = analyse(load(path))
    d = r.diagnosis
    assert d.request_family == "saved_logprob_softmax"
    acts = next(w for w in d.what_ifs if w.family == "saved_activations")
    assert acts.fits and acts.bytes < 16 * chunk  # the smaller family would also do
    assert d.excess_family == "saved_logprob_softmax" and d.accumulating["count"] == 16
    assert d.alternative_family == "saved_activations"
    text = verdict(r)
    assert "16 × 594.00 MiB = 9.28 GiB" in text
    assert text.index("saved_logprob_softmax") < text.index("saved_activations")
    assert d.knobs[0].id == "torch.checkpoint_loss" and d.knobs[0].knob in text
    assert "areal" in d.frameworks and all(
        k.framework in {"areal", "fsdp", "pytorch", "any"} for k in d.knobs)


def _trace_only(entries):
    """A snapshot whose trace has segment events but whose final segments are missing."""
    from snapana.sources.torch_snapshot import from_snapshot_dict

    return from_snapshot_dict({"segments": [], "device_traces": [[
        {"stream": 0, "frames": [], **e} for e in entries]]}, "trace-only")


def test_blocks_outside_the_segments_set_the_trace_aside():
    """A trace whose live blocks the segments cannot hold (12288 bytes allocated, 4096
    reserved after event 2) is not the history of the final segments (none here): it is
    not replayed, and the report is the snapshot's final state, said so (issue 66: the
    report printed allocated above reserved, flagged)."""
    (r,) = analyse(_trace_only([
        {"action": "segment_alloc", "addr": 0x100000, "size": 4096},
        {"action": "alloc", "addr": 0x100000, "size": 4096},
        {"action": "alloc", "addr": 0x200000, "size": 8192},  # in no segment
    ]))
    # the raw file's final state: no segments, so nothing reserved and nothing allocated
    assert (r.allocated_bytes, r.reserved_bytes, r.cached_unallocated_bytes) == (0, 0, 0)
    assert r.moment.kind == "snapshot" and r.not_replayed and not r.diagnosis.history
    (why,) = [w for w in r.warnings if w.startswith("the trace cannot be replayed")]
    assert "12288 > 4096 bytes after event 2" in why and "its 3 events" in why
    assert not any(w.startswith("the figures are inconsistent") for w in r.warnings)


def test_pending_free_blocks_are_not_cached_and_the_figures_add_up():
    (r,) = analyse(_trace_only([
        {"action": "segment_alloc", "addr": 0x100000, "size": 2 << 20},
        {"action": "alloc", "addr": 0x100000, "size": 1 << 20},
        {"action": "alloc", "addr": 0x100000 + (1 << 20), "size": 512 << 10},
        {"action": "free_requested", "addr": 0x100000 + (1 << 20), "size": 512 << 10},
    ]), at="end")
    assert (r.allocated_bytes, r.pending_free_bytes) == (1 << 20, 512 << 10)
    assert r.cached_unallocated_bytes == 512 << 10  # 2 MiB - 1 MiB - 512 KiB
    assert r.reserved_bytes == (r.allocated_bytes + r.pending_free_bytes
                                + r.cached_unallocated_bytes)
    assert sum(p.free_bytes for p in r.pools) == r.cached_unallocated_bytes
    assert not any("inconsistent" in w for w in r.warnings)


# ----- last step's gradients held through this forward ----------------------------------------
GRADS = [(f"{SITE}/torch/autograd/graph.py", 768, "_engine_run_backward"),
         (f"{SITE}/torch/autograd/__init__.py", 347, "backward"),
         (f"{SITE}/torch/_tensor.py", 581, "backward"), ("/job/train.py", 50, "main")]
PARAMS = [(f"{SITE}/torch/nn/modules/module.py", 1174, "to"), ("/job/train.py", 12, "main")]
FORWARD = [("/job/model.py", 54, "forward"),
           (f"{SITE}/torch/nn/modules/module.py", 1790, "_call_impl"),
           ("/job/train.py", 30, "main")]


def _forward_oom(tmp_path, grads: bool, driver: tuple | None = None):
    """A forward that runs out of memory after parameters (and last step's gradients);
    `driver`: a frame of the program's own under every forward stack."""
    sim = CachingAllocatorSim(capacity=(2048 + 2048 * grads + 6 * 512 + 512) * MiB)
    forward = FORWARD[:-1] + [driver] if driver else FORWARD
    for stack, family, n in ((PARAMS, "parameters", 4), (GRADS, "gradients", 4 * grads),
                             (forward, "saved_activations", 6)):
        for _ in range(n):
            sim.malloc(512 * MiB, stack, family=family)
    with pytest.raises(SimulatedOOM):
        sim.malloc(1024 * MiB, forward, family="saved_activations")
    path = tmp_path / "forward.pickle"
    path.write_bytes(pickle.dumps(sim.snapshot(), protocol=4))
    (r,) = analyse(load(path))
    return r


def test_gradients_held_through_the_forward_are_freed_before_it(tmp_path) -> None:
    """A forward OOM while last step's gradients are still live: they can go (zero_grad
    before the forward frees them, at no cost), and that is the verdict's knob rather than
    recomputing activations."""
    r = _forward_oom(tmp_path, grads=True)
    d = r.diagnosis
    assert d.workload == "training" and d.phase == "forward"
    grads = next(w for w in d.what_ifs if w.family == "gradients")
    assert grads.removable == "yes" and grads.fits
    assert d.excess_family == "gradients"
    assert d.knobs[0].id == "torch.zero_grad_before_forward"
    assert "zero_grad(set_to_none=True)" in verdict(r)


def test_a_forward_with_no_sign_of_training_or_inference_gets_conditional_advice(
        tmp_path) -> None:
    """No gradient, optimizer, backward or driver that says which: the workload is
    undetermined, so no inference-only knob comes first (inference_mode would break a
    trained forward whose backward was not recorded) and the verdict says both ways."""
    r = _forward_oom(tmp_path, grads=False)
    d = r.diagnosis
    assert d.workload == "undetermined"
    ids = [k.id for k in d.knobs]
    assert ids[0] != "torch.inference_mode" and "torch.inference_mode" in ids
    first_inference = min(i for i, k in enumerate(d.knobs) if k.workload == "inference")
    assert all(k.workload != "inference" for k in d.knobs[:first_inference])
    text = verdict(r)
    assert "If this forward is trained: " in text and "if it is not: torch.inference_mode" \
        in text


def test_a_forward_driven_by_a_predict_function_gets_inference_knobs(tmp_path) -> None:
    """The program's own `predict` drives the forward and nothing trains: inference, with
    the evidence, and inference_mode first; never activation checkpointing."""
    r = _forward_oom(tmp_path, grads=False, driver=("/job/serve.py", 30, "predict"))
    d = r.diagnosis
    assert d.workload == "inference"
    assert any("/job/serve.py:predict" in e for e in d.evidence.workload.evidence)
    ids = [k.id for k in d.knobs]
    assert ids[0] == "torch.inference_mode"
    assert "torch.activation_checkpointing" not in ids and "torch.micro_batch" not in ids
    assert "/job/serve.py:predict" in d.applies["torch.inference_mode"]


def test_a_forward_driven_by_a_train_function_is_training(tmp_path) -> None:
    """A training step recorded up to its forward (no backward yet) is still training when
    the program's own `train` drives it: no inference knob at all."""
    r = _forward_oom(tmp_path, grads=False, driver=("/job/run.py", 30, "train_epoch"))
    d = r.diagnosis
    assert d.workload == "training"
    assert not any(k.workload == "inference" for k in d.knobs)
    assert d.knobs[0].workload == "training"


def test_top_sites_break_ties_the_same_way_whatever_the_row_order():
    """A site's family is its most common one and its stack its largest block's; on a tie,
    the family first by name and the smaller stack id, however the rows are ordered (a
    report names the same site family on every run)."""
    import polars as pl
    from snapana.analysis.diagnosis.moment_state import top_sites as _top_sites
    from snapana.model import StackTable

    stacks = StackTable()
    held = pl.DataFrame({
        "site": ["a.py:1 f"] * 4 + ["b.py:2 g"] * 2,
        "family": ["logits", "gradients", "gradients", "logits", "unknown", "parameters"],
        "size": [512, 512, 1024, 1024, 512, 512],
        "stack_id": [0, 0, 0, 0, 0, 0],
    })

    class Cap:
        pass

    cap = Cap()
    cap.stacks = stacks  # type: ignore[attr-defined]
    seen = set()
    for seed in range(8):
        rows = held.sample(fraction=1.0, shuffle=True, seed=seed)
        sites = _top_sites(cap, rows)  # type: ignore[arg-type]
        seen.add(tuple((s.site, s.bytes, s.blocks, s.family) for s in sites))
    assert seen == {(("a.py:1 f", 3072, 4, "gradients"), ("b.py:2 g", 1024, 2, "parameters"))}


@pytest.mark.parametrize("kept", [False, True])
def test_zero_grad_alone_is_no_training_step(tmp_path, kept) -> None:
    """Issue 56: a benchmark calls optimizer.zero_grad() (its annotation is recorded) and
    then runs a forward. Under no_grad each layer's outputs go within the layer: the
    zero_grad shows an optimizer exists, not that anything trains, so the workload is not
    "training" and recomputing activations (nothing is saved) does not lead. A forward that
    keeps its outputs for a backward after the same zero_grad is a training step's forward
    (the window stopped before its backward), and says why."""
    sim = CachingAllocatorSim(capacity=80 * 1024 * MiB)
    for _ in range(4):
        sim.malloc(64 * MiB, PARAMS, family="parameters")
    with sim.annotate("Optimizer.zero_grad#AdamW.zero_grad"):
        pass
    for _ in range(120):
        out = sim.malloc(8 * MiB, FORWARD, family="saved_activations" if kept
                         else "activation_temporaries")
        if not kept:
            sim.free(out, FORWARD)
    path = tmp_path / "bench.pickle"
    path.write_bytes(pickle.dumps(sim.snapshot(), protocol=4))
    (r,) = analyse(load(path))
    d = r.diagnosis
    if kept:
        assert d.workload == "training", d.evidence.workload
        assert any("cleared its gradients" in e for e in d.evidence.workload.evidence), \
            d.evidence.workload
    else:
        assert d.workload != "training", d.evidence.workload
        assert not d.knobs or d.knobs[0].id != "torch.activation_checkpointing"
