"""The family timeline: each family's live bytes over the trace, stacked in the report.

Checked against what is independent of it: the replay's allocated series (the families must
add up to it after every event), the report's families at its moment, and for the chunked
log-prob sample the generator's ground truth (its saved softmax chunks, one step each).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import snapana

from .browser import open_report
from .conftest import SNAPSHOTS, corpus_params, invoke

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = sorted((ROOT / "sample_snapshots").glob("*.pickle"))
CHUNKED = ROOT / "sample_snapshots" / "slime-tp2-chunked-logprob-oom.pickle"


def _dense(frame: pl.DataFrame, n_events: int) -> dict[str, np.ndarray]:
    """Each family's bytes after every event (index 0: before the first event), rebuilt
    from the public change table by holding each value until the family's next change."""
    out = {}
    for (family,), g in frame.group_by("family"):
        series = np.zeros(n_events + 1, dtype=np.int64)
        for event, nbytes in g.sort("event").select("event", "bytes").iter_rows():
            series[event + 1:] = nbytes
        out[str(family)] = series
    return out


def _check_sums(path: Path) -> None:
    for device in snapana.load(path).capture.devices:
        _check_device_sums(path, device)


def _check_device_sums(path: Path, device: int) -> None:
    a = snapana.load(path, device=device)
    dr = a.replay
    if not dr.n_events:
        assert a.timeline.is_empty()
        return
    dense = _dense(a.timeline, dr.n_events)
    total = sum(dense.values(), np.zeros(dr.n_events + 1, dtype=np.int64))  # none: all zero
    before = dr.allocated_at(dr.at(-1))
    assert total[0] == before
    bad = np.flatnonzero(total[1:] != dr.allocated)
    assert bad.size == 0, f"families != allocated after event {bad[:5]}"
    # at the report's moment the families are the report's own (the treemap's)
    m = a.moment.idx
    at_moment = {f: int(v[m + 1]) for f, v in dense.items() if v[m + 1]}
    assert at_moment == dict(zip(a.families["family"], a.families["bytes"], strict=True))


@pytest.mark.parametrize("path", SAMPLES, ids=lambda p: p.name)
def test_families_add_up_to_allocated_on_samples(path: Path) -> None:
    _check_sums(path)


@pytest.mark.parametrize("path", corpus_params("torch_snapshots", "*.pickle")
                         + corpus_params("kineto_traces") + corpus_params("memory_timeline"))
def test_families_add_up_to_allocated_on_corpus(path: Path) -> None:
    """Every corpus capture with a time axis: snapshots, profiler traces, memory timelines."""
    _check_sums(path)


@pytest.mark.parametrize("path", SAMPLES[:3] + [CHUNKED], ids=lambda p: p.name)
def test_drawn_areas_add_up_to_allocated(path: Path) -> None:
    """At every drawn point the areas add up to the replay's allocated bytes after that
    event, and the figure draws exactly those areas."""
    a = snapana.load(path)
    t = a._device_view.timeline
    assert t.families and len(t.family_events) == len(t.family_x)
    drawn = np.sum([np.asarray(f.bytes) for f in t.families], axis=0)
    assert np.array_equal(drawn, a.replay.allocated[list(t.family_events)])
    fig = a.figure("families_over_time")
    areas = [tr for tr in fig.data if getattr(tr, "stackgroup", None) == "families"]
    assert [tr.name for tr in areas] == [f.name for f in t.families]
    for tr, f in zip(areas, t.families, strict=True):
        assert np.allclose(np.asarray(tr.y, dtype=np.float64) * 2**30, f.bytes,
                           rtol=1e-6, atol=2**12)


def _softmax_truth() -> tuple[int, int]:
    """Chunk size and count of the saved softmax at the OOM, from the generator's truth."""
    truth = json.loads(CHUNKED.with_suffix(".truth.json").read_text())
    sizes = [b["size"] for b in truth["blocks"] if b["family"] == "saved_logprob_softmax"
             and b["state"] == "active_allocated"]
    assert len(set(sizes)) == 1, sizes
    return sizes[0], len(sizes)


@pytest.mark.chromium
def test_softmax_grows_in_steps_of_one_chunk_in_chromium(tmp_path: Path) -> None:
    """S1 #3: in the drawn report, the saved_logprob_softmax area rises chunk by chunk up
    to the OOM (from the last moment it held nothing); each step is one chunk, as many
    steps as chunks the truth says were live at the OOM."""
    chunk, count = _softmax_truth()
    out = tmp_path / "report.html"
    result = invoke("report", str(CHUNKED), "-o", str(out))
    assert result.returncode == 0, result.stderr
    visit = open_report(out, probe="""(() => {
        const div = document.querySelector('div[data-figure="families_over_time"]');
        return div._fullData.map(t => ({name: t.name, x: Array.from(t.x || []),
                                    y: Array.from(t.y || []), stack: t.stackgroup || null}));
    })()""")
    assert visit.console_errors == []
    traces = {t["name"]: t for t in visit.probed}
    softmax = traces["saved_logprob_softmax"]
    assert softmax["stack"] == "families"
    y = np.asarray(softmax["y"]) * 2**30
    assert y[0] == 0
    # the last run from nothing up to the OOM (an earlier micro-batch may have come and gone)
    y = y[np.flatnonzero(y < 2**16)[-1]:]
    steps = np.diff(y)
    rises = steps[np.abs(steps) > 2**20]
    assert (rises > 0).all(), "the saved softmax only grows up to the OOM"
    assert len(rises) == count
    assert np.allclose(rises, chunk, atol=2**16)  # the page holds GiB as float32
    assert abs(y[-1] - count * chunk) < 2**16
    assert "OOM" in visit.text


def test_summary_says_how_each_family_got_there() -> None:
    """The text line for the accumulating family states its growth and its chunks, with
    numbers from the truth."""
    chunk, count = _softmax_truth()
    result = invoke("summary", str(CHUNKED), "-f", "json")
    assert result.returncode == 0, result.stderr
    dev = json.loads(result.stdout)["devices"][0]
    growth = {g["family"]: g for g in dev["growth"]}
    g = growth["saved_logprob_softmax"]
    assert (g["start_bytes"], g["moment_bytes"]) == (0, chunk * count)
    assert (g["allocations"], g["uniform_size"]) == (count, chunk)
    assert g["phase"] == "forward"
    text = invoke("summary", str(CHUNKED), "--full").stdout
    assert "how it got there" in text
    assert f"{count} × 486.00 MiB" in " ".join(text.split())


def test_downsampled_chart_keeps_every_family_peak(tmp_path: Path) -> None:
    """With far fewer points than events, each drawn family still reaches its own peak and
    the OOM step is drawn (the step into the OOM and the families' maxima are kept)."""
    from snapana.render.views import FAMILY_AREAS, timeline_view

    a = snapana.load(CHUNKED)
    t = a.device_report.timeline
    view = timeline_view(t, max_points=40, family_points=20)
    assert len(view.family_events) < t.n_events // 10
    assert t.oom_idx in view.family_events
    dense = _dense(a.timeline, t.n_events)
    for area in view.families[:FAMILY_AREAS]:
        if area.name in dense:
            assert max(area.bytes) == int(dense[area.name].max()), area.name


@pytest.mark.parametrize("path", SAMPLES + [p for p in (
    SNAPSHOTS / "gpt-medium-ctx1024-train.pickle", SNAPSHOTS / "cnn-cpp-frames.pickle")
    if p.exists()], ids=lambda p: p.name)
def test_every_lifetime_gets_the_family_a_block_would(path: Path) -> None:
    """The timeline decides all lifetimes at once; each must get the family the per-block
    attribution gives the same block (its stack, pool, stream, size and allocation event),
    for every lifetime of the trace, not only those live at the report's moment."""
    from snapana.analysis.attribution.lifetimes import attribute_lifetimes

    a = snapana.load(path)
    dr, attributor = a.replay, a.attributor
    fast = attribute_lifetimes(attributor, dr)
    segs = dr.segment_intervals.sort("address")
    blocks = dr.lifetimes.with_columns(pl.lit("active_allocated").alias("state"))
    pools = (blocks.sort("address").join_asof(
        segs.select(pl.col("address").alias("seg"), "total_size", "pool", "open_idx",
                    "close_idx"), left_on="address", right_on="seg", strategy="backward")
        .with_columns(pl.when((pl.col("address") < pl.col("seg") + pl.col("total_size"))
                              & (pl.col("alloc_idx") >= pl.col("open_idx"))
                              & (pl.col("alloc_idx") < pl.col("close_idx")))
                      .then(pl.col("pool")).otherwise(pl.lit("0,0")).alias("pool")))
    slow = attributor.attribute(pools.drop("seg", "total_size", "open_idx", "close_idx"))
    framed = slow.filter(pl.col("evidence") == "frames")
    got = fast.select("address", "alloc_idx", pl.col("family").alias("fast"))
    joined = framed.join(got, on=["address", "alloc_idx"], how="left")
    wrong = joined.filter(pl.col("family") != pl.col("fast"))
    assert joined.height == framed.height
    assert wrong.is_empty(), wrong.select("address", "alloc_idx", "family", "fast").head()


@pytest.mark.parametrize("path", corpus_params("torch_snapshots", "llm-1.3b-no-history.pickle"))
def test_figures_over_time_of_a_capture_without_history_say_so(path: Path) -> None:
    """A notebook asking for a chart over time of a snapshot without history gets an empty
    chart that says why, not an IndexError; the report draws none of them."""
    a = snapana.load(path)
    assert not a.diagnosis.history
    for name in ("timeline", "families_over_time", "allocations"):
        fig = a.figure(name)
        assert not fig.data and "No allocation history" in fig.layout.title.text
    result = invoke("summary", str(path))
    assert result.returncode == 0 and "how it got there" not in result.stdout


@pytest.mark.parametrize("path", SAMPLES, ids=lambda p: p.name)
def test_every_sample_report_draws_the_family_timeline(path: Path) -> None:
    """Every bundled sample has history, so its committed report (kept current by
    test_reports) draws the family chart, one area per family the trace held (or the
    largest of them and one 'other')."""
    from snapana.render.views import FAMILY_AREAS

    html = (ROOT / "reports" / f"{path.stem}.html").read_text()
    assert 'data-figure="families_over_time"' in html
    held = snapana.load(path).timeline["family"].unique().to_list()
    fig = json.loads(re.search(r'id="data-families_over_time-0">(.*?)</script>', html,
                               re.S).group(1).replace("<\\/", "</"))
    areas = [t["name"] for t in fig["data"] if t.get("stackgroup") == "families"]
    if len(held) <= FAMILY_AREAS + 1:
        assert sorted(areas) == sorted(held)
    else:
        assert len(areas) == FAMILY_AREAS + 1 and areas[-1].endswith("other families")


def test_open_annotation_windows_match_a_brute_force_reading() -> None:
    """Which record_function windows are open at a time (inclusive ends, repeated and
    nested names, windows never closed), against a direct reading of the annotations."""
    import random
    from types import SimpleNamespace

    from snapana.analysis.attribution.assign import AnnotationWindows

    rng = random.Random(7)
    events = []
    for _ in range(300):
        name = rng.choice(["fwd", "bwd", "ProfilerStep#1", "ProfilerStep#2", "opt"])
        start = rng.randrange(0, 1000)
        events.append({"name": name, "stage": "START", "time_us": start, "device": 0})
        if rng.random() < 0.9:
            events.append({"name": name, "stage": "END", "device": 0,
                           "time_us": start + rng.randrange(0, 200)})
    events.sort(key=lambda a: (a["time_us"], a["stage"] == "START"))
    windows = AnnotationWindows(SimpleNamespace(annotations=events), 0)  # type: ignore[arg-type]
    times = np.arange(-5, 1300)
    ids, sets = windows.at_many(times)
    for t, k in zip(times, ids, strict=True):
        expected = tuple(sorted({n for s, e, n in windows.windows if s <= t <= e}))
        assert windows.at(int(t)) == expected == sets[k], t
