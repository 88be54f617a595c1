"""Many snapshots at once: an 8-rank incident built with the allocator simulator."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import polars as pl
import pytest
from snapana.analysis.ranks.aggregate import aggregate
from snapana.session import summarize_many
from snapana.synth import CachingAllocatorSim, SimulatedOOM

from .browser import open_report
from .conftest import SAMPLES, SNAPSHOTS, invoke, require

MiB, GiB = 2**20, 2**30
SITE = "/usr/lib/python3.10/site-packages"
STACKS = {
    "parameters": [(f"{SITE}/torch/nn/modules/module.py", 930, "_apply"),
                   ("/job/train.py", 10, "main")],
    "optimizer_state": [(f"{SITE}/torch/optim/adam.py", 120, "_init_group"),
                        (f"{SITE}/torch/optim/adam.py", 210, "step"),
                        (f"{SITE}/torch/optim/optimizer.py", 480, "wrapper"),
                        ("/job/train.py", 50, "main")],
    "saved_activations": [("/job/model.py", 54, "forward"),
                          (f"{SITE}/torch/nn/modules/module.py", 1790, "_call_impl"),
                          ("/job/train.py", 30, "main")],
}
FAILING, LATE_FAILING, IMBALANCED = 5, 6, 3


def _rank_snapshot(rank: int) -> dict:
    # every rank starts at the same wall-clock time; rank 6 fails later than rank 5
    sim = CachingAllocatorSim(capacity=12 * GiB, outside_pytorch=GiB,
                              time_origin_us=1_700_000_000_000_000)
    for _ in range(4):
        sim.malloc(512 * MiB, STACKS["parameters"], family="parameters")
    for _ in range(8):
        sim.malloc(512 * MiB, STACKS["optimizer_state"], family="optimizer_state")
    acts = 6 if rank != IMBALANCED else 10
    for _ in range(acts):
        sim.malloc(256 * MiB, STACKS["saved_activations"], family="saved_activations")
    if rank == LATE_FAILING:
        sim.advance(5_000_000)
    if rank in (FAILING, LATE_FAILING):
        try:
            sim.malloc(4 * GiB, STACKS["saved_activations"], family="saved_activations")
        except SimulatedOOM:
            pass
    return sim.snapshot()


@pytest.fixture(scope="module")
def incident(tmp_path_factory):
    folder = tmp_path_factory.mktemp("incident")
    for rank in range(8):
        (folder / f"snapshot_oom_rank-{rank}.pickle").write_bytes(
            pickle.dumps(_rank_snapshot(rank), protocol=4))
    (folder / "snapshot_oom_rank-8.pickle").write_bytes(b"\x80\x04not a pickle at all")
    return folder


def test_the_failing_rank_and_the_outlier_are_named(incident):
    paths = sorted(incident.glob("*.pickle"))
    m = aggregate(summarize_many(paths, workers=2))
    assert m.first_oom is not None and m.first_oom.rank == FAILING
    assert {r.rank for r in m.ok if r.oom} == {FAILING, LATE_FAILING}
    flagged = {(o["rank"], o["family"]) for o in m.outliers}
    assert (IMBALANCED, "saved_activations") in flagged
    assert all(rank == IMBALANCED for rank, _ in flagged)
    broken = [r for r in m.ranks if r.error]
    assert [r.rank for r in broken] == [8] and "not a readable pickle" in broken[0].error
    assert m.one_job


def test_summary_json_has_one_entry_per_input(incident):
    result = invoke("summary", str(incident), "--format", "json")
    assert result.returncode == 5, result.stderr  # rank 8 cannot be read (SOME_INPUTS_FAILED)
    data = json.loads(result.stdout)
    entries = {e["rank"]: e for e in data["inputs"]}
    assert sorted(entries) == list(range(9))
    raw = pickle.loads((incident / f"snapshot_oom_rank-{FAILING}.pickle").read_bytes())
    (oom,) = [e for e in raw["device_traces"][0] if e["action"] == "oom"]
    assert entries[FAILING]["oom"]["requested_bytes"] == oom["size"]
    assert entries[FAILING]["first_oom"] and not entries[LATE_FAILING]["first_oom"]
    reserved = sum(s["total_size"] for s in raw["segments"])
    assert entries[FAILING]["reserved_bytes"] == reserved
    assert entries[8]["error"] and entries[8]["oom"] is None
    assert entries[IMBALANCED]["outlier_families"] == ["saved_activations"]


@pytest.mark.chromium
def test_multi_report_renders(incident, tmp_path):
    out = tmp_path / "all.html"
    result = invoke("report", str(incident / "*.pickle"), "-o", str(out))
    assert result.returncode == 5, result.stderr  # rank 8 cannot be read: listed, exit 5
    visit = open_report(out)
    assert visit.console_errors == [] and visit.requests == [out.resolve().as_uri()]
    assert "First to run out of memory: rank 5" in visit.text
    assert visit.plots == visit.figure_divs >= 4  # heatmap + the failing rank's charts


@pytest.mark.dask
def test_dask_engine_in_local_mode(incident, tmp_path):
    require("dask")
    out = tmp_path / "dataset"
    result = invoke("batch", str(incident), "-o", str(out), "--engine", "dask",
                     "--job", "incident42")
    assert result.returncode == 0, result.stderr
    ranks = pl.read_parquet(out / "ranks", hive_partitioning=True)
    assert sorted(ranks["rank"].to_list()) == list(range(9))
    assert set(ranks["job"].to_list()) == {"incident42"}
    first = ranks.filter(pl.col("first_oom"))
    assert first["rank"].to_list() == [FAILING]
    fams = pl.read_parquet(out / "families", hive_partitioning=True)
    act = fams.filter(pl.col("family") == "saved_activations")
    by_rank = dict(zip(act["rank"].to_list(), act["bytes"].to_list(), strict=True))
    assert by_rank[IMBALANCED] > by_rank[0]


@pytest.mark.corpus
def test_unrelated_corpus_files_are_said_to_be_unrelated(tmp_path):
    if not SNAPSHOTS.is_dir():
        pytest.skip("../shared/corpus absent")
    out = tmp_path / "corpus.html"
    result = invoke("report", str(SNAPSHOTS), "-o", str(out))
    assert result.returncode == 0, result.stderr
    text = out.read_text()
    assert "do not look like one job" in text
    summary = json.loads(invoke("summary", str(SNAPSHOTS), "--format", "json").stdout)
    assert summary["one_job"] is False and summary["outliers"] == []
    # every snapshot of the folder is an input, whatever its name ends with (.pickle, .pkl,
    # a commit-suffixed copy such as dump_snapshot.pickle__c5af41f): content decides
    assert len(summary["inputs"]) == len([p for p in SNAPSHOTS.iterdir()
                                          if p.is_file() and p.suffix != ".md"])


def test_batch_of_files_without_ranks_keeps_every_file(tmp_path):
    """Inputs whose names carry no rank (the bundled samples) all land in rank=-1, one part
    each: the dataset holds one row per input, none lost and no crash."""
    samples = sorted(SAMPLES.glob("*.pickle"))[:3]
    folder = tmp_path / "incident"
    folder.mkdir()
    for p in samples:
        (folder / p.name).write_bytes(p.read_bytes())
    out = tmp_path / "dataset"
    result = invoke("batch", str(folder), "-o", str(out))
    assert result.returncode == 0, result.stderr
    ranks = pl.read_parquet(out / "ranks", hive_partitioning=True)
    assert sorted(Path(f).name for f in ranks["file"].to_list()) == [p.name for p in samples]
    assert set(ranks["rank"].to_list()) == {-1}


def test_a_folder_is_read_by_content_and_nothing_is_dropped_silently(tmp_path):
    """Issue 46: a folder holding a suffixed pickle (`rank1.pickle__<sha>`, as artefact
    stores name them), a profiler trace, a memray capture, a text log, an empty file and a
    sidecar: the two snapshots are analysed, each other file is named with why it is not."""
    import shutil

    shutil.copy(SAMPLES / "slime-tp2-recompute-loss-ok.pickle", tmp_path / "rank0.pickle")
    shutil.copy(SAMPLES / "slime-tp2-chunked-logprob-oom.pickle",
                tmp_path / "rank1.pickle__3f2a9c")
    (tmp_path / "trace.json").write_text('{"traceEvents": [], "schemaVersion": 1}')
    (tmp_path / "host.bin").write_bytes(b"memray\x00\x01 not a whole capture")
    (tmp_path / "job.log").write_text("torch.OutOfMemoryError: CUDA out of memory.\n")
    (tmp_path / "empty.dat").write_bytes(b"")
    (tmp_path / "rank9.pickle.meta.json").write_text("{}")
    out = invoke("summary", str(tmp_path), "-f", "json")
    data = json.loads(out.stdout)
    assert data["headline"].startswith("2 inputs, 2 analysed.")
    assert {Path(e["file"]).name for e in data["inputs"]} == {"rank0.pickle",
                                                               "rank1.pickle__3f2a9c"}
    why = {line.split(":", 1)[0]: line for line in data["skipped"]}
    # the OOM log is read as the log of the same failure (issue 71), not listed
    assert set(why) == {"trace.json", "host.bin", "empty.dat", "rank9.pickle.meta.json"}
    assert "profiler trace" in why["trace.json"] and "memray" in why["host.bin"]
    assert "empty file" in why["empty.dat"]
    assert "sidecar" in why["rank9.pickle.meta.json"]
    text = " ".join(invoke("summary", str(tmp_path)).stdout.split())
    assert "4 other files not taken as inputs" in text


def _profiler_trace(path: Path, nbytes: int = 64 * MiB) -> None:
    """A torch.profiler chrome trace of one op allocating and freeing `nbytes` on the CPU,
    in the profiler's own event layout (`[memory]` instant events, as test_source_kineto)."""
    def mem(ts: int, n: int, total: int) -> dict:
        return {"ph": "i", "s": "t", "cat": "cpu_instant_event", "name": "[memory]",
                "pid": 1, "tid": 1, "ts": ts,
                "args": {"Device Type": 0, "Device Id": -1, "Bytes": n, "Addr": 0x7000,
                         "Total Allocated": total, "Total Reserved": total}}

    events = [{"ph": "X", "cat": "cpu_op", "name": "aten::empty", "pid": 1, "tid": 1,
               "ts": 10, "dur": 5, "args": {}}, mem(12, nbytes, nbytes), mem(40, -nbytes, 0)]
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": events}))


def test_an_incident_folder_with_strays_a_failed_input_and_a_state_only_dump(tmp_path):
    """Issue 60: one incident's folder (its pickle, a profiler trace, a stray notes.txt and
    a binary stray) is analysed, each other file listed with why, the trace read beside the
    snapshot; an input that cannot be read is listed with its reason and the run ends with
    exit code 5 (errors.SOME_INPUTS_FAILED; none read: 2); a state-only dump named for an
    OOM is 'unknown' in the OOM column, as its own report says it cannot tell."""
    import shutil

    from snapana.errors import SOME_INPUTS_FAILED

    from .conftest import raw_load

    folder = tmp_path / "incident"
    folder.mkdir()
    shutil.copy(SAMPLES / "slime-tp2-chunked-logprob-oom.pickle", folder / "rank0.pickle")
    _profiler_trace(folder / "trace.json")
    (folder / "notes.txt").write_text("restarted the job at 3am, same config as yesterday\n")
    (folder / "photo.png").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4)
    run = invoke("summary", str(folder))
    assert run.returncode == 0, run.stderr
    flowed = " ".join(run.stdout.split())
    assert flowed.startswith("1 input, 1 analysed. 2 other files not taken as inputs")
    for name in ("notes.txt", "photo.png"):
        assert f"{name}: " in flowed
    assert "1 other capture of this folder: trace.json: a torch.profiler trace" in flowed
    assert "the full report of" in flowed and "rank0.pickle" in flowed
    (folder / "trace.json").unlink()

    whole = raw_load(SAMPLES / "slime-tp2-recompute-loss-ok.pickle")
    state_only = dict(whole, device_traces=[[] for _ in whole["device_traces"]])
    (folder / "rank1_oom_snapshot.pickle").write_bytes(pickle.dumps(state_only))
    (folder / "rank2.pickle").write_bytes((SAMPLES / "fsdp-train-step.pickle")
                                          .read_bytes()[:4000])  # cut short
    js = invoke("summary", str(folder), "-f", "json")
    assert js.returncode == SOME_INPUTS_FAILED == 5
    data = json.loads(js.stdout)
    failed = {Path(e["file"]).name: e for e in data["inputs"] if e.get("error")}
    assert list(failed) == ["rank2.pickle"] and "truncated" in failed["rank2.pickle"]["error"]
    assert "1 of 3 inputs could not be read" in js.stderr and "exit code 5" in js.stderr
    text = invoke("summary", str(folder), columns=200)
    assert text.returncode == 5
    row = next(ln for ln in text.stdout.splitlines() if "rank1_oom_snapshot" in ln)
    assert "unknown: no history, written at an OOM" in row and "  no  " not in row
    report = invoke("report", str(folder), "-o", str(tmp_path / "r.html"))
    assert report.returncode == 5 and (tmp_path / "r.html").is_file()
    (folder / "rank2.pickle").unlink()
    assert invoke("summary", str(folder)).returncode == 0


def test_a_folders_trace_is_read_beside_its_one_snapshot(tmp_path):
    """Issue 60: a folder of one incident (its snapshot, a profiler trace of the same job, a
    broken memray capture): the trace is read beside the snapshot as `--trace` reads it (its
    own report follows, in JSON too), the listing says what each file gave; the capture that
    cannot be read is listed with why, and the run ends with exit code 5. Beside several
    snapshots a trace is tied to none: it is listed with why, not read."""
    import shutil

    from snapana.errors import SOME_INPUTS_FAILED

    folder = tmp_path / "incident"
    folder.mkdir()
    shutil.copy(SAMPLES / "slime-tp2-chunked-logprob-oom.pickle", folder / "rank0.pickle")
    _profiler_trace(folder / "trace.json", nbytes=64 * MiB)
    alone = json.loads(invoke("summary", str(folder / "trace.json"), "-f", "json").stdout)
    js = invoke("summary", str(folder), "-f", "json")
    assert js.returncode == 0, js.stderr
    data = json.loads(js.stdout)
    (beside,) = data["beside"]
    assert beside.startswith("trace.json: a torch.profiler trace of the same folder, read "
                             "beside rank0.pickle") and "not joined to its blocks" in beside
    paths = [Path(d["file"]).name for d in data["devices"]]
    assert paths == ["rank0.pickle", "trace.json"]
    # the trace's report is the one it gets alone
    assert data["devices"][1]["peak_allocated_bytes"] == \
        alone["devices"][0]["peak_allocated_bytes"] == 64 * MiB
    page = tmp_path / "r.html"
    assert invoke("report", str(folder), "-o", str(page)).returncode == 0
    assert "Sources together" in page.read_text()

    (folder / "host.bin").write_bytes(b"memray\x00\x01 not a whole capture")
    run = invoke("summary", str(folder), columns=200)
    assert run.returncode == SOME_INPUTS_FAILED, run.stderr
    flowed = " ".join(run.stdout.split())
    assert "2 other captures of this folder: host.bin: a memray capture, not read (" in flowed
    assert "1 of 3 inputs could not be read" in run.stderr

    (folder / "host.bin").unlink()
    shutil.copy(SAMPLES / "slime-tp2-recompute-loss-ok.pickle", folder / "rank1.pickle")
    data = json.loads(invoke("summary", str(folder), "-f", "json").stdout)
    assert data["beside"] == []
    assert any(s.startswith("trace.json: a torch.profiler trace: give it alone, or beside a "
                            "snapshot with --trace (with several snapshots it is tied to none)")
               for s in data["skipped"])
    assert all(Path(d["file"]).suffix == ".pickle" for d in data["devices"])


@pytest.mark.memray
def test_a_folders_memray_capture_is_read_beside_its_one_snapshot(tmp_path):
    """The same with a real memray capture of this process: its host report follows the
    snapshot's, with the high-water mark memray itself records."""
    import shutil

    memray = require("memray")
    folder = tmp_path / "incident"
    folder.mkdir()
    shutil.copy(SAMPLES / "slime-tp2-chunked-logprob-oom.pickle", folder / "rank0.pickle")
    with memray.Tracker(str(folder / "host.bin")):
        held = bytearray(48 * MiB)
    del held
    peak = memray.FileReader(str(folder / "host.bin")).metadata.peak_memory
    js = invoke("summary", str(folder), "-f", "json")
    assert js.returncode == 0, js.stderr
    data = json.loads(js.stdout)
    (beside,) = data["beside"]
    assert beside.startswith("host.bin: a memray capture of the same folder, read beside "
                             "rank0.pickle")
    host = data["devices"][1]
    assert Path(host["file"]).name == "host.bin" and host["host"]
    assert host["peak_allocated_bytes"] == peak


def test_the_headline_does_not_deny_a_dump_written_at_an_oom(tmp_path):
    """Issue 71: a folder of a run with no OOM in its history and a state-only dump whose name
    says it was written at one: the headline said "No input recorded an OOM." above that
    dump's row "unknown: no history, written at an OOM". Both now say the same: no history
    records an OOM, and one dump (no history) was written at one."""
    import shutil

    from .conftest import raw_load

    shutil.copy(SAMPLES / "fsdp-train-step.pickle", tmp_path / "rank0.pickle")
    whole = raw_load(SAMPLES / "slime-tp2-recompute-loss-ok.pickle")
    state_only = dict(whole, device_traces=[[] for _ in whole["device_traces"]])
    (tmp_path / "rank1_oom_snapshot.pickle").write_bytes(pickle.dumps(state_only))
    text = invoke("summary", str(tmp_path), columns=200)
    assert text.returncode == 0, text.stderr
    row = next(ln for ln in text.stdout.splitlines() if "rank1_oom_snapshot" in ln)
    assert "written at an OOM" in row
    flowed = " ".join(text.stdout.split())
    assert "No input recorded an OOM" not in flowed
    assert "1 dump without history was written at one" in flowed
    data = json.loads(invoke("summary", str(tmp_path), "-f", "json").stdout)
    assert "1 dump without history was written at one" in data["headline"]
    shutil.copy(SAMPLES / "fsdp-train-step.pickle", tmp_path / "rank1_oom_snapshot.pickle")
    flowed = " ".join(invoke("summary", str(tmp_path)).stdout.split())
    assert "No input recorded an OOM." in flowed  # history, and no OOM in it: said plainly
