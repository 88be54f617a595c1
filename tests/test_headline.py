"""Issue 60: the answer first. A verdict is a headline (one or two sentences: what failed,
what holds the memory, the first fix and what it buys) and at most three evidence lines, the
same in text, markdown, HTML and JSON; `summary` of one capture fits 80×24 (the headline and
the first knob on the first screen), `--full` prints every section; `report` says the
headline after "wrote ...". The request and shortfall the headline states are recomputed
from the raw pickle (an independent loader)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from snapana.units import fmt_bytes

from .conftest import SAMPLES, corpus_files, corpus_ooms, invoke, oom_entry

SCREEN = (80, 24)
SAMPLE_FILES = sorted(SAMPLES.glob("*.pickle"))


def _flat(text: str) -> str:
    """Text with its layout (line breaks, indents) gone: what wrapping may not change."""
    return re.sub(r"\s+", "", text)


def _first_screen(path: Path) -> tuple[list[str], dict]:
    run = invoke("summary", str(path), columns=SCREEN[0])
    assert run.returncode == 0, run.stderr
    js = invoke("summary", str(path), "-f", "json")
    assert js.returncode == 0, js.stderr
    return run.stdout.splitlines(), json.loads(js.stdout)["devices"][0]


def _check_first_screen(path: Path) -> None:
    lines, dev = _first_screen(path)
    assert all(len(ln) <= SCREEN[0] for ln in lines), [ln for ln in lines if len(ln) > 80]
    screen = _flat("\n".join(lines[:SCREEN[1]]))
    d = dev["diagnosis"]
    assert d["headline"] and _flat("Verdict. " + d["headline"]) in screen
    assert 1 <= len(d["evidence"]) <= 3
    if d["knobs"]:
        assert _flat("1. " + d["knobs"][0]["knob"]) in screen
        assert _flat(d["knobs"][0]["knob"]) in _flat(d["headline"])
    assert len(lines) <= SCREEN[1], len(lines)


@pytest.mark.parametrize("path", SAMPLE_FILES, ids=lambda p: p.name)
def test_summary_puts_the_headline_and_the_first_knob_on_the_first_screen(path: Path) -> None:
    _check_first_screen(path)


@pytest.mark.corpus
@pytest.mark.parametrize("path", corpus_ooms())
def test_corpus_ooms_fit_the_first_screen(path: Path) -> None:
    _check_first_screen(path)


@pytest.mark.parametrize("path", [p for p in SAMPLE_FILES if "oom" in p.name],
                         ids=lambda p: p.name)
def test_the_headline_states_the_recorded_request_and_shortfall(path: Path) -> None:
    oom = oom_entry(path)
    assert oom is not None
    requested, free = int(oom["size"]), int(oom["device_free"])
    _, dev = _first_screen(path)
    head = dev["diagnosis"]["headline"]
    assert f"a {fmt_bytes(requested)} request" in head
    assert f"short by {fmt_bytes(requested - free)}" in head
    assert head.count(". ") <= 2  # one or two sentences (a site's dots are not sentences)
    assert "First fix: " in head
    figures = dev["diagnosis"]["evidence"][0]
    assert f"device free {fmt_bytes(free)}" in figures


def test_every_format_leads_with_the_same_headline(tmp_path: Path) -> None:
    path = SAMPLES / "slime-tp2-chunked-logprob-oom.pickle"
    dev = json.loads(invoke("summary", str(path), "-f", "json").stdout)["devices"][0]
    head, evidence = dev["diagnosis"]["headline"], dev["diagnosis"]["evidence"]
    md = invoke("summary", str(path), "-f", "markdown").stdout
    assert f"**Verdict.** {head}" in md
    for line in evidence:
        assert f"- {line}" in md
    assert md.index(head) < md.index("| what holds memory")
    assert "**The verdict in full.**" in md
    out = tmp_path / "r.html"
    run = invoke("report", str(path), "-o", str(out))
    assert run.returncode == 0, run.stderr
    page = out.read_text()
    box = re.search(r'<div class="verdict oom" id="verdict-0"><b>Verdict.</b> (.*?)</div>',
                    page, re.S)
    assert box is not None and _flat(head) == _flat(re.sub(r"<[^>]+>", "", box.group(1))
                                                    .replace("&#39;", "'"))
    assert 'id="evidence-0"' in page and 'id="in-full-0"' in page
    said = run.stderr
    assert said.index("wrote ") < said.index("Verdict. ")
    assert _flat(head) in _flat(said)


def test_full_prints_every_section_and_the_default_does_not() -> None:
    path = SAMPLES / "slime-tp1-logits-fp32-oom.pickle"
    brief = invoke("summary", str(path), columns=80).stdout
    full = invoke("summary", str(path), "--full", columns=80).stdout
    for section in ("figures", "what holds memory", "what if a family were gone",
                    "knobs (the first is the verdict's)", "cause checks", "In full. "):
        assert section in full and section not in brief, section
    assert brief.startswith(full.split("\nIn full. ")[0])  # the answer is the same


#: The verdict box's lines in the drawn page: its content height over its line height.
VERDICT_LINES = """(() => {
  const el = document.getElementById('verdict-0');
  const s = getComputedStyle(el);
  const content = el.clientHeight - parseFloat(s.paddingTop) - parseFloat(s.paddingBottom);
  return [content / parseFloat(s.lineHeight), window.innerWidth];
})()"""


def _verdict_lines(path: Path, tmp_path: Path) -> float:
    from .browser import open_report

    out = tmp_path / "r.html"
    assert invoke("report", str(path), "-o", str(out)).returncode == 0
    visit = open_report(out, probe=VERDICT_LINES)
    assert visit.console_errors == []
    lines, width = visit.probed
    assert width == 1280
    return lines


@pytest.mark.chromium
@pytest.mark.parametrize("path", SAMPLE_FILES, ids=lambda p: p.name)
def test_the_verdict_box_is_at_most_five_lines_at_1280_px(path: Path, tmp_path: Path) -> None:
    assert round(_verdict_lines(path, tmp_path)) <= 5


@pytest.mark.chromium
@pytest.mark.parametrize("path", [f for f in corpus_files("torch_snapshots")
                                  if f.name.startswith("Constructor-Sun+code_location")]
                         or [pytest.param(None, marks=pytest.mark.skip(
                             reason="../shared/corpus absent"))])
def test_the_corpus_dataparallel_verdict_box_is_at_most_five_lines(path: Path,
                                                                    tmp_path: Path) -> None:
    assert round(_verdict_lines(path, tmp_path)) <= 5
