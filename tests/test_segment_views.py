"""Issue 46, the segment views MemoryViz has — the allocator's state after any event and the
cached segments over the trace — in real headless Chromium: a click on the cached-segment
timeline at three places picks an event, and the segments drawn there equal the replay's
segments at that event (`a.at(event=N).segments`), the blocks drawn its allocated blocks;
hovering the largest block there shows its Python frames and clicking it pins the whole
stack its allocation recorded in the pickle."""

from __future__ import annotations

import pickle
import re
from pathlib import Path

import polars as pl
import pytest
import snapana
from snapana.caching_allocator import ACTIVE_ALLOCATED
from snapana.units import fmt_bytes

from .browser import open_report
from .conftest import SAMPLES, corpus_files, invoke

CLICKS = (0.2, 0.55, 0.95)
CORPUS = ("Constructor-Sun+code_location__memory_snapshot.pickle",
          "gpt-medium-ctx1024-train.pickle")
SEG = "section.device .explore-segments"


def _inputs() -> list:
    corpus = [f for f in corpus_files("torch_snapshots", "*.pickle") if f.name in CORPUS]
    return [pytest.param(f, id=f.name) for f in sorted(SAMPLES.glob("*.pickle")) + corpus]


def _raw_frames(path: Path, device: int, address: int, event: int) -> list[str] | None:
    """The frames the pickle recorded for the allocation at `address` live after `event`:
    the last `alloc` entry at that address up to the event (None: made before the trace).
    A name past `limits.MAX_FRAME_TEXT` is cut as every report shows names (issue 58: C++
    template names run to thousands of characters)."""
    from snapana.limits import MAX_FRAME_TEXT
    from snapana.units import shown_name

    trace = pickle.loads(path.read_bytes())["device_traces"][device]
    for entry in reversed(trace[:event + 1]):
        if entry["action"] == "alloc" and entry["addr"] == address:
            return [f"{shown_name(f['filename'], MAX_FRAME_TEXT)}:{f['line']} "
                    f"{shown_name(f['name'], MAX_FRAME_TEXT)}" for f in entry["frames"]]
    return None


@pytest.mark.chromium
@pytest.mark.parametrize("snap", _inputs())
def test_segments_drawn_are_the_replays(tmp_path: Path, snap: Path) -> None:
    out = tmp_path / "report.html"
    assert invoke("report", str(snap), "-o", str(out)).returncode == 0
    a = snapana.load(snap)
    seen: list[dict] = []

    def act(page) -> None:
        for fraction in CLICKS:
            page.locator(f"{SEG} .segt-canvas").first.scroll_into_view_if_needed()
            canvas = page.locator(f"{SEG} .segt-canvas").first.bounding_box()
            page.mouse.click(canvas["x"] + canvas["width"] * fraction,
                             canvas["y"] + canvas["height"] * 0.98)
            page.wait_for_timeout(150)
            got = page.evaluate(f"""(() => {{ const s = document.querySelector('{SEG}');
              return {{event: Number(s.dataset.event), drawn: s.drawn, blocks: s.blocks,
                       column: s.column(Number(s.dataset.event))}}; }})()""")
            largest = max(got["blocks"], key=lambda b: b[1]) if got["blocks"] else None
            got["hover"] = None
            if largest is not None:
                page.locator(f"{SEG} .seg-canvas").first.scroll_into_view_if_needed()
                x, y = page.evaluate(f"document.querySelector('{SEG}').pointOf({largest[0]})")
                page.mouse.move(x, y)
                page.wait_for_timeout(100)
                tip = page.evaluate(f"document.querySelector('{SEG} .seg-tip').textContent")
                page.mouse.click(x, y)  # pins the whole stack
                page.wait_for_timeout(100)
                got["hover"] = (largest[0], tip, page.evaluate(
                    f"document.querySelector('{SEG} .seg-stack').textContent"))
            seen.append(got)

    visit = open_report(out, act=act)
    assert not visit.console_errors
    assert len(seen) == len(CLICKS)
    compared = 0
    for got in seen:
        event = got["event"]
        state = a.at(event=event)
        want = sorted(state.segments.select("address", "total_size").iter_rows())
        assert sorted(map(tuple, got["drawn"])) == want, f"event {event}"
        assert sorted(map(tuple, got["column"])) == want, f"event {event}"
        live = state.blocks.filter(pl.col("state") == ACTIVE_ALLOCATED)
        assert sorted(map(tuple, got["blocks"])) == sorted(
            live.select("address", "size").iter_rows()), f"event {event}"
        if got["hover"] is not None:
            address, tip, pinned = got["hover"]
            assert f"at 0x{address:x}" in tip and f"at 0x{address:x}" in pinned
            frames = _raw_frames(snap, a.device, address, event)
            if frames is not None:
                # pinned: the whole stack; hovered: its Python frames (else its first), <= 12
                shown = pinned.split("stack, innermost first:\n", 1)[1].splitlines()
                assert shown == (frames or ["(no frames recorded)"])
                brief = tip.split("stack, innermost first:\n", 1)[1].splitlines()
                python = [f for f in frames if re.search(r"\.py:\d+ ", f)] or frames
                assert brief[:len(python[:12])] == python[:12] or not frames
                compared += 1
    assert compared, "no hovered block was allocated inside the trace"


def test_the_segment_maps_hover_names_the_blocks_site() -> None:
    """The segment map at the report's moment: a block's hover says its family and where it
    was allocated (a frame of its own stack in the pickle), not only its family and size."""
    path = SAMPLES / "slime-tp2-chunked-logprob-oom.pickle"
    snap = pickle.loads(path.read_bytes())
    fig = snapana.load(path).figure("segments")
    texts = [t for trace in fig.data if trace.name == "used (allocated)" for t in trace.text]
    largest = max((b for seg in snap["segments"] for b in seg["blocks"]
                   if b["state"] == "active_allocated" and b.get("frames")),
                  key=lambda b: b["size"])
    names = {f["name"] for f in largest["frames"] if f["filename"].endswith(".py")}
    mine = [t for t in texts if t.endswith(fmt_bytes(largest["size"])) and " · " in t]
    assert mine and any(any(n in t for n in names) for t in mine)


def test_alike_segments_are_one_bar_checked_against_the_pickle() -> None:
    """Issue 60: the bundled sample's segment map was dozens of identical bars. Segments
    alike in size and blocks are one bar ("36 × 692.00 MiB"); the pickle's own segments at
    those addresses agree: one size, one layout of blocks (offset, size, state) each. The
    legend and the axis sit on top, where the first bars are."""
    path = SAMPLES / "slime-tp2-chunked-logprob-oom.pickle"
    a = snapana.load(path)
    view = a._device_view
    groups = view.segment_groups
    assert sum(g.count for g in groups) == len(view.segments) > len(groups)
    raw = {s["address"]: s for s in pickle.loads(path.read_bytes())["segments"]}

    def layout(seg: dict) -> tuple:
        out, offset = [], 0
        for b in seg["blocks"]:
            if b["state"] != "inactive":
                out.append((offset, b["size"], b["state"]))
            offset += b["size"]
        return tuple(out)

    for g in groups:
        shapes = {(raw[x]["total_size"], layout(raw[x])) for x in g.addresses}
        assert len(shapes) == 1 and next(iter(shapes))[0] == g.size, g.addresses
    fig = a.figure("segments")
    names = {y for trace in fig.data for y in trace.y}
    big = max(groups, key=lambda g: g.count)
    assert f"{big.count} × {fmt_bytes(big.size)} · pool {big.pool}" in names
    assert len(names) == len(groups)
    assert fig.layout.legend.y >= 1 and fig.layout.xaxis.side == "top"
    assert {t.name for t in fig.data} <= {"used (allocated)", "cached, unallocated",
                                          "freed, pending on a stream", "mixed (see hover)"}


@pytest.mark.chromium
def test_the_segment_chart_shows_its_groups_and_legend_on_screen(tmp_path: Path) -> None:
    """In the drawn page the grouped bar's label is on the chart and the legend sits at the
    chart's top, inside it (it was below dozens of bars, off-screen)."""
    out = tmp_path / "r.html"
    path = SAMPLES / "slime-tp2-chunked-logprob-oom.pickle"
    assert invoke("report", str(path), "-o", str(out)).returncode == 0
    probe = """(() => { const f = document.querySelector('[data-figure="segments"]');
      f.scrollIntoView(); const box = f.getBoundingClientRect();
      const leg = f.querySelector('.legend').getBoundingClientRect();
      const ticks = [...f.querySelectorAll('.ytick text')].map(t => t.textContent);
      return [box.top, box.bottom, leg.top, leg.bottom, ticks]; })()"""
    visit = open_report(out, probe=probe)
    assert not visit.console_errors
    top, bottom, legend_top, legend_bottom, ticks = visit.probed
    assert top <= legend_top and legend_bottom <= top + 150, visit.probed[:4]
    assert any(t.startswith("36 × 692.00 MiB") for t in ticks), ticks
