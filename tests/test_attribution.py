"""Rules engine and built-in packs, on stacks built from the frameworks' real file paths
and function names (old and new versions where they differ).

Stacks are written caller -> callee (like a Python traceback) with ``calls(...)`` and turned
into the snapshot's innermost-first order, so each test reads top-down.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from snapana.analysis.attribution import (
    PHASES,
    BlockContext,
    Decision,
    RuleError,
    builtin_pack_names,
    chunk_groups,
    family_ids,
    infer_phase,
    load_rules,
)

from .conftest import PACKS, ROOT, vocabulary

SP = "/opt/venv/lib/python3.11/site-packages/"
MiB = 1 << 20
GiB = 1 << 30

def py(path: str, name: str, line: int = 10) -> tuple[str, str, int]:
    """A Python frame; paths not starting with '/' are put under site-packages."""
    return (path if path.startswith("/") else SP + path, name, line)


def cpp(symbol: str, filename: str = "??") -> tuple[str, str, int]:
    return (filename, symbol, 0)


def calls(*frames: tuple[str, str, int]) -> tuple[tuple[str, str, int], ...]:
    """Frames given outermost first -> the snapshot's innermost-first stack."""
    return tuple(reversed(frames))


ALLOC_CPP = (
    cpp("c10::cuda::CUDACachingAllocator::Native::NativeCachingAllocator::malloc(void**)", ""),
    cpp("at::detail::empty_cuda(c10::ArrayRef<long>, c10::TensorOptions const&)"),
    cpp("at::(anonymous namespace)::create_out(c10::ArrayRef<long>)", "RegisterCUDA_0.cpp"),
)
"""The C++ frames a ``stacks="all"`` snapshot puts innermost."""

MAIN = py("/home/u/train.py", "<module>", 300)
MODULE = "torch/nn/modules/module.py"


def module_call(path: str, line: int = 10) -> list[tuple[str, str, int]]:
    """``self.layer(x)``: _wrapped_call_impl -> _call_impl -> forward."""
    return [
        py(MODULE, "_wrapped_call_impl", 1739),
        py(MODULE, "_call_impl", 1750),
        py(path, "forward", line),
    ]


@pytest.fixture(scope="module")
def rules():
    return load_rules()


CTX = BlockContext(size=64 * MiB, has_alloc_event=True)


def classify(rules, stack, ctx: BlockContext = CTX) -> Decision:
    return rules.classify(stack, ctx)


# ---------------------------------------------------------------------------------------
# packs, families


def test_every_builtin_pack_loads_with_rules(rules):
    """Every pack file in packs/ (read from the folder: a new pack is a file, no list here to
    extend) is loaded, and each gives at least one rule."""
    expected = {p.stem for p in PACKS.glob("*.toml")} - {"vocabulary"}
    assert expected  # the folder was found
    assert set(builtin_pack_names()) == expected
    per_pack = {p: 0 for p in expected}
    for r in (*rules.rules, *rules.phase_rules, *rules.for_memory("host").rules):
        per_pack[r.id.split(".")[0]] += 1
    assert all(n > 0 for n in per_pack.values()), per_pack


#: where the data files other than the packs name a family: `family = "id"`, `[family.id]`
NAMED_FAMILY = re.compile(r'^\s*(?:family\s*=\s*"([a-z0-9_]+)"|\[family\.([a-z0-9_]+)\])', re.M)


def test_family_table_is_the_vocabulary_and_every_named_family_is_in_it():
    """The family table is vocabulary.toml's [[family]] entries in their order (read here with
    tomllib: a new family is data, no list here to extend), and ids are stable API: every id
    the inference and scaling tables and the README's family list name is one of them, so a
    renamed or dropped family fails here, not in a user's report."""
    ids = [f["id"] for f in vocabulary()["family"]]
    assert family_ids() == tuple(ids) and len(set(ids)) == len(ids)
    analysis = PACKS.parent.parent
    for table in (analysis / "attribution" / "inference.toml", analysis / "scaling.toml"):
        named = {a or b for a, b in NAMED_FAMILY.findall(table.read_text())}
        assert named and named <= set(ids), (table.name, named - set(ids))
    readme = (ROOT / "README.md").read_text()
    (listed,) = re.findall(r"^Families: (.*?)(?:\n\n)", readme, flags=re.M | re.S)
    while re.search(r"\([^()]*\)", listed):  # the notes in brackets name other things
        listed = re.sub(r"\([^()]*\)", "", listed)
    named = set(re.findall(r"`([a-z0-9_]+)`", listed))
    assert len(named) > 10 and named <= set(ids), named - set(ids)


def test_vocabulary_holds_families_phases_and_causes():
    from snapana.analysis.attribution import (
        cause_ids,
        families_with_lifetime,
        phase_ids,
        phase_label,
    )
    from snapana.analysis.attribution.families import parse_vocabulary

    assert PHASES == phase_ids() == tuple(p["id"] for p in vocabulary()["phase"])
    assert phase_label("optimizer") == "optimizer step"
    assert "outside_pytorch" in cause_ids() and "fragmentation" in cause_ids()
    assert "logits" in families_with_lifetime("transient")
    assert "recompute" in families_with_lifetime("working_set")
    # the schema's words (issue 68): file, line, path in it
    with pytest.raises(ValueError,
                       match=r"^v.toml:5: family\[0\].shade: unknown field \(allowed: "):
        parse_vocabulary('[[family]]\nid = "x"\nlabel = "x"\ndescription = "d"\nshade = 1\n',
                         "v.toml")
    with pytest.raises(ValueError, match=r"family\[0\].lifetime: 'forever' is not one of "
                                         r"\('transient', 'working_set', 'undetermined'\)"):
        parse_vocabulary('[[family]]\nid = "x"\nlabel = "x"\ndescription = "d"\n'
                         'colour = "#000000"\nlifetime = "forever"\n', "v.toml")
    with pytest.raises(ValueError, match="family\\[0\\].colour: missing required field"):
        parse_vocabulary('[[family]]\nid = "x"\nlabel = "x"\ndescription = "d"\n', "v.toml")
    with pytest.raises(ValueError, match="colour: expected `str` matching regex|colour: .*#"):
        parse_vocabulary('[[family]]\nid = "x"\nlabel = "x"\ndescription = "d"\n'
                         'colour = "red"\n', "v.toml")


def test_inventory_roles_are_the_vocabulary_s_and_the_format_s() -> None:
    """What a recorded tensor's role means as a family is said once, in the vocabulary
    (#59: it was a dict in the sidecar reader, which attribution imported back up the
    pipeline); every role the recorder writes is one the sidecar reader takes, and every
    one but `tensor` (role not known) names exactly one family."""
    from snapana.analysis.attribution.families import parse_vocabulary, role_families
    from snapana.record.inventory import ROLES as WRITTEN
    from snapana.sources.sidecar import ROLES as READ

    assert set(WRITTEN) == set(READ)
    assert set(role_families()) == set(READ) - {"tensor"}
    assert role_families()["buffer"] == role_families()["parameter"] == "parameters"
    assert role_families()["gradient"] == "gradients"
    two = ('[[family]]\nid = "{0}"\nlabel = "{0}"\ndescription = "d"\ncolour = "#000000"\n'
           'inventory_roles = ["gradient"]\n')
    rest = ('[[phase]]\nid = "unknown"\nlabel = "u"\ndescription = "d"\n'
            '[[cause]]\nid = "c"\ndescription = "d"\n')
    with pytest.raises(ValueError, match="inventory role 'gradient' is given to two families"):
        parse_vocabulary(two.format("a") + two.format("b") + rest, "v.toml")


def test_family_colours_are_given_distinct_and_stable() -> None:
    """Every family's colour is written in the vocabulary (issue 59: it was its place in the
    list, so a new family recoloured every later one, and 24 families shared 20 colours:
    optimizer_temporaries was drawn in saved_activations' colour). Read from the data file
    itself: every pair of families at least 30 apart in RGB, none near the grey of "other";
    what the renderer draws is the data's colour; a family inserted first recolours none."""
    import itertools
    import math

    import tomllib
    from snapana.analysis.attribution.families import parse_vocabulary
    from snapana.render.views import OTHER_COLOUR, family_colour

    text = (PACKS / "vocabulary.toml").read_text()
    given = {f["id"]: f["colour"].lower() for f in tomllib.loads(text)["family"]}

    def rgb(c: str) -> tuple[int, ...]:
        return tuple(int(c[i:i + 2], 16) for i in (1, 3, 5))

    close = [(a, b) for (a, ca), (b, cb) in itertools.combinations(given.items(), 2)
             if math.dist(rgb(ca), rgb(cb)) < 30]
    assert not close
    assert all(math.dist(rgb(c), rgb(OTHER_COLOUR)) >= 30 for c in given.values())
    assert {f: family_colour(f) for f in given} == given
    first = '[[family]]\nid = "new"\nlabel = "n"\ndescription = "d"\ncolour = "#000001"\n\n'
    inserted = parse_vocabulary(first + text)
    assert {f.id: f.colour for f in inserted.families if f.id != "new"} == given


def test_framework_rules_default_above_generic_pytorch(rules):
    framework = [
        r.priority for r in rules.rules
        if not r.id.startswith(("pytorch.", "generic.")) and r.family != "unknown"
    ]
    generic = [r.priority for r in rules.rules
               if r.id.startswith("pytorch.") and r.family != "workspace"]
    assert min(framework) > max(generic)
    # a library workspace is named by the C++ frame that allocates it, whatever framework
    # code ran the op: it wins over every framework rule
    workspace = [r.priority for r in rules.rules if r.family == "workspace"]
    assert workspace and min(workspace) > max(framework)
    by_name = [r.priority for r in rules.rules if r.id.startswith("generic.")]
    assert by_name and max(by_name) < min(framework)  # a name-based guess never wins
    by_name = [r.priority for r in rules.rules if r.id.startswith("generic.")]
    assert by_name and max(by_name) < min(framework)  # a name-based guess never wins


# ---------------------------------------------------------------------------------------
# slime


SLIME_LOSS = [
    py("slime/backends/megatron_utils/loss.py", "loss_function", 700),
    py("slime/backends/megatron_utils/loss.py", "policy_loss_function", 420),
    py("slime/backends/megatron_utils/loss.py", "get_log_probs_and_entropy", 120),
    py("slime/utils/ppo_utils.py", "calculate_log_probs_and_entropy", 690),
    py("slime/utils/ppo_utils.py", "_calculate_log_probs_and_entropy_chunk", 620),
    py("torch/autograd/function.py", "apply", 575),
    py("slime/utils/ppo_utils.py", "forward", 540),
    py("slime/utils/ppo_utils.py", "vocab_parallel_softmax", 512),
]


def test_slime_logprob_softmax_per_chunk(rules):
    stack = calls(MAIN, *SLIME_LOSS, *reversed(ALLOC_CPP))
    d = classify(rules, stack)
    assert d.family == "saved_logprob_softmax"
    assert d.rule_id == "slime.logprob_softmax"
    assert d.label == "saved log_prob_softmax (per chunk)"
    assert d.reason.startswith(
        "matched rule `slime.logprob_softmax`: frame `vocab_parallel_softmax` in "
        "`slime/utils/ppo_utils.py` under `calculate_log_probs_and_entropy`"
    )
    # matched_frames index into the stack: innermost matched is vocab_parallel_softmax
    assert [stack[i][1] for i in d.matched_frames] == [
        "vocab_parallel_softmax",
        "calculate_log_probs_and_entropy",
    ]
    assert d.phase == "forward"


def test_slime_recompute_loss_function_is_recompute_in_backward(rules):
    stack = calls(
        cpp("torch::autograd::Engine::thread_main(std::shared_ptr<GraphTask> const&)"),
        py("torch/utils/checkpoint.py", "unpack_hook", 1100),
        py("torch/utils/checkpoint.py", "recompute_fn", 1070),
        py("slime/backends/megatron_utils/loss.py", "policy_loss_function", 420),
        *SLIME_LOSS[3:],
    )
    d = classify(rules, stack)
    assert (d.family, d.rule_id, d.phase) == (
        "recompute",
        "slime.logprob_softmax_recompute",
        "backward",
    )


def test_slime_older_clone_in_calculate_log_probs(rules):
    # older slime: the copy is made by a .clone() line directly in the function; the C++
    # frames of clone() sit innermost and must not count for `where = "innermost"`
    stack = calls(
        MAIN,
        *SLIME_LOSS[:4],
        cpp("torch::autograd::THPVariable_clone(_object*, _object*)", "python_variable_m.cpp"),
        cpp("at::_ops::clone::call(at::Tensor const&)"),
        *reversed(ALLOC_CPP),
    )
    d = classify(rules, stack)
    assert (d.family, d.rule_id) == ("saved_logprob_softmax", "slime.logprob_clone_old")


def test_slime_weight_update(rules):
    stack = calls(
        MAIN,
        py("slime/backends/megatron_utils/actor.py", "update_weights", 400),
        py(
            "slime/backends/megatron_utils/update_weight/update_weight_from_tensor.py",
            "_send_to_colocated_engine",
            210,
        ),
        py("slime/backends/megatron_utils/update_weight/common.py", "all_gather_param", 50),
        py("torch/distributed/distributed_c10d.py", "all_gather", 3300),
    )
    d = classify(rules, stack)
    assert d.family == "weight_update_buffer"
    assert d.phase == "weight_update"


def test_near_miss_reports_the_failed_condition(rules):
    # the softmax without the chunk loop: the per-chunk rule nearly matched
    stack = calls(MAIN, *SLIME_LOSS[5:])
    d = classify(rules, stack)
    assert d.rule_id == "slime.logprob_softmax_unchunked"
    assert any(
        n.startswith("slime.logprob_softmax:") and "calculate_log_probs_and_entropy" in n
        for n in d.near_misses
    ), d.near_misses
    ex = rules.explain(stack, CTX)
    nm = next(n for n in ex.near_misses if n.rule_id == "slime.logprob_softmax")
    assert any("vocab_parallel_softmax" in h for h in nm.held)
    assert any("calculate_log_probs_and_entropy" in f for f in nm.failed)
    assert "near miss `slime.logprob_softmax`" in str(ex)


# ---------------------------------------------------------------------------------------
# Megatron


def test_megatron_float16_to_fp32_logits(rules):
    stack = calls(
        MAIN,
        py("megatron/core/pipeline_parallel/schedules.py", "forward_step", 280),
        *module_call("megatron/core/distributed/distributed_data_parallel.py"),
        *module_call("megatron/core/transformer/module.py", 470),
        py("megatron/core/transformer/module.py", "float16_to_fp32", 360),
        py("megatron/core/transformer/module.py", "conversion_helper", 330),
        py("megatron/core/transformer/module.py", "float_conversion", 358),
    )
    d = classify(rules, stack)
    assert (d.family, d.rule_id, d.phase) == ("logits", "megatron.logits_fp32", "forward")


def _output_layer_stack(postprocess: bool):
    gpt = "megatron/core/models/gpt/gpt_model.py"
    head = [py(gpt, "forward", 300)] + ([py(gpt, "_postprocess", 410)] if postprocess else [])
    return calls(
        MAIN,
        *head,
        *module_call("megatron/core/tensor_parallel/layers.py", 950),
        py(
            "megatron/core/tensor_parallel/layers.py",
            "linear_with_grad_accumulation_and_async_allreduce",
            700,
        ),
        py("torch/autograd/function.py", "apply", 575),
        py("megatron/core/tensor_parallel/layers.py", "forward", 460),
    )


@pytest.mark.parametrize("postprocess", [True, False], ids=["new-_postprocess", "old-forward"])
def test_megatron_output_layer_logits_new_and_old(rules, postprocess):
    d = classify(rules, _output_layer_stack(postprocess))
    assert (d.family, d.rule_id) == ("logits", "megatron.logits_output_layer")


def test_megatron_decoder_linear_is_not_logits(rules):
    gpt = "megatron/core/models/gpt/gpt_model.py"
    stack = calls(
        MAIN,
        py(gpt, "forward", 300),
        *module_call("megatron/core/transformer/transformer_block.py", 500),
        *module_call("megatron/core/transformer/transformer_layer.py", 400),
        *module_call("megatron/core/transformer/attention.py", 300),
        *module_call("megatron/core/tensor_parallel/layers.py", 950),
        py("torch/autograd/function.py", "apply", 575),
        py("megatron/core/tensor_parallel/layers.py", "forward", 460),
    )
    d = classify(rules, stack)
    assert d.family == "saved_activations"


def _buffer_stack(param_line: int, grad_line: int | None, which: str):
    ddp = "megatron/core/distributed/distributed_data_parallel.py"
    line = param_line if which == "param" else grad_line
    return calls(
        MAIN,
        py("megatron/training/training.py", "setup_model_and_optimizer", 900),
        py("megatron/training/training.py", "get_model", 600),
        py(ddp, "__init__", 200),
        py(ddp, "_allocate_buffers_for_parameters", 160),
        py("megatron/core/distributed/param_and_grad_buffer.py", "__init__", line),
    )


@pytest.mark.parametrize(
    "param_line,grad_line",
    [(560, 575), (671, 702)],
    ids=["old-ParamAndGradBuffer", "new-_ParamAndGradBuffer"],
)
def test_megatron_param_vs_grad_buffer_by_line_order(rules, param_line, grad_line):
    p = _buffer_stack(param_line, grad_line, "param")
    g = _buffer_stack(param_line, grad_line, "grad")
    sited = rules.with_sites([p, g])
    dp, dg = sited.classify(p, CTX), sited.classify(g, CTX)
    assert (dp.family, dp.rule_id) == ("param_buffer", "megatron.param_buffer")
    assert (dg.family, dg.rule_id) == ("grad_buffer", "megatron.grad_buffer")
    assert dp.phase == dg.phase == "init"
    # without the snapshot's sites the order is unknown: say so rather than guess
    d = rules.classify(p, CTX)
    assert d.rule_id == "megatron.param_grad_buffer"
    assert "not resolved" in d.label


def test_megatron_line_rank_ignores_lines_that_only_call_helpers(rules):
    p = _buffer_stack(671, 702, "param")
    g = _buffer_stack(671, 702, "grad")
    # __init__ also appears (line 640, 720) as the *caller* of other allocating helpers
    helper_before = calls(
        *reversed(_buffer_stack(640, None, "param")),
        py("megatron/core/distributed/param_and_grad_buffer.py", "_pad", 90),
    )
    helper_after = calls(
        *reversed(_buffer_stack(720, None, "param")),
        py("megatron/core/distributed/param_and_grad_buffer.py", "_pad", 91),
    )
    sited = rules.with_sites([helper_before, p, g, helper_after])
    assert sited.classify(p, CTX).family == "param_buffer"
    assert sited.classify(g, CTX).family == "grad_buffer"


def test_megatron_only_grad_data_without_distributed_optimizer(rules):
    g = _buffer_stack(0, 575, "grad")
    d = rules.with_sites([g]).classify(g, CTX)
    assert (d.family, d.rule_id) == ("grad_buffer", "megatron.grad_buffer")


def test_megatron_schedules_phases(rules):
    sched = "megatron/core/pipeline_parallel/schedules.py"
    bwd = calls(MAIN, py(sched, "backward_step", 380), py(sched, "custom_backward", 150))
    assert infer_phase(bwd, CTX, rules) == "backward"
    fwd = calls(MAIN, py(sched, "forward_step", 280), py("/home/u/pretrain_gpt.py", "loss_func", 9))
    assert infer_phase(fwd, CTX, rules) == "forward"


def test_megatron_main_params_and_recompute(rules):
    d = classify(
        rules,
        calls(
            MAIN,
            py("megatron/core/optimizer/distrib_optimizer.py", "__init__", 500),
            py(
                "megatron/core/optimizer/distrib_optimizer.py",
                "_build_model_and_main_param_groups",
                380,
            ),
        ),
    )
    assert d.family == "main_params_fp32"
    d = classify(
        rules,
        calls(
            cpp("torch::autograd::Engine::thread_main(std::shared_ptr<GraphTask> const&)"),
            py("torch/autograd/function.py", "apply", 300),
            py("megatron/core/tensor_parallel/random.py", "backward", 320),
            *module_call("megatron/core/transformer/transformer_layer.py", 400),
        ),
    )
    assert (d.family, d.phase) == ("recompute", "backward")


# ---------------------------------------------------------------------------------------
# vLLM


def test_vllm_v0_cache_engine(rules):
    stack = calls(
        MAIN,
        py("vllm/worker/worker.py", "_init_cache_engine", 240),
        py("vllm/worker/cache_engine.py", "__init__", 70),
        py("vllm/worker/cache_engine.py", "_allocate_kv_cache", 90),
    )
    d = classify(rules, stack)
    assert (d.family, d.rule_id, d.phase) == ("kv_cache", "vllm.kv_cache_v0", "init")


def test_vllm_v1_gpu_model_runner(rules):
    runner = "vllm/v1/worker/gpu_model_runner.py"
    stack = calls(
        MAIN,
        py("vllm/v1/worker/gpu_worker.py", "initialize_from_config", 300),
        py(runner, "initialize_kv_cache", 3000),
        py(runner, "initialize_kv_cache_tensors", 2950),
        py(runner, "_allocate_kv_cache_tensors", 2800),
    )
    d = classify(rules, stack)
    assert (d.family, d.rule_id) == ("kv_cache", "vllm.kv_cache_v1")


def test_vllm_v1_worker_utils(rules):
    stack = calls(
        MAIN,
        py("vllm/v1/worker/gpu_model_runner.py", "initialize_kv_cache", 3000),
        py("vllm/v1/worker/utils.py", "allocate_kv_cache", 250),
    )
    assert classify(rules, stack).family == "kv_cache"


def test_vllm_cuda_graph_weights_and_profile_run(rules):
    runner = "vllm/v1/worker/gpu_model_runner.py"
    graph = calls(
        MAIN,
        py(runner, "capture_model", 2500),
        py(runner, "_dummy_run", 2200),
        py("vllm/compilation/cuda_graph.py", "__call__", 180),
        *module_call("vllm/model_executor/models/llama.py", 380),
    )
    in_graph_pool = BlockContext(pool_id=(0, 3), size=MiB)
    assert classify(rules, graph, in_graph_pool).family == "cuda_graph_pool"
    weights = calls(
        MAIN,
        py("vllm/model_executor/model_loader/default_loader.py", "load_model", 260),
        py("vllm/model_executor/model_loader/utils.py", "initialize_model", 60),
        py("vllm/model_executor/layers/linear.py", "__init__", 400),
        py("vllm/model_executor/layers/linear.py", "create_weights", 200),
    )
    assert classify(rules, weights).rule_id == "vllm.create_weights"
    profile = calls(
        MAIN,
        py("vllm/v1/worker/gpu_worker.py", "determine_available_memory", 230),
        py(runner, "profile_run", 2600),
        py(runner, "_dummy_run", 2200),
        *module_call("vllm/model_executor/models/llama.py", 380),
    )
    d = classify(rules, profile)
    assert (d.family, d.phase) == ("activation_temporaries", "init")


# ---------------------------------------------------------------------------------------
# SGLang, torch_memory_saver


def test_sglang_kv_pools(rules):
    mp = "sglang/srt/mem_cache/memory_pool.py"
    runner = "sglang/srt/model_executor/model_runner.py"
    kv = calls(
        MAIN,
        py(runner, "init_memory_pool", 900),
        py(mp, "__init__", 400),
        py(mp, "_create_buffers", 430),
    )
    d = classify(rules, kv)
    assert (d.family, d.rule_id, d.phase) == ("kv_cache", "sglang.kv_cache", "init")
    req = calls(MAIN, py(runner, "init_memory_pool", 880), py(mp, "__init__", 60))
    assert classify(rules, req).family == "kv_cache"


def test_sglang_rollout_graph_and_weight_sync(rules):
    runner = "sglang/srt/model_executor/model_runner.py"
    decode = calls(
        MAIN,
        py(runner, "forward", 1700),
        py(runner, "forward_decode", 1600),
        *module_call("sglang/srt/models/qwen2.py", 300),
    )
    d = classify(rules, decode)
    assert (d.family, d.phase) == ("activation_temporaries", "rollout")
    graph = calls(
        MAIN,
        py("sglang/srt/model_executor/cuda_graph_runner.py", "capture", 400),
        py("sglang/srt/model_executor/cuda_graph_runner.py", "capture_one_batch_size", 500),
        *module_call("sglang/srt/models/qwen2.py", 300),
    )
    assert classify(rules, graph).family == "cuda_graph_pool"
    bucket = calls(
        MAIN,
        py(runner, "update_weights_from_tensor", 800),
        py("sglang/srt/weight_sync/tensor_bucket.py", "__init__", 40),
    )
    d = classify(rules, bucket)
    assert (d.family, d.phase) == ("weight_update_buffer", "weight_update")


def test_torch_memory_saver_pool_without_identifying_stack(rules):
    ctx = BlockContext(pool_id=(0, 2), size=GiB, has_alloc_event=True)
    d = classify(rules, calls(MAIN, py("/home/u/helpers.py", "make", 3)), ctx)
    assert d.family == "unknown"
    assert d.rule_id == "torch_memory_saver.private_pool_unidentified"
    assert "MemPool" in d.label
    # a stack rule still wins inside the region (SGLang puts its KV cache there)
    mp = "sglang/srt/mem_cache/memory_pool.py"
    d = classify(rules, calls(MAIN, py(mp, "_create_buffers", 430)), ctx)
    assert d.family == "kv_cache"


# ---------------------------------------------------------------------------------------
# FSDP, DeepSpeed, TransformerEngine


@pytest.mark.parametrize(
    "path",
    [
        "torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py",
        "torch/distributed/_composable/fsdp/_fsdp_collectives.py",
    ],
    ids=["fsdp2-new", "fsdp2-old"],
)
def test_fsdp2_all_gather(rules, path):
    stack = calls(
        MAIN,
        *module_call("/home/u/model.py"),
        py("torch/distributed/fsdp/_fully_shard/_fsdp_state.py", "_pre_forward", 230),
        py("torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py", "unshard", 280),
        py(path, "foreach_all_gather", 150),
    )
    d = classify(rules, stack, BlockContext(stream=7, size=GiB, has_alloc_event=True))
    assert (d.family, d.rule_id) == ("comm_buffer", "fsdp.fsdp2_all_gather")


def test_fsdp1_unsharded_flat_param(rules):
    stack = calls(
        MAIN,
        py("torch/distributed/fsdp/_runtime_utils.py", "_pre_forward_unshard", 450),
        py("torch/distributed/fsdp/_flat_param.py", "unshard", 1300),
        py("torch/distributed/fsdp/_flat_param.py", "_alloc_padded_unsharded_flat_param", 1350),
    )
    assert classify(rules, stack).family == "comm_buffer"


def test_deepspeed_optimizer_state(rules):
    stack = calls(
        MAIN,
        py("deepspeed/runtime/engine.py", "step", 2200),
        py("deepspeed/runtime/zero/stage_1_and_2.py", "step", 1800),
        py("deepspeed/ops/adam/fused_adam.py", "step", 150),
    )
    d = classify(rules, stack)
    assert (d.family, d.phase) == ("optimizer_state", "optimizer")
    init = calls(
        MAIN,
        py("deepspeed/runtime/zero/stage_1_and_2.py", "__init__", 500),
        py("deepspeed/runtime/zero/stage_1_and_2.py", "initialize_optimizer_states", 650),
    )
    assert classify(rules, init).rule_id == "deepspeed.initialize_optimizer_states"


def test_transformer_engine_fused_adam(rules):
    te = "transformer_engine/pytorch/optimizers/fused_adam.py"
    stack = calls(
        MAIN,
        py("torch/optim/optimizer.py", "wrapper", 485),
        py(te, "step", 500),
        py(te, "initialize_state", 350),
        py(te, "_initialize_state", 320),
    )
    d = classify(rules, stack)
    assert (d.family, d.rule_id) == ("optimizer_state", "transformer_engine.fused_adam_state")


# ---------------------------------------------------------------------------------------
# verl, AReaL, OpenRLHF, ms-swift


def test_rl_framework_logprob_sites(rules):
    cases = {
        "verl.logprobs_from_logits": calls(
            MAIN,
            py("verl/workers/actor/dp_actor.py", "_forward_micro_batch", 300),
            py("verl/utils/torch_functional.py", "logprobs_from_logits", 80),
            py("torch/nn/functional.py", "log_softmax", 2200),
        ),
        "areal.vocab_parallel_logprobs": calls(
            MAIN,
            py("areal/utils/functional/vocab_parallel.py", "gather_logprobs", 200),
            py("torch/autograd/function.py", "apply", 575),
            py("areal/utils/functional/vocab_parallel.py", "forward", 90),
        ),
        "openrlhf.log_probs_from_logits": calls(
            MAIN,
            py("openrlhf/models/actor.py", "forward", 250),
            py("openrlhf/models/utils.py", "log_probs_from_logits", 70),
            py("openrlhf/models/utils.py", "_logsumexp_by_chunk", 50),
        ),
    }
    for rule_id, stack in cases.items():
        d = classify(rules, stack)
        assert (d.family, d.rule_id) == ("saved_logprob_softmax", rule_id), rule_id


def test_offload_reload_sites(rules):
    swift = calls(
        MAIN,
        py("swift/megatron/trainers/grpo_trainer.py", "_engine_infer", 900),
        py("swift/megatron/trainers/utils.py", "load_megatron_model_to_gpu", 300),
    )
    d = classify(rules, swift)
    assert (d.family, d.rule_id) == ("param_buffer", "ms_swift.load_megatron_model")
    verl = calls(MAIN, py("verl/utils/megatron_utils.py", "load_megatron_model_to_gpu", 420))
    assert classify(rules, verl).rule_id == "verl.load_megatron_model"


# ---------------------------------------------------------------------------------------
# generic PyTorch


def test_pytorch_adam_state_and_module_to(rules):
    adam = calls(
        MAIN,
        py("torch/optim/optimizer.py", "wrapper", 485),
        py("torch/optim/optimizer.py", "_use_grad", 79),
        py("torch/optim/adam.py", "step", 220),
        py("torch/optim/adam.py", "_init_group", 160),
    )
    d = classify(rules, adam)
    assert (d.family, d.rule_id, d.phase) == (
        "optimizer_state",
        "pytorch.optim_init_group",
        "optimizer",
    )
    to = calls(MAIN, py(MODULE, "to", 1340), py(MODULE, "_apply", 900), py(MODULE, "convert", 1326))
    d = classify(rules, to)
    assert (d.family, d.phase) == ("parameters", "init")


def test_pytorch_checkpoint_recompute_and_collective(rules):
    rec = calls(
        cpp("torch::autograd::Engine::thread_main(std::shared_ptr<GraphTask> const&)"),
        py("torch/utils/checkpoint.py", "unpack_hook", 1120),
        py("torch/utils/checkpoint.py", "recompute_fn", 1080),
        *module_call("/home/u/model.py", 40),
    )
    d = classify(rules, rec)
    assert (d.family, d.phase) == ("recompute", "backward")
    coll = calls(
        MAIN,
        py("/home/u/zero.py", "gather_params", 10),
        py("torch/distributed/c10d_logger.py", "wrapper", 83),
        py("torch/distributed/distributed_c10d.py", "all_gather_into_tensor", 3600),
    )
    d = classify(rules, coll, BlockContext(stream=5, state="active_pending_free", size=MiB))
    assert d.family == "comm_buffer"


def test_forward_under_call_impl_is_saved_activations(rules):
    stack = calls(MAIN, *module_call("/home/u/model.py", 54), *reversed(ALLOC_CPP))
    d = classify(rules, stack)
    assert (d.family, d.rule_id, d.phase) == (
        "saved_activations",
        "pytorch.module_forward",
        "forward",
    )
    assert "saved for backward" in d.label


def test_custom_function_forward_torch_2_9_and_2_10(rules):
    old = calls(
        MAIN, py("torch/autograd/function.py", "apply", 575), py("/home/u/ops.py", "forward", 20)
    )
    new = calls(MAIN, py("/home/u/ops.py", "my_op", 30), py("/home/u/ops.py", "forward", 20))
    d_old, d_new = classify(rules, old), classify(rules, new)
    assert (d_old.family, d_old.rule_id, d_old.phase) == (
        "saved_activations",
        "pytorch.function_forward",
        "forward",
    )
    assert (d_new.family, d_new.rule_id, d_new.phase) == (
        "saved_activations",
        "pytorch.bare_forward",
        "forward",
    )


def test_custom_function_backward(rules):
    stack = calls(
        cpp("torch::autograd::Engine::thread_main(std::shared_ptr<GraphTask> const&)"),
        cpp("torch::autograd::PyNode::apply(std::vector<at::Tensor>&&)", "python_function.cpp"),
        py("torch/autograd/function.py", "apply", 307),
        py("/home/u/ops.py", "backward", 40),
    )
    d = classify(rules, stack)
    assert (d.family, d.phase) == ("gradients", "backward")


@pytest.mark.parametrize(
    "driver",
    [
        "run_forward_backward_step",
        "_forward_pass_wrapper",
        "run_memory_foward_fullstep",
        "forward_and_step",
    ],
)
def test_driver_name_is_not_a_forward_frame(rules, driver):
    """An outer function whose name merely contains 'forward' must not turn an optimizer
    step allocation into activations: names match exactly."""
    stack = calls(
        MAIN,
        py("/home/u/bench.py", driver, 234),
        py("torch/optim/optimizer.py", "wrapper", 493),
        py("/home/u/my_optim.py", "step", 82),
        *reversed(ALLOC_CPP),
    )
    d = classify(rules, stack)
    assert (d.family, d.rule_id, d.phase) == (
        "optimizer_state",
        "pytorch.optimizer_step",
        "optimizer",
    )
    # and without any optimizer frame the driver alone is no forward either
    alone = calls(MAIN, py("/home/u/bench.py", driver, 230), py("/home/u/bench.py", "helper", 5))
    d = classify(rules, alone)
    # (nothing but the program's own code on the stack: that much is known, no more)
    assert (d.family, d.rule_id, d.phase) == ("user_tensors", "pytorch.program_own_code",
                                              "unknown")


def test_optimizer_annotation_window(rules):
    ctx = BlockContext(size=MiB, has_alloc_event=True, annotations=("Optimizer.step#AdamW.step",))
    stack = calls(MAIN, py("/home/u/my_optim.py", "update", 9))
    assert infer_phase(stack, ctx, rules) == "optimizer"
    d = classify(rules, stack, ctx)
    assert d.family == "optimizer_state"
    assert "Optimizer.step#AdamW.step" in d.reason


def test_phase_hint_wins(rules):
    stack = calls(MAIN, *module_call("/home/u/model.py"))
    assert infer_phase(stack, BlockContext(phase_hint="logprobs"), rules) == "logprobs"
    d = classify(rules, stack, BlockContext(phase_hint="rollout"))
    assert (d.family, d.phase) == ("activation_temporaries", "rollout")
    assert set(PHASES) >= {infer_phase(stack, CTX, rules)}


# ---------------------------------------------------------------------------------------
# C++-only stacks, empty stacks


AUTOGRAD_THREAD = (
    cpp("at::_ops::bmm::call(at::Tensor const&, at::Tensor const&)"),
    cpp("torch::autograd::generated::BmmBackward0::apply(std::vector<at::Tensor>&&)"),
    cpp("torch::autograd::Node::operator()(std::vector<at::Tensor>&&)", ""),
    cpp("torch::autograd::Engine::evaluate_function(std::shared_ptr<GraphTask>&)"),
    cpp("torch::autograd::Engine::thread_main(std::shared_ptr<GraphTask> const&)"),
    cpp("torch::autograd::Engine::thread_init(int, std::shared_ptr<ReadyQueue> const&, bool)"),
    cpp("execute_native_thread_routine", "thread48.o"),
)


def test_cpp_only_autograd_thread_is_gradients_in_backward(rules):
    d = classify(rules, ALLOC_CPP + AUTOGRAD_THREAD)
    assert (d.family, d.rule_id, d.phase) == ("gradients", "pytorch.autograd_thread", "backward")
    assert "autograd thread" in d.label
    acc = (
        ALLOC_CPP
        + (
            cpp(
                "void torch::autograd::AccumulateGrad::accumulateGrad<std::function<void "
                "(at::Tensor&&)> >(at::Tensor const&, at::Tensor&)",
                "",
            ),
            cpp("torch::autograd::AccumulateGrad::apply(std::vector<at::Tensor>&&)"),
        )
        + AUTOGRAD_THREAD[3:]
    )
    d = classify(rules, acc)
    assert (d.family, d.rule_id, d.phase) == ("gradients", "pytorch.accumulate_grad", "backward")
    assert "`torch::autograd::AccumulateGrad::accumulateGrad`" in d.reason


@pytest.mark.parametrize(
    "has_alloc_event,phrase,phase",
    [
        (False, "no frames: allocated before recording began", "unknown"),
        # a frameless block is in backward only where the trace places it (phase_hint)
        (True, "no frames: allocated in the window by a thread without a Python stack",
         "unknown"),
        (None, "no frames: no allocation history was recorded", "unknown"),
    ],
)
def test_empty_stack_unknown_reasons(rules, has_alloc_event, phrase, phase):
    d = classify(rules, (), BlockContext(size=MiB, has_alloc_event=has_alloc_event))
    assert d.family == "unknown"
    assert phrase in d.label
    assert phrase in d.reason
    assert d.phase == phase


def test_interleaved_cpp_frames_do_not_break_innermost(rules):
    # innermost Python frame is the slime function although 5 C++ frames sit inside it
    ok = calls(
        MAIN,
        py("slime/utils/ppo_utils.py", "calculate_log_probs_and_entropy", 690),
        cpp("_PyEval_EvalFrameDefault"),
        cpp("torch::autograd::THPVariable_clone(_object*, _object*)"),
        *reversed(ALLOC_CPP),
    )
    assert classify(rules, ok).rule_id == "slime.logprob_clone_old"
    # ... but a Python frame inside it (an einsum helper) makes it not innermost any more
    not_inner = calls(
        MAIN,
        py("slime/utils/ppo_utils.py", "calculate_log_probs_and_entropy", 690),
        cpp("_PyEval_EvalFrameDefault"),
        py("torch/functional.py", "einsum", 407),
        *reversed(ALLOC_CPP),
    )
    assert classify(rules, not_inner).rule_id != "slime.logprob_clone_old"


# ---------------------------------------------------------------------------------------
# user rule files: priority, ties, errors


def write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text, encoding="utf-8")
    return p


def test_user_rule_overrides_builtin_by_priority(tmp_path):
    user = write(
        tmp_path,
        "mine.toml",
        """
[pack]
name = "mine"

[[rule]]
id = "softmax_is_logits"
family = "logits"
label = "my view of the softmax"
frames = [{ file = "slime/utils/ppo_utils.py", function = "vocab_parallel_softmax" }]
""",
    )
    rs = load_rules([user])
    stack = calls(MAIN, *SLIME_LOSS)
    d = rs.classify(stack, CTX)
    # user files default to priority 150, above every built-in rule
    assert (d.family, d.rule_id) == ("logits", "mine.softmax_is_logits")
    assert "slime.logprob_softmax" not in d.ties
    # an explicit lower priority gives precedence back to the built-in
    low = write(
        tmp_path,
        "low.toml",
        """
[[rule]]
id = "low.softmax"
family = "logits"
label = "x"
priority = 1
frames = [{ file = "slime/utils/ppo_utils.py", function = "vocab_parallel_softmax" }]
""",
    )
    assert load_rules([low]).classify(stack, CTX).rule_id == "slime.logprob_softmax"


def test_ties_are_reported_and_first_loaded_wins(tmp_path):
    user = write(
        tmp_path,
        "tie.toml",
        """
[pack]
name = "tie"
default_priority = 300

[[rule]]
id = "tie.a"
family = "parameters"
label = "a"
frames = [{ function = "forward" }]

[[rule]]
id = "tie.b"
family = "logits"
label = "b"
frames = [{ function_re = "for.*" }]
""",
    )
    d = load_rules([user]).classify(calls(MAIN, *module_call("/home/u/m.py")), CTX)
    assert d.rule_id == "tie.a"
    assert d.ties == ("tie.b",)


RULE = "[[rule]]\nid = 'r'\nfamily = 'logits'\nlabel = 'l'\n"
KNOB = "[[knob]]\nid = 'u.k'\nknob = '--k'\ndirection = 'lowers'\neffect = 'e'\n"
EXAMPLE = "[[example]]\nstack = [{ file = 'm.py', function = 'forward', line = 1 }]\n"
IN_RULE = " (rule `user_pack.r`)"
IN_KNOB = " (knob `u.k`)"


@pytest.mark.parametrize(
    "body,where,problem",
    [
        ("[[rule]\nid = 'x'", "TOML syntax error", "Expected ']]'"),
        (RULE + "colour = 'red'\nframes = [{ function = 'f' }]", "rule[0].colour" + IN_RULE,
         "unknown field (allowed: annotation, description, family, frames, "),
        (RULE.replace("logits", "logitz") + "frames = [{ function = 'f' }]",
         "rule[0].family" + IN_RULE, "unknown family 'logitz' (known: "),
        (RULE + "frames = [{ function_re = 'f(' }]", "rule[0].frames[0].function_re" + IN_RULE,
         "invalid regex 'f('"),
        (RULE + "frames = [{ function = 'f' }, { function = 'f', whre = 'innermost' }]",
         "rule[0].frames[1].whre" + IN_RULE, "unknown field (allowed: file, file_re, "),
        ("[[rule]]\nid = 'no_label'\nfamily = 'logits'\nframes = [{ function = 'f' }]",
         "rule[0].label (rule `user_pack.no_label`)", "missing required field"),
        ("[[rule]]\nfamily = 'logits'\nlabel = 'l'\npool = 'default'", "rule[0].id",
         "missing required field"),
        ("[[rule]]\nid = 'a b'\nfamily = 'logits'\nlabel = 'l'\npool = 'default'",
         "rule[0].id (rule `user_pack.a b`)", "expected `str` that is a dotted name"),
        (RULE, "rule[0]" + IN_RULE, "needs at least one condition"),
        (RULE + "min_size = 'lots'", "rule[0].min_size" + IN_RULE, "cannot read 'lots' as a size"),
        ("[[phase_rule]]\nid = 'bad_phase'\nphase = 'warmup'\nframes = [{ function = 'f' }]",
         "phase_rule[0].phase (rule `user_pack.bad_phase`)", "unknown phase 'warmup'"),
        (RULE + "frames = [{ function = '__init__', line_rank = 0 }]",
         "rule[0].frames[0].line_rank" + IN_RULE, 'needs where = "innermost"'),
        (RULE + "pool = 'shared'", "rule[0].pool" + IN_RULE,
         "'shared' is not one of ('default', 'mempool', 'graph', 'private')"),
        (RULE + "pool = ['default', 'shared']", "rule[0].pool[1]" + IN_RULE,
         "'shared' is not one of ('default', 'mempool', 'graph', 'private')"),
        (RULE + "state = 'freed'", "rule[0].state" + IN_RULE, "unknown block state 'freed'"),
        (RULE + "frames = [{ function = 3 }]", "rule[0].frames[0].function" + IN_RULE,
         "expected `str | list`, got `int`"),
        (RULE + "frames = [{ function = [] }]", "rule[0].frames[0].function" + IN_RULE,
         "expected `list` of length >= 1"),
        (RULE + "frames = { function = 'f' }", "rule[0].frames" + IN_RULE,
         "expected `list`, got `table`"),
        (RULE + "frames = [{ function = 'f', within = true }]",
         "rule[0].frames[0].within" + IN_RULE, "expected `int`, got `bool`"),
        (RULE + "frames = [{ function = 'f*' }]", "rule[0].frames[0].function" + IN_RULE,
         "'f*' is a pattern: use `function_re`"),
        (KNOB + "families = ['logits']\ncost = 'free'\ncolour = 1", "knob[0].colour" + IN_KNOB,
         "unknown field (allowed: causes, caveat, cost, direction, "),
        (KNOB + "families = ['logits']", "knob[0].cost" + IN_KNOB, "missing required field"),
        (KNOB + "families = ['logits']\ncost = 'cheap'", "knob[0].cost" + IN_KNOB,
         "'cheap' is not one of ('free', 'compute', 'communication', 'quality')"),
        (KNOB + "families = ['logitz']\ncost = 'free'", "knob[0].families" + IN_KNOB,
         "unknown family 'logitz'"),
        (KNOB + "causes = ['oom']\ncost = 'free'", "knob[0].causes" + IN_KNOB,
         "unknown cause 'oom'"),
        (KNOB + "cost = 'free'", "knob[0]" + IN_KNOB, "needs `families` or `causes`"),
        (KNOB + "families = ['logits']\ncost = 'free'\nphases = ['warmup']",
         "knob[0].phases" + IN_KNOB, "unknown phase 'warmup'"),
        (KNOB.replace("'lowers'", "'shrinks'") + "families = ['logits']\ncost = 'free'",
         "knob[0].direction" + IN_KNOB, "'shrinks' is not one of ('lowers', "),
        (KNOB + "families = ['logits']\ncost = 'free'\nrequires = ['gpu']",
         "knob[0].requires" + IN_KNOB, "unknown fact 'gpu' (known: backward, "),
        (KNOB + "families = ['logits']\ncost = 'free'\nsimulate = ['expandable_segments:Maybe']",
         "knob[0].simulate" + IN_KNOB, "expandable_segments is True or False"),
        (KNOB + "causes = ['fragmentation']\ncost = 'free'\nrequires = ['stranded_cache']\n"
         "replay_decides = ['stranded_cache']", "knob[0].replay_decides" + IN_KNOB,
         "needs `simulate`"),
        (KNOB + "causes = ['fragmentation']\ncost = 'free'\nsimulate = ['expandable_segments:True']"
         "\nreplay_decides = ['stranded_cache']", "knob[0].replay_decides" + IN_KNOB,
         "'stranded_cache' is not in the knob's `requires`"),
        (EXAMPLE + "family = 'logits'\nwhy = 'x'", "example[0].why", "unknown field (allowed: "),
        (EXAMPLE, "example[0].family", "missing required field"),
        (EXAMPLE + "family = 'logitz'", "example[0].family", "unknown family 'logitz'"),
        (EXAMPLE + "family = 'logits'\nphase = 'warmup'", "example[0].phase",
         "unknown phase 'warmup'"),
        (EXAMPLE + "family = 'logits'\npool = 'shared'", "example[0].pool",
         "'shared' is not one of ('default', 'mempool', 'graph')"),
        ("[[example]]\nfamily = 'logits'\nstack = [{ file = 'm.py', func = 'f' }]",
         "example[0].stack[0].func", "unknown field (allowed: file, function, line, symbol)"),
        ("[[example]]\nfamily = 'logits'\nstack = [{ file = 'libtorch.so', function = 'f' }]",
         "example[0].stack[0].file", "is not a Python frame"),
        ("[pack]\nmarkers = 'x/'\nowner = 'me'", "pack.owner", "unknown field (allowed: "),
        ("[pack]\nmarkers = ['']", "pack.markers", "entries must be non-empty"),
        ("[pack]\nname = 'a b'", "pack.name", "expected `str` that is a simple name"),
        ("pack = 3", "pack", "expected `table`, got `int`"),
        ("[[knobs]]\nid = 'x'", "knobs",
         "unknown field (allowed: example, knob, pack, phase_rule, rule)"),
    ],
)
def test_bad_packs_give_one_line_errors_naming_the_path(tmp_path, body, where, problem):
    """A bad pack is one line: the file, the path in it (with the entry's id), the problem."""
    path = write(tmp_path, "user_pack.toml", body)
    with pytest.raises(RuleError) as info:
        load_rules([path])
    msg = str(info.value)
    assert "\n" not in msg
    # the schema's errors name the line too (issue 68): `file:line: path: problem`
    assert re.match(rf"{re.escape(str(path))}(:\d+)?: {re.escape(where)}: ", msg), msg
    assert problem in msg, msg


def test_duplicate_rule_id_is_an_error(tmp_path):
    # a user pack named like a built-in one that redefines one of its ids
    path = write(
        tmp_path,
        "slime_local.toml",
        """
[pack]
name = "slime"

[[rule]]
id = "slime.logprob_softmax"
family = "logits"
label = "l"
frames = [{ function = "f" }]
""",
    )
    with pytest.raises(RuleError) as info:
        load_rules([path])
    msg = str(info.value)
    assert msg.startswith(f"{path}: rule `slime.logprob_softmax`: duplicate rule id")
    assert "packs/slime.toml" in msg


# ---------------------------------------------------------------------------------------
# context conditions, memoisation


def test_context_conditions(tmp_path):
    path = write(
        tmp_path,
        "ctx.toml",
        """
[pack]
name = "ctx"
default_priority = 500

[[rule]]
id = "big_side_stream"
family = "comm_buffer"
label = "big, side stream, pending free"
stream = "nondefault"
state = "active_awaiting_free"
min_size = "1GiB"
pool = "default"
frames = [{ function = "bucket" }]
""",
    )
    rs = load_rules([path])
    stack = calls(MAIN, py("/home/u/x.py", "bucket", 3))
    hit = BlockContext(stream=9, state="active_pending_free", size=2 * GiB, has_alloc_event=True)
    assert rs.classify(stack, hit).rule_id == "ctx.big_side_stream"
    for miss in (
        BlockContext(stream=0, state="active_pending_free", size=2 * GiB),
        BlockContext(stream=9, state="active_allocated", size=2 * GiB),
        BlockContext(stream=9, state="active_pending_free", size=GiB - 1),
        BlockContext(pool_id=(0, 1), stream=9, state="active_pending_free", size=2 * GiB),
    ):
        d = rs.classify(stack, miss)
        assert d.rule_id != "ctx.big_side_stream"
        assert any(n.startswith("ctx.big_side_stream:") for n in d.near_misses)


def test_classify_is_memoised_by_stack_and_context_key():
    rs = load_rules()
    stack = calls(MAIN, *module_call("/home/u/model.py"))
    a = rs.classify(stack, BlockContext(size=10, has_alloc_event=True))
    b = rs.classify(stack, BlockContext(size=10_000_000, has_alloc_event=True))
    assert a is b  # no built-in rule uses sizes: one decision for every size
    assert rs.cache_size == 1
    rs.classify(stack, BlockContext(pool_id=(3, 0), size=10, has_alloc_event=True))
    assert rs.cache_size == 2


# ---------------------------------------------------------------------------------------
# chunk groups


def test_chunk_groups_softmax_chunks():
    chunk = 1024 * 124160 * 4  # 485 MiB: one chunk of [1024, V/2] fp32 for Qwen3.5-4B, TP=2
    blocks = [("ppo_utils.py:512", "saved_logprob_softmax", chunk, 100 + i) for i in range(8)]
    blocks += [("model.py:54", "saved_activations", 10 * MiB, 5)]
    groups = chunk_groups(blocks)
    assert len(groups) == 1
    g = groups[0]
    assert (g.count, g.chunk_size, g.total, g.uniform) == (8, chunk, 8 * chunk, True)
    assert g.total == 8 * 1024 * 124160 * 4  # the whole [8192, V/2] kept for backward
    assert isinstance(g.total, int)


def test_chunk_groups_tail_and_split():
    blocks = [("s", "f", 100, i) for i in range(3)] + [("s", "f", 40, 3)]
    blocks += [("s", "f", 100, 1000 + i) for i in range(2)]
    (one,) = chunk_groups(blocks)
    assert (one.count, one.chunk_size, one.total, one.min_size) == (6, 100, 540, 40)
    two = chunk_groups(blocks, max_order_gap=10)
    assert [(g.count, g.total) for g in two] == [(4, 340), (2, 200)]
    assert chunk_groups([("s", "f", 1, 0)]) == []


def test_program_own_code_needs_every_python_frame_to_be_the_programs(rules):
    """A stack of the program's files and torch's operator entry points is the program's
    own tensor; one more frame of a library, a module forward or a framework checkout on it,
    and the rule no longer holds (the block falls to the rules that know that code, or to
    an honest unknown)."""
    own = calls(MAIN, py("/home/u/infer.py", "main", 40),
                py("torch/nn/functional.py", "relu", 1771), *reversed(ALLOC_CPP))
    d = classify(rules, own)
    assert (d.family, d.rule_id) == ("user_tensors", "pytorch.program_own_code")
    for extra in (py("einops/einops.py", "rearrange", 500),
                  py("/workspace/Megatron-LM/megatron/core/utils.py", "helper", 3),
                  ("<string>", "__init__", 2)):
        d = classify(rules, calls(MAIN, py("/home/u/infer.py", "main", 40), extra))
        assert d.family == "unknown", (extra, d.reason)
    assert rules.classify((), CTX).family != "user_tensors"  # no Python frame: nothing known


def test_only_frames_names_python_code_only(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text('[pack]\nname = "mine"\n[[rule]]\nid = "mine.x"\nfamily = "logits"\n'
                    'label = "x"\nonly_frames = [{ symbol_re = "at::" }]\n')
    with pytest.raises(RuleError) as info:
        load_rules([path])
    assert "only_frames" in str(info.value)


def test_rules_tried_by_name_decide_as_every_rule_tried():
    """The engine tries a rule whose frames all name functions only on stacks with one of
    those names; on every stack of the samples (and the corpus, when present), in a few
    contexts, it decides exactly as trying every rule does: family, rule, reason, phase,
    ties and near misses."""
    import snapana
    from snapana.analysis.attribution.engine import RuleSet

    from .conftest import SAMPLES, SNAPSHOTS

    files = sorted(SAMPLES.glob("*.pickle")) + sorted(SNAPSHOTS.glob("*.p*kl*"))
    tables = [snapana.load(f).session.capture.stacks for f in files]
    stacks = {t.stack(i) for t in tables for i in range(len(t.stacks))}
    # (the samples alone hold 67 distinct stacks; the corpus, where present, hundreds more)
    assert len(stacks) > (100 if SNAPSHOTS.is_dir() else 50)
    contexts = [CTX, BlockContext(size=4 * MiB, has_alloc_event=False),
                BlockContext(size=1 * MiB, has_alloc_event=True, phase_hint="backward")]
    indexed, every = load_rules(), load_rules()
    every._worth_trying = lambda kind, ns: set(range(len(  # type: ignore[method-assign]
        every.rules if kind == "family" else every.phase_rules)))
    assert every._worth_trying is not RuleSet._worth_trying
    for stack in stacks:
        for ctx in contexts:
            assert indexed.classify(stack, ctx) == every.classify(stack, ctx), stack
