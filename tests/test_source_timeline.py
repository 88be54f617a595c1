"""export_memory_timeline outputs: exact per-time totals, one category frame per block."""

from __future__ import annotations

import gzip
import json
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
from snapana import capture_kinds as kinds
from snapana.analysis.replay import replay
from snapana.errors import InputError
from snapana.session import analyse
from snapana.sources import memory_timeline

from .conftest import corpus_params, invoke, require


def _raw(path: Path) -> list[list[int]]:
    with path.open("rb") as fh:
        data = fh.read()
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    return json.loads(data)


def _running(capture) -> np.ndarray:
    """Running total straight from the events table, independent of replay."""
    ev = capture.device_events(0)
    act = ev["action"].to_numpy()
    sign = np.where(act == "alloc", 1, np.where(act == "free_requested", -1, 0))
    return np.cumsum(sign * ev["size"].to_numpy())


def _per_time_totals(records: list[list[int]]) -> dict[int, int]:
    totals, run = {}, 0
    for t, _, nbytes, _ in records:
        run += nbytes
        totals[t] = run
    return totals


def _live_by_category(capture) -> dict[str, int]:
    out: dict[str, int] = defaultdict(int)
    for size, sid in capture.blocks.select("size", "stack_id").iter_rows():
        ((filename, name, line),) = capture.stacks.stack(sid)
        assert filename == memory_timeline.FRAME_FILE and line == 0
        out[name] += size
    return dict(out)


def _check_raw(path: Path) -> None:
    records = _raw(path)
    capture = memory_timeline.load(path)
    totals = _per_time_totals(records)
    running = _running(capture)
    assert running.min() >= 0
    assert int(running.max()) == max(totals.values())  # never above the file's own totals
    assert int(running[-1]) == sum(r[2] for r in records)
    end: dict[str, int] = defaultdict(int)
    for _, _, nbytes, cat in records:
        end[memory_timeline.category_name(cat)] += nbytes
    assert _live_by_category(capture) == {k: v for k, v in end.items() if v}
    dr = replay(capture, 0)
    assert dr.mismatches == []
    assert dr.peak_allocated_bytes == max(totals.values())
    analyse(capture)


@pytest.mark.parametrize("path", corpus_params("memory_timeline"))
def test_corpus_timeline(path):
    capture = memory_timeline.load(path)
    assert capture.source == "memory_timeline" and capture.devices == [0]
    assert capture.metadata["memory_timeline_layout"] == "raw"
    assert set(capture.metadata["category_families"]) == set(memory_timeline.CATEGORIES)
    analyse(capture)
    _check_raw(path)


@pytest.mark.torch
def test_category_order_matches_installed_torch():
    mp = require("torch.profiler._memory_profiler")
    order = sorted(mp._CATEGORY_TO_INDEX.items(), key=lambda kv: kv[1])
    names = tuple("UNKNOWN" if c is None else c.name for c, _ in order)
    assert names == memory_timeline.CATEGORIES
    assert {a.value: a.name for a in mp.Action} == memory_timeline.ACTIONS


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """A real CPU training step exported in both layouts."""
    torch = require("torch")
    from torch.profiler import ProfilerActivity, profile

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(),
                                torch.nn.Linear(512, 10))
    opt = torch.optim.Adam(model.parameters())
    x, y = torch.randn(64, 256), torch.randint(0, 10, (64,))
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True,
                 with_stack=True) as prof:
        for _ in range(2):
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
    out = tmp_path_factory.mktemp("timeline")
    with pytest.warns(FutureWarning):
        prof.export_memory_timeline(str(out / "t.raw.json.gz"), device="cpu")
        prof.export_memory_timeline(str(out / "t.json"), device="cpu")
    return out


@pytest.mark.torch
def test_exported_raw_timeline(exported):
    capture = memory_timeline.load(exported / "t.raw.json.gz")
    names = {capture.stacks.stack(s)[0][1] for s in capture.events["stack_id"].unique()}
    assert {"PARAMETER", "GRADIENT", "OPTIMIZER_STATE"} <= names
    _check_raw(exported / "t.raw.json.gz")


@pytest.mark.torch
def test_exported_plot_timeline(exported):
    times, sizes = json.loads((exported / "t.json").read_text())
    capture = memory_timeline.load(exported / "t.json")
    assert capture.metadata["memory_timeline_layout"] == "plot"
    running = _running(capture)
    assert int(running.max()) == max(sum(r) for r in sizes)
    expected_end = {memory_timeline.category_name(i - 1): v for i, v in enumerate(sizes[-1]) if v}
    assert _live_by_category(capture) == expected_end
    dr = replay(capture, 0)
    assert dr.mismatches == []
    analyse(capture)


def test_plot_layout_splits_blocks_to_keep_totals_exact(tmp_path):
    # slot 0 unused; slot 1 PARAMETER, slot 4 TEMPORARY, slot 8 UNKNOWN
    rows = [[0, 100, 0, 0, 50, 0, 0, 0, 0],
            [0, 100, 0, 0, 80, 0, 0, 0, 7],
            [0, 100, 0, 0, 10, 0, 0, 0, 0],
            [0, 60, 0, 0, 30, 0, 0, 0, 0]]
    path = tmp_path / "plot.json.gz"
    path.write_bytes(gzip.compress(json.dumps([[1, 2, 3, 4], rows]).encode()))
    capture = memory_timeline.load(path)
    running = _running(capture)
    times = capture.device_events(0)["time_us"].to_numpy()
    for t, row in zip([1, 2, 3, 4], rows, strict=True):
        assert int(running[times == t][-1]) == sum(row)
    assert int(running.max()) == max(sum(r) for r in rows)
    assert _live_by_category(capture) == {"PARAMETER": 60, "TEMPORARY": 30}


def test_raw_frees_within_a_timestamp_go_first(tmp_path):
    records = [[-1, 1, 4096, 0],      # PREEXISTING parameter
               [10, 2, 1000, 3],      # temporary
               [20, 2, 2000, 4],      # same timestamp: create an activation ...
               [20, 4, -1000, 3],     # ... and destroy the temporary
               [20, 2, 300, 3],       # created and destroyed at the same time
               [20, 4, -300, 3],
               [30, 3, -2000, 4],     # INCREMENT_VERSION: activation -> gradient
               [30, 3, 2000, 5],
               [40, 4, -64, 7]]       # a free of memory the timeline never saw
    path = tmp_path / "t.raw.json"
    path.write_text(json.dumps(records))
    capture = memory_timeline.load(path)
    running = _running(capture)
    assert int(running.max()) == 4096 + 2000 + 300
    assert _live_by_category(capture) == {"PARAMETER": 4096, "GRADIENT": 2000}
    assert any("match no live block" in w for w in capture.warnings)
    ev = capture.device_events(0)
    assert ev["time_us"][0] == 0  # PREEXISTING shown at the first timestamp (10 ns -> 0 us)
    dr = replay(capture, 0)
    assert dr.mismatches == []


@pytest.mark.parametrize("content", [
    b'[[1, 2], [3]]',
    b'[[1, 2, 3, 4, 5]]',
    b'[[-1, 9, 4096, 0]]',
    b'[[-1, 1, 4096, 0], [1, 2',
    b'[]',
])
def test_bad_timelines_raise_one_line_input_error(tmp_path, content):
    path = tmp_path / "bad.json"
    path.write_bytes(content)
    with pytest.raises(InputError) as info:
        memory_timeline.load(path)
    assert "\n" not in str(info.value) and str(path) in str(info.value)


def test_sniff_helper():
    assert kinds.looks_like_timeline(b"  [ [-1, 1, 512, 7]")
    assert kinds.looks_like_timeline(b"[[1696966048083, 1")
    assert not kinds.looks_like_timeline(b'[{"ph": "X"}]')
    assert not kinds.looks_like_timeline(b'{"traceEvents": []}')


def test_plot_ending_empty_leaves_no_blocks(tmp_path):
    path = tmp_path / "t.json"
    path.write_text(json.dumps([[1, 2], [[0, 10, 0, 0, 0, 0, 0, 0, 0],
                                         [0, 0, 0, 0, 0, 0, 0, 0, 0]]]))
    capture = memory_timeline.load(path)
    assert capture.blocks.is_empty()
    assert capture.device_events(0)["action"].to_list() == ["alloc", "free_requested",
                                                            "free_completed"]


@pytest.mark.torch
def test_cli_summary_reads_a_timeline(exported):
    from snapana import sources

    path = exported / "t.raw.json.gz"
    assert sources.sniff(path) == "memory_timeline"
    result = invoke("summary", str(path), "--format", "json")
    assert result.returncode == 0, result.stderr
    json.loads(result.stdout)
