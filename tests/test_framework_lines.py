"""Frameworks' own memory lines read into figures and judged (issue 57). Every line is
written here with the framework's own format string (cited above each writer, as read in
its source), filled with figures the test chooses; expected figures, budget terms and knob
values are recomputed from those figures by the test's own arithmetic."""

from __future__ import annotations

import math
import re
import time
from pathlib import Path

import pytest
from snapana.log_session import read_logs, weigh
from snapana.render.text_log import text_log_view
from snapana.sources.log_text import read_text
from snapana.sources.memory_lines import line_formats, read_memory_lines

from .test_log_texts import _budget

GIB, MIB = 1 << 30, 1 << 20


def gb(n: int) -> str:
    """SGLang's and DeepSpeed's '{x:.2f} GB' of bytes / (1 << 30)."""
    return f"{n / GIB:.2f}"


def printed(n: int) -> int:
    """The bytes a '{:.2f}' GiB figure stands for."""
    return round(float(gb(n)) * GIB)


def oom(request: int, free: int, capacity: int, allocated: int, cached: int, own: int) -> str:
    """PyTorch 2.2+'s OOM message (c10/cuda/CUDACachingAllocator.cpp)."""
    return (f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {gb(request)} GiB. "
            f"GPU 0 has a total capacity of {gb(capacity)} GiB of which {gb(free)} GiB is "
            f"free. Including non-PyTorch memory, this process has {gb(own)} GiB memory in "
            f"use. Of the allocated memory {gb(allocated)} GiB is allocated by PyTorch, and "
            f"{gb(cached)} GiB is reserved by PyTorch but unallocated.")


def sglang_startup(tp: int, before: int, weights: int, kv_half: int, tokens: int,
                   graphs: int, mfs: float, stamp: str = "2026-02-01 00:05:03") -> str:
    """SGLang's start-up lines (python/sglang/srt/model_executor/model_runner.py load_model
    and init_device_graphs, mem_cache/memory_pool.py, managers/scheduler.py), each with its
    f-string: 'Load weight end. elapsed=..., type=..., dtype=..., avail mem={:.2f} GB, mem
    usage={:.2f} GB.', 'KV Cache is allocated. #tokens: {size}, K size: {:.2f} GB, V size:
    {:.2f} GB', 'Memory pool end. avail mem={:.2f} GB', 'Capture cuda graph begin. This can
    take up to several minutes. avail mem={:.2f} GB', 'Capture cuda graph end. Time
    elapsed: {:.2f} s. mem usage={:.2f} GB. avail mem={:.2f} GB.', the scheduler's
    'max_total_num_tokens=..., available_gpu_mem={:.2f} GB', the ServerArgs repr."""
    p = f"[{stamp} TP{tp}] "
    loaded = before - weights
    pooled = loaded - 2 * kv_half
    left = pooled - graphs
    return "\n".join([
        f"{p}server_args=ServerArgs(model_path='Qwen/Qwen3-8B', tp_size=2, "
        f"mem_fraction_static={mfs}, max_running_requests=None, chunked_prefill_size=8192)",
        f"{p}Load weight begin. avail mem={gb(before)} GB",
        f"{p}Load weight end. elapsed=12.31 s, type=Qwen3ForCausalLM, dtype=torch.bfloat16, "
        f"avail mem={gb(loaded)} GB, mem usage={gb(weights)} GB.",
        f"{p}KV Cache is allocated. #tokens: {tokens}, K size: {gb(kv_half)} GB, V size: "
        f"{gb(kv_half)} GB",
        f"{p}Memory pool end. avail mem={gb(pooled)} GB",
        f"{p}Capture cuda graph begin. This can take up to several minutes. avail mem="
        f"{gb(pooled)} GB",
        f"{p}Capture cuda graph end. Time elapsed: 6.04 s. mem usage={gb(graphs)} GB. avail "
        f"mem={gb(left)} GB.",
        f"{p}max_total_num_tokens={tokens}, chunked_prefill_size=8192, max_prefill_tokens="
        f"16384, max_running_requests=2049, context_len=40960, available_gpu_mem={gb(left)} GB",
    ]) + "\n"


def test_sglang_startup_budget_and_the_term_the_oom_ate() -> None:
    cap = int(79.19 * GIB)
    before, weights, kv_half, graphs = cap - 700 * MIB, 15 * GIB + 300 * MIB, 27 * GIB, 1800 * MIB
    mfs = 0.88
    left = before - weights - 2 * kv_half - graphs
    request, free = left + 3 * GIB + 500 * MIB, left - 250 * MIB
    text = sglang_startup(0, before, weights, kv_half, 399740, graphs, mfs)
    text += "[2026-02-01 00:07:09 TP0] Scheduler hit an exception: " + oom(
        request, free, cap, 70 * GIB, GIB, cap - free - 100 * MIB) + "\n"
    ev = weigh([read_text(text, "sglang.log")])
    (fw,) = ev.frameworks
    assert (fw.framework, fw.rank) == ("sglang", 0)
    budget = dict(next(f for f in fw.findings if f.id == "sglang_budget").terms)
    assert budget["weights"] == printed(weights)
    assert budget["KV cache pool"] == 2 * printed(kv_half)
    assert budget["CUDA graphs"] == printed(graphs)
    assert budget["left after start-up"] == printed(left)
    # the OOM lacked request - free; the KV pool alone holds that much: the fraction drops by
    # that share of the card, rounded up to a hundredth
    gap = printed(request) - printed(free)
    lower = math.ceil(gap * 100 / printed(cap)) / 100
    (knob, why) = fw.knobs[0]
    # the ServerArgs line's mem_fraction_static is the value it was set to (issue 69)
    assert knob == f"--mem-fraction-static {mfs - lower:.2f} (now {mfs:g})"
    assert "alone covers" in why
    assert all(not k.startswith("--cuda-graph-max-bs") for k, _ in fw.knobs)  # 1.8 < gap
    view = text_log_view("sglang.log", ev)
    (sec,) = [s for s in view.sections if s.id == "framework"]
    assert "start-up budget" in sec.sentences[0]


def test_sglang_ranks_and_an_mla_pool_are_read_apart() -> None:
    """Two tensor-parallel ranks in one log ('TP0', 'TP1'); an MLA model's pool prints one
    'KV size' (memory_pool.MLATokenToKVPool)."""
    text = sglang_startup(0, 78 * GIB, 15 * GIB, 20 * GIB, 300000, GIB, 0.85)
    text += sglang_startup(1, 78 * GIB, 15 * GIB, 21 * GIB, 315000, 2 * GIB, 0.85)
    text += "[2026-02-26 16:41:18 TP2] KV Cache is allocated. #tokens: 2454421, KV size: " \
            "160.63 GB\n"
    ev = weigh([read_text(text, "tp.log")])
    by_rank = {e.rank: e for e in ev.frameworks}
    assert sorted(by_rank) == [0, 1, 2]
    for rank, half in ((0, 20 * GIB), (1, 21 * GIB)):
        terms = dict(by_rank[rank].findings[0].terms)
        assert terms["KV cache pool"] == 2 * printed(half)
    assert dict(by_rank[2].findings[0].terms)["KV cache pool"] == round(160.63 * GIB)


#: A public slime job's log line (a Ray actor's prefix, Ray's repeat count), as posted.
SAVER_REAL = ("(MegatronTrainRayActor pid=10310) [torch_memory_saver.cpp] "
              "TorchMemorySaver::malloc return OOM since memory_margin_bytes=1073741824 "
              "(alloc)size=27640463360 free_bytes=26254573568 [repeated 18x across cluster]")


def saver_line(margin: int, size: int, free: int) -> str:
    """torch_memory_saver's csrc: '[torch_memory_saver.cpp] TorchMemorySaver::malloc return
    OOM since memory_margin_bytes=%zu (alloc)size=%zu free_bytes=%zu'."""
    return (f"[torch_memory_saver.cpp] TorchMemorySaver::malloc return OOM since "
            f"memory_margin_bytes={margin} (alloc)size={size} free_bytes={free}")


def test_memory_saver_refusals() -> None:
    (fw,) = weigh([read_text(SAVER_REAL + "\n", "slime.log")]).frameworks
    refused = dict(fw.findings[0].terms)
    assert (refused["size"], refused["free"], refused["margin"]) == (27640463360, 26254573568,
                                                                     1073741824)
    assert refused["times"] == 18
    # larger than what is free: no margin would have let it through, so no margin knob
    assert fw.findings[1].id == "saver_short" and not fw.knobs
    margin, size, free = 2 * GIB, 20 * GIB, 21 * GIB
    (fw,) = weigh([read_text(saver_line(margin, size, free), "x.log")]).frameworks
    assert fw.findings[1].id == "saver_margin"
    (knob, _), = fw.knobs
    assert knob.startswith(f"memory_margin_bytes <= {free - size:,}")


def vllm_v1(weights: float, non_kv: float, activation: float, non_torch: float, kv: float,
            tokens: int, max_len: int, rank: int = 0) -> str:
    """vLLM V1's lines: gpu_model_runner 'Model loading took %.4f GiB and %.6f seconds';
    gpu_worker's debug 'Memory profiling takes %.2f seconds. Total non KV cache memory:
    %.2fGiB; torch peak memory increase: %.2fGiB; non-torch forward increase memory:
    %.2fGiB; weights memory: %.2fGiB.' and 'Available KV cache memory: %.2f GiB';
    kv_cache_utils 'GPU KV cache size: %s tokens' (f'{n:,}') and 'Maximum concurrency for %s
    tokens per request: %.2fx'."""
    p = f"(VllmWorker rank={rank} pid=4242) INFO 03-14 09:12:55 "
    return "\n".join([
        f"{p}[gpu_model_runner.py:1289] Model loading took {weights:.4f} GiB and 13.204526 "
        "seconds",
        f"{p}[gpu_worker.py:227] Memory profiling takes 11.85 seconds. Total non KV cache "
        f"memory: {non_kv:.2f}GiB; torch peak memory increase: {activation:.2f}GiB; non-torch "
        f"forward increase memory: {non_torch:.2f}GiB; weights memory: {weights:.2f}GiB.",
        f"{p}[gpu_worker.py:241] Available KV cache memory: {kv:.2f} GiB",
        f"{p}[kv_cache_utils.py:566] GPU KV cache size: {tokens:,} tokens",
        f"{p}[kv_cache_utils.py:570] Maximum concurrency for {max_len:,} tokens per request: "
        f"{tokens / max_len:.2f}x",
    ]) + "\n"


def test_vllm_v1_lines_and_their_judgements() -> None:
    # a healthy start: the figures read, no knob
    (fw,) = weigh([read_text(vllm_v1(14.99, 16.51, 1.21, 0.31, 55.05, 450816, 32768),
                             "v.log")]).frameworks
    terms = dict(fw.findings[0].terms)
    assert terms["weights"] == round(14.9888 * GIB) or terms["weights"] == round(14.99 * GIB)
    assert terms["budget (non-KV + KV)"] == round(16.51 * GIB) + round(55.05 * GIB)
    assert not fw.knobs
    # the cache holds less than one request of max_model_len: --max-model-len its tokens
    (fw,) = weigh([read_text(vllm_v1(14.99, 16.51, 1.21, 0.31, 1.05, 8592, 32768),
                             "v.log")]).frameworks
    assert [k for k, _ in fw.knobs] == ["--max-model-len 8,592"]
    # the profiling run's activations take half the budget or more: a word and a knob
    non_kv, activation, kv = 30.0, 24.0, 17.0
    (fw,) = weigh([read_text(vllm_v1(5.0, non_kv, activation, 1.0, kv, 300000, 8192),
                             "v.log")]).frameworks
    assert activation / (non_kv + kv) >= 0.5
    assert "vllm_activation_half" in {f.id for f in fw.findings}
    assert any(k.startswith("--max-num-batched-tokens") for k, _ in fw.knobs)


def test_vllm_v1_negative_cache_with_the_card_size_of_an_oom_message() -> None:
    """Seed 003's 'Available KV cache memory: -27.82 GiB' and, on the same rank, the
    card's 79.25 GiB from the OOM that followed. Without the profiling line nothing says
    what took the budget (there: the colocated trainer's buffers), so no utilisation is
    offered; with it, the utilisation would have to rise by at least 27.82 / 79.25 of the
    card, if nothing else held that memory."""
    card = ("[rank0]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 7.50 GiB. "
            "GPU 0 has a total capacity of 79.25 GiB of which 975.94 MiB is free. Including "
            "non-PyTorch memory, this process has 78.25 GiB memory in use. Of the allocated "
            "memory 77.28 GiB is allocated by PyTorch, and 66.45 MiB is reserved by PyTorch "
            "but unallocated.\n")
    kv_line = "INFO 03-12 11:58:22 [gpu_worker.py:424] Available KV cache memory: -27.82 GiB\n"
    (fw,) = weigh([read_text(kv_line + card, "s3.log")]).frameworks
    assert not fw.knobs and "vllm_unsplit" in {f.id for f in fw.findings}
    profile = ("DEBUG 03-12 11:58:22 [gpu_worker.py:400] Memory profiling takes 3.51 seconds. "
               "Total non KV cache memory: 67.40GiB; torch peak memory increase: 1.21GiB; "
               "non-torch forward increase memory: 0.66GiB; weights memory: 65.53GiB.\n")
    (fw,) = weigh([read_text(profile + kv_line + card, "s3.log")]).frameworks
    more = math.ceil(round(27.82 * GIB) * 100 / round(79.25 * GIB)) / 100
    (knob, why), = fw.knobs
    assert knob == f"--gpu-memory-utilization +{more:.2f} or more"
    assert "if no other process holds that memory" in why


def test_vllm_budget_message_with_an_activation_peak_of_half_the_budget() -> None:
    """vLLM 0.7's budget message (worker.determine_num_available_blocks): the activation
    peak is half the budget — a sentence and the batched-tokens knob, with no refusal."""
    text, budget, _ = _budget(44.39, 0.92, 10.20, 0.36, 21.50)
    activation = 21.50
    view = text_log_view("v07.log", weigh([read_text(text, "v07.log")]))
    (sec,) = [s for s in view.sections if s.id == "vllm"]
    share = round(activation * GIB) / round(budget * GIB)
    assert share >= 0.5
    assert f"takes {share:.0%} of the budget" in " ".join(sec.sentences)
    assert [k for k, _ in sec.knobs] == ["--max-num-batched-tokens <fewer>"]


def megatron_report(rank: int, iteration: int, allocated: float, max_allocated: float,
                    reserved: float, max_reserved: float) -> str:
    """megatron/training/utils.report_memory: name + ' memory (MB)' + f' | allocated:
    {:.2f} | max allocated: {:.2f} | reserved: {:.2f} | max reserved: {:.2f}', printed as
    '[Rank {}] {}'.format(rank, string)."""
    string = f"(after {iteration} iterations) memory (MB)"
    string += f" | allocated: {allocated:.2f} | max allocated: {max_allocated:.2f}"
    string += f" | reserved: {reserved:.2f} | max reserved: {max_reserved:.2f}"
    return "[Rank {}] {}".format(rank, string)  # noqa: UP032 (Megatron's own call)


def test_a_folder_of_megatron_rank_logs_is_read_rank_by_rank(tmp_path: Path) -> None:
    peaks = {0: 41000.0, 1: 41200.0, 2: 52000.0, 3: 40900.0}
    for rank, peak in peaks.items():
        lines = [megatron_report(rank, it, 20000.0 + it, peak - 500, peak, peak)
                 for it in (10, 20)]
        if rank == 2:
            lines.append(f"[rank2]: {oom(6 * GIB, GIB, int(79.15 * GIB), 60 * GIB, GIB, 78 * GIB)}")
        (tmp_path / f"rank{rank}.log").write_text("\n".join(lines) + "\n")
    paths = sorted(tmp_path.iterdir())
    ev = read_logs(paths, {p: int(p.stem[4:]) for p in paths})
    by_rank = {e.rank: e for e in ev.frameworks}
    assert sorted(by_rank) == [0, 1, 2, 3]
    for rank, peak in peaks.items():
        assert dict(by_rank[rank].findings[0].terms)["max reserved"] == round(peak * MIB)
    uneven = [f for e in ev.frameworks for f in e.findings if f.id == "uneven_ranks"]
    (word,) = uneven
    assert dict(word.terms) == {"rank 2": round(52000.0 * MIB), "rank 3": round(40900.0 * MIB)}
    vs = [f for f in by_rank[2].findings if f.id == "report_vs_oom"]
    assert vs and by_rank[2].message is not None
    assert not [f for f in by_rank[0].findings if f.id == "report_vs_oom"]


def test_deepspeed_see_memory_usage_both_formats() -> None:
    """deepspeed/runtime/utils.see_memory_usage prints its message, then f'MA {..} GB \\
    Max_MA {..} GB \\ CA {..} GB \\ Max_CA {round(..)} GB ' (the continuation lines' eight
    spaces stay in the string; Max_CA rounded to a whole GB); a newer one joins
    f'MA {:0.2f} GB', ... with ' | '."""
    classic = ("After forward\n"
               f"MA {round(12.3456, 2)} GB         Max_MA {round(20.111, 2)} GB         "
               f"CA {round(22.5, 2)} GB         Max_CA {round(24.4)} GB \n")
    joined = ("before step\n" + " | ".join([f"MA {9.5:0.2f} GB", f"Max_MA {11.25:0.2f} GB",
                                            f"CA {12.0:0.2f} GB", f"Max_CA {30.0:0.2f} GB",
                                            f"NV {31.0:0.2f} GB"]) + "\n")
    lines = read_memory_lines((classic + joined).splitlines())
    assert [m.label for m in lines] == ["After forward", "before step"]
    assert lines[0].size("ma").bytes == round(12.35 * GIB)
    assert lines[0].size("max_ca").bytes == 24 * GIB and lines[0].size("max_ca").slack > 0
    assert lines[1].size("max_ca").bytes == 30 * GIB
    (fw,) = weigh([read_text(classic + joined, "ds.log")]).frameworks
    assert dict(fw.findings[0].terms)["max reserved"] == 30 * GIB


def test_every_memory_line_pattern_is_bounded_and_linear() -> None:
    """Every pattern uses bounded repetitions only (no *, + or {n,}), so a match attempt is
    a bounded amount of work; and 100 KB of digits, spaces and dots after each anchor is
    read at once."""
    for f in line_formats():
        src = re.sub(r"\\.|\[[^\]]*\]", "", f.pattern.pattern)  # escapes and classes out
        assert not re.search(r"[*+]|\{\d+,\}", src), f.id
    for filler in ("9", " ", ".", "9.", "1 GB, "):
        junk = filler * (100_000 // len(filler))
        lines = [f.anchor + junk for f in line_formats()]
        start = time.process_time()
        bare = {f.id for f in line_formats() if f.pattern.match(f.anchor)}  # an error line
        assert all(m.figures or m.format in bare for m in read_memory_lines(lines))
        assert time.process_time() - start < 2.0


@pytest.mark.parametrize("name", ["sglang.log"])
def test_a_log_of_framework_lines_alone_is_read_not_refused(tmp_path: Path, name: str) -> None:
    from .conftest import invoke

    path = tmp_path / name
    path.write_text(sglang_startup(0, 78 * GIB, 15 * GIB, 20 * GIB, 300000, GIB, 0.85))
    result = invoke("summary", str(path))
    assert result.returncode == 0, result.stderr
    assert "SGLang memory lines (rank 0)" in result.stdout
    assert result.stdout.count("Next time, record the allocator's history") == 1


def test_sglang_speculative_captures_add_up() -> None:
    """A speculative engine captures the target's and the draft's graphs, each line in the
    newer wording ('Capture target verify CUDA graph end. elapsed=... s, mem usage=... GB,
    avail mem=... GB.'); the graphs term is their sum since the last memory pool."""
    p = "[2026-09-11 23:46:13 TP0 EP0] "
    usages = (600 * MIB, 300 * MIB)
    text = "\n".join([
        f"{p}Memory pool end. avail mem={gb(9 * GIB)} GB",
        f"{p}Capture target verify CUDA graph begin. backend=full, num_tokens_per_req=6, "
        f"bs=[1, 2, 3, 4], avail mem={gb(9 * GIB)} GB",
        f"{p}Capture target verify CUDA graph end. elapsed=13.48 s, mem usage="
        f"{gb(usages[0])} GB, avail mem={gb(9 * GIB - usages[0])} GB.",
        f"{p}Capture draft verify CUDA graph end. elapsed=2.10 s, mem usage="
        f"{gb(usages[1])} GB, avail mem={gb(9 * GIB - sum(usages))} GB.",
    ])
    (fw,) = weigh([read_text(text, "spec.log")]).frameworks
    terms = dict(fw.findings[0].terms)
    assert terms["CUDA graphs"] == sum(printed(u) for u in usages)
    assert terms["left after start-up"] == printed(9 * GIB - sum(usages))


def test_vllm_06_profiling_results_with_another_instance_on_the_card() -> None:
    """vLLM 0.6's worker: 'Memory profiling results: total_gpu_memory=%.2fGiB
    initial_memory_usage=%.2fGiB peak_torch_memory=%.2fGiB memory_usage_post_profile=%.2fGib
    non_torch_memory=%.2fGiB kv_cache_size=%.2fGiB gpu_memory_utilization=%.2f' (its 'Gib'
    as printed), after 'Loading model weights took %.4f GB'. A second instance held 40 GiB
    before profiling: said, with the budget total × utilisation."""
    total, util, weights, initial, peak, kv = 79.15, 0.90, 27.60, 68.01, 10.77, -8.00
    text = (f"INFO 12-06 14:55:15 model_runner.py:1077] Loading model weights took "
            f"{weights:.4f} GB\n"
            f"INFO 12-06 14:55:15 worker.py:232] Memory profiling results: total_gpu_memory="
            f"{total:.2f}GiB initial_memory_usage={initial:.2f}GiB peak_torch_memory="
            f"{peak:.2f}GiB memory_usage_post_profile={initial + 0.03:.2f}Gib non_torch_memory="
            f"0.40GiB kv_cache_size={kv:.2f}GiB gpu_memory_utilization={util:.2f}\n")
    (fw,) = weigh([read_text(text, "v06.log")]).frameworks
    terms = dict(fw.findings[0].terms)
    assert terms["budget (total × utilisation)"] == int(round(total * GIB) * util)
    assert terms["activation peak (profiling run)"] == round(peak * GIB)
    (held,) = [f for f in fw.findings if f.id == "vllm_held_at_start"]
    assert dict(held.terms)["held"] == round(initial * GIB) - round(weights * GIB)
    assert not fw.knobs  # another instance holds the memory: no utilisation to raise


def test_mangled_memory_lines_never_raise() -> None:
    """Every anchor followed by fragments of figures (commas alone, signs, units without
    numbers, numbers past their bounds): read or skipped, never an exception, and the
    judgements of what was read hold."""
    import random

    r = random.Random(57)
    bits = [",", ",,,", "-", "1", "0.5", "GB", "GiB", " ", "=", "x", "99999999999", "|", ".",
            " tokens", " tokens per request: ", " GB, V size: ", " | max allocated: "]
    lines = []
    for _ in range(3000):
        f = r.choice(line_formats())
        lines.append(r.choice(["", "[rank3]: ", "[2026 TP1] "]) + f.anchor
                     + "".join(r.choice(bits) for _ in range(r.randrange(0, 30))))
        lines.append(f.pattern.pattern.replace("\\", "")[:200])
    read = read_memory_lines(lines)
    weigh([read_text("\n".join(lines), "fuzz.log")])  # judged without raising
    bare = {f.id for f in line_formats() if f.pattern.match(f.anchor)}  # an error line: none
    assert all(m.figures or m.format in bare for m in read)


def test_sglang_distributed_init_and_a_pool_expanded_after_start_up() -> None:
    """model_runner.init_torch_distributed's f"Init torch distributed ends. mem usage={:.2f}
    GB" is a start-up term (NCCL's communicators, taken before the weights); memory_pool's
    f"Expand token kv pool to {size}, avail mem={:.2f} GB", printed after start-up, is the
    last free figure before the OOM where it is lower than what start-up left (#69)."""
    from snapana.render.text_log import text_log_view

    cap = int(79.19 * GIB)
    before, weights, kv_half, graphs, dist = cap - 2 * GIB, 15 * GIB, 20 * GIB, GIB, 1200 * MIB
    left = before - weights - 2 * kv_half - graphs
    later = left - 9 * GIB
    p = "[2026-02-01 00:05:02 TP0] "
    text = (f"{p}Init torch distributed begin.\n"
            f"{p}Init torch distributed ends. mem usage={gb(dist)} GB\n")
    text += sglang_startup(0, before, weights, kv_half, 300000, graphs, 0.85)
    text += f"{p}Expand token kv pool to 600000, avail mem={gb(later)} GB\n"
    request, free = later + GIB, later - 100 * MIB
    text += f"{p}Scheduler hit an exception: " + oom(request, free, cap, 60 * GIB, GIB,
                                                      cap - free) + "\n"
    ev = weigh([read_text(text, "s.log")])
    (fw,) = ev.frameworks
    budget = dict(next(f for f in fw.findings if f.id == "sglang_budget").terms)
    assert budget["torch distributed init"] == printed(dist)
    said = dict(next(f for f in fw.findings if f.id == "sglang_oom").terms)
    assert said["last avail mem before the OOM"] == printed(later)
    (sec,) = [s for s in text_log_view("s.log", ev).sections if s.id == "framework"]
    taken = printed(left) - printed(later)
    assert f"{taken / GIB:.2f} GiB taken after start-up" in " ".join(sec.sentences)
