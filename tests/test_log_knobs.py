"""A first knob from what a log's framework says (issue 69): a refusal that names its own
knob (vLLM's 'Try increasing `gpu_memory_utilization`', SGLang's 'Please try to increase
--mem-fraction-static') gets it, with the value its own figures give. Each line is written
with the framework's format string (cited above each writer); expected values are
recomputed here from the figures the test printed."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from snapana.log_session import weigh
from snapana.render.text_log import text_log_view
from snapana.sources.log_text import read_text

from .test_pasted_formats import vllm_064

GIB = 1 << 30
CORPUS = Path(__file__).resolve().parents[1] / ".." / "shared" / "corpus" / "oom_messages"

#: vllm/worker/worker.py raise_if_cache_size_invalid (V0) and vllm/v1/core/kv_cache_utils.py
#: check_enough_kv_cache_memory (V1): raise ValueError("No available memory for the cache
#: blocks. Try increasing `gpu_memory_utilization` when initializing the engine.")
NO_BLOCKS = ("No available memory for the cache blocks. Try increasing "
             "`gpu_memory_utilization` when initializing the engine.")


def gib(x: float) -> int:
    """The bytes a '%.2f' GiB figure stands for."""
    return round(round(x, 2) * GIB)


def _knobs(text: str) -> tuple[tuple[str, str], ...]:
    return text_log_view("t.log", weigh([read_text(text, "t.log")])).best_knobs


def test_vllm_refusal_alone_names_its_knob_without_a_value() -> None:
    """The refusal as a traceback ends it: the raise line, then the exception (knobs [])."""
    text = (f'    raise ValueError("No available memory for the cache blocks. "\n'
            f"ValueError: {NO_BLOCKS}\n")
    (first, why), *_ = _knobs(text)
    assert first == "--gpu-memory-utilization <higher than the one set>"
    assert "Try increasing `gpu_memory_utilization`" in why
    assert "no budget figures" in why


def test_vllm_064_profiling_results_give_the_utilisation_that_leaves_room() -> None:
    """0.6.4's profiling results with the cache spent: what the weights, the profiling run
    and non-torch memory took is total × utilisation − kv_cache_size; the least utilisation
    leaving the cache 1% of the card is (that + 1% of the card) / total, rounded up."""
    total, util, kv = 31.74, 0.80, -1.37
    text = vllm_064(total, 15.3, 9.9, 15.9, 0.6, kv, util) + f"ValueError: {NO_BLOCKS}\n"
    knobs = _knobs(text)
    used = int(gib(total) * util) - gib(kv)
    at = math.ceil((used + gib(total) // 100) * 100 / gib(total)) / 100
    assert knobs[0][0] == f"--gpu-memory-utilization {at:.2f}"
    assert at > util
    # the refusal's own direction is not offered beside the value
    assert [k for k, _ in knobs if k.startswith("--gpu-memory-utilization")] == [knobs[0][0]]


def test_vllm_064_with_no_utilisation_that_fits_offers_none() -> None:
    total, util, kv = 23.65, 0.90, -3.0  # (21.29 + 3.0 + 1%) / 23.65 > 0.95
    text = vllm_064(total, 20.1, 2.0, 21.0, 0.5, kv, util) + f"ValueError: {NO_BLOCKS}\n"
    knobs = [k for k, _ in _knobs(text) if k.startswith("--gpu-memory-utilization")]
    assert knobs == ["--gpu-memory-utilization <higher than the one set>"]


def test_sglang_refusal_gets_the_least_fraction_that_leaves_a_pool() -> None:
    """sglang model_runner: 'Load weight begin. avail mem={:.2f} GB', 'Load weight end.
    type=..., dtype=..., avail mem={:.2f} GB, mem usage={:.2f} GB.', then
    RuntimeError("Not enough memory. Please try to increase --mem-fraction-static."):
    profile_max_num_token's rest_memory = avail after − avail before × (1 − fraction)."""
    before, after = 78.50, 12.25
    p = "[2026-05-02 10:11:12 TP0] "
    text = (f"{p}Load weight begin. avail mem={before:.2f} GB\n"
            f"{p}Load weight end. type=Qwen3ForCausalLM, dtype=torch.bfloat16, avail "
            f"mem={after:.2f} GB, mem usage={before - after:.2f} GB.\n"
            "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static.\n")
    (first, why), *_ = _knobs(text)
    lower = math.ceil((1 - gib(after) / gib(before)) * 100) / 100
    assert first == f"--mem-fraction-static {lower:.2f} or more"
    assert "profile_max_num_token" in why


def test_sglang_refusal_without_its_figures_names_the_knob() -> None:
    text = "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static.\n"
    (first, why), *_ = _knobs(text)
    assert first == "--mem-fraction-static <higher than the one set>"
    # its words say the way the value goes: the pool gets room from a larger share
    effect = why.split(" — ", 1)[0]
    assert "raising" in effect and "lowering" not in effect


def test_sglang_runtime_oom_lowers_the_fraction_in_words_and_value() -> None:
    """An OOM after start-up whose KV pool alone covers the shortfall: the value lowers the
    share, and so do the words (sglang model_runner 'KV Cache is allocated. #tokens: {},
    K size: {:.2f} GB, V size: {:.2f} GB' and server_args' mem_fraction_static)."""
    p = "[2026-05-02 10:11:12 TP0] "
    text = (f"{p}server_args=ServerArgs(model_path='m', mem_fraction_static=0.88)\n"
            f"{p}KV Cache is allocated. #tokens: 1000000, K size: 10.00 GB, V size: 10.00 GB\n"
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 "
            "has a total capacity of 79.19 GiB of which 1.00 GiB is free. Including "
            "non-PyTorch memory, this process has 78.18 GiB memory in use. Of the allocated "
            "memory 70.00 GiB is allocated by PyTorch, and 1.00 GiB is reserved by PyTorch "
            "but unallocated.\n")
    knobs = [(k, w) for k, w in _knobs(text) if k.startswith("--mem-fraction-static")]
    assert knobs
    for knob, why in knobs:
        value = float(knob.split()[1])
        assert value < 0.88
        effect = why.split(" — ", 1)[0]
        assert "lowering" in effect and "raising" not in effect


def test_a_knob_a_framework_message_names_is_worded_its_way() -> None:
    """Each [hint] of framework_knobs.toml whose value goes up has words that do not
    describe lowering (the words and the value of one knob agree)."""
    import snapana.analysis as analysis
    import tomllib

    table = tomllib.loads((Path(analysis.__file__).parent / "framework_knobs.toml")
                          .read_text(encoding="utf-8"))
    for hid, hint in table["hint"].items():
        words = table["knob"][hint["knob"]]
        if "higher" in hint["value"] or "more" in hint["value"]:
            assert "lowering" not in words["effect"], hid


@pytest.mark.skipif(not (CORPUS / "messages.jsonl").exists(), reason="corpus absent")
def test_corpus_vllm_refusals_get_the_knob_their_message_names() -> None:
    """Every corpus message whose text holds vLLM's 'Try increasing
    `gpu_memory_utilization`' (found here by the raw text, not by snapana) leads its knobs
    with it."""
    lines = (CORPUS / "messages.jsonl").read_text().splitlines()
    found = [m for m in map(json.loads, lines)
             if "Try increasing `gpu_memory_utilization`" in m["text"]]
    assert found
    for m in found:
        knobs = _knobs(m["text"])
        assert knobs and knobs[0][0].startswith("--gpu-memory-utilization"), m["id"]


def test_sglang_verdict_follows_avail_mem_to_the_last_figure_before_the_oom() -> None:
    """Start-up leaves 74 GB; a later line SGLang prints with the card's free memory
    (model_runner.load_model's f"Load weight begin. avail mem={...:.2f} GB", a reload) says
    20 GB: the verdict must not stop at start-up's figure."""
    from .test_framework_lines import oom, printed, sglang_startup

    cap = 94 * GIB + GIB // 2
    before, weights, kv_half, graphs = cap - GIB, 15 * GIB, 2 * GIB, GIB
    left = before - weights - 2 * kv_half - graphs
    later = left - 54 * GIB
    text = sglang_startup(0, before, weights, kv_half, 40000, graphs, 0.3)
    text += f"[2026-02-01 00:06:00 TP0] Load weight begin. avail mem={later / GIB:.2f} GB\n"
    request, free = later + GIB, later - 100 * (1 << 20)
    text += "[2026-02-01 00:07:09 TP0] Scheduler hit an exception: " + oom(
        request, free, cap, 70 * GIB, GIB, cap - free) + "\n"
    ev = weigh([read_text(text, "s.log")])
    (sec,) = [s for s in text_log_view("s.log", ev).sections if s.id == "framework"]
    taken = printed(left) - printed(later)
    assert f"was {printed(later) / GIB:.2f} GiB" in sec.verdict
    assert f"{taken / GIB:.2f} GiB taken after start-up" in sec.verdict


def test_sglang_draft_graph_end_with_avail_first_is_counted() -> None:
    """eagle_worker.init_cuda_graphs: f"Capture draft cuda graph end. Time elapsed: {:.2f} s.
    avail mem={after_mem:.2f} GB. mem usage={(before_mem - after_mem):.2f} GB." beside the
    target's f"Capture cuda graph end. Time elapsed: {:.2f} s. mem usage={:.2f} GB. avail
    mem={:.2f} GB.": the graphs took both."""
    p = "[2026-02-01 00:05:03 TP0] "
    text = (f"{p}Memory pool end. avail mem=44.00 GB\n"
            f"{p}Capture cuda graph end. Time elapsed: 6.04 s. mem usage=2.25 GB. avail "
            "mem=41.75 GB.\n"
            f"{p}Capture draft cuda graph end. Time elapsed: 3.10 s. avail mem=40.50 GB. mem "
            "usage=1.25 GB.\n")
    (fw,) = weigh([read_text(text, "d.log")]).frameworks
    budget = dict(fw.findings[0].terms)
    assert budget["CUDA graphs"] == gib(2.25) + gib(1.25)
    assert budget["left after start-up"] == gib(40.50)
