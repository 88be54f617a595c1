"""The traceback above an OOM message as the failing allocation's stack (issue 57).

The logs are written here with the frame lines the frameworks' own sources print (file,
line, function and source line read from slime v0.2.4, Megatron-LM main and the ms-swift /
vLLM log of seed 003, kept verbatim). What the log reader names is checked against the
rules engine run by the test on the stack it builds itself from the frames it wrote
(innermost first, as a snapshot stores it): the same packs, the same decision."""

from __future__ import annotations

import json

import pytest
from snapana.analysis.attribution import load_rules
from snapana.analysis.attribution.stack import BlockContext
from snapana.log_session import weigh
from snapana.render.text_log import text_log_view
from snapana.sources.log_text import read_text
from snapana.sources.traceback_text import read_tracebacks

from .conftest import invoke

RULES = load_rules()
SITE = "/usr/local/lib/python3.12/dist-packages"

#: (file, line, function, source line), outermost first: slime v0.2.4's log-prob pass
#: (slime/backends/megatron_utils/loss.py, slime/utils/ppo_utils.py) into Megatron's fused
#: cross entropy, whose calculate_logits_max is torch.compile'd (jit_fuser).
SLIME_FRAMES = [
    ("/root/slime/slime/backends/megatron_utils/loss.py", 269, "get_log_probs_and_entropy",
     "log_prob, entropy = calculate_log_probs_and_entropy("),
    ("/root/slime/slime/utils/ppo_utils.py", 672, "calculate_log_probs_and_entropy",
     "log_prob = compute_log_probs(logits.clone(), tokens, tp_group)"),
    ("/root/slime/slime/utils/ppo_utils.py", 158, "compute_log_probs",
     "return -fused_vocab_parallel_cross_entropy(logits, tokens, process_group)"),
    ("/root/Megatron-LM/megatron/core/fusions/fused_cross_entropy.py", 148,
     "fused_vocab_parallel_cross_entropy",
     "return _VocabParallelCrossEntropy.apply(vocab_parallel_logits, target, tp_group)"),
    (f"{SITE}/torch/autograd/function.py", 575, "apply",
     "return super().apply(*args, **kwargs)  # type: ignore[misc]"),
    ("/root/Megatron-LM/megatron/core/fusions/fused_cross_entropy.py", 93, "forward",
     "vocab_parallel_logits, logits_max = calculate_logits_max(vocab_parallel_logits)"),
    (f"{SITE}/torch/_dynamo/eval_frame.py", 655, "_fn", "return fn(*args, **kwargs)"),
    (f"{SITE}/torch/_functorch/aot_autograd.py", 1130, "forward",
     "return compiled_fn(full_args)"),
    (f"{SITE}/torch/_inductor/output_code.py", 613, "__call__",
     "return self.current_callable(inputs)"),
]
#: Megatron's Float16Module turning the bf16 logits fp32 (megatron/core/transformer/module.py)
MEGATRON_FP32 = [
    ("/workspace/Megatron-LM/pretrain_gpt.py", 196, "forward_step",
     "output_tensor = model(tokens, position_ids, attention_mask, labels=labels)"),
    (f"{SITE}/torch/nn/modules/module.py", 1751, "_wrapped_call_impl",
     "return self._call_impl(*args, **kwargs)"),
    (f"{SITE}/torch/nn/modules/module.py", 1762, "_call_impl",
     "return forward_call(*args, **kwargs)"),
    ("/workspace/Megatron-LM/megatron/core/transformer/module.py", 566, "forward",
     "outputs = float16_to_fp32(outputs)"),
    ("/workspace/Megatron-LM/megatron/core/transformer/module.py", 442, "float16_to_fp32",
     "return conversion_helper(val, float_conversion)"),
    ("/workspace/Megatron-LM/megatron/core/transformer/module.py", 401, "conversion_helper",
     "return conversion(val)"),
    ("/workspace/Megatron-LM/megatron/core/transformer/module.py", 439, "float_conversion",
     "val = val.float()"),
]
#: Megatron's unfused vocab-parallel cross entropy (megatron/core/tensor_parallel/
#: cross_entropy.py): another rank failing elsewhere in the same step.
MEGATRON_CE = [
    ("/workspace/Megatron-LM/megatron/core/models/common/language_module/language_module.py",
     200, "compute_language_model_loss",
     "loss = tensor_parallel.vocab_parallel_cross_entropy("),
    ("/workspace/Megatron-LM/megatron/core/tensor_parallel/cross_entropy.py", 233,
     "vocab_parallel_cross_entropy", "return _VocabParallelCrossEntropy.apply("),
    (f"{SITE}/torch/autograd/function.py", 575, "apply",
     "return super().apply(*args, **kwargs)  # type: ignore[misc]"),
    ("/workspace/Megatron-LM/megatron/core/tensor_parallel/cross_entropy.py", 127, "forward",
     "vocab_parallel_logits, logits_max = VocabParallelCrossEntropy.calculate_logits_max("),
    ("/workspace/Megatron-LM/megatron/core/tensor_parallel/cross_entropy.py", 25,
     "calculate_logits_max", "vocab_parallel_logits = vocab_parallel_logits.float()"),
]


def message(request: str, free: str, own: str, allocated: str, cached: str,
            capacity: str = "79.15 GiB") -> str:
    """PyTorch 2.2+'s OOM message (c10/cuda/CUDACachingAllocator.cpp)."""
    return (f"CUDA out of memory. Tried to allocate {request}. GPU 0 has a total capacity of "
            f"{capacity} of which {free} is free. Including non-PyTorch memory, this process "
            f"has {own} memory in use. Of the allocated memory {allocated} is allocated by "
            f"PyTorch, and {cached} is reserved by PyTorch but unallocated. If reserved but "
            "unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF="
            "expandable_segments:True to avoid fragmentation.  See documentation for Memory "
            "Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-"
            "variables)")


def traceback_lines(frames: list[tuple[str, int, str, str]], exception: str,
                    prefix: str = "", carets: bool = True) -> list[str]:
    """A traceback as CPython 3.11+ prints it: each frame, its source line, its carets."""
    out = [f"{prefix}Traceback (most recent call last):"]
    for path, line, function, code in frames:
        out.append(f'{prefix}  File "{path}", line {line}, in {function}')
        out.append(f"{prefix}    {code}")
        if carets:
            out.append(f"{prefix}    {'^' * min(len(code), 40)}")
    return [*out, f"{prefix}{exception}"]


def stack_of(frames: list[tuple[str, int, str, str]]) -> tuple[tuple[str, str, int], ...]:
    """The snapshot's form of the frames: (file, function, line), innermost first."""
    return tuple((path, function, line) for path, line, function, _ in reversed(frames))


def decided(frames: list[tuple[str, int, str, str]], request: int):
    stack = stack_of(frames)
    return RULES.with_sites([stack]).classify(stack, BlockContext(size=request))


def slime_ray_log(remote_header: bool = True) -> str:
    """The driver's traceback through ray.get, Ray's RayTaskError line, then the actor's own
    frames ending in the OOM message (THUDM/slime#1951's shape): Ray prints them right after
    its exception line, without a header (`remote_header=False`); a log that re-raised the
    cause has one."""
    driver = [
        ("/root/slime/train.py", 110, "<module>", "train(args)"),
        ("/root/slime/train.py", 88, "train",
         "ray.get(actor_model.async_train(rollout_id, rollout_data_ref))"),
        (f"{SITE}/ray/_private/worker.py", 1012, "get_objects",
         "raise value.as_instanceof_cause()"),
    ]
    lines = ["(MegatronTrainRayActor pid=2025282) training step 3",
             *traceback_lines(driver, "ray.exceptions.RayTaskError(OutOfMemoryError): "
                              "ray::MegatronTrainRayActor.train() (pid=2025282, "
                              "ip=10.252.197.29)"),
             "           ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^",
             *traceback_lines(SLIME_FRAMES, "torch.OutOfMemoryError: " + message(
                 "58.15 GiB", "47.69 GiB", "31.50 GiB", "23.50 GiB", "502.00 MiB",
                 "79.19 GiB"))[0 if remote_header else 1:]]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("remote_header", [False, True])
def test_slime_log_prob_copy_is_named_by_the_slime_pack(remote_header: bool) -> None:
    log = read_text(slime_ray_log(remote_header), "slime.log")
    (finding,) = weigh([log]).requests
    want = decided(SLIME_FRAMES, int(58.15 * (1 << 30)))
    assert (finding.family, finding.rule_id) == (want.family, want.rule_id)
    assert want.rule_id == "slime.logprob_logits_copy" and want.family == "logits"
    # the actor's traceback, not the driver's: its frames are the ones written
    assert finding.traceback.stack == stack_of(SLIME_FRAMES)
    assert finding.code == SLIME_FRAMES[5][3] and finding.called_code == SLIME_FRAMES[2][3]
    assert {fw for fw, _ in finding.owners} >= {"slime", "megatron"}
    knobs = [k for k, _ in finding.knobs]
    # slime's own knobs bounding the tokens of the micro-batch, its owner shown by frames
    assert "--max-tokens-per-gpu" in knobs
    assert all("— " in why for _, why in finding.knobs)
    view = text_log_view("slime.log", weigh([log]))
    assert "from the traceback: one request, not what held the rest" in view.verdict
    assert "logits.clone()" in view.verdict


def test_megatron_ranks_printing_at_once_are_read_apart() -> None:
    """torchrun prefixes every line with its rank; two ranks' tracebacks interleave line by
    line. Each message gets its own rank's frames."""
    rank0 = traceback_lines(MEGATRON_FP32, "torch.OutOfMemoryError: " + message(
        "29.50 GiB", "12.31 GiB", "66.20 GiB", "63.91 GiB", "1.48 GiB"), "[rank0]: ")
    rank1 = traceback_lines(MEGATRON_CE, "torch.OutOfMemoryError: " + message(
        "14.75 GiB", "3.02 GiB", "75.49 GiB", "72.80 GiB", "1.92 GiB"), "[rank1]: ",
        carets=False)
    lines = []
    for k in range(max(len(rank0), len(rank1))):
        lines += [*rank0[k:k + 1], *rank1[k:k + 1]]
    log = read_text("\n".join(lines), "torchrun.log")
    ev = weigh([log])
    by_rank = {d.message.rank: r for d, r in zip(ev.diagnoses, ev.requests, strict=True)}
    for rank, frames, size in ((0, MEGATRON_FP32, 29.50), (1, MEGATRON_CE, 14.75)):
        got = by_rank[rank]
        want = decided(frames, int(size * (1 << 30)))
        assert got.traceback.stack == stack_of(frames), rank
        assert (got.family, got.rule_id) == (want.family, want.rule_id), rank
    assert by_rank[0].rule_id == "megatron.logits_fp32"
    assert by_rank[0].code == "val = val.float()"


#: Seed 003's last traceback, verbatim as its log printed it: ms-swift's colocated vLLM
#: engine refused to start and the offload context's reload then ran out of memory (the
#: log had lost its indentation and the dunder names, as pasted).
SEED_003 = """\
[rank0]: Traceback (most recent call last):
[rank0]: File "/data_nvme0n1/zpk/ms-swift/swift/megatron/trainers/rollout_mixin.py", line 220, in init_rollout_engine
[rank0]: with context():
[rank0]: File "/data_nvme0n1/conda/envs/ms-swift/lib/python3.12/contextlib.py", line 155, in exit
[rank0]: self.gen.throw(value)
[rank0]: File "/data_nvme0n1/zpk/ms-swift/swift/megatron/trainers/rollout_mixin.py", line 582, in offload_context
[rank0]: load_megatron_model_to_gpu(self.wrapped_models)
[rank0]: File "/data_nvme0n1/conda/envs/ms-swift/lib/python3.12/site-packages/torch/utils/contextlib.py", line 124, in decorate_context
[rank0]: return func(*args, **kwargs)
[rank0]: ^^^^^^^^^^^^^^^^^^^^^
[rank0]: File "/data_nvme0n1/zpk/ms-swift/swift/megatron/trainers/utils.py", line 128, in load_megatron_model_to_gpu
[rank0]: buffer.param_data.storage().resize(buffer.param_data_size)
[rank0]: File "/data_nvme0n1/conda/envs/ms-swift/lib/python3.12/site-packages/torch/storage.py", line 1257, in resize
[rank0]: self.resize(size)
[rank0]: File "/data_nvme0n1/conda/envs/ms-swift/lib/python3.12/site-packages/torch/storage.py", line 1261, in resize
[rank0]: self.untyped_storage.resize(size * self._element_size())
[rank0]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 7.50 GiB. GPU 0 has a total capacity of 79.25 GiB of which 975.94 MiB is free. Including non-PyTorch memory, this process has 78.25 GiB memory in use. Of the allocated memory 77.28 GiB is allocated by PyTorch, with 26.83 MiB allocated in private pools (e.g., CUDA Graphs), and 66.45 MiB is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting PYTORCH_ALLOC_CONF=expandable_segments:True to avoid fragmentation. See documentation for Memory Management (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)
"""  # noqa: E501 (verbatim log lines)


def test_a_vllm_colocated_reload_is_named_without_offload_advice() -> None:
    """Seed 003: the request is the Megatron buffers ms-swift reloads after offloading them
    for vLLM; the ms-swift pack's rule names it, and its offload knob (the path that failed)
    is not offered — as on a snapshot of the same failure."""
    (tb,) = read_tracebacks(SEED_003.splitlines())
    frames = [(p, ln, fn, "") for p, fn, ln in reversed(tb.stack)]
    assert len(frames) == 7 and frames[-1][2] == "resize"
    (finding,) = weigh([read_text(SEED_003, "seed003.log")]).requests
    want = decided(frames, int(7.5 * (1 << 30)))
    assert (finding.family, finding.rule_id) == (want.family, "ms_swift.load_megatron_model")
    assert finding.code == "buffer.param_data.storage().resize(buffer.param_data_size)"
    assert not any("offload" in k for k, _ in finding.knobs)
    # the environment named after the framework does not make torch's frames its own
    assert all("torch/storage.py" not in where for _, where in finding.owners)


def test_json_and_markdown_carry_the_request(tmp_path) -> None:
    path = tmp_path / "slime.log"
    path.write_text(slime_ray_log())
    result = invoke("summary", "--format", "json", str(path))
    assert result.returncode == 0, result.stderr
    (msg,) = json.loads(result.stdout)["messages"]
    req = msg["failing_request"]
    assert req["family"] == "logits" and req["rule"] == "slime.logprob_logits_copy"
    assert [f["line"] for f in req["traceback"]["frames"]] == [f[1] for f in SLIME_FRAMES]
    md = invoke("summary", "--format", "markdown", str(path))
    assert "request: from the traceback" in md.stdout.lower()


@pytest.mark.parametrize("filler", ["9", " ", ".", 'File "', "[rank1]: "])
def test_traceback_lines_are_read_in_linear_time(filler: str) -> None:
    """100 KB of one character (and of a frame's start) on one line and over many lines:
    every pattern is bounded, so the count of lines read is all the work there is."""
    import time

    text = "Traceback (most recent call last):\n" + filler * (100_000 // len(filler))
    many = "Traceback (most recent call last):\n" + "\n".join([filler * 50] * 2000)
    start = time.process_time()
    for t in (text, many):
        read_tracebacks(t.splitlines())
    assert time.process_time() - start < 2.0


def test_many_cut_tracebacks_are_each_read_once() -> None:
    """Headers whose tracebacks never reach an exception line (a log cut, or ranks that
    died mid-print): each ends at the next header, so the lines read are the log's lines
    once, not once per header (5,000 of them took a minute before)."""
    import time

    lines = []
    for _ in range(5000):
        lines += ["Traceback (most recent call last):", '  File "a.py", line 1, in f', "    x()"]
    start = time.process_time()
    got = read_tracebacks(lines)
    assert time.process_time() - start < 2.0
    assert len(got) == 5000 and all(len(t.frames) == 1 and t.end_line == 0 for t in got)
    # a thousand ranks' headers, then their frames interleaved: each line read once
    ranks = range(1000)
    lines = [f"[rank{r}]: Traceback (most recent call last):" for r in ranks]
    for k in range(20):
        lines += [f'[rank{r}]:   File "a.py", line {k + 1}, in f' for r in ranks]
    start = time.process_time()
    got = read_tracebacks(lines)
    assert time.process_time() - start < 2.0
    assert sorted(t.rank for t in got) == list(ranks) and all(len(t.frames) == 20 for t in got)


#: SGLang's scheduler receiving the trainer's weights in a colocated job (slime + SGLang):
#: sglang/srt/managers/tp_worker.py and model_executor/model_runner.py as the sources quote
#: them (update_weights_from_tensor unwrapping each serialized tensor onto the device).
SGLANG_UPDATE = [
    ("/sgl-workspace/sglang/python/sglang/srt/managers/scheduler.py", 2210,
     "update_weights_from_tensor",
     "success, message = self.tp_worker.update_weights_from_tensor(recv_req)"),
    ("/sgl-workspace/sglang/python/sglang/srt/managers/tp_worker.py", 168,
     "update_weights_from_tensor",
     "success, message = self.model_runner.update_weights_from_tensor("),
    ("/sgl-workspace/sglang/python/sglang/srt/model_executor/model_runner.py", 779,
     "update_weights_from_tensor", "named_tensors = ["),
    ("/sgl-workspace/sglang/python/sglang/srt/model_executor/model_runner.py", 780,
     "<listcomp>", "(name, _unwrap_tensor(tensor, tp_rank=self.tp_rank))"),
    ("/sgl-workspace/sglang/python/sglang/srt/model_executor/model_runner.py", 796,
     "_unwrap_tensor", "return tensor.to(torch.cuda.current_device())"),
]


def test_a_colocated_sglang_weight_update_is_named_with_its_budget() -> None:
    """SGLang logs the scheduler's traceback as one record (the prefix on its first line
    only). The request is named by the SGLang pack (weights received from the trainer); the
    trainer's knob for its buckets is not offered, its frames not being in this process; the
    start-up lines of the same rank give the budget and --mem-fraction-static its value."""
    from .test_framework_lines import GIB as G
    from .test_framework_lines import sglang_startup

    head = "[2026-02-01 00:09:12 TP0] Scheduler hit an exception: "
    lines = traceback_lines(SGLANG_UPDATE, "torch.OutOfMemoryError: " + message(
        "3.20 GiB", "1.10 GiB", "76.60 GiB", "70.95 GiB", "420.00 MiB", "79.19 GiB"))
    text = sglang_startup(0, 78 * G, 16 * G, 28 * G, 420000, 2 * G, 0.85) + head + \
        "\n".join(lines) + "\n"
    ev = weigh([read_text(text, "sglang.log")])
    (finding,) = ev.requests
    want = decided(SGLANG_UPDATE, int(3.2 * (1 << 30)))
    assert (finding.family, finding.rule_id) == (want.family, want.rule_id)
    assert want.rule_id == "sglang.update_weights"
    assert "sglang" in {fw for fw, _ in finding.owners}
    assert not any(k.startswith("--update-weight-buffer-size") for k, _ in finding.knobs)
    (fw,) = ev.frameworks
    gap = round(3.20 * G) - round(1.10 * G)
    lower = -(-gap * 100 // round(79.19 * G)) / 100
    assert fw.message is not None
    # the ServerArgs line says what it was set to (issue 69)
    assert fw.knobs[0][0] == f"--mem-fraction-static {0.85 - lower:.2f} (now 0.85)"


#: A vLLM worker's model forward as a Ray worker's log prints it from mid-stack (the worker's
#: execute_model / profile_run frames above it cut off): vllm/compilation/decorators.py's
#: __call__ into a model's forward, a fused-MoE layer's intermediate cache (vllm
#: model_executor/layers/fused_moe/fused_moe.py fused_experts_impl: torch.empty).
VLLM_MIDSTACK = [
    (f"{SITE}/vllm/compilation/decorators.py", 172, "__call__",
     "return self.forward(*args, **kwargs)"),
    (f"{SITE}/vllm/model_executor/models/deepseek_v2.py", 646, "forward",
     "hidden_states, residual = layer(positions, hidden_states, residual)"),
    (f"{SITE}/torch/nn/modules/module.py", 1739, "_wrapped_call_impl",
     "return self._call_impl(*args, **kwargs)"),
    (f"{SITE}/vllm/model_executor/layers/fused_moe/fused_moe.py", 1290, "fused_experts_impl",
     "intermediate_cache1 = torch.empty((M, topk_ids.shape[1], N),"),
]


def test_a_vllm_forward_pasted_mid_stack_is_a_step_temporary() -> None:
    """vLLM runs its model under torch.inference_mode (the workers' execute_model and
    profile run are decorated with it): a forward in vllm/model_executor makes step
    temporaries, never activations saved for a backward, and inference_mode is no knob
    for it; the engine's own batch knob is."""
    prefix = "(RayWorkerWrapper pid=4711, ip=10.0.0.2) ERROR 03-27 10:29:13 [worker_base.py:620] "
    lines = traceback_lines(VLLM_MIDSTACK, "torch.OutOfMemoryError: " + message(
        "2.00 MiB", "448.00 KiB", "44.52 GiB", "43.71 GiB", "1.04 MiB", "44.53 GiB"),
        prefix=prefix)[1:]  # no header: the paste starts at the first frame
    (finding,) = weigh([read_text("\n".join(lines) + "\n", "vllm.log")]).requests
    want = decided(VLLM_MIDSTACK, 2 << 20)
    assert (finding.family, finding.rule_id) == (want.family, want.rule_id)
    assert want.family == "activation_temporaries" and want.rule_id == "vllm.model_forward"
    knobs = [k for k, _ in finding.knobs]
    assert not any("inference_mode" in k for k in knobs)
    assert any("max_num_seqs" in k for k in knobs)


#: ZeRO-3's gather before a module's forward, outermost first (deepspeed/runtime/zero/
#: partitioned_param_coordinator.py fetch_sub_module -> __all_gather_params ->
#: partition_parameters.py all_gather_coalesced's full-size buffer, torch.empty).
ZERO3_GATHER = [
    (f"{SITE}/deepspeed/runtime/zero/partitioned_param_coordinator.py", 329,
     "fetch_sub_module", "self.__all_gather_params(params_to_fetch, forward)"),
    (f"{SITE}/deepspeed/runtime/zero/partitioned_param_coordinator.py", 424,
     "__all_gather_params", "self.__all_gather_params_(nonquantized_params, forward)"),
    (f"{SITE}/deepspeed/runtime/zero/partition_parameters.py", 1123, "all_gather_coalesced",
     "param_buffer = torch.empty("),
]


def test_a_zero3_gather_oom_gets_the_live_parameters_knob() -> None:
    """The ZeRO-3 all-gather buffer is named, and its knob is DeepSpeed's own bound on the
    parameters gathered and prefetched at once (DeepSpeed's config docs: smaller values use
    less memory), offered because the gather's frames show ZeRO-3."""
    lines = traceback_lines(ZERO3_GATHER, "torch.cuda.OutOfMemoryError: " + message(
        "512.00 MiB", "62.19 MiB", "31.60 GiB", "30.25 GiB", "430.00 MiB", "31.75 GiB"))
    (finding,) = weigh([read_text("\n".join(lines) + "\n", "ds.log")]).requests
    want = decided(ZERO3_GATHER, 512 << 20)
    assert (finding.family, finding.rule_id) == (want.family, "deepspeed.zero3_allgather")
    assert [k for k, _ in finding.knobs][0].startswith(
        "zero_optimization.stage3_max_live_parameters")


#: deepspeed.initialize moving the module whole (deepspeed/__init__.py initialize ->
#: runtime/engine.py DeepSpeedEngine.__init__ -> _configure_distributed_model ->
#: torch/nn/modules/module.py Module.to's convert).
DS_MODULE_TO = [
    (f"{SITE}/deepspeed/__init__.py", 181, "initialize", "engine = DeepSpeedEngine(args=args,"),
    (f"{SITE}/deepspeed/runtime/engine.py", 262, "__init__",
     "self._configure_distributed_model(model)"),
    (f"{SITE}/deepspeed/runtime/engine.py", 1103, "_configure_distributed_model",
     "self.module.to(self.device)"),
    (f"{SITE}/torch/nn/modules/module.py", 1152, "convert",
     "return t.to(device, dtype if t.is_floating_point() or t.is_complex() else None, "
     "non_blocking)"),
]


def test_deepspeed_initialize_moving_the_model_is_named_with_zero_init() -> None:
    """A rank's OOM inside deepspeed.initialize (pdsh's 'host: ' and torchrun's '[rankN]:'
    before every line) is the whole model moved to the GPU before ZeRO partitions it: the
    parameters family, and zero.Init (each rank builds only its partition) as the first
    knob."""
    lines = traceback_lines(DS_MODULE_TO, "torch.OutOfMemoryError: " + message(
        "500.00 MiB", "213.81 MiB", "79.11 GiB", "78.60 GiB", "1.69 MiB", "79.33 GiB"),
        prefix="worker-5: [rank22]: ")[1:]
    (finding,) = weigh([read_text("\n".join(lines) + "\n", "ds.log")]).requests
    want = decided(DS_MODULE_TO, 500 << 20)
    assert (finding.family, finding.rule_id) == (want.family, want.rule_id)
    assert want.rule_id == "deepspeed.engine_module_to_device"
    assert finding.family == "parameters"
    assert "deepspeed.zero.Init()" in finding.knobs[0][0]


#: vLLM v1's prompt log-probs (vllm/v1/executor/multiproc_executor.py worker_busy_loop ->
#: vllm/v1/worker/gpu_model_runner.py _get_prompt_logprobs_dict -> vllm/v1/sample/
#: sampler.py Sampler.compute_logprobs: `logits.log_softmax(dim=-1, dtype=torch.float32)`).
VLLM_PROMPT_LOGPROBS = [
    (f"{SITE}/vllm/v1/executor/multiproc_executor.py", 847, "worker_busy_loop",
     "output = func(*args, **kwargs)"),
    (f"{SITE}/vllm/v1/worker/gpu_model_runner.py", 4308, "_get_prompt_logprobs_dict",
     "logprobs = self.sampler.compute_logprobs(logits)"),
    (f"{SITE}/vllm/v1/sample/sampler.py", 207, "compute_logprobs",
     "return logits.log_softmax(dim=-1, dtype=torch.float32)"),
]


def test_a_traceback_flattened_onto_one_line_is_read() -> None:
    """A paste that lost its newlines holds the header, every frame with its source line
    and carets, and the OOM message on one line: its frames are read as the failing
    request's stack, in order, with their source lines (no carets)."""
    exc = "torch.OutOfMemoryError: " + message(
        "18.55 GiB", "6.01 GiB", "73.17 GiB", "70.22 GiB", "1.12 GiB", "79.19 GiB")
    flat = " ".join(traceback_lines(VLLM_PROMPT_LOGPROBS, exc))
    log = read_text(flat + "\n", "flat.log")
    (finding,) = weigh([log]).requests
    assert finding is not None
    assert finding.traceback.stack == stack_of(VLLM_PROMPT_LOGPROBS)
    assert [f.code for f in finding.traceback.frames] == [c for *_, c in VLLM_PROMPT_LOGPROBS]
    want = decided(VLLM_PROMPT_LOGPROBS, int(18.55 * (1 << 30)))
    assert (finding.family, finding.rule_id) == (want.family, want.rule_id)


def test_a_flattened_traceback_of_another_exception_is_listed_as_not_read() -> None:
    """A flattened traceback that ends in another exception than the OOM message is read,
    and said as read and not used."""
    other = " ".join(traceback_lines(VLLM_PROMPT_LOGPROBS, "RuntimeError: worker died"))
    oom = "torch.OutOfMemoryError: " + message(
        "18.55 GiB", "6.01 GiB", "73.17 GiB", "70.22 GiB", "1.12 GiB", "79.19 GiB")
    between = "".join(f"INFO step {i}\n" for i in range(5))  # not the OOM's own traceback
    evidence = weigh([read_text(f"{other}\n{between}{oom}\n", "flat.log")])
    (note,) = evidence.not_read
    assert "flat.log line 1" in note and "3 frame(s)" in note and "RuntimeError" in note


#: vLLM's LogitsProcessor (vllm/model_executor/layers/logits_processor.py forward ->
#: _get_logits), reached from the v1 worker's execute_model (compute_logits).
VLLM_LOGITS = [
    (f"{SITE}/vllm/v1/executor/multiproc_executor.py", 430, "worker_busy_loop",
     "output = func(*args, **kwargs)"),
    (f"{SITE}/vllm/v1/worker/gpu_model_runner.py", 1201, "execute_model",
     "logits = self.model.compute_logits(sample_hidden_states, None)"),
    (f"{SITE}/vllm/model_executor/layers/logits_processor.py", 70, "forward",
     "logits = self._get_logits(hidden_states, lm_head, embedding_bias)"),
]


@pytest.mark.parametrize("frames", [VLLM_LOGITS, VLLM_PROMPT_LOGPROBS])
def test_vllm_logits_are_named_without_a_training_loss_knob(frames) -> None:
    """What vLLM's LogitsProcessor and its sampler's log-softmax make is the [tokens, vocab]
    logits: named `logits` by the vLLM pack, with the engine's own batch bound as its knob
    and no loss knob (a serving engine's logits feed a sampler, not a cross-entropy)."""
    lines = traceback_lines(frames, "torch.OutOfMemoryError: " + message(
        "270.00 MiB", "156.94 MiB", "21.82 GiB", "21.42 GiB", "104.00 MiB", "21.98 GiB"))
    (finding,) = weigh([read_text("\n".join(lines) + "\n", "vllm.log")]).requests
    want = decided(frames, 270 << 20)
    assert (finding.family, finding.rule_id) == (want.family, want.rule_id)
    assert (want.family, want.rule_id) == ("logits", "vllm.logits")
    knobs = [k for k, _ in finding.knobs]
    assert knobs and "max_num_seqs" in knobs[0]
    assert not any("cross-entropy" in k or "cross_entropy" in k.lower() for k in knobs)


def verl_entropy(outer: list[tuple[str, int, str, str]]) -> list[tuple[str, int, str, str]]:
    """verl's entropy over the logits (verl/workers/actor/dp_actor.py _forward_micro_batch ->
    verl/utils/torch_functional.py entropy_from_logits), under `outer`."""
    return [*outer,
            ("/verl/verl/workers/actor/dp_actor.py", 266, "_forward_micro_batch",
             "entropy = verl_F.entropy_from_logits(logits)  # (bsz, response_length)"),
            ("/verl/verl/utils/torch_functional.py", 148, "entropy_from_logits",
             "entropy = torch.logsumexp(logits, dim=-1) - torch.sum(pd * logits, dim=-1)")]


#: the old-policy log-prob pass (fsdp_workers.py compute_log_prob -> dp_actor.py
#: compute_log_prob, whose micro-batches run under `with torch.no_grad()`)
VERL_LOG_PROB = verl_entropy([
    ("/verl/verl/workers/fsdp_workers.py", 782, "compute_log_prob",
     "output, entropys = self.actor.compute_log_prob(data=data, calculate_entropy=True)"),
    ("/verl/verl/workers/actor/dp_actor.py", 332, "compute_log_prob",
     "entropy, log_probs = self._forward_micro_batch("),
])
#: the training step (fsdp_workers.py update_actor -> dp_actor.py update_policy)
VERL_UPDATE = verl_entropy([
    ("/verl/verl/workers/fsdp_workers.py", 700, "update_actor",
     "metrics = self.actor.update_policy(data=data)"),
    ("/verl/verl/workers/actor/dp_actor.py", 420, "update_policy",
     "entropy, log_prob = self._forward_micro_batch("),
])


@pytest.mark.parametrize(("frames", "kept"), [(VERL_LOG_PROB, False), (VERL_UPDATE, True)])
def test_verl_entropy_checkpointing_needs_a_pass_that_keeps_for_backward(frames, kept) -> None:
    """entropy_checkpointing recomputes in backward what a trained forward keeps for it: a
    no-grad log-prob pass (compute_log_prob) keeps nothing, so it is offered on the training
    step's entropy and not on the log-prob pass's, whose first knob is its own budget."""
    lines = traceback_lines(frames, "torch.OutOfMemoryError: " + message(
        "13.91 GiB", "8.85 GiB", "70.25 GiB", "60.49 GiB", "6.77 GiB", "79.11 GiB"))
    (finding,) = weigh([read_text("\n".join(lines) + "\n", "verl.log")]).requests
    want = decided(frames, int(13.91 * (1 << 30)))
    assert (finding.family, finding.rule_id) == (want.family, want.rule_id)
    knobs = [k for k, _ in finding.knobs]
    assert any("entropy_checkpointing" in k for k in knobs) == kept
    # under no_grad the entropy's intermediates are temporaries, not kept for backward
    assert (want.family == "saved_logprob_softmax") == kept
    if not kept:
        assert want.family == "activation_temporaries"
        assert "log_prob_micro_batch_size_per_gpu" in knobs[0]


def slime_ref_log_prob(inner: tuple[str, int, str, str]) -> list[tuple[str, int, str, str]]:
    """slime's reference-model log-prob pass (actor.py compute_log_prob -> model.py
    forward_only -> Megatron's forward_step -> loss.py), ending in `inner`."""
    return [
        ("/root/slime/slime/backends/megatron_utils/actor.py", 187, "compute_log_prob",
         "return forward_only("),
        ("/root/slime/slime/backends/megatron_utils/model.py", 221, "forward_only",
         "forward_data_store += forward_backward_func("),
        ("/root/Megatron-LM/megatron/core/pipeline_parallel/schedules.py", 289,
         "forward_step", "output_tensor, loss_func = forward_step_func(data_iterator, model)"),
        inner,
    ]


#: what slime's log-prob step allocates in its own frame: the temperature-scaled copy
#: (loss.py get_log_probs_and_entropy, slime main) and the clone handed to compute_log_probs
#: (loss.py calculate_log_probs_and_entropy, slime 2025-09)
SLIME_OWN_COPIES = [
    ("/root/slime/slime/backends/megatron_utils/loss.py", 543, "get_log_probs_and_entropy",
     "logits = logits / rollout_temperature"),
    ("/root/slime/slime/backends/megatron_utils/loss.py", 27, "calculate_log_probs_and_entropy",
     "log_prob = compute_log_probs(logits.clone(), tokens, mpu.get_tensor_model_parallel_group())"),
]


@pytest.mark.parametrize("inner", SLIME_OWN_COPIES)
def test_slime_log_prob_steps_own_logits_copy_is_logits(inner) -> None:
    """A request made in slime's log-prob step's own frame, as large as a [T, V/TP] logits
    copy, is `logits`; in the reference model's forward-only pass its first knob is that
    pass's own token budget (--log-probs-max-tokens-per-gpu), and the loss recompute knob is
    not offered (nothing is kept for backward)."""
    frames = slime_ref_log_prob(inner)
    request = int(58.15 * (1 << 30))
    lines = traceback_lines(frames, "torch.OutOfMemoryError: " + message(
        "58.15 GiB", "17.32 GiB", "61.85 GiB", "58.99 GiB", "1.37 GiB", "79.19 GiB"))
    (finding,) = weigh([read_text("\n".join(lines) + "\n", "slime.log")]).requests
    want = decided(frames, request)
    assert (finding.family, finding.rule_id) == (want.family, want.rule_id)
    assert want.family == "logits" and finding.phase == "logprobs"
    knobs = [k for k, _ in finding.knobs]
    assert knobs[0] == "--log-probs-max-tokens-per-gpu"
    assert "--recompute-loss-function" not in knobs
    # a per-token tensor of that frame (the tokens' cat: T x 8 bytes) is no logits copy
    assert decided(frames, 205_000 * 8).family != "logits"


#: transformers' OPTAttention.forward upcasting its scores' softmax (modeling_opt.py, after
#: huggingface/transformers#17437), entered through nn.Module's call: nothing in these
#: frames says whether the job trains.
OPT_SOFTMAX = [
    (f"{SITE}/torch/nn/modules/module.py", 1518, "_call_impl",
     "return forward_call(*args, **kwargs)"),
    (f"{SITE}/transformers/models/opt/modeling_opt.py", 232, "forward",
     "attn_weights = nn.functional.softmax(attn_weights, dim=-1, "
     "dtype=torch.float32).to(torch.float16)"),
    (f"{SITE}/torch/nn/functional.py", 1843, "softmax", "ret = input.softmax(dim, dtype=dtype)"),
]


def test_a_forward_only_knob_on_an_undetermined_workload_says_its_condition(tmp_path) -> None:
    """Where the stack does not show whether the job trains, a knob made for one workload
    (inference_mode would break a trained forward) carries its condition before its effect,
    so the one-screen summary, which prints the effect alone, says it too."""
    lines = traceback_lines(OPT_SOFTMAX, "torch.cuda.OutOfMemoryError: " + message(
        "896.00 MiB", "381.31 MiB", "78.80 GiB", "76.68 GiB", "573.44 MiB", "79.17 GiB"))
    text = "\n".join(lines) + "\n"
    (finding,) = weigh([read_text(text, "opt.log")]).requests
    assert finding.workload.startswith("Whether this job trains is not recorded")
    whys = dict(finding.knobs)
    mode = next(k for k in whys if k.startswith("torch.inference_mode()"))
    assert whys[mode].startswith("only if this job is not trained: ")
    path = tmp_path / "opt.log"
    path.write_text(text)
    screen = " ".join(invoke("summary", str(path)).stdout.split())
    assert f"{mode} — only if this job is not trained: " in screen
