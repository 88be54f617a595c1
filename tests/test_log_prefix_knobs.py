"""vLLM's worker prefix before an OOM message (issue 69): vllm/v1/executor/multiproc_executor.py
WorkerProc names its process '(VllmWorker rank=N pid=P)' (vllm/utils _add_prefix) before
every line it prints. A V1 worker captures its CUDA graphs after the KV cache is allocated,
so a message that shows memory in private pools (PyTorch 2.6+: 'with X allocated in private
pools (e.g., CUDA Graphs)', c10/cuda/CUDACachingAllocator.cpp) came after the cache took its
share: --gpu-memory-utilization is that moment's knob. Without the clause, or behind
another process's prefix, no such knob."""

from __future__ import annotations

import json

import pytest
from snapana.log_session import weigh
from snapana.render.text_log import text_log_view
from snapana.sources.log_text import read_text

from .conftest import CORPUS

KNOB = "--gpu-memory-utilization <lower than the one set>"


def oom(pools: str | None) -> str:
    """PyTorch 2.6+'s message; `pools`: the private-pool clause's figure (None: not printed)."""
    pool = f", with {pools} allocated in private pools (e.g., CUDA Graphs)," if pools else ""
    return ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.74 GiB. GPU 0 has "
            "a total capacity of 23.57 GiB of which 605.88 MiB is free. Including non-PyTorch "
            "memory, this process has 22.97 GiB memory in use. Of the allocated memory 20.21 "
            f"GiB is allocated by PyTorch{pool} and 185.98 MiB is reserved by PyTorch but "
            "unallocated.\n")


def _knobs(text: str) -> list[str]:
    return [k for k, _ in text_log_view("t.log", weigh([read_text(text, "t.log")])).best_knobs]


@pytest.mark.parametrize("prefix", [
    "(VllmWorker rank=1 pid=2978) ERROR 03-19 07:27:53 [multiproc_executor.py:375] ",
    "(EngineCore_DP0 pid=811) ERROR 09-02 01:02:03 [core.py:700] ",
    "(EngineCore_0 pid=811) ",
])
def test_a_vllm_worker_oom_after_its_graphs_gets_the_utilisation_knob(prefix: str) -> None:
    assert _knobs(prefix + oom("128.00 MiB"))[0] == KNOB


@pytest.mark.parametrize("text", [
    "(VllmWorker rank=1 pid=2978) " + oom(None),  # no private pools: loading, profiling
    "(MegatronTrainRayActor pid=1234) " + oom("128.00 MiB"),  # another framework's process
    oom("128.00 MiB"),  # no prefix
])
def test_no_knob_without_the_prefix_or_the_clause(text: str) -> None:
    assert KNOB not in _knobs(text)


@pytest.mark.parametrize("mid", ["oom-139", "oom-140"])
def test_corpus_vllm_worker_pastes(mid: str) -> None:
    path = CORPUS / "oom_messages" / "messages.jsonl"
    if not path.exists():
        pytest.skip("the corpus is not next to this checkout")
    text = next(m["text"] for m in map(json.loads, path.read_text().splitlines())
                if m["id"] == mid)
    # as pasted: '(VllmWorker rank=N pid=P) ERROR ...' and 'with ... allocated in private
    # pools (e.g., CUDA Graphs)': a V1 worker after its graphs, so after the KV cache
    assert "(VllmWorker rank=" in text and "allocated in private pools" in text
    assert _knobs(text)[0] == KNOB
