"""The command line resolved once (`snapana.inputs`, #59): files, folders, globs, `-`,
`--log`, `--trace` and `--memray` become one typed list (kind told by content, role, sidecar,
rank from the file name) and the lines for the files of a folder that are not read; the
commands and the rank runner read that list and resolve nothing again."""

from __future__ import annotations

import ast
import glob
import json
import pickle
from collections import Counter
from pathlib import Path

import pytest
import snapana
from snapana import sources
from snapana.capture_kinds import CaptureKind
from snapana.errors import InputError
from snapana.inputs import Input, Role, resolve
from snapana.sources import sidecar

PACKAGE = Path(snapana.__file__).parent
OOM_LINE = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 "
            "has a total capacity of 79.19 GiB of which 1.06 GiB is free.\n")


def _snapshot(path: Path) -> Path:
    path.write_bytes(pickle.dumps({"segments": [], "device_traces": []}, protocol=4))
    return path


def _trace(path: Path) -> Path:
    path.write_text(json.dumps({"traceEvents": []}))
    return path


def _memray(path: Path) -> Path:
    path.write_bytes(b"memray\x00" + bytes(64))
    return path


def _log(path: Path, text: str = OOM_LINE) -> Path:
    path.write_text(text)
    return path


@pytest.fixture
def counted(monkeypatch):
    """How often each path is sniffed and has its sidecar looked up."""
    sniffs: Counter[Path] = Counter()
    finds: Counter[Path] = Counter()
    real_sniff, real_find = sources.sniff, sidecar.find

    def sniff(path: Path) -> CaptureKind:
        sniffs[path] += 1
        return real_sniff(path)

    def find(path: Path) -> Path | None:
        finds[path] += 1
        return real_find(path)

    monkeypatch.setattr(sources, "sniff", sniff)
    monkeypatch.setattr(sidecar, "find", find)
    return sniffs, finds


def test_a_folder_of_one_snapshot_its_sidecar_its_other_captures_and_a_log(tmp_path, counted):
    job = tmp_path / "job"
    job.mkdir()
    snap = _snapshot(job / "snapshot.pickle")
    meta = job / "snapshot.meta.json"
    meta.write_text("{}")
    trace, host = _trace(job / "trace.json"), _memray(job / "host.bin")
    log = _log(job / "train.log")

    ins = resolve([str(job)])

    assert ins.items == (
        Input(snap, CaptureKind.TORCH_SNAPSHOT, Role.RANK, meta, None),
        Input(host, CaptureKind.MEMRAY, Role.BESIDE, None, None),
        Input(trace, CaptureKind.KINETO_TRACE, Role.BESIDE, None, None),
        # issue 71: the job's OOM log in its incident folder is read beside the snapshot,
        # as a log named among the inputs is, not listed as not taken
        Input(log, CaptureKind.TEXT_LOG, Role.LOG, None, None),
    )
    assert ins.skipped == ("snapshot.meta.json: a sidecar, read with its capture",)
    assert ins.single is None and not ins.text_only and ins.title == "1 inputs"
    assert set(ins.files) == {snap, meta, host, trace, log}  # never an output
    sniffs, finds = counted
    assert max(sniffs.values()) == 1 and max(finds.values()) == 1, (sniffs, finds)
    with pytest.raises(InputError, match="--at applies to one capture"):
        resolve([str(job)], at="oom")


def test_logs_alone_a_folder_of_per_rank_logs(tmp_path, counted):
    logs = tmp_path / "logs"
    logs.mkdir()
    r0, r1 = _log(logs / "worker_rank_0.log"), _log(logs / "worker_rank_1.log")
    (logs / "core.bin").write_bytes(b"\x00\x01\x02")

    ins = resolve([str(logs)])

    assert ins.items == (Input(r0, CaptureKind.TEXT_LOG, Role.LOG, None, 0),
                         Input(r1, CaptureKind.TEXT_LOG, Role.LOG, None, 1))
    assert ins.skipped == (f"{logs / 'core.bin'}: not read (not a text log, or empty)",)
    assert ins.text_only and ins.title == "2 logs"
    assert set(ins.files) == {r0, r1, logs}  # an output inside a folder of logs is refused
    assert max(counted[0].values()) == 1


def test_standard_input_is_one_log_with_no_path():
    ins = resolve(["-"])
    assert ins.items == (Input(None, CaptureKind.TEXT_LOG, Role.LOG),)
    assert ins.text_only and ins.files == [] and ins.title == "<stdin>"


def test_a_glob_of_rank_files_each_a_rank_with_its_sidecar(tmp_path, counted, monkeypatch):
    snaps = [_snapshot(tmp_path / f"snapshot_oom_rank-{r}.pickle") for r in (2, 0, 1)]
    meta = tmp_path / "snapshot_oom_rank-1.meta.json"
    meta.write_text("{}")
    globbed: Counter[str] = Counter()
    real_glob = glob.glob

    def counted_glob(pattern: str) -> list[str]:
        globbed[pattern] += 1
        return real_glob(pattern)

    monkeypatch.setattr(glob, "glob", counted_glob)

    ins = resolve([str(tmp_path / "snapshot_oom_rank-*.pickle")])

    assert [(i.path, i.kind, i.role, i.sidecar, i.rank) for i in ins.items] == [
        (tmp_path / f"snapshot_oom_rank-{r}.pickle", CaptureKind.TORCH_SNAPSHOT, Role.RANK,
         meta if r == 1 else None, r) for r in (0, 1, 2)]
    assert ins.ranks == list(ins.items) and ins.single is None
    assert set(ins.files) == {*snaps, meta}
    assert max(counted[0].values()) == 1 and max(counted[1].values()) == 1
    assert list(globbed.values()) == [1]  # matched once (as text, then as captures)
    with pytest.raises(InputError, match="--at applies to one capture"):
        resolve([str(tmp_path / "snapshot_oom_rank-*.pickle")], at="peak")
    one = resolve([str(tmp_path / "snapshot_oom_rank-0*.pickle")], at="peak")  # a glob of one
    assert one.single == Input(snaps[1], CaptureKind.TORCH_SNAPSHOT, Role.SHOWN, None, 0)


def test_a_log_named_among_captures_is_read_beside_the_one_shown(tmp_path, counted):
    snap, log = _snapshot(tmp_path / "oom.pickle"), _log(tmp_path / "job.log")
    trace, host = _trace(tmp_path / "prof.json"), _memray(tmp_path / "host.bin")
    other = _log(tmp_path / "other.log")

    ins = resolve([str(snap), str(log)], logs=[other], trace=[trace], memray=[host])

    assert [(i.path, i.kind, i.role) for i in ins.items] == [
        (snap, CaptureKind.TORCH_SNAPSHOT, Role.SHOWN),
        (trace, CaptureKind.KINETO_TRACE, Role.BESIDE),
        (host, CaptureKind.MEMRAY, Role.BESIDE),
        (other, CaptureKind.TEXT_LOG, Role.LOG),
        (log, CaptureKind.TEXT_LOG, Role.LOG),
    ]
    assert ins.single is not None and ins.single.path == snap and ins.title == "oom.pickle"
    assert set(ins.files) == {snap, log, trace, host, other}
    assert max(counted[0].values()) == 1 and max(counted[1].values()) == 1
    # several captures: a rank table; --trace / --memray belong to one capture only
    both = [str(snap), str(_snapshot(tmp_path / "b.pickle")), str(log)]
    with pytest.raises(InputError, match="read beside one capture"):
        resolve(both, trace=[trace])
    two = resolve(both)
    assert [(i.path.name, i.role) for i in two.items if i.path] == [
        ("oom.pickle", Role.RANK), ("b.pickle", Role.RANK), ("job.log", Role.LOG)]


def test_a_file_named_is_read_or_refused_never_passed_over(tmp_path):
    """A `--trace` / `--memray` beside several captures, or beside logs alone, would be read
    by nothing: refused, one line, exit 2, before any work (it was passed over without a
    word, and `-o` naming it replaced it with the report). A `--log` beside logs alone is
    one more log: read with them, and never the output."""
    from snapana.cli import app
    from typer.testing import CliRunner

    a, b = _snapshot(tmp_path / "rank0.pickle"), _snapshot(tmp_path / "rank1.pickle")
    trace, host = _trace(tmp_path / "t.json"), _memray(tmp_path / "host.bin")
    log, other = _log(tmp_path / "job.log"), _log(tmp_path / "other.log")
    for args in ([str(a), str(b)], [str(log)]):
        for beside in ({"trace": [trace]}, {"memray": [host]}):
            with pytest.raises(InputError, match="read beside one capture"):
                resolve(args, **beside)
    ins = resolve([str(log)], logs=[other])
    assert [i.path for i in ins.logs] == [log, other] and ins.text_only
    for args, kept in (([str(a), str(b), "--trace", str(trace), "-o", str(tmp_path / "r.html")],
                        trace),
                       ([str(log), "--log", str(other), "-o", str(other)], other)):
        before = kept.read_bytes()
        run = CliRunner().invoke(app, ["report", *args])
        assert run.exit_code == 2, run.output
        assert kept.read_bytes() == before
        assert len(run.output.strip().splitlines()) == 1, run.output
    run = CliRunner().invoke(app, ["report", str(log), "--log", str(other),
                                   "-o", str(tmp_path / "logs.html")])
    assert run.exit_code == 0, run.output
    assert "other.log" in (tmp_path / "logs.html").read_text()


def test_an_input_that_cannot_be_told_carries_its_refusal_to_where_it_is_read(tmp_path):
    snap = _snapshot(tmp_path / "a.pickle")
    empty = tmp_path / "b.pickle"
    empty.write_bytes(b"")
    ins = resolve([str(snap), str(empty)])
    assert [i.kind for i in ins.ranks] == [CaptureKind.TORCH_SNAPSHOT, None]
    assert ins.ranks[1].problem == f"{empty}: empty file"
    with pytest.raises(InputError, match="empty file"):
        ins.ranks[1].known_kind()
    # the same line as the source gives it when it is read
    with pytest.raises(InputError) as read:
        sources.sniff(empty)
    assert str(read.value) == ins.ranks[1].problem


def test_every_rank_takes_one_input_as_a_rank_too(tmp_path):
    snap = _snapshot(tmp_path / "rank3.pickle")
    ins = resolve([str(snap)], texts=False, every_rank=True)
    assert ins.items == (Input(snap, CaptureKind.TORCH_SNAPSHOT, Role.RANK, None, 3),)


# ----- nothing resolves an input a second time ---------------------------------------------------
#: What resolving an input is: telling its kind, expanding folders and globs, finding its
#: sidecar, reading its rank from its name.
RESOLVING = {"sniff", "expand", "expand_inputs", "find_sidecar", "rank_of", "_folder"}


def _resolving_calls(path: Path) -> list[str]:
    """The calls in a module to a function that resolves an input (by name or attribute,
    `sidecar.find` included)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) \
            else ""
        if name in RESOLVING or (isinstance(f, ast.Attribute) and f.attr == "find"
                                 and isinstance(f.value, ast.Name) and f.value.id == "sidecar"):
            found.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {name}")
    return found


def test_the_resolver_is_the_only_place_that_resolves_an_input():
    """The commands and the rank runner read the list `inputs.resolve` made; none of them
    sniffs, expands or looks for a sidecar itself."""
    consumers = sorted([*(PACKAGE / "commands").glob("*.py"),
                        *(PACKAGE / "analysis" / "ranks").glob("*.py")])
    found = [call for path in consumers for call in _resolving_calls(path)]
    assert not found, found
    # the scan sees such calls where they are: in the resolver
    assert {c.rsplit(" ", 1)[1] for c in _resolving_calls(PACKAGE / "inputs.py")} >= {
        "sniff", "expand", "find", "rank_of", "_folder"}


@pytest.mark.parametrize("stray", ["notes.txt", "readme.md"])
def test_a_folder_of_a_snapshot_by_content_and_a_stray_text_is_analysed(tmp_path, stray):
    """Issue 71: `incident/` holding `rank0.pickle__3f2a9c` (a snapshot by content, not by
    name) and a note was read as a folder of logs and refused whole (exit 2, "none of the
    text inputs says anything about GPU memory"): the snapshot is analysed, the note listed
    as not taken with why, exit 0 (the README's table: a file that is not a capture is no
    failure); an OOM log beside it is read as the log of the same failure (as one named
    among the inputs is)."""
    import shutil

    from .conftest import SAMPLES, invoke

    folder = tmp_path / "incident"
    folder.mkdir()
    snap = folder / "rank0.pickle__3f2a9c"
    shutil.copy(SAMPLES / "fsdp-train-step.pickle", snap)
    (folder / stray).write_text("# what happened\nrestarted at 3am, same config\n")
    _log(folder / "job.log")
    ins = resolve([str(folder)])
    assert [i.path for i in ins.ranks] == [snap]
    assert [i.path for i in ins.logs] == [folder / "job.log"]
    assert ins.skipped == (f"{stray}: no OOM message or capture in it",)
    run = invoke("summary", str(folder), "-f", "json")
    assert run.returncode == 0, run.stderr
    data = json.loads(run.stdout)
    assert [Path(e["file"]).name for e in data["inputs"]] == [snap.name]
    assert sorted(data["skipped"]) == sorted(ins.skipped)


def test_an_incident_folder_s_oom_log_is_checked_against_its_snapshot(tmp_path):
    """Issue 71: the log a crashed job left beside its snapshot was listed as not taken
    ("give it beside a snapshot with --log") though the folder was the incident: it is
    read as `--log` would be, and its figures are checked against the snapshot. The log's
    line is written here from the raw pickle's OOM entry, as PyTorch's message prints it."""
    import pickle
    import shutil

    from .conftest import SAMPLES, invoke

    sample = SAMPLES / "slime-tp1-logits-fp32-oom.pickle"
    raw = pickle.loads(sample.read_bytes())
    oom = next(e for t in raw["device_traces"] for e in t if e["action"] == "oom")
    gib = 2**30
    folder = tmp_path / "incident"
    folder.mkdir()
    shutil.copy(sample, folder / "rank0.pickle")
    (folder / "train.log").write_text(
        "step 12\n[rank0]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate "
        f"{oom['size'] / gib:.2f} GiB. GPU 0 has a total capacity of 79.11 GiB of which "
        f"{oom['device_free'] / gib:.2f} GiB is free.\n")
    run = invoke("summary", str(folder), "-f", "json")
    assert run.returncode == 0, run.stderr
    data = json.loads(run.stdout)
    assert data["skipped"] == []
    (check,) = data["log_checks"]
    assert check["title"].startswith("train.log line 2 (rank 0)")
    rows = {r[0]: r for r in check["rows"]}
    assert rows["device free"][1] == f"{oom['device_free'] / gib:.2f} GiB"
    assert rows["device free"][3] == "agrees"
