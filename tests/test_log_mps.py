"""PyTorch's MPS (Apple GPU) allocator's own OOM wording (issue 69): refused with exit 2
before. Written from aten/src/ATen/mps/MPSAllocator.mm alloc_buffer_block's TORCH_CHECK
(with the high watermark on: '... max allowed: Z). Tried to allocate W on private pool. Use
PYTORCH_MPS_HIGH_WATERMARK_RATIO=0.0 ...'; with it off, no 'max allowed' and no hint), sizes
in format_size's units (bytes / KB / MB / GB on 1024 before, KiB / MiB / GiB since). The
ratio to try is recomputed here: max allowed = ratio × the recommended working set, the
default ratio 1.7 and its bound 2.0 (MPSAllocator.h)."""

from __future__ import annotations

import json
import math

import pytest
from snapana.log_session import weigh
from snapana.render.text_log import text_log_view
from snapana.sources.log_text import read_text

from .conftest import CORPUS, invoke

GIB, MIB = 1 << 30, 1 << 20
HINT = ("Use PYTORCH_MPS_HIGH_WATERMARK_RATIO=0.0 to disable upper limit for memory "
        "allocations (may cause system failure).")


def mps(allocated: str, other: str, allowed: str | None, request: str,
        pool: str = "private") -> str:
    limit = f", max allowed: {allowed}" if allowed else ""
    tail = f" {HINT}" if allowed else ""
    return (f"RuntimeError: MPS backend out of memory (MPS allocated: {allocated}, other "
            f"allocations: {other}{limit}). Tried to allocate {request} on {pool} pool.{tail}\n")


def _view(text: str):
    return text_log_view("t.log", weigh([read_text(text, "t.log")]))


@pytest.mark.parametrize(("g", "m"), [("GiB", "MiB"), ("GB", "MB")])
def test_a_small_excess_gets_the_ratio_that_covers_it(g: str, m: str) -> None:
    allocated, other, allowed, request = 9.57, 17.35, 27.20, 292.50  # GiB, GiB, GiB, MiB
    view = _view(mps(f"{allocated:.2f} {g}", f"{other:.2f} {g}", f"{allowed:.2f} {g}",
                     f"{request:.2f} {m}"))
    needed = round(allocated * GIB) + round(other * GIB) + round(request * MIB)
    ratio = math.ceil(1.7 * needed / round(allowed * GIB) * 100) / 100
    assert 1.7 < ratio <= 2.0
    (knob, why), *_ = view.best_knobs
    assert knob == f"PYTORCH_MPS_HIGH_WATERMARK_RATIO={ratio:.2f}"
    assert "may cause system failure" in why
    assert "over the 27.20 GiB it allows" in view.verdict
    assert view.record == ()  # torch.mps records no allocator history


def test_an_excess_no_ratio_within_its_bound_covers_gets_the_message_own_zero() -> None:
    # 8 + 10 + 2 GiB against 12 GiB: 1.7 × 20 / 12 = 2.83 > 2.0
    view = _view(mps("8.00 GiB", "10.00 GiB", "12.00 GiB", "2.00 GiB"))
    assert view.best_knobs[0][0] == "PYTORCH_MPS_HIGH_WATERMARK_RATIO=0.0"


def test_with_the_limit_off_no_ratio_is_offered() -> None:
    view = _view(mps("20.00 GiB", "3.00 GiB", None, "1.50 GiB", "shared"))
    assert view.best_knobs == ()
    assert "no watermark limit set" in view.verdict


def test_the_cli_reads_a_paste_of_it(tmp_path) -> None:
    f = tmp_path / "mac.log"
    f.write_text("Traceback (most recent call last):\n" + mps(
        "3.11 GB", "5.42 GB", "9.07 GB", "720.00 MB"))
    res = invoke("summary", "--format", "json", str(f))
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["record"] == []


def test_corpus_mps_paste() -> None:
    path = CORPUS / "oom_messages" / "messages.jsonl"
    if not path.exists():
        pytest.skip("the corpus is not next to this checkout")
    # oom-133 as pasted: 9.57 GiB + 17.35 GiB + 292.50 MiB is just over 27.20 GiB
    text = next(m["text"] for m in map(json.loads, path.read_text().splitlines())
                if m["id"] == "oom-133")
    view = _view(text)
    assert view.best_knobs[0][0].startswith("PYTORCH_MPS_HIGH_WATERMARK_RATIO=")
    assert float(view.best_knobs[0][0].split("=")[1]) > 1.7
