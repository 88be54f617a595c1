"""Issue 66, fifth round: thousands of ranks. A job on 4,096 GPUs dumps a tiny snapshot per
rank; a rank folder paid an interpreter per file (its bounded decode child) and kept every
rank's findings. Now each rank worker decodes its small files in one kept decode process
(`sources.decode_pool`), under each file's own limits, and the run keeps each rank's row."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest
from snapana.analysis.ranks.aggregate import aggregate
from snapana.analysis.ranks.runner import run_many
from snapana.errors import InputError
from snapana.inputs import resolve
from snapana.render.json import ranks_dict
from snapana.render.views import ranks_view
from snapana.render.wording import rank_rows
from snapana.session import summarize, summarize_many
from snapana.sources import decode_pool
from snapana.sources.torch_snapshot import load
from snapana.synth import CachingAllocatorSim, SimulatedOOM

from .conftest import invoke
from .fuzz.pickle_codec import Laughs, Raw, encode

MiB, GiB = 1 << 20, 1 << 30
STACK = [("/job/model.py", 54, "forward"), ("/job/train.py", 30, "main")]


def _tiny(rank: int, oom: bool = False) -> bytes:
    """A small valid snapshot pickle (about 1 KB); `oom`: its last request fails."""
    sim = CachingAllocatorSim(capacity=64 * MiB, time_origin_us=1_700_000_000_000_000)
    for _ in range(3):
        sim.malloc((rank % 7 + 1) * MiB, STACK, family="activations")
    if oom:
        sim.advance(1000 * rank)
        try:
            sim.malloc(128 * MiB, STACK, family="activations")
        except SimulatedOOM:
            pass
    return pickle.dumps(sim.snapshot(), protocol=4)


def _folder(base: Path, n: int, bad: dict[int, bytes] | None = None,
            oom: frozenset[int] = frozenset()) -> Path:
    base.mkdir()
    for rank in range(n):
        data = (bad or {}).get(rank)
        (base / f"rank{rank}.pickle").write_bytes(data if data is not None
                                                  else _tiny(rank, rank in oom))
    return base


def _started(log: Path) -> list[str]:
    """The kinds of the decode processes started (SNAPANA_CHILD_LOG: `pid kind` a line)."""
    return [line.split()[1] for line in log.read_text().splitlines()] if log.exists() else []


def _table(summaries: list) -> tuple[list, str]:
    """The rank table's rows and its JSON, as `summary DIR` prints them."""
    m = aggregate(summaries)
    return rank_rows(m), json.dumps(ranks_dict(ranks_view(m)), sort_keys=True)


def _one_child_each(folder: Path) -> list:
    """The old per-file path: each input summarised in this process, a decode child each."""
    return [summarize(i, [], None)[0] for i in resolve([str(folder)], texts=False).ranks]


def test_a_folder_of_200_ranks_starts_one_decode_process_per_worker(tmp_path, monkeypatch):
    folder = _folder(tmp_path / "job", 200)
    log = tmp_path / "children.log"
    monkeypatch.setenv("SNAPANA_CHILD_LOG", str(log))
    summaries = summarize_many([folder], workers=2)
    assert len(summaries) == 200 and all(s.error is None for s in summaries)
    # before: a child per file (200 starts); now one kept process in each worker
    assert 1 <= len(_started(log)) <= 2 and set(_started(log)) == {"pool"}
    log.unlink()
    assert len(summarize_many([folder], workers=1)) == 200  # a run in this process: one
    assert _started(log) == ["pool"]


def test_the_cli_on_a_folder_starts_a_decode_process_per_worker_not_per_file(
        tmp_path, monkeypatch):
    folder = _folder(tmp_path / "job", 40)
    log = tmp_path / "children.log"
    monkeypatch.setenv("SNAPANA_CHILD_LOG", str(log))
    for form in (str(folder), str(folder / "rank*.pickle")):
        log.unlink(missing_ok=True)
        result = invoke("summary", form, "--format", "json", "--workers", "2")
        assert result.returncode == 0, result.stderr
        assert len(json.loads(result.stdout)["inputs"]) == 40
        # the workers' kept processes, and the rank shown in full analysed once more
        assert _started(log).count("pool") <= 2 and len(_started(log)) <= 3, _started(log)


EVIL = b"\x80\x02cos\nsystem\n(S'true'\ntR."


@pytest.mark.parametrize("case", ["plain", "with an OOM", "with bad files"])
def test_the_rank_table_is_byte_identical_to_a_child_per_file(tmp_path, case):
    bad = {} if case != "with bad files" else {
        2: b"\x80\x04not a pickle at all", 5: _tiny(5)[:40], 7: EVIL}
    oom = frozenset({3, 6}) if case == "with an OOM" else frozenset()
    folder = _folder(tmp_path / "job", 10, bad, oom)
    before = _table(_one_child_each(folder))
    for workers in (1, 2):
        assert _table(summarize_many([folder], workers=workers)) == before
    if bad:  # each bad file keeps its one-line refusal in its row
        errors = {Path(r["file"]).name: r["error"] for r in json.loads(before[1])["inputs"]
                  if r["error"]}
        assert set(errors) == {"rank2.pickle", "rank5.pickle", "rank7.pickle"}
        assert "os.system" in errors["rank7.pickle"]
        assert all("\n" not in e for e in errors.values())


def test_a_hostile_rank_costs_the_kept_process_not_the_folder(tmp_path, monkeypatch):
    # the laughs run past the decode's alarm (its process ends), the memo index past its
    # memory limit (it replies, then goes): each is refused as a child refuses it, and the
    # next file gets a new process with its own limits
    monkeypatch.setenv("SNAPANA_DECODE_SECONDS", "1")
    files = {"good": _tiny(1), "laughs": encode({Laughs("tuple", 60): 1, "segments": []}),
             "memo": encode({"segments": [], "device_traces": [],
                             "user_metadata": Raw(b"Nr\xff\xff\xff\x3f")}),
             "evil": EVIL, "cut": _tiny(2)[:30]}
    for name, data in files.items():
        (tmp_path / f"{name}.pickle").write_bytes(data)
    order = ["good", "laughs", "good", "memo", "good", "evil", "good", "cut", "good"]

    def said() -> list[str]:
        out = []
        for name in order:
            try:
                load(tmp_path / f"{name}.pickle")
                out.append("ok")
            except InputError as exc:
                out.append(str(exc).split(": ", 1)[1])
        return out

    log = tmp_path / "children.log"
    monkeypatch.setenv("SNAPANA_CHILD_LOG", str(log))
    alone = said()
    assert _started(log) == ["child"] * len(order)
    log.unlink()
    with decode_pool.kept():
        kept = said()
    assert kept == alone
    assert "did not finish" in alone[1] and "memory" in alone[3] and "os.system" in alone[5]
    assert _started(log) == ["pool"] * 3  # the first, and one after each that ended it


def test_a_large_file_keeps_a_child_of_its_own(tmp_path, monkeypatch):
    path = tmp_path / "big.pickle"
    path.write_bytes(pickle.dumps({"segments": [], "device_traces": [],
                                   "pad": "x" * (decode_pool.SERVED_BYTES + 1)}, protocol=4))
    log = tmp_path / "children.log"
    monkeypatch.setenv("SNAPANA_CHILD_LOG", str(log))
    with decode_pool.kept():
        load(path)
    assert _started(log) == ["child"]  # the scan and the payload file are a child's


def test_a_rank_run_keeps_rows_not_analyses(tmp_path):
    folder = _folder(tmp_path / "job", 12, oom=frozenset({4}))
    ins = resolve([str(folder)], texts=False).ranks
    for workers in (1, 2):
        run = run_many(ins, summarize, workers, [], None)
        assert all(s.findings is None for s in run.summaries)
        assert all(s.history for s in run.summaries)
        # in this process: the full report of the rank shown in full alone
        assert len(run.kept) == (1 if workers == 1 else 0)
    assert list(run_many(ins, summarize, 1, [], None).kept) == [str(folder / "rank4.pickle")]
    # where the findings are asked for (batch words each rank's verdict), they are kept
    asked = run_many(ins, summarize, 2, [], None, findings=True)
    assert all(s.findings is not None for s in asked.summaries)


def _bytes_read() -> int:
    with open("/proc/self/io") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("rchar:"))


@pytest.mark.skipif(not Path("/proc/self/io").exists(), reason="Linux's /proc/self/io")
def test_a_folder_of_compressed_ranks_is_sniffed_by_its_first_bytes(tmp_path):
    import gzip
    import os

    folder = tmp_path / "job"
    folder.mkdir()
    body = pickle.dumps({"segments": [], "device_traces": [],
                         "pad": os.urandom(1 << 20).hex()}, protocol=4)  # 2 MiB of text
    for rank in range(8):
        (folder / f"rank{rank}.pickle.gz").write_bytes(gzip.compress(body, 1))
    resolve([str(folder)], texts=False)  # imports made before counting
    before = _bytes_read()
    ranks = resolve([str(folder)], texts=False).ranks
    per_file = (_bytes_read() - before) / len(ranks)
    # before: a read buffer's worth (a MiB decompressed, 600 KB of each file) to tell a kind
    assert len(ranks) == 8 and all(i.kind is not None for i in ranks)
    assert per_file < 64 << 10, per_file


def test_batch_still_words_each_ranks_verdict(tmp_path):
    import polars as pl

    folder = _folder(tmp_path / "job", 4, oom=frozenset({1}))
    out = tmp_path / "dataset"
    result = invoke("batch", str(folder), "-o", str(out), "--workers", "2")
    assert result.returncode == 0, result.stderr
    verdicts = pl.read_parquet(out / "ranks", hive_partitioning=True)["verdict"].to_list()
    assert len(verdicts) == 4 and all(v.strip() for v in verdicts)  # findings kept for them


def test_a_second_file_while_one_is_decoding_gets_a_child_of_its_own(tmp_path, monkeypatch):
    # (another thread's file): never a reply meant for the other
    small, other = tmp_path / "a.pickle", tmp_path / "b.pickle"
    small.write_bytes(_tiny(1))
    other.write_bytes(pickle.dumps({"segments": [], "pad": "y" * 5000}, protocol=4))
    log = tmp_path / "children.log"
    monkeypatch.setenv("SNAPANA_CHILD_LOG", str(log))
    with decode_pool.kept():
        first = decode_pool.start(small, small.stat().st_size, False, True)
        second = decode_pool.start(other, other.stat().st_size, False, True)
        said = {}
        for name, child in (("second", second), ("first", first)):
            out = child.wait()[1]
            said[name] = json.loads(out.split(b"\n", 1)[0])["size"]
    assert said == {"first": small.stat().st_size, "second": other.stat().st_size}
    assert _started(log) == ["pool", "child"]


def test_compressed_tiny_ranks_share_the_kept_process(tmp_path, monkeypatch):
    import gzip

    folder = tmp_path / "job"
    folder.mkdir()
    for rank in range(6):
        (folder / f"rank{rank}.pickle.gz").write_bytes(gzip.compress(_tiny(rank), mtime=0))
    (folder / "rank6.pickle.gz").write_bytes(gzip.compress(_tiny(6), mtime=0)[:-12])  # cut
    log = tmp_path / "children.log"
    monkeypatch.setenv("SNAPANA_CHILD_LOG", str(log))
    before = _table(_one_child_each(folder))
    assert _started(log) == ["child"] * 7
    log.unlink()
    assert _table(summarize_many([folder], workers=1)) == before
    assert _started(log) == ["pool"]  # a child each before
    assert "gzip" in json.loads(before[1])["inputs"][6]["error"]


def test_the_kept_process_is_renewed_after_its_files(tmp_path, monkeypatch):
    monkeypatch.setattr(decode_pool, "RESTART_FILES", 3)
    path = tmp_path / "rank0.pickle"
    path.write_bytes(_tiny(0))
    log = tmp_path / "children.log"
    monkeypatch.setenv("SNAPANA_CHILD_LOG", str(log))
    with decode_pool.kept():
        for _ in range(7):
            load(path)
    assert _started(log) == ["pool"] * 3  # files 1-3, 4-6, 7


def test_a_worker_loads_its_rules_once_for_all_its_ranks(tmp_path, monkeypatch):
    from snapana import session
    from snapana.analysis.attribution import engine
    from snapana.analysis.ranks import runner

    loads: list[int] = []
    real = engine.load_rules

    def counted(files=()):
        loads.append(1)
        return real(files)

    monkeypatch.setattr(engine, "load_rules", counted)
    monkeypatch.setattr(session, "load_rules", counted)
    loaded = getattr(runner, "_rules", None)  # the worker's rules, kept
    if loaded is not None:
        loaded.cache_clear()
    folder = _folder(tmp_path / "job", 6)
    rows = [runner.summary_dict(i, summarize, [], None)
            for i in resolve([str(folder)], texts=False).ranks]
    if loaded is not None:
        loaded.cache_clear()
    assert len(rows) == 6 and all(r["error"] is None for r in rows)
    assert len(loads) == 1  # one per input before
