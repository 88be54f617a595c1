"""OOMs raised outside PyTorch's caching allocator in wordings refused with exit 2 before
(issue 69), each written from the code that prints it: c10/cuda/driver_api.h
C10_CUDA_DRIVER_CHECK and Triton's launcher ('CUDA driver error: ' + cuGetErrorString), and
CTranslate2's src/cuda/utils.h CUDA_CHECK ('CUDA failed with error ' + cudaGetErrorString).
No figures, so no cause and no knob; CTranslate2 allocates without PyTorch, so no advice to
record PyTorch's allocator history."""

from __future__ import annotations

import json

import pytest
from snapana.log_session import weigh
from snapana.render.text_log import text_log_view
from snapana.sources.log_text import read_text

from .conftest import CORPUS

DRIVER = "RuntimeError: CUDA driver error: " + "out of memory"  # cuGetErrorString's string
CT2 = "RuntimeError: CUDA failed with error " + "out of memory"  # cudaGetErrorString's


@pytest.mark.parametrize(("line", "says", "records"), [
    (DRIVER, "a CUDA driver call ran out", True),
    (CT2, "CTranslate2 ran out of device memory", False),
])
def test_each_wording_is_read_without_figures(line: str, says: str, records: bool) -> None:
    ev = weigh([read_text(line + "\n", "t.log")])
    view = text_log_view("t.log", ev)
    assert ev.diagnoses == ()
    assert view.verdict is not None and says in view.verdict
    assert view.best_knobs == ()
    assert bool(view.record) is records


def test_corpus_ctranslate2_paste() -> None:
    path = CORPUS / "oom_messages" / "messages.jsonl"
    if not path.exists():
        pytest.skip("the corpus is not next to this checkout")
    text = next(m["text"] for m in map(json.loads, path.read_text().splitlines())
                if m["id"] == "oom-120")
    view = text_log_view("t.log", weigh([read_text(text, "t.log")]))
    assert "CTranslate2" in view.verdict and view.best_knobs == ()
