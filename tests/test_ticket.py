"""Issue 60: `snapana ticket FILE -o DIR` (and `Analysis.ticket`) writes what a ticket needs:
`card.png` (decoded here: 800 px wide, each family's bar in the report's colour where the
layout puts it), `ticket.md` (the card embedded, under GitHub's 65,536 characters),
`report.html` and `summary.json`; an output that is an input is refused."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from PIL import Image
from snapana import api
from snapana.io.ticket import MARKDOWN_LIMIT, TICKET_FILES
from snapana.render.card import WIDTH, card_layout
from snapana.render.markdown import esc
from snapana.render.views import capture_view, family_colour

from .conftest import SAMPLES, corpus_ooms, invoke

SAMPLE_FILES = sorted(SAMPLES.glob("*.pickle"))


def _rgb(colour: str) -> tuple[int, int, int]:
    return tuple(int(colour[i:i + 2], 16) for i in (1, 3, 5))  # type: ignore[return-value]


def _check_ticket(path: Path, out: Path) -> None:
    started = time.perf_counter()
    run = invoke("ticket", str(path), "-o", str(out))
    took = time.perf_counter() - started
    assert run.returncode == 0, run.stderr
    assert sorted(p.name for p in out.iterdir()) == sorted(TICKET_FILES)
    data = json.loads((out / "summary.json").read_text())
    first = data["devices"][0]
    # the card: the picture's size is the layout's, every bar in its family's report colour
    view = capture_view([api.load(path, device=first["device"]).device_report],
                        title=path.name).devices[0]
    layout = card_layout(view, path.name)
    image = Image.open(out / "card.png").convert("RGB")
    assert image.size == (WIDTH, layout.height)
    groups = [g["family"] for g in first["groups"]]
    assert [b.label.split("  ")[0] for b in layout.bars][:len(groups[:8])] == groups[:8]
    for bar, family in zip(layout.bars, groups[:8], strict=False):
        left, top, right, bottom = bar.box
        x, y = (left + right - 1) // 2, (top + bottom) // 2
        assert image.getpixel((x, y)) == _rgb(family_colour(family)), family
    md = (out / "ticket.md").read_text()
    assert md.startswith("![") and "](card.png)" in md.splitlines()[0]
    assert len(md) < MARKDOWN_LIMIT
    assert esc(first["diagnosis"]["headline"]) in md  # as markdown shows it: escaped
    page = (out / "report.html").read_text()
    assert page.startswith("<!DOCTYPE html>") and "cdn." not in page
    assert took < 60, took
    assert (out / "card.png").stat().st_size < 200_000


@pytest.mark.parametrize("path", SAMPLE_FILES, ids=lambda p: p.name)
def test_ticket_of_every_sample(path: Path, tmp_path: Path) -> None:
    _check_ticket(path, tmp_path / "ticket")


@pytest.mark.corpus
@pytest.mark.parametrize("path", corpus_ooms())
def test_ticket_of_every_corpus_oom(path: Path, tmp_path: Path) -> None:
    _check_ticket(path, tmp_path / "ticket")


def test_the_api_writes_the_same_four_files(tmp_path: Path) -> None:
    a = api.load(SAMPLES / "slime-tp2-chunked-logprob-oom.pickle")
    written = a.ticket(tmp_path / "t")
    assert [p.name for p in written] == list(TICKET_FILES)
    assert a.headline in (tmp_path / "t" / "ticket.md").read_text()


def test_an_output_that_is_an_input_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "incident"
    folder.mkdir()
    src = SAMPLES / "fsdp-train-step.pickle"
    (folder / "card.png").write_bytes(src.read_bytes())
    run = invoke("ticket", str(folder / "card.png"), "-o", str(folder))
    assert run.returncode == 2 and "input" in run.stderr, run.stderr
    assert (folder / "card.png").read_bytes() == src.read_bytes()  # untouched
    assert sorted(p.name for p in folder.iterdir()) == ["card.png"]
    target = tmp_path / "file"
    target.write_text("x")
    run = invoke("ticket", str(src), "-o", str(target))
    assert run.returncode == 2 and "not a folder" in run.stderr


def test_markdown_is_cut_under_the_limit() -> None:
    from snapana.io import ticket

    a = api.load(SAMPLES / "slime-tp2-chunked-logprob-oom.pickle")
    small = ticket.MARKDOWN_LIMIT
    try:
        ticket.MARKDOWN_LIMIT = 3000
        md = ticket.ticket_markdown(a.view)
    finally:
        ticket.MARKDOWN_LIMIT = small
    assert len(md) <= 3000 and "report.html holds every section" in md
    assert md.startswith("![") and a.headline in md
