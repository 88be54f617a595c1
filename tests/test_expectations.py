"""Every capture's report held to its expert review (tests/expectations/*.toml, written from
the raw file, never from snapana's output): the workload, the knobs an expert accepts first,
the knobs that must not appear, the allocator settings and history the capture records, the
devices it used. Checked in every format: JSON, markdown, terminal text and the HTML page.
"""

from __future__ import annotations

import html
import json
import re
import sys
from pathlib import Path

import pytest

from .conftest import CORPUS, ROOT, invoke

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

EXPECTATIONS = ROOT / "tests" / "expectations"
PACKS = ROOT / "analyzer" / "snapana" / "analysis" / "attribution" / "packs"


def _reviews() -> list:
    out = []
    for toml in sorted(EXPECTATIONS.glob("*.toml")):
        review = tomllib.loads(toml.read_text(encoding="utf-8"))
        source = review["source"]
        path = (CORPUS / source.removeprefix("corpus/") if source.startswith("corpus/")
                else ROOT / source)
        marks = ([pytest.mark.skip(reason="../shared/corpus absent")]
                 if source.startswith("corpus/") and not CORPUS.is_dir() else [])
        out.append(pytest.param(path, review, id=toml.name.removesuffix(".toml"),
                                marks=marks))
    return out


def _knob_texts() -> dict[str, str]:
    """Knob id -> the text a report prints for it, read from the packs' TOML directly."""
    out = {}
    for pack in PACKS.glob("*.toml"):
        for k in tomllib.loads(pack.read_text(encoding="utf-8")).get("knob", []):
            out[k["id"]] = k["knob"]
    return out


def _flat(text: str) -> str:
    return " ".join(text.split())


def _html_text(page: str) -> str:
    body = re.sub(r"<script.*?</script>", " ", page, flags=re.S)
    return _flat(html.unescape(re.sub(r"<[^>]+>", " ", body)))


@pytest.fixture(scope="module")
def knob_texts() -> dict[str, str]:
    return _knob_texts()


def _formats(path: Path, tmp_path: Path) -> dict[str, str]:
    out = {}
    for fmt in ("json", "markdown", "text"):
        got = invoke("summary", "--format", fmt, str(path))
        assert got.returncode == 0, got.stderr
        out[fmt] = got.stdout
    page = tmp_path / "report.html"
    got = invoke("report", str(path), "-o", str(page))
    assert got.returncode == 0, got.stderr
    out["html"] = page.read_text(encoding="utf-8")
    return out


def test_every_capture_has_a_review() -> None:
    """The corpus's captures and the bundled samples each have their expert review."""
    reviewed = {p.name.removesuffix(".toml") for p in EXPECTATIONS.glob("*.toml")}
    wanted = {p.name for p in (ROOT / "sample_snapshots").glob("*.pickle")}
    if CORPUS.is_dir():
        wanted |= {p.name for p in (CORPUS / "torch_snapshots").iterdir()}
    assert wanted <= reviewed, sorted(wanted - reviewed)


@pytest.mark.parametrize(("path", "review"), _reviews())
def test_the_report_agrees_with_the_expert_review(path: Path, review: dict, tmp_path: Path,
                                                  knob_texts: dict[str, str]) -> None:
    formats = _formats(path, tmp_path)
    devices = json.loads(formats["json"])["devices"]
    first = devices[0]
    d = first["diagnosis"]
    expected = review.get("workload", {}).get("answer")
    knobs = review.get("knobs", {})
    # the workload: as the expert decided it, the same on every device (one job), and the
    # statement of it the same in every format
    for dev in devices:
        if expected == "undetermined":
            assert dev["diagnosis"]["workload"] in ("undetermined", None), dev["device"]
        elif expected:
            assert dev["diagnosis"]["workload"] == expected, (dev["device"],
                                                              dev["diagnosis"]["workload"])
    statement = d["workload_statement"]
    if statement:
        for fmt in ("text", "markdown"):
            assert _flat(statement) in _flat(formats[fmt].replace("\\", "")), fmt
        assert _flat(statement) in _html_text(formats["html"])
    # knobs: none whose preconditions fail here, in any format; the first one acceptable
    offered = [k["id"] for dev in devices for k in dev["diagnosis"]["knobs"]]
    banned = set(knobs.get("must_not", ())) & set(offered)
    assert not banned, sorted(banned)
    for kid in knobs.get("must_not", ()):
        text = knob_texts.get(kid)
        if text:
            for fmt in ("text", "markdown"):
                assert _flat(text) not in _flat(formats[fmt].replace("\\", "")), (fmt, kid)
            assert _flat(text) not in _html_text(formats["html"]), ("html", kid)
    accepted = knobs.get("first_any_of") or []
    if accepted and d["knobs"]:
        assert d["knobs"][0]["id"] in accepted, [k["id"] for k in d["knobs"]]
    if expected in ("training", "undetermined"):
        assert not d["knobs"] or d["knobs"][0]["workload"] != "inference"
    # every knob offered says why it applies
    for dev in devices:
        for k in dev["diagnosis"]["knobs"]:
            assert k["applies"], k["id"]
    # the allocator's own settings, as recorded
    settings = review.get("settings", {})
    if first["source"] == "torch_snapshot" and "recorded" in settings:
        assert (d["allocator_settings"] is not None) == settings["recorded"]
        if "expandable_segments" in settings:
            assert d["expandable_segments"] == settings["expandable_segments"]
            if settings["expandable_segments"]:
                assert "torch.expandable_segments" not in offered
    # history: recorded or not, said alike everywhere
    history = review.get("history", {})
    if "recorded" in history:
        assert first["history"] == history["recorded"], first["history"]
        if not history["recorded"]:
            for fmt in ("text", "markdown"):
                assert "peaked at" not in formats[fmt]
    page = _html_text(formats["html"])
    assert not ("History recording was on" in page and "No allocation history was recorded"
                in page)
    # devices: skew is stated only among devices that held memory
    used = set(review.get("devices", {}).get("used", ()))
    if used:
        for line in _flat(formats["text"]).split("Uneven:")[1:]:
            named = {int(n) for n in re.findall(r"cuda:(\d+) (?:peaked at|holds|at) ",
                                                line.split(" look at ")[0])}
            assert named <= used, (named, used)
