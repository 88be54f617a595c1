"""PyTorch's cudaMallocAsync backend's own OOM wording (issue 69): refused with exit 2
before. Written from c10/cuda/CUDAMallocAsyncAllocator.cpp mallocAsync's
TORCH_CHECK_WITH(OutOfMemoryError, ...): the refusal line, then 'Currently allocated',
'Requested', 'Device limit', 'Free (according to CUDA)' and the memory-fraction limit, each on
a line of its own, sizes by c10's format_size. The figures an engineer needs are recomputed
here; no knob is offered (nothing in the text says what the live allocations are), and no
advice to record history (the backend's recordHistory raises 'does not yet support')."""

from __future__ import annotations

import json

import pytest
from snapana.log_session import weigh
from snapana.render.text_log import text_log_view
from snapana.sources.log_text import read_text

from .conftest import CORPUS, invoke

GIB, MIB = 1 << 30, 1 << 20


def refusal(device: int, allocated: str, request: str, total: str, free: str,
            limit: str = "17179869184.00 GiB", pad: bool = True) -> str:
    """The message as PyTorch prints it (`pad`) or as a paste that collapsed the padding."""
    def row(name: str, width: int) -> str:
        return f"{name}{' ' * (width - len(name)) if pad else ' '}: "
    return (f"torch.OutOfMemoryError: Allocation on device {device} would exceed allowed "
            "memory. (out of memory)\n"
            f"{row('Currently allocated', 24)}{allocated}\n{row('Requested', 24)}{request}\n"
            f"{row('Device limit', 24)}{total}\nFree (according to CUDA): {free}\n"
            "PyTorch limit (set by user-supplied memory fraction)\n"
            f"                        : {limit}\n")


def _view(text: str):
    return text_log_view("t.log", weigh([read_text(text, "t.log")]))


@pytest.mark.parametrize("pad", [True, False])
def test_the_figures_and_what_was_neither_live_nor_free(pad: bool) -> None:
    view = _view(refusal(0, "21.55 GiB", "952.00 MiB", "24.00 GiB", "0 bytes", pad=pad))
    elsewhere = round(24.00 * GIB) - 0 - round(21.55 * GIB)  # total - free - allocated
    assert view.verdict is not None
    assert "952.00 MiB requested with 21.55 GiB allocated by PyTorch" in view.verdict
    assert f"{elsewhere / GIB:.2f} GiB was neither PyTorch's live allocations nor free" \
        in view.verdict
    assert view.best_knobs == ()
    assert view.record == ()


def test_the_refusal_alone_says_its_figures_are_missing() -> None:
    text = ("torch.OutOfMemoryError: Allocation on device 0 would exceed allowed memory. "
            "(out of memory)\n")
    view = _view(text)
    assert "holds none of the figures" in view.verdict


def test_figure_lines_without_the_refusal_are_not_read() -> None:
    log = read_text("Requested : 5.00 MB\nDevice limit : 8.00 GiB\n", "t.log")
    assert log.memory_lines == () and log.empty


def test_the_cli_reads_the_file(tmp_path) -> None:
    f = tmp_path / "comfy.log"
    f.write_text("Exception during processing\n" + refusal(1, "9.43 GiB", "640.00 MiB",
                                                           "11.59 GiB", "7.12 MiB", pad=False))
    res = invoke("summary", "--format", "json", str(f))
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["record"] == []


def test_corpus_paste() -> None:
    path = CORPUS / "oom_messages" / "messages.jsonl"
    if not path.exists():
        pytest.skip("the corpus is not next to this checkout")
    text = next(m["text"] for m in map(json.loads, path.read_text().splitlines())
                if m["id"] == "oom-127")
    view = _view(text)
    # as printed: 952.00 MiB requested, 21.55 GiB allocated, 24.00 GiB total, 0 bytes free
    assert "952.00 MiB requested with 21.55 GiB allocated" in view.verdict
    assert "2.45 GiB was neither" in view.verdict
