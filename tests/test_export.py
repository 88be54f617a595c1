"""Parquet export: plain Parquet any tool reads, written atomically, and read back into the same
capture, so the report of an export is the report of the original."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import snapana
from snapana import sources
from snapana.errors import InputError
from snapana.io.export import export, export_capture
from snapana.io.output import OutputError
from snapana.model import Capture
from snapana.render import render
from snapana.render.views import capture_view
from snapana.session import analyse, sessions
from snapana.sources import parquet_dir

from .conftest import SAMPLES, corpus_params, require

SAMPLE_PARAMS = [pytest.param(p, id=p.name) for p in sorted(SAMPLES.glob("*.pickle"))]
OOM_SAMPLE = SAMPLES / "slime-tp2-chunked-logprob-oom.pickle"
CORPUS_PARAMS = (corpus_params("torch_snapshots", "*.pickle")
                 + corpus_params("kineto_traces") + corpus_params("memory_timeline"))


def _report_json(path: Path) -> list[dict]:
    """The JSON report, without the one field that names the input file."""
    devices = json.loads(render(capture_view(analyse(sources.load(path)), path.name),
                                "json"))["devices"]
    for d in devices:
        d.pop("file")
    return devices


def _same_metadata(a: object, b: object) -> bool:
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.dtype == b.dtype and np.array_equal(a, b)
    if isinstance(a, dict):
        return (isinstance(b, dict) and list(a) == list(b)
                and all(_same_metadata(a[k], b[k]) for k in a))
    if isinstance(a, (list, tuple)):
        return (type(a) is type(b) and len(a) == len(b)  # type: ignore[arg-type]
                and all(_same_metadata(x, y) for x, y in zip(a, b, strict=True)))  # type: ignore[call-overload]
    return type(a) is type(b) and a == b


def _assert_same_capture(a: Capture, b: Capture) -> None:
    for f in ("source", "devices", "allocator_settings", "annotations", "warnings",
              "has_trace", "has_time", "capacity_bytes"):
        assert getattr(a, f) == getattr(b, f), f
    assert _same_metadata(a.metadata, b.metadata)
    for t in ("segments", "blocks", "events"):
        assert getattr(a, t).equals(getattr(b, t)), t
    assert a.stacks.frames == b.stacks.frames
    assert a.stacks.stacks == b.stacks.stacks


def _round_trip(path: Path, tmp_path: Path) -> None:
    out = export_capture(path, tmp_path / "export")
    assert sources.sniff(out) == "snapana_export"
    _assert_same_capture(sources.load(path), sources.load(out))
    assert _report_json(out) == _report_json(path)


@pytest.mark.parametrize("path", SAMPLE_PARAMS)
def test_round_trip_sample(path: Path, tmp_path: Path) -> None:
    _round_trip(path, tmp_path)


@pytest.mark.parametrize("path", CORPUS_PARAMS)
def test_round_trip_corpus(path: Path, tmp_path: Path) -> None:
    _round_trip(path, tmp_path)


@pytest.mark.memray
def test_round_trip_memray_capture(tmp_path: Path) -> None:
    memray = require("memray")
    run = tmp_path / "run.bin"
    with memray.Tracker(str(run)):
        held = [bytearray(3 << 20) for _ in range(3)]
        del held
    _round_trip(run, tmp_path)


def test_tables_are_plain_parquet(tmp_path: Path) -> None:
    out = export_capture(OOM_SAMPLE, tmp_path / "x")
    a = snapana.load(OOM_SAMPLE)
    files = {p.name for p in out.iterdir()}
    assert files == {"frames.parquet", "stacks.parquet", "segments.parquet", "events.parquet",
                     "blocks.parquet", "families.parquet", parquet_dir.MARKER}
    blocks = pl.read_parquet(out / "blocks.parquet")
    final = blocks.filter(pl.col("at") == "final")
    moi = blocks.filter(pl.col("at") == "moment_of_interest")
    assert final.height == a.capture.blocks.height
    assert set(moi["moment"].unique()) == {"oom"}
    held = moi.filter(pl.col("state") == "active_allocated")
    by_family = held.group_by("family").agg(pl.col("size").sum()).sort("family")
    fam = pl.read_parquet(out / "families.parquet").sort("family")
    assert by_family.rows() == fam.select("family", "bytes").rows()
    assert fam.select("family", "bytes").sort("family").rows() == \
        a.families.select("family", "bytes").sort("family").rows()
    # live final blocks carry their family; inactive ones have none
    assert final.filter(pl.col("state") == "active_allocated")["family"].null_count() == 0
    assert final.filter(pl.col("state") == "inactive")["family"].null_count() == \
        final.filter(pl.col("state") == "inactive").height
    assert pl.read_parquet(out / "events.parquet").height == a.events.height
    stacks = pl.read_parquet(out / "stacks.parquet")
    assert stacks.columns[:4] == ["stack_id", "depth", "site", "frames"]
    meta = json.loads((out / parquet_dir.MARKER).read_text())
    assert meta["source"] == "torch_snapshot" and meta["path"] == str(OOM_SAMPLE)
    assert meta["moments"]["0"]["kind"] == "oom"


def test_duckdb_reads_the_tables_when_installed(tmp_path: Path) -> None:
    duckdb = require("duckdb")
    out = export_capture(OOM_SAMPLE, tmp_path / "x")
    total = duckdb.sql(
        f"select sum(size) from '{out}/blocks.parquet' "
        "where \"at\" = 'moment_of_interest' and state = 'active_allocated'").fetchall()[0][0]
    assert total == snapana.load(OOM_SAMPLE).device_report.allocated_bytes


def test_load_an_export_through_the_api(tmp_path: Path) -> None:
    out = snapana.load(OOM_SAMPLE).export(tmp_path / "x")
    a, b = snapana.load(OOM_SAMPLE), snapana.load(out)
    assert b.capture.path == str(out)
    assert a.families.equals(b.families) and a.blocks.equals(b.blocks)
    assert a.diff(b).diff.is_empty


def test_an_export_whose_events_carry_no_time_has_no_clock(tmp_path: Path) -> None:
    """An export read back whose events' times are all null (edited, or written by another
    tool) has no clock, whatever its marker says: its report draws the trace by event index
    (a clock of nulls was an internal error, found by the fuzzer)."""
    out = export_capture(OOM_SAMPLE, tmp_path / "x")
    events = pl.read_parquet(out / "events.parquet")
    events.with_columns(pl.lit(None, pl.Int64).alias("time_us")).write_parquet(
        out / "events.parquet")
    assert json.loads((out / "snapana-export.json").read_text())["has_time"] is True
    capture = parquet_dir.load(out)
    assert not capture.has_time
    (report,) = analyse(capture)
    assert report.timeline.times_us is None
    assert "<html" in render(capture_view([report], title="x"), "html")


def test_export_replaces_an_export_but_nothing_else(tmp_path: Path) -> None:
    out = tmp_path / "x"
    export_capture(OOM_SAMPLE, out)
    export_capture(SAMPLES / "fsdp-train-step.pickle", out)  # replaced in place
    assert json.loads((out / parquet_dir.MARKER).read_text())["path"].endswith("fsdp-train-step"
                                                                               ".pickle")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x"]  # no temp folders left
    other = tmp_path / "mine"
    other.mkdir()
    (other / "notes.txt").write_text("keep me")
    with pytest.raises(OutputError, match="not a snapana export"):
        export_capture(OOM_SAMPLE, other)
    assert (other / "notes.txt").read_text() == "keep me"
    with pytest.raises(OutputError, match="does not exist"):
        export_capture(OOM_SAMPLE, tmp_path / "missing" / "x")
    empty = tmp_path / "empty"
    empty.mkdir()
    export_capture(OOM_SAMPLE, empty)
    assert (empty / parquet_dir.MARKER).is_file()


def test_interrupted_export_leaves_nothing(tmp_path: Path, monkeypatch) -> None:
    out = tmp_path / "x"
    export_capture(OOM_SAMPLE, out)
    before = sorted(p.name for p in out.iterdir())
    calls = {"n": 0}
    real = pl.DataFrame.write_parquet

    def fail_third(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:
            raise OSError("disk full")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(pl.DataFrame, "write_parquet", fail_third)
    with pytest.raises(OSError, match="disk full"):
        export(sessions(sources.load(SAMPLES / "fsdp-train-step.pickle")), out)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x"]
    assert sorted(p.name for p in out.iterdir()) == before
    assert json.loads((out / parquet_dir.MARKER).read_text())["path"] == str(OOM_SAMPLE)


def test_a_folder_without_the_marker_is_still_refused(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="is a directory"):
        sources.load(tmp_path)


def test_bad_exports_are_input_errors(tmp_path: Path) -> None:
    out = export_capture(OOM_SAMPLE, tmp_path / "x")
    marker = out / parquet_dir.MARKER
    meta = json.loads(marker.read_text())
    marker.write_text(json.dumps({**meta, "version": 99}))
    with pytest.raises(InputError, match="version 99"):
        sources.load(out)
    marker.write_text(json.dumps(meta))
    (out / "events.parquet").write_bytes(b"PAR1 not really")
    with pytest.raises(InputError, match="events.parquet"):
        sources.load(out)
    (out / "events.parquet").unlink()
    with pytest.raises(InputError, match="lacks events.parquet"):
        sources.load(out)
    marker.write_text("{")
    with pytest.raises(InputError, match="unreadable"):
        sources.load(out)


def test_metadata_codec_keeps_python_types() -> None:
    value = {0: np.arange(5, dtype=np.int64), "t": (1, "a", None), "$odd": b"\x00\xff",
             "nested": {"k": [1.5, {2: np.int32(7)}]}, "s": {3}, "f": frozenset()}
    back = parquet_dir.decode(json.loads(json.dumps(parquet_dir.encode(value))))
    assert list(back) == list(value)
    assert np.array_equal(back[0], value[0]) and back[0].dtype == np.int64
    assert back["t"] == (1, "a", None) and back["$odd"] == b"\x00\xff"
    assert back["nested"]["k"][1][2] == 7 and isinstance(back["nested"]["k"][1][2], np.int32)
    assert back["s"] == {3} and back["f"] == set()


def test_an_export_folders_allocator_settings_are_read_as_a_snapshots(tmp_path: Path) -> None:
    """Free-form settings in an export folder's marker are bounded and made finite as a
    snapshot's are: an infinite roundup_power2_divisions entry (JSON allows `Infinity`) once
    made `whatif` fail with an internal error; now it is kept as text and the replay runs."""
    from .conftest import invoke

    out = tmp_path / "ex"
    export_capture(SAMPLES / "fsdp-train-step.pickle", out)
    marker = json.loads((out / "snapana-export.json").read_text())
    marker["allocator_settings"]["roundup_power2_divisions"]["128"] = float("inf")
    (out / "snapana-export.json").write_text(json.dumps(marker))
    run = invoke("whatif", str(out), "--set", "expandable_segments:True", "-f", "json")
    assert run.returncode == 0, run.stderr
    settings = parquet_dir.load(out).allocator_settings
    assert settings["roundup_power2_divisions"]["128"] == "inf"
