"""Issue 60: `snapana ticket FILE -o DIR` (and `Analysis.ticket`) writes what a ticket needs:
`card.png` (decoded here: 800 px wide, each family's bar in the report's colour where the
layout puts it), `ticket.md` (a first line for the card, under GitHub's 65,536 characters),
`report.html`, `report.html.zip` and `summary.json`; an output that is an input is refused."""

from __future__ import annotations

import json
import time
import zipfile
from html.parser import HTMLParser
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
    assert md.splitlines()[0].startswith("<!-- snapana: drop card.png") and "![" not in md
    assert len(md) < MARKDOWN_LIMIT
    assert esc(first["diagnosis"]["headline"]) in md  # as markdown shows it: escaped
    _as_github_shows(md, first["diagnosis"]["headline"])
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


def test_the_api_writes_the_same_five_files(tmp_path: Path) -> None:
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
    assert len(md) <= 3000 and "report.html.zip holds every section" in md
    assert md.startswith("<!-- snapana: drop card.png") and a.headline in md


#: GitHub's issue body as a tracker shows it at its narrowest usual width, in CSS px.
TRACKER_WIDTH = 800
#: Widths that overestimate GitHub's fonts (16 px body text, 85 % monospace): px a character.
TEXT_PX, CODE_PX = 9.6, 8.2
#: A cell's horizontal padding and border (GitHub: 6px 13px, 1 px border).
CELL_PX = 27


class _Rendered(HTMLParser):
    """A GFM page's text (alt text included), images and tables: each table a list of rows,
    each row a list of cells, each cell its (text, code) pieces."""

    def __init__(self, page: str) -> None:
        super().__init__(convert_charrefs=True)
        self.text: list[str] = []
        self.images: list[str] = []
        self.tables: list[list[list[list[tuple[str, bool]]]]] = []
        self._code = False
        self._cell: list[tuple[str, bool]] | None = None
        self.feed(page)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "img":
            self.images.append(dict(attrs).get("src") or "")
            self.text.append(dict(attrs).get("alt") or "")
        elif tag == "table":
            self.tables.append([])
        elif tag == "tr":
            self.tables[-1].append([])
        elif tag in ("td", "th"):
            self._cell = []
            self.tables[-1][-1].append(self._cell)
        elif tag == "code":
            self._code = True

    def handle_endtag(self, tag: str) -> None:
        if tag == "code":
            self._code = False
        elif tag in ("td", "th"):
            self._cell = None

    def handle_data(self, data: str) -> None:
        self.text.append(data)
        if self._cell is not None:
            self._cell.append((data, self._code))


def _least_width(cell: list[tuple[str, bool]]) -> float:
    """The narrowest a cell can wrap to: its longest run without a space (a browser breaks a
    table cell's text at spaces only; a path in a code span does not wrap)."""
    return max((len(word) * (CODE_PX if code else TEXT_PX)
                for text, code in cell for word in text.split()), default=0.0)


def _as_github_shows(md: str, headline: str) -> None:
    """`ticket.md` rendered by cmark-gfm as GitHub renders an issue body: no image (a
    relative one is broken until uploaded), no table over 4 columns or wider than the
    tracker's page at its narrowest wrapping, the headline once, each attachment named."""
    import cmarkgfm
    from cmarkgfm.cmark import Options

    page = _Rendered(cmarkgfm.markdown_to_html_with_extensions(
        md, options=Options.CMARK_OPT_UNSAFE,
        extensions=["autolink", "table", "strikethrough", "tagfilter"]))
    assert page.images == []
    for table in page.tables:
        assert max(len(row) for row in table) <= 4, table[0]
        columns = [max(_least_width(row[i]) for row in table if i < len(row))
                   for i in range(max(len(row) for row in table))]
        assert sum(w + CELL_PX for w in columns) <= TRACKER_WIDTH, (columns, table[0])
    text = " ".join("".join(page.text).split())
    first = " ".join(headline.split(" First fix: ")[0].split())
    assert text.count(first) == 1, first
    for name in TICKET_FILES:
        if name != "ticket.md":
            assert name in text, name


def test_the_zip_holds_the_report_and_stdout_the_body(tmp_path: Path) -> None:
    """Issue 71: `report.html.zip` (GitHub attaches a .zip, not an .html) opens to the very
    bytes `snapana report` writes; `--stdout` prints ticket.md (for `gh issue create
    --body-file -`), what was written said on stderr only."""
    path = SAMPLES / "slime-tp2-chunked-logprob-oom.pickle"
    run = invoke("ticket", str(path), "-o", str(tmp_path / "t"), "--stdout")
    assert run.returncode == 0, run.stderr
    assert run.stdout == (tmp_path / "t" / "ticket.md").read_text()
    assert "wrote " in run.stderr and "wrote " not in run.stdout
    report = invoke("report", str(path), "-o", str(tmp_path / "r.html"))
    assert report.returncode == 0, report.stderr
    with zipfile.ZipFile(tmp_path / "t" / "report.html.zip") as archive:
        assert archive.namelist() == ["report.html"]
        assert archive.read("report.html") == (tmp_path / "r.html").read_bytes()
    assert (tmp_path / "t" / "report.html").read_bytes() == (tmp_path / "r.html").read_bytes()
