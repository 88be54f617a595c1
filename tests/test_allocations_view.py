"""The allocations around the moment: MemoryViz-style bands in the window before the OOM.

Checked against what is independent of the view: the replay's allocated series and its
lifetimes (after every event of the window the bands tile 0..allocated, each allocation
band is live exactly when its lifetime is, as thick as its block), the report's blocks at
the moment (evidence), and the raw snapshot (a clicked band's frames and size)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import snapana
from snapana.render import allocation_bands as ab
from snapana.render import figures
from snapana.render.html import _figure_json
from snapana.render.views import OTHER_COLOUR
from snapana.units import fmt_bytes

from .browser import open_report
from .conftest import SNAPSHOTS, corpus_params, invoke, raw_load, vocabulary_colours

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = sorted((ROOT / "sample_snapshots").glob("*.pickle"))
CHUNKED = ROOT / "sample_snapshots" / "slime-tp2-chunked-logprob-oom.pickle"
GiB = 2**30


def _span(band: ab.AllocationBand, i: int) -> tuple[int, int] | None:
    """The band's bytes (base, top) after event `i`, None where it is not drawn."""
    if not band.events[0] <= i < band.end:
        return None
    j = int(np.searchsorted(band.events, i, side="right")) - 1
    return int(band.base[j]), int(band.top[j])


def _check(path: Path) -> None:
    a = snapana.load(path)
    dr = a.replay
    av = a._device_view.allocations
    if not a.device_report.diagnosis.history:
        assert av is None
        return
    assert av is not None and av.end == a.moment.idx
    assert 0 <= av.start <= av.end and av.end - av.start < ab.WINDOW_EVENTS
    # the replay's lifetimes live after some event of the window (alloc <= i < free)
    lt = dr.lifetimes.filter((pl.col("alloc_idx") <= av.end)
                             & (pl.col("free_req_idx") > av.start))
    assert av.allocations == lt.height
    drawn = [b for b in av.bands if b.kind == "allocation"]
    held = [b for b in av.bands if b.kind == "held"]
    other = [b for b in av.bands if b.kind == "other"]
    assert len(drawn) <= ab.BAND_COUNT and av.points("allocation") <= ab.POINT_LIMIT
    assert av.points() <= ab.POINT_LIMIT + 4 * ab.WINDOW_EVENTS * len(other) + 4 * len(held)
    # the summed bands are on top: one per family (the largest), then at most one grey one
    assert len(other) <= ab.OTHER_FAMILIES + 1
    assert all(x is y for x, y in zip(av.bands[len(av.bands) - len(other):], other, strict=True))
    assert [b.family for b in other].count("") <= 1 and all(b.family for b in other[:-1])
    assert len({b.family for b in other}) == len(other)
    assert av.count("allocation") + av.count("held") + av.count("other") == lt.height
    assert all(b.count > 1 for b in held)
    # each allocation band is its lifetime: live exactly then, as thick as its block
    life = {(ad, al): (s, f) for ad, al, s, f in lt.select(
        "address", "alloc_idx", "size", "free_req_idx").iter_rows()}
    for b in drawn:
        size, free = life[(b.address, b.alloc_idx)]
        assert b.size == size
        for i in range(av.start, av.end + 1):
            span = _span(b, i)
            assert (span is not None) == (b.alloc_idx <= i < free), (b.address, i)
            assert span is None or span[1] - span[0] == size
    # held bands: constant, and only what was live through the whole window
    through = lt.filter((pl.col("alloc_idx") <= av.start) & (pl.col("free_req_idx") > av.end))
    assert sum(b.size for b in held) <= int(through["size"].sum())
    for b in held:
        assert len(b.events) == 1 and b.top[0] - b.base[0] == b.size
    # the verdict's families are drawn first, then the largest: nothing summed into `other`
    # that changes in the window is of a named family (while there is room), or larger than
    # the smallest drawn of the others
    d = a.device_report.diagnosis
    named = {f for f in (d.excess_family, d.request_family) if f}
    if other and drawn:
        shown = {(b.address, b.alloc_idx) for b in drawn}
        lives = a.device_report.timeline.families.lifetimes
        fam = dict(zip(zip(lives["address"], lives["alloc_idx"], strict=True),
                       lives["family"], strict=True))
        moving = lt.filter(~((pl.col("alloc_idx") <= av.start)
                             & (pl.col("free_req_idx") > av.end)))
        rest = [(s, fam[(ad, al)]) for ad, al, s in
                moving.select("address", "alloc_idx", "size").iter_rows()
                if (ad, al) not in shown]
        unnamed = [b.size for b in drawn if b.family not in named]
        if unnamed:
            assert not [f for _, f in rest if f in named]
            assert max((s for s, _ in rest), default=0) <= min(unnamed)
    # after every event the bands tile 0..allocated: the top edge is allocated bytes
    for i in range(av.start, av.end + 1):
        spans = sorted(s for b in av.bands if (s := _span(b, i)) is not None)
        if not spans:  # nothing live after this event (a window that opens on an empty device)
            assert int(dr.allocated[i]) == 0, i
            continue
        assert spans[0][0] == 0
        assert all(lo[1] == hi[0] for lo, hi in zip(spans, spans[1:], strict=False)), i
        assert spans[-1][1] == int(dr.allocated[i]), (i, spans[-1][1], dr.allocated[i])
    # evidence at the moment is the report's
    evidence = dict(a.blocks.filter(pl.col("state") == "active_allocated")
                    .select("address", "evidence").iter_rows())
    for b in drawn:
        if b.alloc_idx <= av.end < life[(b.address, b.alloc_idx)][1]:
            assert b.evidence == evidence[b.address]


@pytest.mark.parametrize("path", [pytest.param(p, id=p.name) for p in SAMPLES]
                         + corpus_params("torch_snapshots", "*.pickle"))
def test_bands_tile_allocated(path: Path) -> None:
    """On the bundled samples and the real corpus."""
    _check(path)


def test_window_starts_at_the_last_trough() -> None:
    allocated = np.array([5, 3, 4, 2, 6, 2, 7, 8, 9, 9])
    assert ab.window_start(allocated, 9, most=100, fewest=2) == 5  # the last minimum
    assert ab.window_start(allocated, 9, most=3, fewest=2) == 7  # at most `most` events
    assert ab.window_start(allocated, 5, most=100, fewest=3) == 3  # at least `fewest`
    assert ab.window_start(allocated, 0) == 0


def test_fewer_bands_when_the_points_would_be_too_many() -> None:
    a = snapana.load(CHUNKED)
    v = a._device_view
    full = v.allocations
    small = ab.allocations_view(v.report, v.colours, "#ccc", "#999", point_limit=200)
    assert full is not None and small is not None
    assert small.points("allocation") <= 200 < full.points("allocation")
    assert small.count("allocation") < full.count("allocation")
    assert small.count("other") > full.count("other")


def test_the_verdicts_family_has_bands_of_its_own() -> None:
    """S1 #3: the 7 saved softmax chunks the verdict names are drawn, never in `other`,
    though 60 larger allocations live in the window."""
    a = snapana.load(CHUNKED)
    d = a.device_report.diagnosis
    av = a._device_view.allocations
    assert d.excess_family == "saved_logprob_softmax" and d.accumulating is not None
    mine = [b for b in av.bands if b.family == "saved_logprob_softmax"]
    live = [b for b in mine if b.end > av.end]  # live at the OOM
    assert len(live) == d.accumulating["count"]
    assert all(b.size == d.accumulating["chunk_size"] for b in live)
    other = [b for b in av.bands if b.kind == "other"]
    assert other and all("saved_logprob_softmax" not in b.detail for b in other)
    # what is summed on top is named by family: the first summed band is the family with the
    # most bytes among the allocations not drawn as bands of their own (the replay's)
    own = {(b.address, b.alloc_idx) for b in av.bands if b.kind == "allocation"}
    lives = a.device_report.timeline.families.lifetimes.filter(
        (pl.col("alloc_idx") <= av.end) & (pl.col("free_req_idx") > av.start)
        & ~((pl.col("alloc_idx") <= av.start) & (pl.col("free_req_idx") > av.end)))
    summed: dict[str, int] = {}
    for ad, al, s, f in lives.select("address", "alloc_idx", "size", "family").iter_rows():
        if (ad, al) not in own:
            summed[f] = summed.get(f, 0) + s
    assert other[0].family == max(summed, key=summed.get)
    assert other[0].name.startswith(f"other {other[0].family} (")


def test_figure_draws_the_bands() -> None:
    """One trace per band, bottom first, in the family colours, the outline of its steps;
    small enough for the page. The colours are the vocabulary file's (read here)."""
    given = vocabulary_colours()
    a = snapana.load(CHUNKED)
    v = a._device_view
    av = v.allocations
    fig = a.figure("allocations")
    bands = list(fig.data)
    assert len(bands) == len(av.bands)
    for tr, b in zip(bands, av.bands, strict=True):
        assert tr.fillcolor == (given[b.family] if b.family else OTHER_COLOUR)
        x, y = b.outline(av.x, av.start)
        assert np.allclose(np.asarray(tr.y, dtype=np.float64) * GiB, y, rtol=1e-6, atol=2**12)
        assert np.allclose(np.asarray(tr.x, dtype=np.float64), x, rtol=1e-6)
    top = np.asarray(bands[-1].y, dtype=np.float64) * GiB
    window = a.replay.allocated[av.start:av.end + 1]
    assert abs(top.max() - window.max()) < 2**12
    assert [an.text for an in fig.layout.annotations] == ["OOM"]
    assert len(_figure_json(figures.allocations(v))) < 120_000


def _raw_alloc(path: Path, band: ab.AllocationBand) -> tuple[list[dict], int]:
    """The raw snapshot's frames of the band's allocation and its block's size."""
    raw = raw_load(path)
    entry = raw["device_traces"][0][band.alloc_idx]
    assert entry["action"] == "alloc" and entry["addr"] == band.address
    sizes = [b["size"] for s in raw["segments"] for b in s["blocks"]
             if b["address"] == band.address]
    assert len(sizes) == 1
    return entry["frames"], sizes[0]


@pytest.mark.chromium
def test_clicking_a_band_shows_its_stack_in_chromium(tmp_path: Path) -> None:
    """A real click on the largest allocation made in the window and live at the OOM
    fills the panel with its size, family, evidence and frames (as the raw snapshot has
    them); an emitted click on `other` shows its sum."""
    a = snapana.load(CHUNKED)
    av = a._device_view.allocations
    k, band = max(((k, b) for k, b in enumerate(av.bands) if b.kind == "allocation"
                   and b.alloc_idx >= av.start and b.end == av.end + 1),
                  key=lambda kb: kb[1].size)
    frames, size = _raw_alloc(CHUNKED, band)
    out = tmp_path / "report.html"
    result = invoke("report", str(CHUNKED), "-o", str(out))
    assert result.returncode == 0, result.stderr
    # the middle of the band, just before the moment line
    x = float(av.x[av.end - av.start] + av.x[av.end - av.start - 1]) / 2
    y = (band.base[-1] + band.top[-1]) / 2 / GiB

    def click(page) -> None:
        div = page.locator('div[data-figure="allocations"]')
        div.scroll_into_view_if_needed()
        px, py = page.evaluate(f"""(() => {{
            const div = document.querySelector('div[data-figure="allocations"]');
            const xa = div._fullLayout.xaxis, ya = div._fullLayout.yaxis;
            const r = div.getBoundingClientRect();
            return [r.left + xa._offset + xa.l2p({x}), r.top + ya._offset + ya.l2p({y})];
        }})()""")
        page.mouse.move(px, py)
        page.wait_for_timeout(200)
        page.mouse.click(px, py)

    other = len(av.bands) - 1
    visit = open_report(out, act=click, probe=f"""(() => {{
        const div = document.querySelector('div[data-figure="allocations"]');
        const panel = document.querySelector('pre.allocation');
        const clicked = panel.textContent;
        div.emit('plotly_click', {{points: [{{curveNumber: {other}}}]}});
        return {{clicked, other: panel.textContent, traces: div._fullData.length,
                 names: div._fullData.map(t => t.name)}};
    }})()""")
    assert visit.console_errors == []
    assert all(u.startswith(("file:", "data:", "blob:")) for u in visit.requests)
    got = visit.probed
    assert got["traces"] == len(av.bands)
    assert got["names"][k] == band.family
    text = got["clicked"]
    assert text.startswith(f"{band.family}: ")
    assert f"{fmt_bytes(size)} ({size:,} bytes)" in text
    assert "evidence: frames" in text and f"at event {band.alloc_idx}" in text
    lines = text.split("stack, innermost first:\n")[1].splitlines()
    python = [f for f in frames if f["filename"].endswith(".py")][:ab.STACK_FRAMES]
    assert len(lines) >= len(python)
    for line, f in zip(lines, python, strict=False):
        assert line.endswith(f":{f['line']} {f['name']}"), (line, f)
        assert f["filename"].endswith(line.split(":")[0])
    assert got["other"].startswith(av.bands[-1].name + ":")
    assert "stack" not in got["other"]


def test_report_draws_it_only_with_history(tmp_path: Path) -> None:
    """After the family chart when the capture has a history; not at all without one."""
    html = (ROOT / "reports" / "slime-tp2-chunked-logprob-oom.html").read_text()
    assert html.index('data-figure="families_over_time"') < html.index(
        'data-figure="allocations"') < html.index('data-figure="segments"')
    none = SNAPSHOTS / "llm-1.3b-no-history.pickle"
    if not none.exists():
        pytest.skip("corpus absent")
    out = tmp_path / "r.html"
    assert invoke("report", str(none), "-o", str(out)).returncode == 0
    assert 'data-figure="allocations"' not in out.read_text()


def test_figure_json_names_each_stack_once() -> None:
    a = snapana.load(CHUNKED)
    d = json.loads(_figure_json(figures.figure("allocations", a._device_view)))
    lines = d["layout"]["meta"]["lines"]
    assert len(lines) == len(set(lines))
    stacks = d["layout"]["meta"]["stacks"]
    used = {t["meta"][1] for t in d["data"] if t["meta"][1] is not None and t["meta"][1] >= 0}
    assert used == set(range(len(stacks)))
