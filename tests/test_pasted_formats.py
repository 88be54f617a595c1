"""Logs as they are pasted (issue 69): formats that were refused with exit 2 or half read.
Each line is written here with the framework's own format string (cited above each
writer, as read in its source), filled with figures the test chooses; expected figures are
recomputed from those figures (or from the corpus's raw text) by the test's own arithmetic."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from snapana.log_session import weigh
from snapana.render.text_log import text_log_view
from snapana.sources.log_text import read_text

from .conftest import invoke

GIB, MIB = 1 << 30, 1 << 20
CORPUS = Path(__file__).resolve().parents[1] / ".." / "shared" / "corpus" / "oom_messages"


def gib(x: float) -> int:
    """The bytes a '%.2f' GiB figure stands for."""
    return round(round(x, 2) * GIB)


def _summary(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    result = invoke("summary", str(path))
    assert result.returncode == 0, result.stderr
    return result.stdout


def vllm_064(total: float, initial: float, peak: float, post: float, non_torch: float,
             kv: float, util: float) -> str:
    """vLLM 0.6.4's vllm/worker/worker.py determine_num_available_blocks: logger.info(
    "Memory profiling results: duration=%.2f seconds, total_gpu_memory=%.2fGiB,
    initial_memory_usage=%.2fGiB, peak_torch_memory=%.2fGiB,
    memory_usage_post_profile=%.2fGiB, non_torch_memory=%.2fGiB, kv_cache_size=%.2fGiB,
    gpu_memory_utilization=%.2f.", ...)."""
    return ("INFO 11-26 08:01:12 worker.py:232] Memory profiling results: duration=4.31 "
            f"seconds, total_gpu_memory={total:.2f}GiB, initial_memory_usage={initial:.2f}GiB, "
            f"peak_torch_memory={peak:.2f}GiB, memory_usage_post_profile={post:.2f}GiB, "
            f"non_torch_memory={non_torch:.2f}GiB, kv_cache_size={kv:.2f}GiB, "
            f"gpu_memory_utilization={util:.2f}.\n")


def test_vllm_064_profiling_results_alone_are_read(tmp_path: Path) -> None:
    total, util, peak, non_torch = 79.15, 0.90, 16.80, 0.55
    kv = total * util - peak - non_torch - 1.0  # what the block says is left for the cache
    text = vllm_064(total, 15.62, peak, 15.75, non_torch, kv, util)
    (fw,) = weigh([read_text(text, "v064.log")]).frameworks
    terms = dict(fw.findings[0].terms)
    assert terms["card (total_gpu_memory)"] == gib(total)
    assert terms["budget (total × utilisation)"] == int(gib(total) * util)
    assert terms["activation peak (profiling run)"] == gib(peak)
    assert terms["non-torch memory"] == gib(non_torch)
    assert terms["KV cache"] == gib(kv)
    out = _summary(tmp_path, "v064.log", text)  # refused with exit 2 before
    assert "vLLM memory lines" in out


def slime_usage(rank: int, msg: str, total: int, free: int, allocated: int,
                reserved: int) -> str:
    """slime/utils/memory_utils.py print_memory: logger.info(f"[Rank {dist.get_rank()}]
    Memory-Usage {msg}: {memory_info}"), memory_info = available_memory(): {"gpu":
    str(device), "total_GB": _byte_to_gb(total), "free_GB": ..., "used_GB":
    _byte_to_gb(total - free), "allocated_GB": ..., "reserved_GB": ...}, _byte_to_gb(n) =
    round(n / (1024**3), 2)."""
    info = {"gpu": str(rank % 8), "total_GB": round(total / GIB, 2),
            "free_GB": round(free / GIB, 2), "used_GB": round((total - free) / GIB, 2),
            "allocated_GB": round(allocated / GIB, 2), "reserved_GB": round(reserved / GIB, 2)}
    return f"(MegatronTrainRayActor pid=4242) [Rank {rank}] Memory-Usage {msg}: {info}\n"


def test_slime_memory_usage_per_rank_and_a_colocated_engine(tmp_path: Path) -> None:
    total = int(79.11 * GIB)
    text = (slime_usage(0, "before offload model", total, 30 * GIB, 40 * GIB, 45 * GIB)
            + slime_usage(1, "after offload model", total, 9 * GIB, 2 * GIB, 3 * GIB))
    fws = {f.rank: f for f in weigh([read_text(text, "slime.log")]).frameworks}
    assert set(fws) == {0, 1}
    t1 = dict(fws[1].findings[0].terms)
    used = gib((total - 9 * GIB) / GIB)
    assert t1["used"] == used and t1["reserved"] == gib(3)
    # rank 1: most of the card is used outside its PyTorch cache (the rollout engine woke)
    (elsewhere,) = [f for f in fws[1].findings if f.id == "usage_elsewhere"]
    assert dict(elsewhere.terms)["outside"] == used - gib(3) >= gib(79.11) / 2
    assert not [f for f in fws[0].findings if f.id == "usage_elsewhere"]  # 45 of 49 its own
    out = _summary(tmp_path, "slime.log", text)
    assert "something else holds this GPU" in out


def test_a_json_error_body_in_a_file_is_read_as_on_standard_input(tmp_path: Path) -> None:
    """An inference server's reply saved as a .log: OpenAI's error shape (vLLM's and SGLang's
    OpenAI-compatible servers) and vLLM's older ErrorResponse ({"object": "error", ...})."""
    message = ("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
               "79.15 GiB of which 1.00 GiB is free. Including non-PyTorch memory, this "
               "process has 78.14 GiB memory in use. Of the allocated memory 70.00 GiB is "
               "allocated by PyTorch, and 7.00 GiB is reserved by PyTorch but unallocated.")
    for body in ({"error": {"message": message, "type": "InternalServerError", "code": 500}},
                 {"object": "error", "message": message, "type": "BadRequestError",
                  "param": None, "code": 400}):
        out = _summary(tmp_path, "reply.log", json.dumps(body))
        assert "for a request of 2.00 GiB" in out
        assert "fragmentation: PyTorch held 7.00 GiB" in out  # 7.00 GiB cached >= 2.00 asked


def test_cuda_error_out_of_memory_has_no_allocator_figures(tmp_path: Path) -> None:
    """c10/cuda/CUDAException.h C10_CUDA_CHECK: "CUDA error: " + cudaGetErrorString(err),
    with cudaErrorMemoryAllocation's string 'out of memory', and the lines PyTorch adds."""
    text = ("  File \"model.py\", line 88, in forward\n    return F.linear(x, self.weight)\n"
            "RuntimeError: CUDA error: out of memory\nCUDA kernel errors might be "
            "asynchronously reported at some other API call, so the stacktrace below might be "
            "incorrect.\nFor debugging consider passing CUDA_LAUNCH_BLOCKING=1.\n")
    out = _summary(tmp_path, "cublas.log", text)
    verdict = out.split("\n\n")[0]
    assert "outside PyTorch's caching allocator" in verdict
    assert "no allocator figures" in verdict


def cublas_error(status: str, call: str) -> str:
    """aten/src/ATen/cuda/Exceptions.h TORCH_CUDABLAS_CHECK: "CUDA error: " +
    _cublasGetErrorEnum(err) + " when calling `" #EXPR "`", raised from the op's frame."""
    return ("  File \"net.py\", line 12, in forward\n    return F.linear(x, self.w)\n"
            f"RuntimeError: CUDA error: {status} when calling `{call}`\n")


def test_cublas_alloc_failed_is_read_as_an_oom_outside_the_allocator(tmp_path: Path) -> None:
    """CUBLAS_STATUS_ALLOC_FAILED (cuBLAS's own handle / workspace memory) is an OOM with no
    allocator figures, said so in its own words, not refused; another cuBLAS status is not
    an OOM and is not read as one."""
    out = _summary(tmp_path, "cublas.log",
                   cublas_error("CUBLAS_STATUS_ALLOC_FAILED", "cublasCreate(handle)"))
    verdict = " ".join(out.split("\n\n")[0].split())
    assert "CUBLAS_STATUS_ALLOC_FAILED" in verdict and "no allocator figures" in verdict
    assert "'CUDA error: out of memory'" not in verdict
    (fw,) = weigh([read_text(cublas_error("CUBLAS_STATUS_ALLOC_FAILED", "cublasCreate(h)")
                             * 2, "x.log")]).frameworks
    assert [(f.id, dict(f.terms)["times"]) for f in fw.findings] == [("cublas_alloc_failed", 2)]
    assert read_text(cublas_error("CUBLAS_STATUS_EXECUTION_FAILED", "cublasGemmEx(...)"),
                     "y.log").empty


def nccl_calloc(size: int, host: str = "node2:24881:25568 [2]") -> str:
    """NCCL src/include/alloc.h: CUDACHECK's WARN("Cuda failure '%s'", cudaGetErrorString(
    err)) then ncclCudaCallocDebug's WARN("Failed to CUDA calloc %ld bytes", nelem *
    sizeof(T)), each behind NCCL's "host:pid:tid [dev] file:line NCCL WARN " prefix."""
    return (f"{host} include/alloc.h:178 NCCL WARN Cuda failure 'out of memory'\n\n"
            f"{host} include/alloc.h:185 NCCL WARN Failed to CUDA calloc {size} bytes\n")


def test_nccl_calloc_is_read_with_its_size(tmp_path: Path) -> None:
    size = 6291456
    (fw,) = weigh([read_text(nccl_calloc(size), "nccl.log")]).frameworks
    assert fw.framework == "nccl"
    assert dict(fw.findings[0].terms)["size"] == size
    out = _summary(tmp_path, "nccl.log", nccl_calloc(size))
    assert f"{size:,} bytes" in out and "outside PyTorch's caching allocator" in out


def test_corpus_nccl_message_is_read() -> None:
    """The corpus's NCCL thread (format 'other', NVIDIA/nccl#1485): its size is the integer
    of its 'Failed to CUDA calloc N bytes' line, read here by splitting the raw text."""
    path = CORPUS / "messages.jsonl"
    if not path.exists():
        pytest.skip("corpus not present")
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    nccl = [r for r in rows if "Failed to CUDA calloc" in r["text"]]
    assert nccl
    for r in nccl:
        size = int(r["text"].split("Failed to CUDA calloc ")[1].split(" bytes")[0]
                   .removeprefix("async "))
        fws = [f for f in weigh([read_text(r["text"], r["id"])]).frameworks
               if f.framework == "nccl"]
        assert fws and dict(fws[0].findings[0].terms)["size"] == size, r["id"]


def test_vllm_cumem_allocator_oom(tmp_path: Path) -> None:
    """vllm csrc/cumem_allocator.cpp CUDA_CHECK: "CUDA Error: %s at %s:%d" (cuGetErrorString,
    __FILE__, __LINE__), raised by vllm/device_allocator/cumem.py's CuMemAllocator on
    wake_up."""
    text = ("  File \"/usr/local/lib/python3.12/dist-packages/vllm/device_allocator/cumem.py\","
            " line 215, in wake_up\n    create_and_map(handle)\n"
            "RuntimeError: CUDA Error: out of memory at /workspace/csrc/cumem_allocator.cpp:139\n")
    (fw,) = weigh([read_text(text, "wake.log")]).frameworks
    (f,) = [f for f in fw.findings if f.id == "vllm_cumem_oom"]
    assert dict(f.terms)["source line"] == 139
    out = _summary(tmp_path, "wake.log", text)
    assert "CuMemAllocator" in out.split("\n\n")[0]


def sglang_kv(tokens: int, k: int, v: int, dtype: str | None) -> str:
    """sglang/srt/mem_cache/memory_pool.py MHATokenToKVPool: f"KV Cache is allocated.
    #tokens: {size}, K size: {k_size / GB:.2f} GB, V size: {v_size / GB:.2f} GB", and the
    later wording with the cache dtype first: "KV Cache is allocated. dtype: {dtype},
    #tokens: ..."."""
    infix = f" dtype: {dtype}," if dtype else ""
    return (f"[2026-05-02 10:11:12 TP0] KV Cache is allocated.{infix} #tokens: {tokens}, "
            f"K size: {k / GIB:.2f} GB, V size: {v / GIB:.2f} GB\n")


@pytest.mark.parametrize("dtype", [None, "torch.bfloat16", "torch.float8_e4m3fn"])
def test_sglang_kv_line_with_and_without_its_dtype(dtype: str | None) -> None:
    k = v = 27 * GIB + 300 * MIB
    (fw,) = weigh([read_text(sglang_kv(399740, k, v, dtype), "kv.log")]).frameworks
    budget = dict(fw.findings[0].terms)
    assert budget["KV cache pool"] == 2 * gib(k / GIB)
    tokens = dict(next(f for f in fw.findings if f.id == "sglang_kv_tokens").terms)
    assert tokens["tokens"] == 399740


@pytest.mark.parametrize("fraction", [None, 0.7])
def test_sglang_refusal_is_the_verdict(tmp_path: Path, fraction: float | None) -> None:
    """sglang model_runner.init_memory_pool: raise RuntimeError("Not enough memory. Please
    try to increase --mem-fraction-static.") — newer (mem_cache pool_configurator
    MemoryPoolConfig.__post_init__) adds f" Current value: mem_fraction_static={...}"."""
    p = "[2026-05-02 10:11:12 TP0] "
    msg = "Not enough memory. Please try to increase --mem-fraction-static."
    if fraction is not None:
        msg += f" Current value: mem_fraction_static={fraction}"
    text = (f"{p}Load weight begin. avail mem=78.50 GB\n"
            f"{p}Load weight end. type=Qwen3ForCausalLM, dtype=torch.bfloat16, avail "
            f"mem=12.25 GB, mem usage=66.25 GB.\n"
            f"{p}Scheduler hit an exception: Traceback (most recent call last):\n"
            f"RuntimeError: {msg}\n")
    ev = weigh([read_text(text, "refused.log")])
    (fw,) = ev.frameworks
    assert fw.findings[-1].id == "sglang_not_enough"
    (sec,) = [s for s in text_log_view("refused.log", ev).sections if s.id == "framework"]
    assert "refused to start" in sec.verdict
    if fraction is not None:
        assert f"mem_fraction_static = {fraction:.2f}" in sec.verdict
    out = _summary(tmp_path, "refused.log", text)
    assert "refused to start" in out.split("\n\n")[0]
