"""vLLM V1's warm-up refusal names its own knobs (issue 69): 'CUDA out of memory occurred
when warming up sampler with N dummy requests. Please try lowering `max_num_seqs` or
`gpu_memory_utilization` when initializing the engine.' Written from
vllm/v1/worker/gpu_model_runner.py _dummy_sampler_run (and _dummy_pooler_run's
'warming up pooler ({task=})'), behind the engine-core process's log prefix."""

from __future__ import annotations

import pytest
from snapana.log_session import weigh
from snapana.render.text_log import text_log_view
from snapana.sources.log_text import read_text

PREFIX = "(EngineCore_0 pid=4242) ERROR 05-02 10:11:12 [core.py:586] "


def warmup(num_reqs: int, what: str = "sampler") -> str:
    return (f"{PREFIX}RuntimeError: CUDA out of memory occurred when warming up {what} with "
            f"{num_reqs} dummy requests. Please try lowering `max_num_seqs` or "
            "`gpu_memory_utilization` when initializing the engine.\n")


@pytest.mark.parametrize("what", ["sampler", "pooler (task='embed')"])
def test_the_refusal_gets_the_two_knobs_it_names(what: str) -> None:
    view = text_log_view("t.log", weigh([read_text(warmup(256, what), "t.log")]))
    knobs = [k for k, _ in view.best_knobs]
    assert knobs[:2] == ["--max-num-seqs <fewer than 256>",
                         "--gpu-memory-utilization <lower than the one set>"]
    assert "Please try lowering `max_num_seqs`" in view.best_knobs[0][1]


def test_a_torch_oom_above_it_keeps_its_figures_and_the_knob_follows() -> None:
    oom = (f"{PREFIX}torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.74 GiB. "
           "GPU 0 has a total capacity of 15.48 GiB of which 953.94 MiB is free. Including "
           "non-PyTorch memory, this process has 14.53 GiB memory in use. Of the allocated "
           "memory 12.19 GiB is allocated by PyTorch, and 368.65 MiB is reserved by PyTorch "
           "but unallocated.\n")
    ev = weigh([read_text(oom + warmup(512), "t.log")])
    view = text_log_view("t.log", ev)
    assert ev.diagnoses[0].message.request is not None
    assert "--max-num-seqs <fewer than 512>" in [k for k, _ in view.best_knobs]
