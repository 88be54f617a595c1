"""The command line as a new user meets it: help, version, sizes, moments, output paths.
Each bad path is one line on stderr and exit code 2; inputs are never touched."""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
from pathlib import Path

import pytest
from snapana.analysis.replay import replay
from snapana.cli import app
from snapana.sources import load

from .conftest import SAMPLES, invoke, raw_load, run_cli

OOM = SAMPLES / "slime-tp2-chunked-logprob-oom.pickle"
OK = SAMPLES / "slime-tp2-recompute-loss-ok.pickle"


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _one_line_refusal(result, *words: str) -> None:
    assert result.returncode == 2, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("snapana: error: "), result.stderr
    for w in words:
        assert w in lines[0]
    assert "Traceback" not in result.stderr


@pytest.fixture(scope="module")
def oom_replay():
    return replay(load(OOM), 0)


def test_version_and_short_help() -> None:
    from snapana import __version__

    for flag in ("-V", "--version"):
        run = invoke(flag)
        assert run.returncode == 0 and run.stdout.strip() == f"snapana {__version__}"
    commands = [c.name or c.callback.__name__ for c in app.registered_commands]
    assert {"report", "summary", "explain", "diff", "export", "batch", "synth"} <= set(commands)
    for command in commands:
        run = invoke(command, "-h")
        assert run.returncode == 0 and "Usage: " in run.stdout, command
        # placeholders are words a user types, never Python types
        assert "<list" not in run.stdout and "<bool>" not in run.stdout, run.stdout
        assert "<path>" not in run.stdout and "<str>" not in run.stdout, run.stdout


def test_console_script_in_a_real_process() -> None:
    run = run_cli("--version")
    assert run.returncode == 0 and run.stdout.startswith("snapana ")
    run = run_cli("summary", str(OOM), "--capacity", "80")
    assert run.returncode == 2 and len(run.stderr.strip().splitlines()) == 1


def test_engine_is_a_choice(tmp_path: Path) -> None:
    run = invoke("batch", str(OOM), "-o", str(tmp_path / "d"), "--engine", "spark")
    assert run.returncode == 2 and "local" in run.stderr and "Traceback" not in run.stderr


@pytest.mark.parametrize("capacity, says", [
    ("80", "no unit"),
    ("80G", "unknown unit"),
    ("1TB", "not a device size"),
    ("1GiB", "less than"),  # below what PyTorch itself reserved at the OOM
])
def test_bad_capacity_is_one_line(capacity: str, says: str) -> None:
    _one_line_refusal(invoke("summary", str(OOM), "--capacity", capacity), "capacity", says)


def test_gb_is_decimal_and_gib_binary() -> None:
    got = {}
    for cap in ("100GB", "100GiB", "95367.431640625MiB"):
        run = invoke("summary", str(OOM), "-f", "json", "--capacity", cap)
        assert run.returncode == 0, run.stderr
        got[cap] = json.loads(run.stdout)["devices"][0]["diagnosis"]["capacity_bytes"]
    assert got["100GB"] == 100 * 10**9 and got["100GiB"] == 100 * 2**30
    assert got["95367.431640625MiB"] == 100 * 10**9


def test_capacity_below_reserved_plus_free_at_the_oom(oom_replay) -> None:
    """Capacity must leave room for what PyTorch reserved and what the driver said was free."""
    from snapana.session import analyse

    cap = load(OOM)
    (r,) = analyse(cap)
    floor = r.reserved_bytes + r.oom.device_free_bytes
    run = invoke("summary", str(OOM), "--capacity", f"{floor - 512}B")
    _one_line_refusal(run, "reserved + device free")
    run = invoke("summary", str(OOM), "-f", "json", "--capacity", f"{floor}B")
    assert run.returncode == 0
    assert json.loads(run.stdout)["devices"][0]["diagnosis"]["outside_pytorch_bytes"] == 0


def test_at_chooses_the_moment(oom_replay) -> None:
    dr = oom_replay
    def moment(*at: str) -> dict:
        run = invoke("summary", str(OOM), "-f", "json", *at)
        assert run.returncode == 0, run.stderr
        return json.loads(run.stdout)["devices"][0]
    default = moment()
    assert default["moment"]["kind"] == "oom" and default["moment"]["asked_for"] is None
    assert moment("--at", "oom")["moment"]["event_index"] == dr.oom.idx
    peak = moment("--at", "peak")
    assert peak["moment"]["kind"] == "peak" and peak["moment"]["event_index"] == dr.peak.idx
    assert peak["oom"] is None and "chosen with --at peak" in peak["diagnosis"]["verdict"]
    assert peak["allocated_bytes"] == int(dr.allocated[dr.peak.idx])
    ev = moment("--at", "event:10")
    assert ev["moment"]["event_index"] == 10 and ev["allocated_bytes"] == int(dr.allocated[10])
    end = moment("--at", "end")
    assert end["moment"]["event_index"] == dr.n_events - 1
    t = int(dr.capture.device_events(0)["time_us"][20])
    at_t = moment("--at", f"time:{t}")
    times = dr.capture.device_events(0)["time_us"].to_list()
    assert at_t["moment"]["event_index"] == max(i for i, x in enumerate(times) if x <= t)
    text = invoke("summary", str(OOM), "--at", "event:10")
    assert text.returncode == 0 and "chosen with --at event:10" in text.stdout


@pytest.mark.parametrize("args, says", [
    ((str(OOM), "--at", "sometime"), "use oom, peak, end"),
    ((str(OOM), "--at", "event:999999999"), "out of range"),
    ((str(OK), "--at", "oom"), "has no OOM"),
])
def test_bad_moment_is_one_line(args: tuple[str, ...], says: str) -> None:
    _one_line_refusal(invoke("summary", *args), says)


def test_report_and_explain_take_at(tmp_path: Path) -> None:
    out = tmp_path / "peak.html"
    run = invoke("report", str(OOM), "--at", "peak", "-o", str(out))
    assert run.returncode == 0, run.stderr
    assert "chosen with --at peak" in out.read_text()
    run = invoke("explain", str(OOM), "--family", "saved_logprob_softmax", "--at", "end")
    assert run.returncode == 0, run.stderr
    assert "vocab_parallel_softmax" in run.stdout
    run = invoke("explain", str(OOM), "--family", "saved_logprob_softmax", "--at", "event:0")
    _one_line_refusal(run, "at event 0")


def test_output_into_an_existing_folder(tmp_path: Path) -> None:
    folder = tmp_path / "out"
    folder.mkdir()
    run = invoke("report", str(OOM), "-o", str(folder))
    assert run.returncode == 0, run.stderr
    written = folder / "slime-tp2-chunked-logprob-oom.html"
    assert written.read_text().startswith("<!DOCTYPE html>")
    assert str(written) in run.stderr.replace("\n", "")  # (rich wraps a long path)
    run = invoke("diff", str(OOM), str(OK), "-o", str(folder))
    assert run.returncode == 0, run.stderr
    diffs = list(folder.glob("*-vs-*.html"))
    assert len(diffs) == 1 and diffs[0].read_text().startswith("<!DOCTYPE html>")


def test_outputs_never_replace_an_input(tmp_path: Path) -> None:
    a, b = tmp_path / "a.pickle", tmp_path / "b.pickle"
    shutil.copy(OOM, a)
    shutil.copy(OK, b)
    link = tmp_path / "link.html"
    link.symlink_to(a)
    before = _digest(a), _digest(b)
    _one_line_refusal(invoke("report", str(a), "-o", str(a)), "is an input")
    _one_line_refusal(invoke("report", str(a), "-o", str(link)), "is an input")
    _one_line_refusal(invoke("diff", str(a), str(b), "-o", str(a)), "is an input")
    _one_line_refusal(invoke("diff", str(a), str(b), "-o", str(b)), "is an input")
    assert (_digest(a), _digest(b)) == before


@pytest.mark.parametrize("engine, extra", [("dask", "dask"), ("ray", "ray")])
def test_missing_extra_names_it(tmp_path: Path, monkeypatch, engine: str, extra: str) -> None:
    monkeypatch.setitem(sys.modules, extra, None)  # as if not installed
    run = invoke("batch", str(OOM), "-o", str(tmp_path / "d"), "--engine", engine)
    _one_line_refusal(run, f"snapana[{extra}]")


@pytest.mark.parametrize("args", [
    ("summary", str(OOM)), ("report", str(OOM), "-o", "{tmp}/r.html"),
    ("explain", str(OOM), "--family", "logits"), ("diff", str(OOM), str(OK)),
    ("export", str(OOM), "-o", "{tmp}/exp"),
])
def test_an_internal_error_is_one_line_and_exit_3(args, tmp_path: Path, monkeypatch) -> None:
    """A bug in snapana, not in the input: one line naming the input, exit 3, no traceback
    unless --debug asks for it."""
    import snapana.sources

    def broken(*a, **k):
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr(snapana.sources, "load", broken)
    argv = [a.replace("{tmp}", str(tmp_path)) for a in args]
    run = invoke(*argv)
    assert run.returncode == 3, (run.stdout, run.stderr)
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and "internal error on" in lines[0] and str(OOM) in lines[0]
    assert "ZeroDivisionError: a bug" in lines[0] and "Traceback" not in run.stderr
    debug = invoke("--debug", *argv)
    assert debug.returncode == 3 and "Traceback" in debug.stderr


def test_synth_lists_and_writes_every_scenario_the_registry_has(tmp_path: Path) -> None:
    """`synth --list` names the bundled samples and the multi-GPU captures, and a listed
    multi-GPU scenario is written with its truth (its devices in the snapshot)."""
    from snapana.synth.scenarios import MULTI_DEVICE, SCENARIOS, SIZED

    listed = invoke("synth", "--list")
    assert listed.returncode == 0
    names = [line.split()[0] for line in listed.stdout.splitlines() if line.strip()]
    assert names == [*SCENARIOS, *MULTI_DEVICE, *SIZED]
    sized = tmp_path / "sized.pickle"
    assert invoke("synth", next(iter(SIZED)), "--batch", "3", "--seq", "64", "-o",
                  str(sized)).returncode == 0
    assert json.loads(sized.with_suffix(".truth.json").read_text())["facts"] == {
        "batch": 3, "seq": 64, "checkpointed": False}
    assert invoke("synth", next(iter(SCENARIOS)), "--seq", "64").returncode == 2
    name = next(iter(MULTI_DEVICE))
    out = tmp_path / "dp.pickle"
    assert invoke("synth", name, "-o", str(out)).returncode == 0
    truth = json.loads(out.with_suffix(".truth.json").read_text())
    assert len(raw_load(out)["device_traces"]) == len(truth["devices"]) > 1


def test_the_readme_writes_a_repeated_flag_as_repeated() -> None:
    """Issue 71: `--fail-on EXPR…` read as several values after one flag, which the CLI
    refuses (exit 2): an option taken once per value is written `[--flag VALUE]…` in the
    README's command table, and the form it shows works as written."""
    import re

    readme = (Path(__file__).parent.parent / "README.md").read_text()
    assert not re.search(r"\[--[a-z-]+ [^\]|`]*…\]", readme)
    assert "[--fail-on EXPR]…" in readme and "[--set KEY:VALUE]…" in readme
    before, after = (str(SAMPLES / n) for n in ("slime-tp2-recompute-loss-ok.pickle",
                                               "slime-tp2-chunked-logprob-oom.pickle"))
    run = invoke("diff", before, after, "--fail-on", "oom", "--fail-on", "new_family")
    assert run.returncode == 1 and "oom" in run.stdout + run.stderr, run.stderr
    run = invoke("diff", before, after, "--fail-on", "oom", "new_family")
    assert run.returncode == 2  # what the old wording read as: refused, as the README says


def test_every_variable_the_tests_read_is_in_the_readme() -> None:
    """Issue 71: `SNAPANA_CORPUS` (where the corpus tests look) was read by the tests and
    named nowhere a user reads: each environment variable tests/conftest.py reads is in the
    README."""
    import re

    root = Path(__file__).parent
    read = set(re.findall(r"environ(?:\.get\(|\[)\s*\"([A-Z_]+)\"",
                          (root / "conftest.py").read_text()))
    assert "SNAPANA_CORPUS" in read
    readme = (root.parent / "README.md").read_text()
    assert {v for v in read if f"`{v}" not in readme} == set()
