"""A diff's family timelines: the crashed run above its fix on one x axis, each side's areas
adding up to its replay's allocated bytes, a family in one colour on both sides, and the
growth lines every format prints checkable against each side's own family timeline."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import snapana
from snapana.render import figures
from snapana.units import GiB, fmt_bytes

from .browser import open_report
from .conftest import SAMPLES, invoke

BEFORE = SAMPLES / "slime-tp2-chunked-logprob-oom.pickle"
AFTER = SAMPLES / "slime-tp2-recompute-loss-ok.pickle"
FIGURE = "document.getElementById('fig-families-over-time')"
#: The drawn traces of the figure, typed arrays as plain ones (JSON through the page).
PROBE = f"""(() => {{ const div = {FIGURE}; const arr = a => a ? Array.from(a) : null;
  return {{matches: [div._fullLayout.xaxis.matches, div._fullLayout.xaxis2.matches],
           ranges: [div._fullLayout.yaxis.range, div._fullLayout.yaxis2.range],
           title: div._fullLayout.title.text,
           data: div._fullData.map(t => ({{name: t.name, xaxis: t.xaxis, yaxis: t.yaxis,
             stackgroup: t.stackgroup, fill: t.fillcolor, x: arr(t.x), y: arr(t.y),
             events: arr(t.customdata)}}))}}; }})()"""


@pytest.fixture(scope="module")
def page(tmp_path_factory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("diff") / "diff.html"
    run = invoke("diff", str(BEFORE), str(AFTER), "-o", str(out))
    assert run.returncode == 0, run.stderr
    visit = open_report(out, probe=PROBE)
    assert visit.console_errors == []
    assert visit.plots == visit.figure_divs == 2  # the change bars and the timelines
    return out, visit.probed


def _sides(probed: dict) -> dict[str, list[dict]]:
    return {side: [t for t in probed["data"] if t["stackgroup"] == side]
            for side in ("before", "after")}


@pytest.mark.chromium
def test_before_above_after_on_one_x_axis_and_one_y_range(page) -> None:
    _, probed = page
    sides = _sides(probed)
    assert {(t["xaxis"], t["yaxis"]) for t in sides["before"]} == {("x", "y")}
    assert {(t["xaxis"], t["yaxis"]) for t in sides["after"]} == {("x2", "y2")}
    assert probed["matches"] == ["x2", None]  # the upper x axis follows the lower one
    top, bottom = probed["ranges"]
    assert top == bottom and top[0] == 0
    peak = max(snapana.load(p).device_report.peak_allocated_bytes for p in (BEFORE, AFTER))
    assert top[1] >= peak / GiB
    assert "seconds since each side's first event" in probed["title"]


@pytest.mark.parametrize("side,path", [("before", BEFORE), ("after", AFTER)])
@pytest.mark.chromium
def test_each_sides_areas_add_up_to_its_allocated_bytes(page, side: str, path: Path) -> None:
    _, probed = page
    areas = _sides(probed)[side]
    events = np.asarray(areas[0]["events"])  # the bottom area carries each point's event
    assert len(events) and all(len(a["y"]) == len(events) for a in areas)
    a = snapana.load(path)
    allocated = a.replay.allocated[events]
    drawn = np.sum([a["y"] for a in areas], axis=0) * GiB
    np.testing.assert_allclose(drawn, allocated, rtol=1e-5, atol=2**20)
    # x: seconds since the side's first event, at those events
    times = a.events["time_us"].to_numpy()
    x = np.asarray(areas[0]["x"])
    np.testing.assert_allclose(x, (times[events] - times[0]) / 1e6, atol=1e-4)
    # the family point budget of the report's own chart
    assert len(events) <= 1.1 * len(a.figure("families_over_time").data[0].x)


@pytest.mark.chromium
def test_a_family_has_one_colour_on_both_sides(page) -> None:
    _, probed = page
    sides = _sides(probed)
    before = {t["name"]: t["fill"] for t in sides["before"]}
    after = {t["name"]: t["fill"] for t in sides["after"]}
    assert len(before.keys() & after.keys()) >= 5
    assert all(before[f] == after[f] for f in before.keys() & after.keys())
    # distinct families, distinct colours, on either side and across them
    colours = before | after
    assert len(set(colours.values())) == len(colours)


def _expected(a: snapana.Analysis, family: str) -> str:
    """A side's growth of `family`, from the notebook's family timeline frame."""
    rows = a.timeline.filter(pl.col("family") == family)
    if rows.is_empty():
        return "never held"
    moment = a.device_report.moment.idx
    upto = rows.filter(pl.col("event") <= moment)
    start = int(rows.filter(pl.col("event") == -1)["bytes"].sum())
    now = int(upto["bytes"][-1]) if upto.height else 0
    most = max(int(upto["bytes"].max() or 0), start)
    when = {"oom": "at the OOM", "peak": "at the peak"}[a.device_report.moment.kind]
    text = f"{fmt_bytes(start)} → {fmt_bytes(now)} {when}"
    return text + (f" (at most {fmt_bytes(most)} before it)"
                   if fmt_bytes(most) != fmt_bytes(now) else "")


@pytest.mark.chromium
def test_growth_lines_are_each_sides_numbers_in_every_format(page) -> None:
    out, _ = page
    before, after = snapana.load(BEFORE), snapana.load(AFTER)
    cmp = before.diff(after)
    lines = cmp.view.growth
    assert 1 <= len(lines) <= 5
    assert lines[0].startswith("saved_logprob_softmax: before 0 B → 3.32 GiB at the OOM")
    data = json.loads(cmp.summary("json"))
    assert [g["text"] for g in data["growth"]] == list(lines)
    for line, g in zip(lines, data["growth"], strict=True):
        family = g["family"]
        assert line == (f"{family}: before {_expected(before, family)}; "
                        f"after {_expected(after, family)}")
        for side, a in (("before", before), ("after", after)):
            if g[side] is not None:
                assert g[side]["moment_bytes"] == int(a.device_report.timeline.families
                                                      .bytes_at(family, np.array(
                                                          [a.device_report.moment.idx]))[0])
    text = " ".join(cmp.summary("text").split())
    markdown = cmp.summary("markdown")
    html = out.read_text()
    for line in lines:
        assert " ".join(line.split()) in text
        assert f"- {line}" in markdown
        assert line in html
    assert cmp.figure().data[0].type == "bar"  # the default figure is still the change bars
    fig = cmp.figure("families_over_time")
    assert {t.stackgroup for t in fig.data if t.stackgroup} == {"before", "after"}


MiB = 2**20
FR = [{"filename": "/job/model.py", "line": 54, "name": "forward"}]


def _snapshot(path: Path, history: bool = True, clock: bool = True) -> Path:
    seg = {"device": 0, "address": 0x1000_0000, "total_size": 20 * MiB, "stream": 0,
           "segment_type": "large", "segment_pool_id": (0, 0), "is_expandable": False,
           "allocated_size": 16 * MiB, "active_size": 16 * MiB, "requested_size": 16 * MiB,
           "frames": [], "blocks": [
               {"address": 0x1000_0000, "size": 16 * MiB, "requested_size": 16 * MiB,
                "state": "active_allocated", "frames": FR},
               {"address": 0x1000_0000 + 16 * MiB, "size": 4 * MiB, "requested_size": 0,
                "state": "inactive", "frames": []}]}
    trace = [{"action": "segment_alloc", "addr": 0x1000_0000, "size": 20 * MiB, "stream": 0,
              "frames": FR},
             {"action": "alloc", "addr": 0x1000_0000, "size": 16 * MiB, "stream": 0,
              "frames": FR}]
    for i, e in enumerate(trace):
        if clock:
            e["time_us"] = 10 + i
    path.write_bytes(pickle.dumps({"segments": [seg], "device_traces": [
        trace if history else []], "allocator_settings": {}}, protocol=4))
    return path


def test_a_side_without_history_is_named_and_draws_no_timelines(tmp_path: Path) -> None:
    flat = _snapshot(tmp_path / "flat.pickle", history=False)
    cmp = snapana.diff(BEFORE, flat)
    note = cmp.view.history_note
    assert note.startswith("No family timelines to compare: after (flat.pickle) has no")
    assert cmp.view.timelines is None and cmp.view.growth == ()
    empty = cmp.figure("families_over_time")  # an empty chart that names the side
    assert not empty.data and "flat.pickle" in empty.layout.title.text
    with pytest.raises(ValueError, match="unknown diff figure"):
        cmp.figure("nope")  # type: ignore[arg-type]
    assert note in cmp.summary("text").replace("\n", " ")
    assert json.loads(cmp.summary("json"))["history_note"] == note
    page = cmp.report(tmp_path / "d.html").read_text()
    assert note in page and 'data-figure="families_over_time"' not in page


def test_a_side_without_a_clock_puts_both_on_the_event_index(tmp_path: Path) -> None:
    timed = _snapshot(tmp_path / "timed.pickle")
    untimed = _snapshot(tmp_path / "untimed.pickle", clock=False)
    cmp = snapana.diff(timed, untimed)
    tl = cmp.view.timelines
    assert tl is not None and tl.axis == "event index"
    assert not tl.before.x_is_time and not tl.after.x_is_time
    assert tl.axis_note == ("after has no clock, so both sides run on the event index from "
                            "their first event")
    fig = figures.families_before_after(cmp.view)
    assert tl.axis_note in fig["layout"]["title"]["text"]
    both = snapana.diff(timed, timed).view.timelines
    assert both is not None and both.before.x_is_time and both.axis_note == ""


def _seconds(path: Path) -> float:
    """A run's length on its clock, from the raw trace: the last event's time minus the
    first's."""
    times = [e["time_us"] for e in pickle.loads(path.read_bytes())["device_traces"][0]
             if "time_us" in e]
    return (times[-1] - times[0]) / 1e6


@pytest.mark.parametrize("before,after", [
    (BEFORE, AFTER),
    (SAMPLES / "fsdp-train-step.pickle", SAMPLES / "swift-vllm-colocate-oom.pickle")])
def test_runs_of_very_different_length_get_an_x_axis_each(before: Path, after: Path) -> None:
    """Two runs share the x axis unless one is more than SHARED_AXIS_RATIO times as long as
    the other (the shorter would fill a corner of the width): then each row has its own
    axis with its own tick labels, and the title says why."""
    ratio = max(_seconds(before), _seconds(after)) / min(_seconds(before), _seconds(after))
    fig = snapana.diff(before, after).figure("families_over_time")
    layout = fig.to_plotly_json()["layout"]
    own = ratio > figures.SHARED_AXIS_RATIO
    assert (layout["xaxis"].get("matches") is None) == own
    assert layout["xaxis"].get("showticklabels", True) == own
    assert ("own x axis" in layout["title"]["text"]) == own
    if own:
        assert f"{ratio:.0f}×" in layout["title"]["text"]
