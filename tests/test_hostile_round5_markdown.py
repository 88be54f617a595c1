"""Issue 66, the fifth hostile round: no live markdown from an input.

A frame's name (a snapshot's stack, a log's traceback) or a file's name is written into
ticket.md and `summary -f markdown`. Each output is rendered here by GitHub's own renderer
(cmark-gfm, with the autolink, table, strikethrough and tagfilter extensions, raw HTML kept so
that any the input made shows): it must hold exactly the elements the same output holds for a
harmless name (no link, image, emphasis or tag more), and show the name as written, its
zero-width and bidi characters escaped (`\\u200b`).
"""

from __future__ import annotations

import pickle
import random
import re
from collections import Counter
from html.parser import HTMLParser
from pathlib import Path

import cmarkgfm
import pytest
from cmarkgfm.cmark import Options
from snapana.render.markdown import code, esc
from snapana.sources.oom_text import unescape
from snapana.units import inert

from .conftest import invoke
from .test_log_traceback import SLIME_FRAMES, message, traceback_lines

EXTENSIONS = ["autolink", "table", "strikethrough", "tagfilter"]

HOSTILE = (
    "![x](https://evil.example/p.png)", "[click](javascript:alert(1))",
    "<img src=x onerror=alert(1)>", "<https://evil.example>", "www.evil.example",
    "https://evil.example", "x@evil.example", "**bold**", "_em_", "~~gone~~", "a|b",
    "``a`b``", "&lt;", "&#x3C;b&#x3E;", "a\u200bb\u200cc\u200dd\ufeff", "\u202eevil\u2066",
    "$x$", "# heading", "1. item",
)
BENIGN = "benign_name"
#: Characters that must never reach a rendered page raw.
INVISIBLE = re.compile("[\u200b-\u200f\u202a-\u202e\u2060-\u2069\ufeff]")


def gfm(markdown: str) -> str:
    """`markdown` as GitHub renders it (raw HTML kept, so a tag the input made is seen)."""
    return cmarkgfm.markdown_to_html_with_extensions(
        markdown, options=Options.CMARK_OPT_UNSAFE, extensions=EXTENSIONS)


class _Page(HTMLParser):
    """The elements (start tags) and the text of a rendered page; comments other than the
    empty one that splits an e-mail address are counted as tags."""

    def __init__(self, page: str) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: Counter[str] = Counter()
        self.text: list[str] = []
        self.feed(page)
        self.close()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags[tag] += 1

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags[tag] += 1

    def handle_comment(self, data: str) -> None:
        if data:
            self.tags["<!--"] += 1

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def _snapshot(path: Path, name: str) -> Path:
    """A small snapshot whose every block was made in a frame called `name` in a file called
    `name` (so both reach the verdict and the table's top site)."""
    blocks = [{"address": (1 << 40) + (1 << 20) * i, "size": 1 << 20,
               "requested_size": 1 << 20, "state": "active_allocated",
               "frames": [{"filename": f"/app/{name}.py", "name": name, "line": 7},
                          {"filename": "/app/main.py", "name": "main", "line": 1}]}
              for i in range(4)]
    trace = [{"action": "alloc", "addr": b["address"], "size": 1 << 20, "stream": 0,
              "frames": b["frames"]} for b in blocks]
    snap = {"segments": [{"device": 0, "address": 1 << 40, "total_size": 4 << 20,
                          "stream": 0, "segment_type": "large", "blocks": blocks}],
            "device_traces": [trace]}
    path.write_bytes(pickle.dumps(snap, protocol=4))
    return path


def _log(path: Path, name: str) -> Path:
    """slime's log-prob traceback with one more slime frame, in a file and function called
    `name` (a function name has no space or comma, as the traceback reader takes it)."""
    function = name if not re.search(r"[\s,]", name) else "f"
    frames = [*SLIME_FRAMES[:3], (f"/root/slime/slime/utils/{name}.py", 9, function, "x = y"),
              *SLIME_FRAMES[3:]]
    oom = message("7.50 GiB", "975.94 MiB", "78.25 GiB", "77.28 GiB", "66.45 MiB")
    path.write_text("\n".join(traceback_lines(frames, "torch.OutOfMemoryError: " + oom)) + "\n")
    return path


def _assert_inert(hostile: str, benign: str, shown: str | None) -> None:
    """The hostile output renders to the benign one's elements (no link; no image but the
    card), shows `shown` as written (escaped where invisible), and no raw invisible
    character."""
    rendered = gfm(hostile)
    page, same = _Page(rendered), _Page(gfm(benign))
    assert page.tags == same.tags, (page.tags - same.tags, same.tags - page.tags)
    assert "<a " not in rendered
    assert set(re.findall(r'<img src="([^"]*)"', rendered)) <= {"card.png"}
    if shown is not None:
        assert inert(shown, lines=False) in "".join(page.text)
    assert not INVISIBLE.search(rendered)


@pytest.mark.parametrize("name", HOSTILE)
def test_a_frames_name_makes_no_markdown_in_the_summary(name: str, tmp_path: Path) -> None:
    """`summary -f markdown` of a snapshot whose frames carry the name (it made a live image,
    link, tag or emphasis in the Verdict line and the table's site cell before): the Verdict
    line reads as the terminal's does."""
    outs = []
    for label in (name, BENIGN):
        run = invoke("summary", str(_snapshot(tmp_path / f"{len(outs)}.pickle", label)),
                     "-f", "markdown")
        assert run.returncode == 0, run.stderr
        outs.append(run.stdout)
    text = invoke("summary", str(tmp_path / "0.pickle"), columns=10_000).stdout
    said = next(line for line in text.splitlines() if line.startswith("Verdict."))
    verdict = next(line for line in outs[0].splitlines() if line.startswith("**Verdict.**"))
    assert "".join(_Page(gfm(verdict)).text).strip() == said
    _assert_inert(outs[0], outs[1], None)


@pytest.mark.parametrize("name", HOSTILE[:4] + HOSTILE[14:16])
def test_a_frames_name_makes_no_markdown_in_ticket_md(name: str, tmp_path: Path) -> None:
    """`ticket FILE -o DIR`: ticket.md (the card's alt text, the Verdict line, the tables)."""
    outs = []
    for label in (name, BENIGN):
        folder = tmp_path / f"t{len(outs)}"
        run = invoke("ticket", str(_snapshot(tmp_path / f"{len(outs)}.pickle", label)),
                     "-o", str(folder))
        assert run.returncode == 0, run.stderr
        outs.append((folder / "ticket.md").read_text())
    _assert_inert(outs[0], outs[1], None)


@pytest.mark.parametrize("name", HOSTILE)
def test_a_tracebacks_frame_makes_no_markdown(name: str, tmp_path: Path) -> None:
    """A log's traceback frame: the request's owners and its knobs' sites name it."""
    outs = []
    for label in (name, BENIGN):
        run = invoke("summary", str(_log(tmp_path / f"{len(outs)}.log", label)),
                     "-f", "markdown")
        assert run.returncode == 0, run.stderr
        outs.append(run.stdout)
    _assert_inert(outs[0], outs[1], unescape(name))  # a log is read HTML-unescaped


def test_file_names_make_no_markdown_in_a_diff(tmp_path: Path) -> None:
    """`diff A B -f markdown` names both files and the changed sites: a file named as a link
    (it was a code span whose backticks the name could close) and frames named hostile."""
    name = "[click](javascript:alert(1)) `x` www.evil.example \u202e"
    before = _snapshot(tmp_path / "before.pickle", BENIGN)
    hostile = _snapshot(tmp_path / f"{name}.pickle", HOSTILE[0])
    same = _snapshot(tmp_path / "after.pickle", "other_name")
    outs = []
    for after in (hostile, same):
        run = invoke("diff", str(before), str(after), "-f", "markdown")
        assert run.returncode == 0, run.stderr
        outs.append(run.stdout)
    _assert_inert(outs[0], outs[1], name)


# ----- the escaping function itself -------------------------------------------------------------

#: What random text is made of: every ASCII punctuation character, letters, digits, spaces,
#: the starts of autolinks and e-mail addresses, invisible and bidi characters.
_PIECES = (list("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~") + list("aZ09 é") +
           ["www.", "http://", "https://", "a@b.co", "&amp;", "&#64;", "<a>", "\u200b",
            "\u202e", "\ufeff", "\t", "\n", "1. ", "# ", "    "])


def _random_texts(n: int, seed: int = 66) -> list[str]:
    r = random.Random(seed)
    return ["".join(r.choice(_PIECES) for _ in range(r.randint(0, 24))) for _ in range(n)]


@pytest.mark.parametrize("where", ["paragraph", "cell"])
def test_escaped_text_renders_as_itself(where: str) -> None:
    """`esc(s)`, alone as a paragraph or in a table cell, renders to exactly `s` (its control,
    zero-width and bidi characters shown escaped, as `inert` shows them) and no element."""
    for s in _random_texts(3000):
        shown = inert(s, lines=False)
        if where == "paragraph":
            page, inside = gfm(esc(s) + "\n"), r"<p>(.*)</p>"
        else:
            page, inside = gfm(f"| h |\n|---|\n| {esc(s)} |\n"), r"<td>(.*)</td>"
        found = re.findall(inside, page, flags=re.S)
        assert found == ([] if not shown and where == "paragraph" else [found[0]]), (s, page)
        body = found[0] if found else ""
        parsed = _Page(body)
        assert not parsed.tags, (s, esc(s), page)
        assert "".join(parsed.text) == shown, (s, esc(s), page)
        if where == "paragraph":
            assert page.strip() == (f"<p>{body}</p>" if found else ""), (s, esc(s), page)


def test_a_code_span_shows_its_text_whatever_it_holds() -> None:
    """`code(s)` in a table cell renders to one code element holding exactly `s` (backtick
    runs, pipes, spaces at its ends included)."""
    for s in _random_texts(3000, seed=5):
        shown = inert(s, lines=False)
        page = gfm(f"| h |\n|---|\n| {code(s)} |\n")
        if not shown.strip(" "):
            continue
        found = re.findall(r"<code>(.*?)</code>", page, flags=re.S)
        assert len(found) == 1, (s, code(s), page)
        parsed = _Page(found[0])
        assert not parsed.tags and "".join(parsed.text) == shown, (s, code(s), page)
