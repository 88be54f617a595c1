"""Issue 47, `snapana check CAPTURE --budget budget.toml`: budgets set just above and just below
the true figures give exit 0 and 1. The true figures come from outside the analyzer: the
sample's ground-truth sidecar (written by the scenario with each block's family) and the raw
pickle's segment events; the JUnit file is read back by a JUnit parser and the markdown by a
markdown parser."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from .conftest import SAMPLES, invoke, raw_load

OK_SAMPLE = SAMPLES / "slime-tp2-recompute-loss-ok.pickle"
OOM_SAMPLE = SAMPLES / "slime-tp2-chunked-logprob-oom.pickle"
DELTA = {"segment_alloc": 1, "segment_map": 1, "segment_free": -1, "segment_unmap": -1}


def _truth(sample: Path) -> dict:
    return json.loads(sample.with_suffix(".truth.json").read_text())


def _family_bytes(truth: dict) -> dict[str, int]:
    out: dict[str, int] = {}
    for b in truth["blocks"]:
        if b["state"] == "active_allocated":
            out[b["family"]] = out.get(b["family"], 0) + b["size"]
    return out


def _peak_reserved(sample: Path) -> int:
    """Reserved before the window (the snapshot's segments less the window's net segment
    events), then its running sum over the trace: the most it reached."""
    snap = raw_load(sample)
    trace = snap["device_traces"][0]
    reserved = sum(s["total_size"] for s in snap["segments"]) - sum(
        DELTA.get(e["action"], 0) * e["size"] for e in trace)
    peak = reserved
    for e in trace:
        reserved += DELTA.get(e["action"], 0) * e["size"]
        peak = max(peak, reserved)
    return peak


def _budget(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def _limits(truth: dict, sample: Path, less: int) -> str:
    """A budget at the true figures (less = 0: exactly them, which holds) or one byte under
    each (less = 1: each is breached)."""
    family, held = max(_family_bytes(truth).items(), key=lambda kv: kv[1])
    return (f'no_oom = true\n'
            f'peak_allocated = "{truth["peak_allocated_bytes"] - less}B"\n'
            f'peak_reserved = "{_peak_reserved(sample) - less}B"\n'
            f'[families]\n{family} = "{held - less}B"\n')


def test_budgets_at_and_just_under_the_true_figures(tmp_path) -> None:
    truth = _truth(OK_SAMPLE)
    assert truth["oom"] is None
    within = _budget(tmp_path, "within.toml", _limits(truth, OK_SAMPLE, 0))
    out = invoke("check", str(OK_SAMPLE), "--budget", str(within), "-f", "json")
    assert out.returncode == 0, out.stdout
    data = json.loads(out.stdout)
    assert data["within_budget"] and len(data["checks"]) == 4
    over = _budget(tmp_path, "over.toml", _limits(truth, OK_SAMPLE, 1))
    out = invoke("check", str(OK_SAMPLE), "--budget", str(over))
    assert out.returncode == 1
    breaches = [ln for ln in out.stdout.replace("\n  ", " ").splitlines()
                if ln.startswith("over budget:")]
    assert len(breaches) == 3  # no_oom holds: the job did not run out of memory
    family = max(_family_bytes(truth).items(), key=lambda kv: kv[1])[0]
    assert any(f"family {family}" in b and "top site:" in " ".join(out.stdout.split())
               for b in breaches)


def test_an_oom_capture_breaches_no_oom_and_the_chunk_count(tmp_path) -> None:
    """The chunked-logprob OOM: its ground truth records the OOM and the scenario's
    per-chunk softmax copies live at it (the blocks of saved_logprob_softmax)."""
    truth = _truth(OOM_SAMPLE)
    assert truth["oom"] is not None
    copies = sum(1 for b in truth["blocks"] if b["family"] == "saved_logprob_softmax"
                 and b["state"] == "active_allocated")
    budget = _budget(tmp_path, "b.toml", f"no_oom = true\n[chunks]\n"
                                          f"saved_logprob_softmax = {copies}\n")
    out = invoke("check", str(OOM_SAMPLE), "--budget", str(budget), "-f", "json")
    assert out.returncode == 1
    checks = {c["name"]: c for c in json.loads(out.stdout)["checks"]}
    assert not checks["no_oom"]["holds"]
    assert checks["chunks saved_logprob_softmax"]["holds"]
    assert checks["chunks saved_logprob_softmax"]["measured_value"] == copies
    fewer = _budget(tmp_path, "c.toml", f"[chunks]\nsaved_logprob_softmax = {copies - 1}\n")
    assert invoke("check", str(OOM_SAMPLE), "--budget", str(fewer)).returncode == 1


def test_junit_markdown_and_github_outputs(tmp_path, monkeypatch) -> None:
    junitparser = pytest.importorskip("junitparser")
    from markdown_it import MarkdownIt

    truth = _truth(OK_SAMPLE)
    over = _budget(tmp_path, "over.toml", _limits(truth, OK_SAMPLE, 1))
    summary = tmp_path / "step-summary.md"
    summary.write_text("earlier step\n")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    report = tmp_path / "budget.xml"
    out = invoke("check", str(OK_SAMPLE), "--budget", str(over), "--junit", str(report),
                 "--annotate", "github")
    assert out.returncode == 1
    xml = junitparser.JUnitXml.fromfile(str(report))
    cases = [case for suite in xml for case in suite]
    assert len(cases) == 4
    failed = [c for c in cases if not c.is_passed]
    assert {c.name for c in failed} == {"peak_allocated", "peak_reserved",
                                        next(c.name for c in cases
                                             if c.name.startswith("family "))}
    annotations = [ln for ln in out.stdout.splitlines() if ln.startswith("::error ")]
    assert len(annotations) == 3 and all("::over budget:" in a for a in annotations)
    text = summary.read_text()
    assert text.startswith("earlier step\n") and "snapana budget check" in text
    tokens = MarkdownIt("commonmark").enable("table").parse(text)
    assert any(t.type == "table_open" for t in tokens)
    rows = [t for t in tokens if t.type == "tr_open"]
    assert len(rows) == 1 + 4  # the header and one row per budget line


@pytest.mark.parametrize("text, words", [
    ('peak_reserved = "80"\n', "no unit"),
    ("peak_reserve = \"80GiB\"\n", "unknown budget"),
    ('[families]\nkv_cahce = "2GiB"\n', "is not a family"),
    ("cached_share = 2\n", "from 0 to 1"),
    ("no_oom = \"yes\"\n", "true or false"),
    ("[chunks]\nsaved_logprob_softmax = -1\n", "0 or more"),
    ("= broken\n", "not a TOML budget"),
    ("", "sets no limit"),
])
def test_a_bad_budget_is_one_line_and_exit_2(tmp_path, text, words) -> None:
    budget = _budget(tmp_path, "bad.toml", text)
    out = invoke("check", str(OK_SAMPLE), "--budget", str(budget))
    assert out.returncode == 2 and words in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


def test_a_budget_that_is_not_a_file_is_refused(tmp_path) -> None:
    fifo = tmp_path / "budget.toml"
    os.mkfifo(fifo)
    out = invoke("check", str(OK_SAMPLE), "--budget", str(fifo))
    assert out.returncode == 2 and "not a regular file" in out.stderr
    junit = invoke("check", str(OK_SAMPLE), "--budget", str(_budget(
        tmp_path, "b.toml", "no_oom = true\n")), "--junit", str(OK_SAMPLE))
    assert junit.returncode == 2 and "is an input" in junit.stderr


def test_diff_fail_on_gates_growth_from_a_baseline() -> None:
    """`snapana diff BEFORE AFTER --fail-on`: the growth of a family and of the peak, with
    the true figures of both sides from their ground-truth sidecars: a limit at the true
    growth holds (exit 0), one byte under it is breached (exit 1, one line naming the
    family); new_family and oom name what the after capture has that the baseline had not."""
    before, after = _truth(OK_SAMPLE), _truth(OOM_SAMPLE)
    family = "saved_logprob_softmax"
    growth = _family_bytes(after).get(family, 0) - _family_bytes(before).get(family, 0)
    assert growth > 0
    base = ["diff", str(OK_SAMPLE), str(OOM_SAMPLE), "-f", "json"]
    assert invoke(*base, "--fail-on", f"family:{family}>+{growth}B").returncode == 0
    out = invoke(*base, "--fail-on", f"family:{family}>+{growth - 1}B")
    assert out.returncode == 1
    (line,) = out.stderr.strip().splitlines()
    assert line.startswith(f"over budget: family {family}")
    json.loads(out.stdout)  # the comparison itself is still written whole
    peak = after["peak_allocated_bytes"] - before["peak_allocated_bytes"]
    assert invoke(*base, "--fail-on", f"peak_allocated>+{max(peak, 0)}B").returncode == 0
    gates = invoke(*base, "--fail-on", "new_family", "--fail-on", "oom")
    assert gates.returncode == 1 and len(gates.stderr.strip().splitlines()) == 2
    assert family in gates.stderr
    same = invoke("diff", str(OK_SAMPLE), str(OK_SAMPLE), "--fail-on", "new_family",
                  "--fail-on", "oom", "--fail-on", "reserved>+0%")
    assert same.returncode == 0
    bad = invoke(*base, "--fail-on", "family:kv_cahce>+1GiB")
    assert bad.returncode == 2 and "is not a family" in bad.stderr


def test_diff_fail_on_writes_junit_and_annotations(tmp_path) -> None:
    junitparser = pytest.importorskip("junitparser")
    report = tmp_path / "gates.xml"
    out = invoke("diff", str(OK_SAMPLE), str(OOM_SAMPLE), "--fail-on", "new_family",
                 "--fail-on", "reserved>+100%", "--junit", str(report), "--annotate-github")
    assert out.returncode == 1
    cases = {c.name: c.is_passed for suite in junitparser.JUnitXml.fromfile(str(report))
             for c in suite}
    assert cases == {"new_family": False, "reserved": True}
    assert sum(ln.startswith("::error ") for ln in out.stdout.splitlines()) == 1
    alone = invoke("diff", str(OK_SAMPLE), str(OOM_SAMPLE), "--junit", str(report))
    assert alone.returncode == 2 and "--fail-on" in alone.stderr


def test_diff_annotates_as_check_does_and_writes_the_step_summary(tmp_path,
                                                                   monkeypatch) -> None:
    """One spelling for both commands, `--annotate github` (diff's old `--annotate-github`
    kept as an alias); under GitHub Actions diff appends its markdown (the diff, then its
    --fail-on limits) to $GITHUB_STEP_SUMMARY, as check does."""
    summary = tmp_path / "step-summary.md"
    summary.write_text("earlier step\n")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    args = ("diff", str(OK_SAMPLE), str(OOM_SAMPLE), "--fail-on", "new_family")
    new = invoke(*args, "--annotate", "github")
    old = invoke(*args, "--annotate-github")
    assert new.returncode == old.returncode == 1
    errors = [ln for ln in new.stdout.splitlines() if ln.startswith("::error ")]
    assert len(errors) == 1 and errors == [ln for ln in old.stdout.splitlines()
                                           if ln.startswith("::error ")]
    written = summary.read_text()
    assert written.startswith("earlier step\n")
    assert written.count("### GPU memory: before vs after") == 2  # both runs appended
    assert written.count("### snapana budget check:") == 2 and "new_family" in written
    assert "--annotate" in invoke("diff", "--help", columns=200).stdout
    assert "--annotate-github" not in invoke("diff", "--help", columns=200).stdout
