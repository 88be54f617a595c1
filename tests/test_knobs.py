"""Knobs and framework detection, read from the framework packs."""

from __future__ import annotations

import pytest
from snapana.analysis.attribution import RuleError, builtin_packs, load_rules
from snapana.analysis.knobs import (
    KNOB_COSTS,
    can_release,
    framework_markers,
    frameworks_in,
    frees_in_phase,
    knobs_for,
    load_knobs,
    transient_families,
    working_set_families,
)

from .conftest import SAMPLES, invoke, vocabulary

SP = "/opt/venv/lib/python3.11/site-packages/"


def test_every_knob_lives_in_its_frameworks_pack_with_a_cost() -> None:
    seen = set()
    for pack in builtin_packs():
        for k in pack.knobs:
            assert k.framework in (pack.name, "any"), (pack.source, k.id)
            assert k.cost in KNOB_COSTS, k.id
            assert k.effect and k.direction, k.id
            seen.add(k.id)
    assert len(seen) == len(load_knobs()) >= 25
    neutral = {k.id for k in load_knobs() if k.framework in ("pytorch", "any")}
    assert neutral == {k.id for p in builtin_packs() if p.name == "pytorch" for k in p.knobs}


def test_costs_follow_what_the_knob_does() -> None:
    cost = {k.id: k.cost for k in load_knobs()}
    assert cost["slime.recompute_loss_function"] == "compute"
    assert cost["megatron.tensor_parallel"] == "communication"
    assert cost["areal.adam_bf16"] == "quality"
    assert cost["torch.expandable_segments"] == "free"


def test_markers_come_from_the_packs() -> None:
    markers = framework_markers()
    assert markers["slime"] == ("slime/",)
    assert markers["ms_swift"] == ("swift/",)
    assert set(markers["fsdp"]) == {
        "torch/distributed/fsdp/", "torch/distributed/_composable/fsdp/",
    }
    assert "pytorch" not in markers  # generic knobs apply always, no detection needed
    paths = [
        SP + "slime/utils/ppo_utils.py",
        "C:\\venv\\Lib\\site-packages\\megatron\\core\\utils.py",
        SP + "torch/distributed/_composable/fsdp/_fsdp_collectives.py",
        "/home/u/train.py",
    ]
    assert frameworks_in(paths) == {"slime", "megatron", "fsdp"}
    assert frameworks_in(["/home/u/train.py"]) == set()


def test_family_lifetimes_come_from_the_vocabulary() -> None:
    """The lifetime sets are the vocabulary file's `lifetime` fields (read here with tomllib:
    a new family is data, no list here to extend)."""
    def lifetime(kind: str) -> set[str]:
        return {f["id"] for f in vocabulary()["family"] if f.get("lifetime") == kind}

    assert transient_families() == lifetime("transient") and "logits" in lifetime("transient")
    assert working_set_families() == lifetime("working_set") and lifetime("working_set")
    assert not transient_families() & working_set_families()


def test_knobs_for_ranks_the_frameworks_own_knob_first() -> None:
    got = knobs_for(["saved_logprob_softmax", "logits"], [], {"slime", "megatron"}, "forward")
    # a knob that lowers the family before one that only bounds each copy (chunk size)
    assert got[0].knob == "--recompute-loss-function"
    ids = [k.id for k in got]
    assert ids.index("megatron.tensor_parallel") < ids.index("slime.log_probs_chunk_size")
    assert all(k.framework in {"slime", "megatron", "pytorch", "any"} for k in got)
    # a phase-bound knob only for its phase
    ids = {k.id for k in knobs_for(["logits"], [], {"slime"}, "forward")}
    assert "slime.log_probs_max_tokens_per_gpu" not in ids
    ids = {k.id for k in knobs_for(["logits"], [], {"slime"}, "logprobs")}
    assert "slime.log_probs_max_tokens_per_gpu" in ids
    assert can_release("main_params_fp32", {"megatron"})
    assert not can_release("main_params_fp32", {"slime"})
    # plain PyTorch offloads optimizer state (FSDP CPUOffload), for a training capture only
    assert can_release("optimizer_state", set(), workload="training")
    assert not can_release("optimizer_state", set(), workload="inference")


def test_knobs_follow_the_workload() -> None:
    """Training knobs (checkpointing, optimizer) are not offered to a capture without a
    backward; inference knobs (inference_mode, KV cache size) only to one."""
    train = {k.id for k in knobs_for(["saved_activations", "optimizer_state", "kv_cache"], [],
                                     set(), "forward", workload="training")}
    infer = {k.id for k in knobs_for(["saved_activations", "optimizer_state", "kv_cache"], [],
                                     set(), "forward", workload="inference")}
    assert "torch.activation_checkpointing" in train and "torch.optimizer_8bit" in train
    assert "torch.inference_mode" not in train and "torch.kv_cache_size" not in train
    assert "torch.inference_mode" in infer and "torch.kv_cache_size" in infer
    assert not {k.id for k in load_knobs() if k.workload == "training"} & infer
    # gradients held through the forward: freeing them before it is the knob, not offload
    assert frees_in_phase("gradients", "forward", set(), workload="training")
    assert not frees_in_phase("gradients", "backward", set(), workload="training")
    cache = {k.id for k in knobs_for([], ["large_cache"], set(), "forward")}
    assert {"torch.expandable_segments", "torch.gc_threshold", "torch.empty_cache"} <= cache


USER_PACK = """
[pack]
name = "myfw"
markers = ["myfw/"]

[[rule]]
id = "buffers"
family = "comm_buffer"
label = "my staging buffers"
frames = [{ file = "myfw/comm.py", function = "stage" }]

[[knob]]
id = "myfw.bucket_mb"
knob = "--bucket-mb"
families = ["comm_buffer"]
direction = "lowers"
cost = "communication"
effect = "smaller staging buckets"
caveat = "more, smaller collectives"

[[example]]
family = "comm_buffer"
rule = "buffers"
stack = [{ file = "myfw/comm.py", function = "stage", line = 7 }]
"""


def test_a_user_pack_brings_its_knobs_markers_and_examples(tmp_path) -> None:
    path = tmp_path / "myfw.toml"
    path.write_text(USER_PACK, encoding="utf-8")
    rs = load_rules([path])
    assert rs.markers["myfw"] == ("myfw/",)
    assert frameworks_in([SP + "myfw/comm.py"], rs) == {"myfw"}
    assert frameworks_in([SP + "myfw/comm.py"]) == set()  # built-ins only
    knob = next(k for k in rs.knobs if k.id == "myfw.bucket_mb")
    assert (knob.framework, knob.cost) == ("myfw", "communication")
    assert knob in knobs_for(["comm_buffer"], [], {"myfw"}, None, rs)
    assert knob not in knobs_for(["comm_buffer"], [], {"slime"}, None, rs)
    assert [e.rule for e in rs.examples if e.pack == "myfw"] == ["myfw.buffers"]
    assert rs.check_examples() == []
    # the copy the Attributor makes keeps them
    sited = rs.with_sites([])
    assert sited.knobs == rs.knobs and sited.markers == rs.markers


def test_duplicate_knob_id_is_an_error(tmp_path) -> None:
    path = tmp_path / "dup.toml"
    path.write_text(
        '[[knob]]\nid = "slime.recompute_loss_function"\nknob = "k"\nfamilies = ["logits"]\n'
        'direction = "lowers"\ncost = "free"\neffect = "e"\n',
        encoding="utf-8",
    )
    with pytest.raises(RuleError) as info:
        load_rules([path])
    msg = str(info.value)
    assert msg.startswith(f"{path}: knob `slime.recompute_loss_function`: duplicate knob id")
    assert "packs/slime.toml" in msg


def test_stop_and_best_knobs_follow_direction_then_cost() -> None:
    from snapana.analysis.knobs import best_knob, stop_knob

    fw = {"slime", "megatron"}
    assert stop_knob("saved_logprob_softmax", fw, "forward").id == \
        "slime.recompute_loss_function"
    assert best_knob("saved_activations", fw, "forward").id == "megatron.recompute_granularity"
    # no framework detected: only the framework-neutral knobs
    assert best_knob("saved_activations", set(), "forward").framework in ("pytorch", "any")
    # no framework detected: the framework-neutral one (checkpoint the loss yourself)
    assert stop_knob("saved_logprob_softmax", set(), "forward").id == "torch.checkpoint_loss"
    # a KV cache in a training job is an engine's: no neutral knob; in an inference job its size
    assert stop_knob("kv_cache", set(), "rollout", workload="training") is None
    assert stop_knob("kv_cache", set(), "rollout", workload="inference").id == \
        "torch.kv_cache_size"


def test_verl_has_its_own_knobs_and_no_other_frameworks_spelling() -> None:
    verl = {k.id: k for k in load_knobs() if k.framework == "verl"}
    names = " ".join(k.knob for k in verl.values())
    for name in ("actor_rollout_ref.rollout.gpu_memory_utilization", "free_cache_engine",
                 "param_offload", "ppo_micro_batch_size_per_gpu"):
        assert name in names
    got = knobs_for(["kv_cache"], ["outside_pytorch"], {"verl", "vllm", "megatron"}, "rollout")
    assert all(k.framework in {"verl", "vllm", "megatron", "pytorch", "any"} for k in got)
    assert not any("ms-swift" in k.knob or "--vllm_" in k.knob for k in got)


def test_no_offload_knob_for_model_state_while_reloading() -> None:
    fams = ["param_buffer", "grad_buffer", "kv_cache"]
    got = knobs_for(fams, [], {"ms_swift", "megatron", "vllm"}, "init", offload=False)
    assert not any(k.direction == "releases" and "param_buffer" in k.families for k in got)
    assert any(k.id == "swift.sleep_level" for k in got)  # releasing the engine's cache is fine
    with_offload = knobs_for(fams, [], {"ms_swift", "megatron", "vllm"}, "init")
    assert any(k.id == "swift.offload_model" for k in with_offload)


def test_an_engines_share_of_the_gpu_is_a_memory_budget_not_compute() -> None:
    """Issue 71: `gpu_memory_utilization` was labelled "(extra compute)". An engine's share
    of the GPU (vLLM's gpu_memory_utilization, verl's and ms-swift's spelling of it, SGLang's
    mem_fraction_static) is a budget: it lowers the engine's KV cache and graph pools to free
    memory outside PyTorch and spends no compute (its caveat says what too low does). Keyed on
    the mechanism: every knob that lowers kv_cache and the memory outside PyTorch."""
    budgets = [k for k in load_knobs() if "kv_cache" in k.families and k.direction == "lowers"
               and "outside_pytorch" in k.causes]
    assert {k.id for k in budgets} >= {"vllm.gpu_memory_utilization",
                                       "verl.rollout_gpu_memory_utilization",
                                       "swift.vllm_gpu_memory_utilization",
                                       "sglang.mem_fraction_static"}
    assert all(k.cost == "free" for k in budgets), [(k.id, k.cost) for k in budgets]
    full = " ".join(invoke("summary", str(SAMPLES / "swift-vllm-colocate-oom.pickle"),
                           "--full", columns=400).stdout.split())
    # vLLM's own spelling is the same setting, folded into ms-swift's (scaling.toml
    # [[same_setting]], tests/test_knob_twins.py): one entry, with no cost
    said = full[full.index("--vllm_gpu_memory_utilization"):][:400]
    assert "[no cost]" in said and "[extra compute]" not in said.split(" acts on ")[0]
