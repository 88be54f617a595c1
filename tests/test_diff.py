"""Before/after diffs: nothing from a capture against itself, exactly the saved softmax going
away for `--recompute-loss-function`, and numbers that match two `snapana summary` runs."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import snapana
from snapana.api import Analysis
from snapana.render import figures, render
from snapana.render.views import diff_view
from snapana.render.wording import diff_verdict
from snapana.units import fmt_bytes

from .conftest import SAMPLES, SNAPSHOTS, corpus_params, invoke

BEFORE = SAMPLES / "slime-tp2-chunked-logprob-oom.pickle"
AFTER = SAMPLES / "slime-tp2-recompute-loss-ok.pickle"
SOFTMAX = "saved_logprob_softmax"
SOFTMAX_SITE = "slime/utils/ppo_utils.py:371 vocab_parallel_softmax"


@pytest.fixture(scope="module")
def pair() -> tuple[Analysis, Analysis]:
    return snapana.load(BEFORE), snapana.load(AFTER)


def _assert_empty(path: Path) -> None:
    a = snapana.load(path)
    d = a.diff(snapana.load(path)).diff  # two loads: nothing shared but the file
    assert d.is_empty
    assert all(f.change_bytes == 0 and f.status == "same" for f in d.families)
    assert all(s.change_bytes == 0 and s.status == "same" for s in d.sites)
    assert not d.new_sites and not d.vanished_sites
    assert d.peak_change_bytes == d.reserved_change_bytes == d.allocated_change_bytes == 0
    assert len(d.families) == len(a.device_report.groups)
    assert diff_verdict(d).startswith("no change")


@pytest.mark.parametrize("path", [pytest.param(p, id=p.name)
                                  for p in sorted(SAMPLES.glob("*.pickle"))])
def test_a_sample_against_itself_is_empty(path: Path) -> None:
    _assert_empty(path)


@pytest.mark.parametrize("path", corpus_params("torch_snapshots", "*.pickle"))
def test_a_corpus_snapshot_against_itself_is_empty(path: Path) -> None:
    _assert_empty(path)


def test_recompute_loss_function_removes_exactly_the_saved_softmax(pair) -> None:
    before, after = pair
    d = before.diff(after).diff
    softmax_before = before.families.filter(before.families["family"] == SOFTMAX)
    fam = d.family(SOFTMAX)
    assert fam is not None
    assert fam.before_bytes == int(softmax_before["bytes"][0]) > 3 * 2**30
    assert fam.before_blocks == int(softmax_before["blocks"][0])
    assert fam.after_bytes == 0 and fam.after_blocks == 0 and fam.status == "vanished"
    assert SOFTMAX not in after.families["family"].to_list()
    # its chunks vanished: the chunk loop of the site, all of it
    group = next(g for g in before.device_report.groups if g.name == SOFTMAX)
    site = next(s for s in d.sites if s.family == SOFTMAX)
    assert site.site == SOFTMAX_SITE
    assert site.before_chunks == sum(c["count"] for c in group.chunks) == 7
    assert site.after_chunks == 0 and site in d.vanished_sites
    assert [s.site for s in d.sites if s.family == SOFTMAX] == [SOFTMAX_SITE]
    # the largest change of all, and the only family of the saved kind to go
    assert d.families[0].family == SOFTMAX
    # headline numbers: the peak from the two timelines, and the OOM gone
    assert d.peak_change_bytes == (after.device_report.peak_allocated_bytes
                                   - before.device_report.peak_allocated_bytes) < 0
    assert d.before.has_oom and not d.after.has_oom and d.oom_gone
    assert d.before.request_bytes == before.diagnosis.request_bytes
    # every family's change is the difference of the two family tables
    for f in d.families:
        b = dict(before.families.select("family", "bytes").iter_rows()).get(f.family, 0)
        a = dict(after.families.select("family", "bytes").iter_rows()).get(f.family, 0)
        assert (f.before_bytes, f.after_bytes) == (b, a)
    v = diff_verdict(d)
    assert v.startswith(f"{SOFTMAX} -3.32 GiB (gone)")
    assert "peak -2.44 GiB" in v and v.endswith("no OOM after")


def test_renderers(pair, tmp_path: Path) -> None:
    before, after = pair
    cmp = before.diff(after)
    plain = repr(cmp)  # one short line a notebook saves, the peak change as the diff has it
    assert "\n" not in plain and len(plain) <= 160, plain
    assert f"peak allocated {fmt_bytes(cmp.diff.peak_change_bytes, signed=True)}" in plain
    assert Path(cmp.diff.before.path).name in plain and "0x" not in plain
    text = cmp.summary("text")
    flowed = " ".join(text.split())  # the verdict wraps to the text's width
    assert "Verdict: " + cmp.verdict in flowed and "7 chunks gone" in flowed
    md = cmp.summary("markdown")
    assert f"| `{SOFTMAX}` |" in md
    data = json.loads(cmp.summary("json"))
    assert data["verdict"] == cmp.verdict
    fam = next(f for f in data["families"] if f["family"] == SOFTMAX)
    assert isinstance(fam["before_bytes"], int) and fam["after_bytes"] == 0
    assert [SOFTMAX, SOFTMAX_SITE] in data["vanished_sites"]
    out = cmp.report(tmp_path / "diff.html")
    page = out.read_text()
    assert cmp.verdict.split(";")[0] in page
    assert 'id="plotly-gz"' in page and 'data-figure="change"' in page
    assert not re.search(r"""(src|href)\s*=\s*["']?\s*(https?:)?//""", page, re.I)
    fig = figures.change(diff_view(cmp.diff))
    assert fig["data"][0]["y"][-1] == SOFTMAX  # largest change drawn at the top
    assert "saved_logprob_softmax" in cmp._repr_html_()
    assert cmp.families.height == len(cmp.diff.families)
    assert cmp.sites.filter(cmp.sites["status"] == "vanished").height == len(
        cmp.diff.vanished_sites)
    with pytest.raises(ValueError):
        render(diff_view(cmp.diff), "xml")


def test_diff_files(tmp_path: Path) -> None:
    text = snapana.diff(BEFORE, AFTER).summary("text")
    assert text.startswith("before: ")
    assert json.loads(snapana.diff(str(BEFORE), AFTER).summary("json"))["oom_gone"] is True
    run = invoke("diff", str(BEFORE), str(AFTER), "-o", str(tmp_path / "d.html"))
    assert run.returncode == 0, run.stderr
    assert (tmp_path / "d.html").read_text().startswith("<!DOCTYPE html>")
    run = invoke("diff", str(BEFORE), str(AFTER), "-f", "markdown", "-o", str(tmp_path / "d.md"))
    assert run.returncode == 0, run.stderr
    assert (tmp_path / "d.md").read_text().startswith("### GPU memory: before vs after")


def test_diff_across_sources(tmp_path: Path) -> None:
    traces = corpus_params("kineto_traces", "switch-transformer-a100.json")
    if traces[0].values[0] is None:
        pytest.skip("../shared/corpus absent")
    data = json.loads(snapana.diff(SAMPLES / "fsdp-train-step.pickle",
                                   traces[0].values[0]).summary("json"))
    assert data["before"]["source"] == "torch_snapshot"
    assert data["after"]["source"] == "kineto_trace"
    assert sum(f["after_bytes"] for f in data["families"]) == data["after"]["allocated_bytes"]


def test_corpus_diff_matches_two_summaries() -> None:
    a, b = SNAPSHOTS / "gpt-medium-ctx1024-train.pickle", \
        SNAPSHOTS / "lm-ctx128-fullstep-segment-free.pickle"
    if not (a.exists() and b.exists()):
        pytest.skip("../shared/corpus absent")
    sums = []
    for p in (a, b):
        run = invoke("summary", str(p), "--format", "json")
        assert run.returncode == 0, run.stderr
        sums.append(json.loads(run.stdout)["devices"][0])
    groups = [{g["family"]: g["bytes"] for g in s["groups"]} for s in sums]
    expected = {f: groups[1].get(f, 0) - groups[0].get(f, 0) for f in {*groups[0], *groups[1]}}
    data = json.loads(snapana.diff(a, b).summary("json"))
    got = {f["family"]: f["change_bytes"] for f in data["families"]}
    assert got == expected
    assert data["peak_change_bytes"] == (sums[1]["peak_allocated_bytes"]
                                         - sums[0]["peak_allocated_bytes"])
    assert data["reserved_change_bytes"] == sums[1]["reserved_bytes"] - sums[0]["reserved_bytes"]
    sites = {(s["family"], s["site"]): s["change_bytes"] for s in data["sites"]}
    want = {}
    for sign, s in ((-1, sums[0]), (1, sums[1])):
        for g in s["groups"]:
            for site in g["sites"]:
                key = (g["family"], site["site"])
                want[key] = want.get(key, 0) + sign * site["bytes"]
    assert sites == want
