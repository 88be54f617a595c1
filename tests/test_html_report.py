"""The HTML report is self-contained and renders in a real browser with no network."""

from __future__ import annotations

import json
import pickle
import re

import pytest
from snapana.units import fmt_bytes

from .browser import open_report
from .conftest import ROOT, corpus_files, invoke, oom_entry, raw_load, require

MiB = 2**20
FR = [{"filename": "/job/model.py", "line": 54, "name": "forward"},
      {"filename": "/job/train.py", "line": 9, "name": "<module>"}]


def _oom_snapshot(path):
    blocks = [{"address": 0x1000_0000, "size": 16 * MiB, "requested_size": 16 * MiB,
               "state": "active_allocated", "frames": FR},
              {"address": 0x1000_0000 + 16 * MiB, "size": 4 * MiB, "requested_size": 0,
               "state": "inactive", "frames": []}]
    seg = {"device": 0, "address": 0x1000_0000, "total_size": 20 * MiB, "stream": 0,
           "segment_type": "large", "segment_pool_id": (0, 0), "is_expandable": False,
           "allocated_size": 16 * MiB, "active_size": 16 * MiB, "requested_size": 16 * MiB,
           "frames": [], "blocks": blocks}
    trace = [{"action": "segment_alloc", "addr": 0x1000_0000, "size": 20 * MiB, "stream": 0,
              "time_us": 10, "frames": FR},
             {"action": "alloc", "addr": 0x1000_0000, "size": 16 * MiB, "stream": 0,
              "time_us": 11, "frames": FR},
             {"action": "oom", "addr": 0, "size": 40 * MiB, "stream": 0, "device_free": MiB,
              "time_us": 12, "frames": FR}]
    path.write_bytes(pickle.dumps({"segments": [seg], "device_traces": [trace],
                                   "allocator_settings": {},
                                   "external_annotations": [
                                       {"stage": "START", "name": "fwd", "device": 0,
                                        "time_us": 10},
                                       {"stage": "END", "name": "fwd", "device": 0,
                                        "time_us": 12}]}, protocol=4))


def _inputs(tmp_path):
    made = tmp_path / "oom.pickle"
    _oom_snapshot(made)
    files = [made]
    corpus = corpus_files("torch_snapshots", "*.pickle")
    files += [f for f in corpus if f.name in ("gpt-medium-ctx1024-train.pickle",
                                              "cnn-cpp-frames.pickle")]
    return files


URL_REF = re.compile(r"""(src|href)\s*=\s*["']?\s*(https?:)?//""", re.I)
CSS_URL = re.compile(r"""url\(\s*["']?\s*(https?:)?//|@import""", re.I)


@pytest.mark.chromium
def test_report_renders_offline_in_chromium(tmp_path):
    for snap in _inputs(tmp_path):
        out = tmp_path / (snap.stem + ".html")
        result = invoke("report", str(snap), "-o", str(out))
        assert result.returncode == 0, result.stderr
        html = out.read_text()
        assert not URL_REF.search(html), "report references a network resource"
        assert not CSS_URL.search(html)
        assert html.count('id="plotly-gz"') == 1  # plotly.js inlined once
        visit = open_report(out)
        assert visit.console_errors == []
        assert visit.requests == [out.resolve().as_uri()]  # the file itself, nothing else
        assert visit.figure_divs >= 2 and visit.plots == visit.figure_divs
        if snap.name == "oom.pickle":
            assert "40.00 MiB" in visit.text  # the failed request
            assert "1.00 MiB" in visit.text  # device free
            assert "model.py:54 forward" in visit.text  # the allocation site


#: A laptop's window (issue 71: the knob table was 1,716 px wide in it).
WINDOW = (1366, 768)

#: With every <details> open (a row's detail counts too): the document's width, each shown
#: table's right edge, and each plotly legend that meets an axis' tick label or title.
LAYOUT = """() => {
  document.querySelectorAll('details').forEach(d => { d.open = true; });
  const box = e => e.getBoundingClientRect();
  const meet = (a, b) => a.left < b.right && b.left < a.right && a.top < b.bottom
                         && b.top < a.bottom;
  const tables = Array.from(document.querySelectorAll('table'))
    .filter(t => box(t).width > 0).map(t => [t.className, box(t).right]);
  const covered = [];
  document.querySelectorAll('.js-plotly-plot').forEach(div => {
    const legend = div.querySelector('.legend');
    if (!legend) return;
    div.querySelectorAll('.xtick text, .ytick text, .g-xtitle text, .g-ytitle text')
      .forEach(t => { if (box(t).width > 0 && meet(box(legend), box(t)))
                        covered.push([div.dataset.figure, t.textContent]); });
  });
  return {width: document.documentElement.scrollWidth, tables: tables, covered: covered,
          legends: document.querySelectorAll('.js-plotly-plot .legend').length};
}"""


@pytest.mark.chromium
@pytest.mark.parametrize("page", [pytest.param(p, id=p.stem)
                                  for p in sorted((ROOT / "reports").glob("*.html"))])
def test_a_sample_report_fits_a_laptop_window_and_no_legend_covers_an_axis(page):
    """At 1,366 × 768 nothing scrolls sideways: no table is wider than the window (a
    knob's frames and paths are in its row's detail), and no legend covers a tick label
    or an axis title (the segment map's legend sat on its first tick labels)."""
    visit = open_report(page, probe=LAYOUT, viewport=WINDOW)
    got = visit.probed
    assert visit.console_errors == []
    assert got["tables"] and got["legends"]  # measured something
    assert got["width"] <= WINDOW[0]
    wide = [(name, right) for name, right in got["tables"] if right > WINDOW[0]]
    assert wide == [], wide
    assert got["covered"] == []


#: A job's log as pasted: an OOM message with a long traceback line, and vLLM's own refusal
#: (its format string in vllm/worker/worker.py, `determine_num_available_blocks`).
_LOG = (
    "[rank1]: Traceback (most recent call last):\n"
    "[rank1]:   File \"/opt/conda/lib/python3.11/site-packages/megatron/core/"
    "tensor_parallel/cross_entropy.py\", line 129, in forward\n"
    "[rank1]:     logits_max = torch.max(vocab_parallel_logits, dim=-1)[0]\n"
    "[rank1]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 29.50 GiB. GPU 1 "
    "has a total capacity of 79.11 GiB of which 14.06 GiB is free. Including non-PyTorch "
    "memory, this process has 65.04 GiB memory in use. Of the allocated memory 61.44 GiB is "
    "allocated by PyTorch, and 2.59 GiB is reserved by PyTorch but unallocated. If reserved "
    "but unallocated memory is large try setting "
    "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.\n")


def _pages(tmp: object) -> dict[str, list[str]]:
    """The report commands whose pages the samples do not show: several ranks with a log
    among them, a log alone, and a diff."""
    from pathlib import Path

    tmp = Path(str(tmp))
    log = tmp / "train.log"
    log.write_text(_LOG)
    samples = ROOT / "sample_snapshots"
    a, b = (samples / "slime-tp2-chunked-logprob-oom.pickle",
            samples / "slime-tp2-recompute-loss-ok.pickle")
    return {"ranks": ["report", str(a), str(b), str(log)],
            "log": ["report", str(log)],
            "diff": ["diff", str(a), str(b), "-f", "html"]}


@pytest.mark.chromium
@pytest.mark.parametrize("kind", ["ranks", "log", "diff"])
def test_the_other_pages_fit_a_laptop_window(tmp_path, kind):
    """Issue 71: the samples' pages were measured at 1,366 × 768, the pages of several
    ranks, of a log and of a diff were not. Each, made here, scrolls no table sideways and
    no legend covers an axis."""
    page = tmp_path / f"{kind}.html"
    run = invoke(*_pages(tmp_path)[kind], "-o", str(page))
    assert run.returncode == 0, run.stderr
    visit = open_report(page, probe=LAYOUT, viewport=WINDOW)
    got = visit.probed
    assert visit.console_errors == []
    assert got["tables"]  # measured something
    assert got["width"] <= WINDOW[0]
    wide = [(name, right) for name, right in got["tables"] if right > WINDOW[0]]
    assert wide == [], wide
    assert got["covered"] == []


def _three_gpu_snapshot(path):
    """One process's snapshot of three GPUs, each holding its own amount (device d: d + 1
    blocks of 5 + 2d MiB in a 40 MiB segment: 5, 14, 27 MiB), the OOM on the last one: a
    `--device` that showed another device's figures, or all three, cannot pass for it."""
    segments, traces = [], []
    for dev in range(3):
        base = 0x1000_0000 * (dev + 1)
        size = (5 + 2 * dev) * MiB
        used = (dev + 1) * size
        blocks = [{"address": base + i * size, "size": size, "requested_size": size,
                   "state": "active_allocated", "frames": FR} for i in range(dev + 1)]
        blocks.append({"address": base + used, "size": 40 * MiB - used, "requested_size": 0,
                       "state": "inactive", "frames": []})
        segments.append({"device": dev, "address": base, "total_size": 40 * MiB, "stream": 0,
                         "segment_type": "large", "segment_pool_id": (0, 0),
                         "is_expandable": False, "allocated_size": used, "active_size": used,
                         "requested_size": used, "frames": [], "blocks": blocks})
        trace = [{"action": "segment_alloc", "addr": base, "size": 40 * MiB, "stream": 0,
                  "time_us": 10, "frames": FR}]
        trace += [{"action": "alloc", "addr": b["address"], "size": b["size"], "stream": 0,
                   "time_us": 11 + i, "frames": FR} for i, b in enumerate(blocks[:-1])]
        if dev == 2:
            trace.append({"action": "oom", "addr": 0, "size": 64 * MiB, "stream": 0,
                          "device_free": MiB, "time_us": 20, "frames": FR})
        traces.append(trace)
    path.write_bytes(pickle.dumps({"segments": segments, "device_traces": traces,
                                   "allocator_settings": {}}, protocol=4))


def _raw_device_figures(path, device: int) -> tuple[int, int]:
    """(allocated, reserved) of one device, summed from the raw pickle without snapana."""
    segs = [s for s in raw_load(path)["segments"] if s["device"] == device]
    allocated = sum(b["size"] for s in segs for b in s["blocks"]
                    if b["state"] == "active_allocated")
    return allocated, sum(s["total_size"] for s in segs)


@pytest.mark.parametrize("device", [0, 1, 2])
def test_device_option_shows_that_device_alone(tmp_path, device):
    """`--device N` of a three-GPU capture shows device N's figures (recomputed here from
    the raw pickle) and no other's; a device the capture lacks is one line, exit 2."""
    snap = tmp_path / "three.pickle"
    _three_gpu_snapshot(snap)
    allocated, reserved = _raw_device_figures(snap, device)
    run = invoke("summary", str(snap), "--device", str(device), "-f", "json")
    assert run.returncode == 0, run.stderr
    (dev,) = json.loads(run.stdout)["devices"]
    assert dev["device_name"] == f"cuda:{device}"
    assert (dev["allocated_bytes"], dev["reserved_bytes"]) == (allocated, reserved)
    assert (dev["oom"] is not None) == (oom_entry(snap) is not None and device == 2)
    page = tmp_path / "a.html"
    ok = invoke("report", str(snap), "--device", str(device), "-o", str(page))
    assert ok.returncode == 0, ok.stderr
    html = page.read_text()
    assert re.findall(r'<section class="device" data-device="(\d+)">', html) == [str(device)]
    assert f"<h2>cuda:{device} " in html and fmt_bytes(allocated) in html
    for other in set(range(3)) - {device}:
        assert fmt_bytes(_raw_device_figures(snap, other)[0]) not in html
    # the OOM happened elsewhere: said so, never as this device's
    assert ("ran out of memory on cuda:2" in html) == (device != 2)
    bad = invoke("report", str(snap), "--device", "7", "-o", str(tmp_path / "b.html"))
    assert bad.returncode == 2 and "no device 7" in bad.stderr
    assert bad.stderr.count("\n") == 1
    assert not (tmp_path / "b.html").exists()


def _kineto(path, t0):
    events = [{"ph": "X", "cat": "cpu_op", "name": "aten::empty", "ts": t0, "dur": 50,
               "pid": 1, "tid": 1}]
    total = 0
    for i, nbytes in enumerate((8 * MiB, 8 * MiB, -8 * MiB)):
        total += nbytes
        events.append({"ph": "i", "s": "t", "cat": "cpu_instant_event", "name": "[memory]",
                       "ts": t0 + 10 + i, "pid": 1, "tid": 1,
                       "args": {"Device Type": 1, "Device Id": 0, "Addr": 4096 * (1 + i % 2),
                                "Bytes": nbytes, "Total Allocated": total,
                                "Total Reserved": 32 * MiB}})
    import json

    path.write_text(json.dumps({"traceEvents": events}))


@pytest.mark.parametrize("t0,shared", [(0, True), (10_000_000, False)])
@pytest.mark.chromium
def test_snapshot_and_trace_together(tmp_path, t0, shared):
    snap, trace = tmp_path / "oom.pickle", tmp_path / "trace.json"
    _oom_snapshot(snap)  # events at 10..12 µs
    _kineto(trace, t0)
    out = tmp_path / "both.html"
    result = invoke("report", str(snap), "--trace", str(trace), "-o", str(out))
    assert result.returncode == 0, result.stderr
    visit = open_report(out)
    assert visit.console_errors == []
    # devices named as PyTorch names them, never capitalised ("Cuda:0")
    assert "oom.pickle: cuda:0" in visit.text and "trace.json: cuda:0" in visit.text
    assert "Cuda:0" not in visit.text
    assert ("do not share a clock" in visit.text) is (not shared)
    assert ("All sources on one clock" in out.read_text()) is shared


#: Each device section's family timeline as drawn: its names and first x values.
SECTIONS = """Array.from(document.querySelectorAll('section.device')).map(sec => {
  const div = sec.querySelector('div[data-figure="families_over_time"]');
  return div ? {names: div._fullData.map(t => t.name), x: Array.from(div._fullData[0].x),
                axis: div._fullLayout.xaxis.title.text} : null; })"""


@pytest.mark.chromium
def test_each_source_draws_its_own_family_timeline_on_the_shared_clock(tmp_path):
    snap, trace = tmp_path / "oom.pickle", tmp_path / "trace.json"
    _oom_snapshot(snap)  # events at 10..12 µs
    _kineto(trace, -2)  # memory events at 8..10 µs: the shared clock starts at 8
    out = tmp_path / "both.html"
    assert invoke("report", str(snap), "--trace", str(trace), "-o", str(out)).returncode == 0
    visit = open_report(out, probe=SECTIONS)
    assert visit.console_errors == []
    snapshot, kineto = visit.probed
    # the snapshot's section draws the snapshot (its family), the trace's the trace (no
    # stacks in a profiler's memory events: all of it unknown), though both are device 0
    assert snapshot["names"][0] == "saved_activations" and kineto["names"][0] == "unknown"
    # one origin, as in "All sources on one clock": they line up one above the other
    assert kineto["x"][0] == 0 and snapshot["x"][0] == pytest.approx(2e-6, abs=1e-9)
    assert snapshot["axis"] == kineto["axis"] == "seconds since the first event of any source"
    ids = re.findall(r'\bid="([^"]+)"', out.read_text())
    assert len(ids) == len(set(ids)), "element ids repeat across the sources' sections"


@pytest.mark.chromium
@pytest.mark.memray
def test_a_memray_source_draws_no_family_timeline_and_breaks_nothing(tmp_path):
    memray = require("memray")
    snap, capture = tmp_path / "oom.pickle", tmp_path / "run.bin"
    _oom_snapshot(snap)
    with memray.Tracker(str(capture)):
        held = [bytearray(1 << 20) for _ in range(4)]
        del held
    out = tmp_path / "with-memray.html"
    result = invoke("report", str(snap), "--memray", str(capture), "-o", str(out))
    assert result.returncode == 0, result.stderr
    visit = open_report(out, probe=SECTIONS)
    assert visit.console_errors == [] and visit.plots == visit.figure_divs
    gpu, host = visit.probed  # host memory (memray) comes after the GPU
    assert gpu["names"][0] == "saved_activations"
    assert gpu["axis"] == "seconds since first event"  # memray has no clock to share
    assert host is None  # a heap high-water mark: no history, so no family timeline


def test_a_report_from_the_cache_is_unchanged_and_keeps_no_code(tmp_path, monkeypatch):
    """A report made twice, the second from what the first kept in the user's cache, is
    byte-identical; nothing kept is compiled code (a template is compiled in each run: code
    read back would be run), and a FIFO or a changed file at a kept file's name, or a cache
    that cannot be written (its folder is a file), costs nothing but the making (a FIFO hung
    every report before)."""
    from .conftest import run_cli

    snap = tmp_path / "oom.pickle"
    _oom_snapshot(snap)
    cache = tmp_path / "cache"
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    pages = []
    for run in range(2):
        out = tmp_path / f"r{run}.html"
        result = run_cli("report", str(snap), "-o", str(out))
        assert result.returncode == 0, result.stderr
        pages.append(out.read_bytes())
    assert pages[0] == pages[1]
    kept = sorted((cache / "snapana" / "sealed").iterdir())
    assert kept and all(p.suffix in (".json", ".b64") for p in kept), kept
    import os

    for damage in ("fifo", "changed"):  # a FIFO is passed over, a changed file made again
        for path in kept:
            path.unlink()
            if damage == "fifo":
                os.mkfifo(path)
            else:
                path.write_bytes(b"0" * 64 + b"\nchanged")
        out = tmp_path / f"{damage}.html"
        result = run_cli("report", str(snap), "-o", str(out))
        assert result.returncode == 0, result.stderr
        assert out.read_bytes() == pages[0]
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("x")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocked))
    out = tmp_path / "blocked.html"
    result = run_cli("report", str(snap), "-o", str(out))
    assert result.returncode == 0, result.stderr
    assert out.read_bytes() == pages[0]
