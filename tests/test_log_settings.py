"""Settings read from the args dumps a log carries (issue 69), and the knobs they give a value:
vLLM's non-default args, its older API server's Namespace and version lines and its engine
config, SGLang's ServerArgs repr, Megatron's (and slime's) `_print_args` block, DeepSpeed's
configuration print and the user's JSON config after it; and the budget knob an engine's
share of the card offers by itself where nothing else in the log names one. Each dump is
written here the way the framework writes it — its format string run on Python's own repr /
str of the values (a dataclass, a dict, an argparse Namespace, a pydantic model, a JSON
encoder), cited above each writer — and every expected value is recomputed here from what
the test printed."""

from __future__ import annotations

import dataclasses
import json
import math
import sys
from argparse import Namespace
from enum import Enum
from pathlib import Path

import msgspec
import pytest
from snapana.analysis.knob_words import with_settings
from snapana.log_session import weigh
from snapana.render.text_log import text_log_view
from snapana.sources.log_text import read_text
from snapana.sources.settings_text import read_settings

from .conftest import invoke
from .test_framework_lines import GIB, MIB, gb, oom, printed, sglang_startup
from .test_log_knobs import NO_BLOCKS
from .test_log_pasted import OOM, REF_LOGPROB, frames_only, ray

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

PKG = Path(__file__).resolve().parents[1] / "analyzer" / "snapana"


def _settings(text: str) -> dict[str, object]:
    return {s.id: s.value for s in read_settings(text.splitlines())}


# ----- vLLM -------------------------------------------------------------------------------

def vllm_non_default(args: dict[str, object]) -> str:
    """vllm/entrypoints/utils.py log_non_default_args: logger.info("non-default args: %s",
    redacted_args), behind vLLM's log prefix."""
    return "INFO 05-02 10:11:12 [utils.py:326] non-default args: %s" % (args,)  # noqa: UP031


def vllm_engine_config(version: str, max_len: int, tp: int, eager: bool) -> str:
    """vllm/v1/engine/core.py: "Initializing a V1 LLM engine (v%s) with config: %s" with
    VllmConfig.__str__'s f-string (model={!r}, ..., max_seq_len=..., ...)."""
    config = (f"model={'Qwen/Qwen3-8B'!r}, speculative_config=None, "
              f"tokenizer={'Qwen/Qwen3-8B'!r}, skip_tokenizer_init=False, tokenizer_mode=auto, "
              "revision=None, tokenizer_revision=None, trust_remote_code=False, "
              f"dtype=torch.bfloat16, max_seq_len={max_len}, download_dir=None, "
              f"load_format=auto, tensor_parallel_size={tp}, pipeline_parallel_size=1, "
              "data_parallel_size=1, disable_custom_all_reduce=False, quantization=None, "
              f"enforce_eager={eager}, kv_cache_dtype=auto, device_config=cuda, "
              "compilation_config={\"level\":3,\"max_seq_len\":1}")
    return (f"INFO 05-02 10:11:13 [core.py:69] Initializing a V1 LLM engine (v{version}) "
            f"with config: {config}")


def test_vllm_non_default_args_name_the_utilisation_the_refusal_asks_to_raise() -> None:
    """The refusal names gpu_memory_utilization without a figure; the non-default args say
    what it was: the knob asks for more than that."""
    args = {"model": "Qwen/Qwen3-8B", "max_model_len": 32768, "gpu_memory_utilization": 0.5,
            "max_num_seqs": 64, "api_key": "**REDACTED**",
            "compilation_config": {"level": 3, "max_num_seqs": 1,
                                   "cudagraph_capture_sizes": [1, 2]}}
    text = (vllm_non_default(args) + "\n"
            + '    raise ValueError("No available memory for the cache blocks. "\n'
            + f"ValueError: {NO_BLOCKS}\n")
    got = _settings(text)
    assert got["vllm.gpu_memory_utilization"] == args["gpu_memory_utilization"]
    assert got["vllm.max_num_seqs"] == args["max_num_seqs"]  # the top level's, not the nested
    assert got["vllm.max_model_len"] == args["max_model_len"]
    ev = weigh([read_text(text, "v.log")])
    view = text_log_view("v.log", ev)
    first, why = view.best_knobs[0]
    assert first == f"--gpu-memory-utilization > {args['gpu_memory_utilization']}"
    assert "line 1" in why and "vllm.non_default_args" in why


def test_vllm_engine_config_gives_max_model_len_to_its_knob() -> None:
    """V1's KV lines (kv_cache_utils: "GPU KV cache size: %s tokens" with {:,}; "Maximum
    concurrency for %s tokens per request: %.2fx") below one request: the knob is the tokens
    the cache holds, and the engine config says the length that was set."""
    max_len, tokens = 40960, 21504
    text = "\n".join([
        vllm_engine_config("0.9.1", max_len, 2, False),
        f"INFO 05-02 10:12:00 [kv_cache_utils.py:716] GPU KV cache size: {tokens:,} tokens",
        f"INFO 05-02 10:12:00 [kv_cache_utils.py:720] Maximum concurrency for {max_len:,} "
        f"tokens per request: {tokens / max_len:.2f}x"]) + "\n"
    got = _settings(text)
    assert got["vllm.max_model_len"] == max_len  # max_seq_len, not compilation_config's
    assert got["vllm.tensor_parallel_size"] == 2
    assert got["vllm.enforce_eager"] is False
    knobs = text_log_view("v.log", weigh([read_text(text, "v.log")])).best_knobs
    # the value named as the engine config printed it: the knob's text does not start so
    assert f"--max-model-len {tokens:,} (now max_seq_len={max_len})" in [k for k, _ in knobs]


# ----- SGLang -----------------------------------------------------------------------------

@dataclasses.dataclass
class ServerArgs:
    """A few of SGLang's ServerArgs fields, in its order: the dataclass repr is the line."""

    model_path: str
    tokenizer_path: str | None = None
    tp_size: int = 1
    mem_fraction_static: float | None = None
    max_running_requests: int | None = None
    chunked_prefill_size: int | None = None
    json_model_override_args: str = "{}"
    cuda_graph_max_bs: int | None = None


def test_sglang_server_args_give_the_graph_knob_its_bound() -> None:
    """engine._launch_subprocesses: logger.info(f"{server_args=}"). The OOM lacks less than
    the CUDA graphs took: the graph knob asks for fewer than the batch size set."""
    cap = int(79.19 * GIB)
    before, weights, kv_half, graphs, mfs = cap - 700 * MIB, 15 * GIB, 27 * GIB, 3 * GIB, 0.88
    left = before - weights - 2 * kv_half - graphs
    request, free = left + 2 * GIB, left - 250 * MIB
    args = ServerArgs(model_path="/models/q(1)=x, tp_size=8", tokenizer_path=None, tp_size=2,
                      mem_fraction_static=mfs, chunked_prefill_size=8192,
                      json_model_override_args='{"cuda_graph_max_bs": 4}', cuda_graph_max_bs=160)
    text = sglang_startup(0, before, weights, kv_half, 399740, graphs, mfs)
    text += f"[2026-02-01 00:05:04 TP0] {args=}".replace("args=", "server_args=") + "\n"
    text += "[2026-02-01 00:07:09 TP0] Scheduler hit an exception: " + oom(
        request, free, cap, 70 * GIB, GIB, cap - free - 100 * MIB) + "\n"
    got = _settings(text)
    assert got["sglang.tp_size"] == args.tp_size  # not the one inside model_path's quotes
    assert got["sglang.cuda_graph_max_bs"] == args.cuda_graph_max_bs  # nor the JSON string's
    assert got["sglang.mem_fraction_static"] == mfs
    assert got["sglang.max_running_requests"] is None  # printed None: unset
    knobs = [k for k, _ in text_log_view("s.log", weigh([read_text(text, "s.log")])).best_knobs]
    assert printed(graphs) >= printed(request) - printed(free)
    assert f"--cuda-graph-max-bs < {args.cuda_graph_max_bs}" in knobs
    assert any(k.startswith("--mem-fraction-static") and k.endswith(f"(now {mfs:g})")
               for k in knobs)


# ----- Megatron / slime -------------------------------------------------------------------

def megatron_print_args(args: Namespace, title: str = "arguments") -> list[str]:
    """megatron/training/arguments.py _print_args, as its source reads."""
    out = [f"------------------------ {title} ------------------------"]
    str_list = []
    for arg in vars(args):
        dots = "." * (48 - len(arg))
        str_list.append("  {} {} {}".format(arg, dots, getattr(args, arg)))  # noqa: UP032
    out += sorted(str_list, key=lambda x: x.lower())
    out.append(f"-------------------- end of {title} ---------------------")
    return out


SLIME_ARGS = Namespace(micro_batch_size=1, tensor_model_parallel_size=4,
                       pipeline_model_parallel_size=1, recompute_granularity="full",
                       max_tokens_per_gpu=16384, log_probs_max_tokens_per_gpu=16384,
                       use_dynamic_batch_size=True, sglang_mem_fraction_static=0.7,
                       overlap_param_gather_with_optimizer_step_and_more_words=False,
                       data_path=["/data/a ........ b"])


def test_slime_arguments_give_the_log_prob_budget_a_value(tmp_path: Path) -> None:
    """slime parses its arguments through Megatron's, which prints them (with slime's own) in
    _print_args' block, here behind Ray's actor prefix. The reference log-prob pass ran out:
    its token budget leads, with the budget × free / request that fits what was free."""
    lines = [ray("MegatronTrainRayActor", 4242, ln) for ln in megatron_print_args(SLIME_ARGS)]
    lines += [ray("MegatronTrainRayActor", 12345, ln)
              for ln in [*frames_only(REF_LOGPROB), OOM]]
    text = "\n".join(lines) + "\n"
    got = _settings(text)
    for name in ("micro_batch_size", "tensor_model_parallel_size", "recompute_granularity"):
        assert got[f"megatron.{name}"] == getattr(SLIME_ARGS, name)
    for name in ("max_tokens_per_gpu", "log_probs_max_tokens_per_gpu", "use_dynamic_batch_size",
                 "sglang_mem_fraction_static"):
        assert got[f"slime.{name}"] == getattr(SLIME_ARGS, name)
    view = text_log_view("r.log", weigh([read_text(text, "r.log")]))
    first, why = view.best_knobs[0]
    request, free = round(18.55 * GIB), round(9.69 * GIB)  # the OOM message's figures
    budget = SLIME_ARGS.log_probs_max_tokens_per_gpu
    assert first == f"--log-probs-max-tokens-per-gpu {budget * free // request} (now {budget})"
    assert "megatron.arguments" in why
    # the training budget is offered too, but the log-prob pass takes its own: no value
    assert f"--max-tokens-per-gpu (now {SLIME_ARGS.max_tokens_per_gpu})" in [
        k for k, _ in view.best_knobs]
    # the JSON names every setting, and which knobs each changed
    path = tmp_path / "ray.log"
    path.write_text(text)
    data = json.loads(invoke("summary", "--format", "json", str(path)).stdout)
    by = {s["setting"]: s for s in data["settings"]}
    assert by["slime.log_probs_max_tokens_per_gpu"]["changes_knobs"] == [first]
    assert by["megatron.tensor_model_parallel_size"]["value"] == 4
    # and the text says it in one line under the knobs
    brief = invoke("summary", str(path)).stdout
    said = "the first knob's value is from the log's settings: log_probs_max_tokens_per_gpu"
    assert said in " ".join(brief.split())


def test_a_log_prob_budget_printed_none_is_the_training_budget() -> None:
    """slime fills log_probs_max_tokens_per_gpu from max_tokens_per_gpu after Megatron prints
    the block (slime_validate_args): printed None, it is the training budget."""
    args = Namespace(**{**vars(SLIME_ARGS), "log_probs_max_tokens_per_gpu": None})
    lines = [*megatron_print_args(args), *frames_only(REF_LOGPROB), OOM]
    view = text_log_view("r.log", weigh([read_text("\n".join(lines), "r.log")]))
    request, free = round(18.55 * GIB), round(9.69 * GIB)
    budget = args.max_tokens_per_gpu
    first, why = view.best_knobs[0]
    assert first == f"--log-probs-max-tokens-per-gpu {budget * free // request} (now {budget})"
    assert "None, so max_tokens_per_gpu's" in why


def test_recompute_already_full_goes_last() -> None:
    """Megatron's recompute knob, with the block saying recompute_granularity is full."""
    settings = read_settings(megatron_print_args(SLIME_ARGS))
    recompute = _pack_knob("megatron.toml", "megatron.recompute_granularity")
    knobs, _ = with_settings([(recompute, "why"), ("other", "why")], settings)
    assert [k for k, _ in knobs] == ["other", f"{recompute} (already set: "
                                              "recompute_granularity=full)"]


def test_a_block_line_with_the_wrong_dots_is_not_a_setting() -> None:
    """The dots are 48 less the name's length (none from 48 characters on): a line inside the
    block with another count is another process's output, not an argument."""
    long_name = "a_name_that_is_well_over_forty_eight_chars_long_x"
    lines = megatron_print_args(Namespace(micro_batch_size=2, **{long_name: 3}))
    lines.insert(2, "  tensor_model_parallel_size ... 8")
    got = _settings("\n".join(lines))
    assert got == {"megatron.micro_batch_size": 2}


# ----- DeepSpeed --------------------------------------------------------------------------

def deepspeed_print(config: object) -> list[str]:
    """deepspeed/runtime/config.py DeepSpeedConfig.print("DeepSpeedEngine configuration"),
    through DeepSpeed's logger format ('[%(asctime)s] [%(levelname)s] [%(filename)s:
    %(lineno)d:%(funcName)s] %(message)s'), then print_user_config's first line."""
    p = "[2025-03-01 10:00:00,123] [INFO] [config.py:1009:print] "
    out = [f"{p}DeepSpeedEngine configuration:"]
    for arg in sorted(vars(config)):
        if arg != "_param_dict":
            dots = "." * (29 - len(arg))
            out.append(p + "  {} {} {}".format(arg, dots, getattr(config, arg)))  # noqa: UP032
    out.append(p + "  json = {")
    return out


def _zero_config(stage: int, offload: str) -> object:
    """DeepSpeedZeroConfig's str as pydantic prints it (DeepSpeedConfigModel:
    use_enum_values=True), with its offload models nested."""
    from pydantic import BaseModel, ConfigDict

    class OffloadDeviceEnum(str, Enum):
        none = "none"
        cpu = "cpu"

    class Base(BaseModel):
        model_config = ConfigDict(use_enum_values=True)

    class DeepSpeedZeroOffloadOptimizerConfig(Base):
        device: OffloadDeviceEnum = OffloadDeviceEnum.none
        nvme_path: str | None = None
        pin_memory: bool = False

    class DeepSpeedZeroConfig(Base):
        stage: int = 0
        contiguous_gradients: bool = True
        offload_param: DeepSpeedZeroOffloadOptimizerConfig | None = None
        offload_optimizer: DeepSpeedZeroOffloadOptimizerConfig | None = None
        sub_group_size: int = 1_000_000_000

    return DeepSpeedZeroConfig(stage=stage, offload_optimizer=DeepSpeedZeroOffloadOptimizerConfig(
        device=OffloadDeviceEnum(offload), pin_memory=True))


def _pack_knob(pack: str, kid: str) -> str:
    data = tomllib.loads((PKG / "analysis" / "attribution" / "packs" / pack).read_text())
    return next(k["knob"] for k in data["knob"] if k["id"] == kid)


def test_deepspeed_config_says_offload_and_zero_are_already_on() -> None:
    config = Namespace(train_batch_size=64, train_micro_batch_size_per_gpu=4,
                       gradient_accumulation_steps=2, zero_config=_zero_config(3, "cpu"),
                       zero_optimization_stage=3, zero_enabled=True,
                       activation_checkpointing_config='{\n    "partition_activations": false\n}')
    assert "offload_optimizer=DeepSpeedZeroOffloadOptimizerConfig(device='cpu'" in str(
        config.zero_config)
    settings = read_settings(deepspeed_print(config))
    got = {s.id: s.value for s in settings}
    assert got == {"deepspeed.zero_optimization_stage": 3, "deepspeed.offload_optimizer": "cpu",
                   "deepspeed.train_micro_batch_size_per_gpu": 4,
                   "deepspeed.gradient_accumulation_steps": config.gradient_accumulation_steps}
    offload = _pack_knob("pytorch.toml", "torch.optimizer_cpu_offload")
    shard = _pack_knob("pytorch.toml", "torch.optimizer_sharding")
    knobs, changed = with_settings([(offload, "why"), (shard, "why"), ("other", "why")], settings)
    assert [k for k, _ in knobs][0] == "other"
    assert {sid for _, sid in changed} == {"deepspeed.offload_optimizer",
                                           "deepspeed.zero_optimization_stage"}
    assert all("already set" in k for k, _ in knobs[1:])


# ----- the data -----------------------------------------------------------------------------

def _all_knob_texts() -> list[str]:
    out = []
    for pack in (PKG / "analysis" / "attribution" / "packs").glob("*.toml"):
        out += [k["knob"] for k in tomllib.loads(pack.read_text()).get("knob", [])]
    words = tomllib.loads((PKG / "analysis" / "framework_knobs.toml").read_text())
    out += [w["knob"] for w in words["knob"].values()]
    return out


def test_every_setting_knob_names_a_knob_that_exists() -> None:
    """Each knob text a setting is the value of begins a knob some pack or the framework
    knobs offer, and each setting is one the formats read (the tables are read strictly)."""
    table = tomllib.loads((PKG / "analysis" / "setting_knobs.toml").read_text())["setting"]
    read = {s["id"] for s in tomllib.loads((PKG / "sources" / "settings_lines.toml").read_text())
            ["setting"]}
    texts = _all_knob_texts()
    for sid, words in table.items():
        assert sid in read, sid
        for prefix in words.get("knobs", []):
            assert any(t.startswith(prefix) for t in texts), (sid, prefix)
    with pytest.raises(msgspec.ValidationError):
        msgspec.toml.decode(b'[setting."x"]\nknob = ["--typo"]\n',
                            type=__import__("snapana.analysis.knob_words", fromlist=["x"])
                            ._SettingKnobs)


def test_mangled_dumps_never_raise() -> None:
    """Cut, unbalanced or garbled dumps: settings left out, never a traceback."""
    for text in ["server_args=ServerArgs(mem_fraction_static=",
                 "non-default args: {'max_model_len': '",
                 "non-default args: {'max_num_seqs': 1e999999, 'gpu_memory_utilization': 0.٥}",
                 "x ServerArgs(tp_size=))))(((, cuda_graph_max_bs=9" + "(" * 5000,
                 "\n".join(megatron_print_args(Namespace(micro_batch_size="x" * 9000))[:2])]:
        read_settings(text.splitlines())
    assert _settings("non-default args: {'max_num_seqs': '12'}") == {"vllm.max_num_seqs": 12}


def test_the_last_dump_is_the_one_kept() -> None:
    """A job restarted with other settings prints them again: the last print is the one the
    knobs read, however many came before."""
    text = "\n".join(vllm_non_default({"gpu_memory_utilization": round(0.3 + k / 100, 2)})
                     for k in range(40))
    assert _settings(text) == {"vllm.gpu_memory_utilization": round(0.3 + 39 / 100, 2)}


def test_the_utilisation_step_becomes_the_value_to_set() -> None:
    """V1's negative KV cache with the card's size: the knob is a step from the utilisation
    set ('+0.36 or more'); the non-default args say it was 0.5, so the value is their sum."""
    util = 0.5
    card = ("[rank0]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 7.50 GiB. "
            "GPU 0 has a total capacity of 79.25 GiB of which 975.94 MiB is free. Including "
            "non-PyTorch memory, this process has 78.25 GiB memory in use. Of the allocated "
            "memory 77.28 GiB is allocated by PyTorch, and 66.45 MiB is reserved by PyTorch "
            "but unallocated.\n")
    text = (vllm_non_default({"gpu_memory_utilization": util}) + "\n"
            "DEBUG 03-12 11:58:22 [gpu_worker.py:400] Memory profiling takes 3.51 seconds. "
            "Total non KV cache memory: 67.40GiB; torch peak memory increase: 1.21GiB; "
            "non-torch forward increase memory: 0.66GiB; weights memory: 65.53GiB.\n"
            "INFO 03-12 11:58:22 [gpu_worker.py:424] Available KV cache memory: -27.82 GiB\n"
            + card)
    (fw,) = weigh([read_text(text, "s3.log")]).frameworks
    more = -(-round(27.82 * GIB) * 100 // round(79.25 * GIB)) / 100
    (knob, why), = fw.knobs
    assert knob == f"--gpu-memory-utilization {util + more:.2f} or more (now {util})"
    assert f"{util} + {more:.2f}" in why


@pytest.mark.parametrize("figures", [True, False])
def test_sglang_refusal_with_its_server_args(figures: bool) -> None:
    """SGLang's 'Not enough memory. Please try to increase --mem-fraction-static.' with the
    ServerArgs line: the value from its figures names the one set; without figures the
    direction becomes a bound on it."""
    mfs, before, after = 0.8, 78.50, 12.25
    p = "[2026-05-02 10:11:12 TP0] "
    text = p + f"{ServerArgs(model_path='m', mem_fraction_static=mfs)=}".replace(
        "ServerArgs(model_path='m', mem_fraction_static=mfs)=", "server_args=") + "\n"
    if figures:
        text += (f"{p}Load weight begin. avail mem={before:.2f} GB\n"
                 f"{p}Load weight end. type=Qwen3ForCausalLM, dtype=torch.bfloat16, avail "
                 f"mem={after:.2f} GB, mem usage={before - after:.2f} GB.\n")
    text += "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static.\n"
    (first, _), *_ = text_log_view("s.log", weigh([read_text(text, "s.log")])).best_knobs
    if figures:
        # profile_max_num_token: positive only from 1 − after / before on (rounded up)
        lower = math.ceil((1 - round(after * GIB) / round(before * GIB)) * 100) / 100
        assert first == f"--mem-fraction-static {lower:.2f} or more (now {mfs})"
    else:
        assert first == f"--mem-fraction-static > {mfs}"


# ----- vLLM's older API server: its version, then the whole Namespace ---------------------

def vllm_api_server(args: Namespace, version: str) -> list[str]:
    """vllm/entrypoints/openai/api_server.py run_server (v0.4 – v0.8): logger.info("vLLM API
    server version %s", VLLM_VERSION); logger.info("args: %s", args), behind vLLM's logger
    format of that time ("%(levelname)s %(asctime)s %(filename)s:%(lineno)d] %(message)s")."""
    p = "INFO 09-10 10:11:1{} api_server.py:{}] "
    return [p.format(1, 494) + "vLLM API server version %s" % version,  # noqa: UP031
            p.format(2, 495) + "args: %s" % (args,)]  # noqa: UP031


API_ARGS = Namespace(host=None, port=8000, uvicorn_log_level="info", allow_credentials=False,
                     model="/models/m, gpu_memory_utilization=0.1", tokenizer=None,
                     max_model_len=None, tensor_parallel_size=2, max_num_seqs=64,
                     gpu_memory_utilization=0.5, enforce_eager=True, lora_modules=None,
                     override_neuron_config={"max_num_seqs": 1})


def test_vllm_api_server_namespace_gives_its_settings_and_version() -> None:
    """The Namespace repr: the top level's values (not the ones inside the model's quotes or a
    nested dict), its None read as unset; the version line's value. The refusal's knob asks
    for more than the utilisation the Namespace printed."""
    version = "0.6.3.post1"
    text = "\n".join([*vllm_api_server(API_ARGS, version),
                      '    raise ValueError("No available memory for the cache blocks. "',
                      f"ValueError: {NO_BLOCKS}"]) + "\n"
    got = _settings(text)
    assert got == {"vllm.version": version,
                   "vllm.gpu_memory_utilization": API_ARGS.gpu_memory_utilization,
                   "vllm.max_model_len": API_ARGS.max_model_len,
                   "vllm.tensor_parallel_size": API_ARGS.tensor_parallel_size,
                   "vllm.max_num_seqs": API_ARGS.max_num_seqs,
                   "vllm.enforce_eager": API_ARGS.enforce_eager}
    first, why = text_log_view("v.log", weigh([read_text(text, "v.log")])).best_knobs[0]
    assert first == f"--gpu-memory-utilization > {API_ARGS.gpu_memory_utilization}"
    assert "line 2, vllm.api_server_args" in why


def test_a_namespace_some_other_script_prints_is_not_vllms() -> None:
    """"args: %s" is a common line: without vLLM's logger naming api_server.py it is another
    program's Namespace, whatever its names."""
    assert _settings(f"args: {API_ARGS}\nINFO 09-10 train.py:12] args: {API_ARGS}\n") == {}


#: other vLLM evidence a paste may keep when it dropped the logger's prefix, each as vLLM
#: writes it: run_server's version line; the executor's initialize_cache line behind the
#: logger prefix; a traceback frame in vLLM's package
VLLM_EVIDENCE = {
    "version": "vLLM API server version 0.6.3",
    "log line": "INFO 09-10 10:11:20 gpu_executor.py:122] "  # noqa: UP031
                "# GPU blocks: %d, # CPU blocks: %d" % (1200, 512),
    "frame": '  File "/usr/local/lib/python3.10/site-packages/vllm/worker/model_runner.py", '
             "line 1450, in execute_model",
}


@pytest.mark.parametrize("evidence", sorted(VLLM_EVIDENCE))
def test_an_unprefixed_namespace_is_vllms_beside_other_vllm_evidence(evidence: str) -> None:
    """A paste that dropped vLLM's logger prefix ('args: Namespace(...)' alone on its line)
    is read where the same text shows vLLM otherwise."""
    text = "\n".join([f"args: {API_ARGS}", VLLM_EVIDENCE[evidence]]) + "\n"
    got = _settings(text)
    assert got["vllm.gpu_memory_utilization"] == API_ARGS.gpu_memory_utilization
    assert got["vllm.max_num_seqs"] == API_ARGS.max_num_seqs


def test_an_unprefixed_namespace_without_other_vllm_evidence_is_refused() -> None:
    """Without it, the line is any script's Namespace: a vLLM-looking path inside the
    Namespace itself, or a traceback through the script's own files, is no evidence."""
    args = Namespace(**{**vars(API_ARGS), "model": "/models/vllm/v1/m"})
    text = "\n".join([f"args: {args}", "Traceback (most recent call last):",
                      '  File "/home/me/train/vllm_style/run.py", line 3, in <module>',
                      "    main()", OOM]) + "\n"
    assert _settings(text) == {}


# ----- DeepSpeed's user config, printed as JSON after the block ----------------------------

def scientific_json(value: object, level: int = 0) -> str:
    """What DeepSpeed's ScientificNotationEncoder (deepspeed/runtime/config_utils.py, its
    iterencode) writes, by its rules: each member of an object on a new line indented 4 per
    level ('"key": value'), the members joined by ", " and the closing brace on a line at the
    parent's indent; a list on one line joined by ", " (its items at level 0); a number over
    1e3 as f"{n:e}", a bool as true / false, anything else as json writes it. It takes no
    notice of json.dumps' sort_keys or separators."""
    pad = " " * 4
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return f"{value:e}" if value > 1e3 else f"{value}"
    if isinstance(value, dict):
        members = [f'\n{pad * (level + 1)}"{k}": {scientific_json(v, level + 1)}'
                   for k, v in value.items()]
        return "{" + ", ".join(members) + f"\n{pad * level}" + "}"
    if isinstance(value, list):
        return "[" + ", ".join(scientific_json(v) for v in value) + "]"
    return json.dumps(value)


def deepspeed_user_config(param_dict: dict[str, object], encoder: str, prefix: str = ""
                          ) -> list[str]:
    """deepspeed/runtime/config.py DeepSpeedConfig.print_user_config: logger.info("  json =
    {}".format(json.dumps(self._param_dict, sort_keys=True, indent=4,
    cls=ScientificNotationEncoder, separators=(",", ":")))) — one record over many lines,
    the log's prefix on the first only (`prefix`: a launcher's, on every line). `encoder`
    "scientific" (v0.5 on) or "plain" (before: json.dumps(..., separators=(",", ":")))."""
    dump = (scientific_json(param_dict) if encoder == "scientific" else
            json.dumps(param_dict, sort_keys=True, indent=4, separators=(",", ":")))
    record = "[2025-03-01 10:00:00,124] [INFO] [config.py:1002:print_user_config]   json = "
    lines = (record + dump).splitlines()
    return [prefix + ln for ln in lines]


DS_CONFIG = {"train_micro_batch_size_per_gpu": 2048, "gradient_accumulation_steps": 4,
             "optimizer": {"type": "AdamW", "params": {"lr": 1e-5, "betas": [0.9, 0.95]}},
             "zero_optimization": {"stage": 3, "overlap_comm": True,
                                   "reduce_bucket_size": 500000000,
                                   "offload_param": {"device": "none"},
                                   "offload_optimizer": {"device": "cpu", "pin_memory": True}},
             "bf16": {"enabled": True},
             "wall_clock_breakdown": False}


@pytest.mark.parametrize(("encoder", "prefix"), [("scientific", ""), ("plain", ""),
                                                  ("scientific", "[rank0]: ")])
def test_deepspeed_user_config_json(encoder: str, prefix: str) -> None:
    """The JSON dump after the block, as each encoder writes it (a number over 1e3 as
    '2.048000e+03' in the scientific one), its nested members by their path; what follows
    the dump is not read into it."""
    lines = deepspeed_user_config(DS_CONFIG, encoder, prefix)
    if encoder == "scientific":
        assert f'"train_micro_batch_size_per_gpu": {2048:e}' in "\n".join(lines)
    lines.append(prefix + '[2025-03-01 10:00:01] [INFO] {"stage": 1}')
    zero = DS_CONFIG["zero_optimization"]
    assert isinstance(zero, dict)
    assert _settings("\n".join(lines)) == {
        "deepspeed.train_micro_batch_size_per_gpu": DS_CONFIG["train_micro_batch_size_per_gpu"],
        "deepspeed.gradient_accumulation_steps": DS_CONFIG["gradient_accumulation_steps"],
        "deepspeed.zero_optimization_stage": zero["stage"],
        "deepspeed.offload_optimizer": zero["offload_optimizer"]["device"],
        "deepspeed.offload_param": zero["offload_param"]["device"]}


def test_deepspeed_json_gives_what_an_old_block_printed_over_many_lines() -> None:
    """Before the pydantic config, zero_config printed as DeepSpeedConfigObject's repr
    (json.dumps(self.__dict__, sort_keys=True, indent=4, cls=ScientificNotationEncoder)):
    many lines the block cannot read. The JSON after it says the optimizer state is on the
    CPU, so that knob goes last."""
    old_zero = scientific_json({"stage": 2, "cpu_offload": True})
    config = Namespace(train_micro_batch_size_per_gpu=8, zero_config=old_zero,
                       zero_optimization_stage=2, zero_enabled=True)
    config_dict = {"train_micro_batch_size_per_gpu": 8,
                   "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}}
    lines = deepspeed_print(config)[:-1] + deepspeed_user_config(config_dict, "scientific")
    settings = read_settings(lines)
    assert {s.id: s.value for s in settings} == {
        "deepspeed.zero_optimization_stage": 2, "deepspeed.offload_optimizer": "cpu",
        "deepspeed.train_micro_batch_size_per_gpu": 8}
    by = {s.id: s for s in settings}
    assert by["deepspeed.offload_optimizer"].format == "deepspeed.json"
    offload = _pack_knob("pytorch.toml", "torch.optimizer_cpu_offload")
    knobs, _ = with_settings([(offload, "why"), ("other", "why")], settings)
    path = "zero_optimization.offload_optimizer.device"  # config_dict's, as the JSON names it
    assert [k for k, _ in knobs] == ["other", f"{offload} (already set: {path}=cpu)"]


# ----- an engine's share of the card, offered by the settings alone ------------------------

CARD = int(79.15 * GIB)


def _share_step(request: int, free: int) -> float:
    """The share of the card the request lacked, from the message's printed figures,
    rounded up to the hundredth."""
    lacked = printed(request) - printed(free)
    return math.ceil(lacked * 100 / printed(CARD)) / 100


def test_vllm_utilization_alone_offers_the_share_the_request_lacked() -> None:
    """An OOM with no traceback, under a vLLM server whose Namespace printed a
    gpu_memory_utilization near 1 and another process on the card: the utilisation is the
    knob, lowered by the shortfall's share of the card."""
    util = 0.95
    args = Namespace(**{**vars(API_ARGS), "gpu_memory_utilization": util})
    request, free, other = 2 * GIB, int(1.5 * GIB), 20 * GIB
    message = oom(request, free, CARD, 55 * GIB, GIB, CARD - free - other).replace(
        "free. Including", f"free. Process 4321 has {gb(other)} GiB memory in use. Including")
    text = "\n".join([*vllm_api_server(args, "0.6.3"), message]) + "\n"
    view = text_log_view("v.log", weigh([read_text(text, "v.log")]))
    knobs = dict(view.best_knobs)
    to = util - _share_step(request, free)
    assert f"--gpu-memory-utilization {to:.2f} (now {util})" in knobs
    why = knobs[f"--gpu-memory-utilization {to:.2f} (now {util})"]
    assert "nothing else in the log names a knob" in why and "line 2" in why
    # the message's own Process line holds more than the shortfall: freeing that process
    # (analysis/cause_knobs.toml) comes first, the share after it
    assert view.best_knobs[0][0].startswith("free or shrink the other process")


def test_sglang_share_alone_and_a_bound_without_figures() -> None:
    """SGLang's ServerArgs alone: mem_fraction_static lowered by the share the request
    lacked; a message cut before its figures gets a bound below the share set."""
    mfs = 0.88
    line = f"[2026-02-01 00:05:04 TP0] {ServerArgs(model_path='m', mem_fraction_static=mfs)=}"
    line = line.replace("ServerArgs(model_path='m', mem_fraction_static=mfs)=", "server_args=")
    request, free = 3 * GIB, 200 * MIB
    text = line + "\n" + oom(request, free, CARD, 70 * GIB, GIB, CARD - free) + "\n"
    (first, _), *_ = text_log_view("s.log", weigh([read_text(text, "s.log")])).best_knobs
    assert first == f"--mem-fraction-static {mfs - _share_step(request, free):.2f} (now {mfs})"
    cut = line + "\ntorch.OutOfMemoryError: CUDA out of memory. Tried to allocate 3.00 GiB\n"
    (first, _), *_ = text_log_view("s.log", weigh([read_text(cut, "s.log")])).best_knobs
    assert first == f"--mem-fraction-static < {mfs}"


def _slime_oom_log(server_args: bool = False, frames: bool = False) -> str:
    """slime's arguments block behind Ray's actor prefix, then an OOM message with no
    traceback (or, `frames`, the reference log-prob pass's); `server_args`: a rollout
    engine's own ServerArgs line with the same share (slime hands it on)."""
    lines = [ray("MegatronTrainRayActor", 4242, ln) for ln in megatron_print_args(SLIME_ARGS)]
    if server_args:
        mfs = SLIME_ARGS.sglang_mem_fraction_static
        lines.append(ray("SGLangEngine", 777, "[2026-02-01 00:05:04 TP0] server_args="
                         f"{ServerArgs(model_path='m', mem_fraction_static=mfs)}"))
    tail = [*frames_only(REF_LOGPROB), OOM] if frames else [
        oom(3 * GIB, 200 * MIB, CARD, 70 * GIB, GIB, CARD - 200 * MIB)]
    lines += [ray("MegatronTrainRayActor", 12345, ln) for ln in tail]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("server_args", [False, True])
def test_slimes_sglang_share_alone(server_args: bool) -> None:
    """slime's --sglang-mem-fraction-static (its arguments block: slime registers SGLang's
    flags with an --sglang- prefix and hands them to each rollout engine's ServerArgs) is
    offered by itself where nothing else names a knob, lowered by the share the request
    lacked; with the engine's own ServerArgs in the log too, the one setting is listed
    once, by the flag slime was given."""
    knobs = [k for k, _ in text_log_view("s.log", weigh([read_text(
        _slime_oom_log(server_args), "s.log")])).best_knobs]
    mfs = SLIME_ARGS.sglang_mem_fraction_static
    lower = mfs - _share_step(3 * GIB, 200 * MIB)
    assert knobs[0] == f"--sglang-mem-fraction-static {lower:.2f} (now {mfs})"
    assert not any(k.startswith("--mem-fraction-static") for k in knobs)


def test_slimes_share_is_not_offered_beside_a_named_request() -> None:
    """A traceback that names the failing request (the reference log-prob pass) gives the
    knobs: slime's share is not added to them."""
    knobs = text_log_view("s.log", weigh([read_text(_slime_oom_log(frames=True), "s.log")]))
    assert knobs.best_knobs
    assert not any("mem-fraction-static" in k for k, _ in knobs.best_knobs)


def test_the_share_is_not_offered_beside_a_named_request() -> None:
    """A traceback that names the failing request gives its own knobs: the share is not
    added to them."""
    lines = [*vllm_api_server(API_ARGS, "0.6.3"), *frames_only(REF_LOGPROB), OOM]
    knobs = text_log_view("r.log", weigh([read_text("\n".join(lines), "r.log")])).best_knobs
    assert knobs and not any(k.startswith("--gpu-memory-utilization") for k, _ in knobs)


# ----- transformers' TrainingArguments, as the scripts that parse it log it -----------------

@dataclasses.dataclass
class AcceleratorConfig:
    split_batches: bool = False
    dispatch_batches: bool | None = None


@dataclasses.dataclass
class TrainingArguments:
    """A few of TrainingArguments' fields; its str by __str__'s rules
    (transformers/training_args.py): every field sorted by name, one a line as
    f"{name}={value},", under the class's name, a *_token field as <NAME_TOKEN>."""

    output_dir: str
    per_device_train_batch_size: int = 8
    gradient_accumulation_steps: int = 1
    gradient_checkpointing: bool = False
    use_liger_kernel: bool = False
    accelerator_config: AcceleratorConfig = dataclasses.field(default_factory=AcceleratorConfig)
    hub_token: str | None = None
    fsdp_config: dict[str, object] = dataclasses.field(default_factory=dict)

    def __str__(self) -> str:
        fields = {k: f"<{k.upper()}>" if k.endswith("_token") else v
                  for k, v in dataclasses.asdict(self).items()}
        body = "".join(f"{k}={fields[k]},\n" for k in sorted(fields))
        return f"{type(self).__name__}(\n{body})"


@pytest.mark.parametrize("prefix", ["", "[rank0]:"])
def test_training_arguments_give_the_micro_batch_its_value(prefix: str) -> None:
    """transformers' examples: logger.info(f"Training/evaluation parameters {training_args}")
    under their logging format. The micro-batch knob gets per_device_train_batch_size ×
    free / request; gradient checkpointing, already on, goes last; the output dir's text
    and fsdp_config's nested names are not settings."""
    args = TrainingArguments(output_dir="/runs/a, per_device_train_batch_size=99",
                             per_device_train_batch_size=16, gradient_accumulation_steps=4,
                             gradient_checkpointing=True, hub_token="hf_secret",
                             fsdp_config={"per_device_train_batch_size": 1, "min_num_params": 0})
    record = ("05/02/2025 10:11:12 - INFO - __main__ - Training/evaluation parameters "
              f"{args}")
    lines = [prefix + ln for ln in record.splitlines()]
    settings = read_settings([*lines, prefix + "05/02/2025 10:11:13 - INFO - x=3,"])
    assert {s.id: s.value for s in settings} == {
        "transformers.per_device_train_batch_size": args.per_device_train_batch_size,
        "transformers.gradient_accumulation_steps": args.gradient_accumulation_steps,
        "transformers.gradient_checkpointing": args.gradient_checkpointing,
        "transformers.use_liger_kernel": args.use_liger_kernel}
    micro = _pack_knob("pytorch.toml", "torch.micro_batch")
    checkpointing = _pack_knob("transformers.toml", "transformers.gradient_checkpointing")
    request, free = 6 * GIB, 2 * GIB
    knobs, _ = with_settings([(checkpointing, "why"), (micro, "why")], settings, request, free)
    to = args.per_device_train_batch_size * free // request
    assert [k for k, _ in knobs] == [
        f"{micro} (per_device_train_batch_size {to}, now {args.per_device_train_batch_size})",
        f"{checkpointing} (already set: gradient_checkpointing=True)"]


# ----- TRL's configs: TrainingArguments' str under their own class names ------------------

@dataclasses.dataclass
class GRPOConfig(TrainingArguments):
    """As trl/trainer/grpo_config.py: a @dataclass subclass (of _BaseConfig, itself
    TrainingArguments'), so it gets a __repr__ of its own but prints with
    TrainingArguments.__str__ under its own name. A few of GRPO's fields, TRL's defaults."""

    num_generations: int | None = 8
    max_completion_length: int | None = 256
    use_vllm: bool = False
    vllm_mode: str = "server"
    vllm_gpu_memory_utilization: float = 0.3


@dataclasses.dataclass
class ScriptArguments(GRPOConfig):
    """Any other class that prints the same way: not one of TRL's names."""


def _training_log(args: object) -> list[str]:
    """open-r1's grpo.py / TRL's examples: logger.info(f"Training parameters {training_args}")
    under the logging format the scripts set."""
    record = f"2025-05-02 10:11:12 - INFO - __main__ - Training parameters {args}"
    return record.splitlines()


def test_grpo_config_gives_grpos_memory_knobs_their_values() -> None:
    """A GRPOConfig dump: the Trainer's settings as from TrainingArguments, GRPO's own read
    under TRL's class name. Its completion knob gets max_completion_length (named: the
    knob's text names two settings), the colocated vLLM's share the value set (use_vllm and
    colocate printed), the micro-batch per_device_train_batch_size x free / request;
    checkpointing, TRL's default on, goes last."""
    args = GRPOConfig(output_dir="/runs/grpo", per_device_train_batch_size=8,
                      gradient_checkpointing=True, num_generations=16,
                      max_completion_length=2048, use_vllm=True, vllm_mode="colocate",
                      vllm_gpu_memory_utilization=0.45)
    assert str(args).startswith("GRPOConfig(\n")  # TrainingArguments.__str__, its own name
    settings = read_settings(_training_log(args))
    assert {s.id: s.value for s in settings} == {
        "transformers.per_device_train_batch_size": args.per_device_train_batch_size,
        "transformers.gradient_accumulation_steps": args.gradient_accumulation_steps,
        "transformers.gradient_checkpointing": args.gradient_checkpointing,
        "transformers.use_liger_kernel": args.use_liger_kernel,
        "trl.num_generations": args.num_generations,
        "trl.max_completion_length": args.max_completion_length,
        "trl.use_vllm": args.use_vllm, "trl.vllm_mode": args.vllm_mode,
        "trl.vllm_gpu_memory_utilization": args.vllm_gpu_memory_utilization}
    assert {s.format for s in settings} == {"trl.config"}
    completion = _pack_knob("trl.toml", "trl.completion_length")
    colocate = _pack_knob("trl.toml", "trl.vllm_colocate")
    micro = _pack_knob("pytorch.toml", "torch.micro_batch")
    checkpointing = _pack_knob("transformers.toml", "transformers.gradient_checkpointing")
    request, free = 5 * GIB, 2 * GIB
    knobs, _ = with_settings([(checkpointing, "why"), (completion, "why"), (colocate, "why"),
                              (micro, "why")], settings, request, free)
    to = args.per_device_train_batch_size * free // request
    assert [k for k, _ in knobs] == [
        f"{completion} (now max_completion_length={args.max_completion_length})",
        f"{colocate} (now vllm_gpu_memory_utilization={args.vllm_gpu_memory_utilization})",
        f"{micro} (per_device_train_batch_size {to}, now {args.per_device_train_batch_size})",
        f"{checkpointing} (already set: gradient_checkpointing=True)"]


def test_grpo_share_is_no_value_without_a_colocated_engine() -> None:
    """TRL prints vllm_gpu_memory_utilization whether or not it sizes an engine: without
    use_vllm and vllm_mode "colocate" it is not the colocate knob's value."""
    colocate = _pack_knob("trl.toml", "trl.vllm_colocate")
    for use_vllm, mode in ((False, "colocate"), (True, "server")):
        args = GRPOConfig(output_dir="o", use_vllm=use_vllm, vllm_mode=mode)
        knobs, _ = with_settings([(colocate, "why")], read_settings(_training_log(args)))
        assert [k for k, _ in knobs] == [colocate]


def test_only_trls_class_names_are_read_as_trl() -> None:
    """The same str under another class name ("...Arguments(", any "Config(") is not a TRL
    config; under a TrainingArguments name the Trainer's settings are read and GRPO's names
    are not (a script's own subclass may have such a field)."""
    fields = {f.name: getattr(GRPOConfig(output_dir="o"), f.name)
              for f in dataclasses.fields(GRPOConfig)}
    other = ScriptArguments(**fields)
    assert read_settings(_training_log(other)) == ()
    config = str(GRPOConfig(output_dir="o"))
    assert read_settings(_training_log(config.replace("GRPOConfig(", "ExperimentConfig(", 1))) \
        == ()
    assert read_settings(_training_log(config.replace("GRPOConfig(", "Config(", 1))) == ()
    got = _settings("\n".join(_training_log(
        config.replace("GRPOConfig(", "MyTrainingArguments(", 1))))
    assert got and not any(k.startswith("trl.") for k in got)


SITE = "/usr/lib/python3/site-packages"
#: GRPO's loss pass (trl/trainer/grpo_trainer.py _compute_loss ->
#: _get_per_token_logps_and_entropies -> trl/trainer/utils.py selective_log_softmax)
GRPO_LOSS = [
    (f"{SITE}/transformers/trainer.py", 3800, "training_step",
     "loss = self.compute_loss(model, inputs)"),
    (f"{SITE}/trl/trainer/grpo_trainer.py", 1650, "compute_loss",
     "return self._compute_loss(model, inputs)"),
    (f"{SITE}/trl/trainer/grpo_trainer.py", 1700, "_compute_loss",
     "per_token_logps, entropies = self._get_per_token_logps_and_entropies("),
    (f"{SITE}/trl/trainer/grpo_trainer.py", 830, "_get_per_token_logps_and_entropies",
     "logps = selective_log_softmax(logits, completion_ids)"),
    (f"{SITE}/trl/trainer/utils.py", 1600, "selective_log_softmax",
     "logsumexp_values = torch.stack([torch.logsumexp(lg, dim=-1) for lg in logits])")]


def test_a_grpo_log_names_its_completion_budget_as_set() -> None:
    """A GRPO run's log: its config, then an OOM in the log-softmax over the completions'
    logits. The traceback's family gives TRL's completion knob; the config gives it the
    value set."""
    args = GRPOConfig(output_dir="o", max_completion_length=4096, num_generations=16)
    text = "\n".join([*_training_log(args), "Traceback (most recent call last):",
                      *frames_only(GRPO_LOSS), OOM]) + "\n"
    knobs = [k for k, _ in
             text_log_view("g.log", weigh([read_text(text, "g.log")])).best_knobs]
    completion = _pack_knob("trl.toml", "trl.completion_length")
    assert f"{completion} (now max_completion_length={args.max_completion_length})" in knobs


@pytest.mark.parametrize("encoder", ["scientific", "plain"])
def test_deepspeeds_old_cpu_offload_key_is_the_optimizer_on_the_cpu(encoder: str) -> None:
    """DeepSpeed < 0.6's ZeRO-Offload key: "cpu_offload": true in zero_optimization set
    offload_optimizer to the CPU (deepspeed/runtime/zero/config.py, v0.5.10
    DeepSpeedZeroConfig._initialize): read as offload_optimizer = cpu, so that knob goes last
    and quotes the key as printed; false is not read as any device."""
    offload = _pack_knob("pytorch.toml", "torch.optimizer_cpu_offload")
    for on in (True, False):
        config = {"train_micro_batch_size_per_gpu": 4,
                  "zero_optimization": {"stage": 2, "cpu_offload": on}}
        settings = read_settings(deepspeed_user_config(config, encoder))
        got = {s.id: s.value for s in settings}
        assert got.get("deepspeed.offload_optimizer") == ("cpu" if on else None)
        assert got["deepspeed.zero_optimization_stage"] == 2
        knobs, _ = with_settings([(offload, "why"), ("other", "why")], settings)
        assert [k for k, _ in knobs] == (
            ["other", f"{offload} (already set: zero_optimization.cpu_offload=true)"] if on
            else [offload, "other"])
