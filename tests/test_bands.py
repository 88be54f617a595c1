"""Annotation bands (record_function ranges) on the timeline: drawn as one trace whatever
their number (issue 14: one plotly shape per band made a report of 897 bands take minutes),
every band still there with its name, nested ranges in lanes by depth, too many capped with
a note that says how many were left out."""

from __future__ import annotations

import itertools
import random
from types import SimpleNamespace
from typing import Any

import pytest
from snapana.analysis.diagnosis.findings import Band
from snapana.render import figures
from snapana.render.views import BAND_LIMIT, TimelineView, cap_bands, capture_view
from snapana.session import Session
from snapana.sources.torch_snapshot import from_snapshot_dict

from .conftest import SAMPLES, raw_load

SAMPLE = SAMPLES / "fsdp-train-step.pickle"


def _with_bands(n: int) -> tuple[Any, list[tuple[str, int, int]]]:
    """The sample with `n` closed ranges on its trace clock: pairs of an outer range and one
    nested inside it, each name distinct. Returns the capture and the (name, start, end)."""
    data = raw_load(SAMPLE)
    times = [e["time_us"] for e in data["device_traces"][0]]
    t0, span = min(times), max(times) - min(times)
    ranges = []
    for i in range(n):
        k, inner = divmod(i, 2)
        start = t0 + span * k // (n // 2 + 1)
        width = span // (n // 2 + 1)
        ranges.append((f"{'inner' if inner else 'outer'}#{k}",
                       start + width // 4 if inner else start,
                       start + width // 2 if inner else start + width))
    data["external_annotations"] = sorted(
        ({"name": name, "stage": stage, "time_us": t, "device": 0}
         for name, s, e in ranges for stage, t in (("START", s), ("END", e))),
        key=lambda a: a["time_us"])
    return from_snapshot_dict(data, str(SAMPLE)), ranges


def _timeline(n: int) -> tuple[Any, list[tuple[str, int, int]], TimelineView]:
    capture, ranges = _with_bands(n)
    device = capture_view([Session(capture).report], title="bands").devices[0]
    return figures.timeline(device), ranges, device.timeline


def _band_trace(fig: Any) -> SimpleNamespace:
    """The figure spec's band trace, its properties as attributes."""
    (trace,) = [t for t in fig["data"] if t.get("name") == "annotations"]
    return SimpleNamespace(**trace)


def test_timeline_draws_any_number_of_bands_as_one_trace() -> None:
    drawn = {n: _timeline(n) for n in (10, 1000)}
    few, many = drawn[10][0], drawn[1000][0]
    assert len(few["data"]) == len(many["data"])
    for fig in (few, many):  # no OOM in the sample
        assert not fig["layout"].get("shapes") and not fig["layout"].get("annotations")
    for fig, expected, t in drawn.values():
        bars = _band_trace(fig)
        assert len(bars.base) == len(bars.x) == len(bars.y) == len(expected)
        drawn = sorted(zip(bars.base, bars.x, strict=True))
        want = sorted(((s - t.x[0]) / 1e6, (e - s) / 1e6) for _, s, e in expected)
        assert [v for pair in drawn for v in pair] == pytest.approx(
            [v for pair in want for v in pair])
        hover = "\n".join(bars.customdata)
        assert all(f"{name}<br>" in hover for name, _, _ in expected)


def test_nested_bands_lie_below_their_parent() -> None:
    fig, ranges, _ = _timeline(10)
    bars = _band_trace(fig)
    lane = {c.split("<br>")[0]: y for c, y in zip(bars.customdata, bars.y, strict=True)}
    assert {lane[name] for name, _, _ in ranges if name.startswith("outer")} == {0}
    assert {lane[name] for name, _, _ in ranges if name.startswith("inner")} == {1}


def test_band_lanes_are_nesting_depth_and_never_overlap() -> None:
    bands = [Band("a", 0, 100), Band("b", 0, 50), Band("c", 10, 20), Band("d", 60, 70),
             Band("e", 100, 200)]
    assert figures.band_lanes(bands) == [0, 1, 2, 1, 0]
    rng = random.Random(0)
    bands = [Band(str(i), s, s + rng.randrange(1, 300))
             for i, s in enumerate(rng.randrange(10_000) for _ in range(500))]
    lanes = figures.band_lanes(bands)
    by_lane: dict[int, list[Band]] = {}
    for b, lane in zip(bands, lanes, strict=True):
        by_lane.setdefault(lane, []).append(b)
    for same in by_lane.values():
        same.sort(key=lambda b: b.start)
        assert all(a.end <= b.start for a, b in itertools.pairwise(same))
    # as few lanes as the most bands open at once (at some band's start)
    assert len(by_lane) == max(sum(b.start <= c.start < b.end for b in bands) for c in bands)


def test_too_many_bands_are_capped_with_a_note_that_counts_them() -> None:
    n = BAND_LIMIT + 500
    bands = [Band(f"r{i}", 10 * i, 10 * i + 1 + i % 7) for i in range(n)]
    kept, left_out = cap_bands(bands)
    assert (len(kept), left_out) == (BAND_LIMIT, 500)
    assert min(b.end - b.start for b in kept) >= max(
        b.end - b.start for b in set(bands) - set(kept))
    assert list(kept) == [b for b in bands if b in set(kept)]  # trace order kept
    t = TimelineView(x=(0, 10 * n), allocated=(0, 1), reserved=(0, 1), x_is_time=True,
                     oom_x=None, peak_x=10 * n, peak_bytes=1, bands=kept,
                     bands_left_out=left_out)
    fig = figures.timeline(SimpleNamespace(timeline=t, origin=None))  # type: ignore[arg-type]
    assert len(_band_trace(fig).base) == BAND_LIMIT
    (note,) = fig["layout"]["annotations"]
    assert f"{BAND_LIMIT:,} longest of {n:,}" in note["text"] and "500 shorter" in note["text"]
