"""Every real corpus snapshot: exact replay, and headline figures recomputed from the raw pickle."""

from __future__ import annotations

import json

import pytest
from snapana.analysis.replay import replay
from snapana.limits import MAX_LINE
from snapana.session import analyse
from snapana.sources import load
from snapana.units import fmt_bytes

from .conftest import SAMPLES, corpus_params, invoke, raw_load
from .raw_replay import final_blocks, live_after, raw_replay

SAMPLE_FILES = [pytest.param(p, id=p.name) for p in sorted(SAMPLES.glob("*.pickle"))]
#: every snapshot of the corpus, whatever its extension (*.pickle, *.pkl, *.pickle.gz)
ALL_SNAPSHOTS = [p for p in corpus_params("torch_snapshots")
                 if p.values[0] is None or p.values[0].suffix != ".md"]


def _raw_frames(raw):
    """Every frame dict of a decoded snapshot that describes a block or a trace entry (a
    legacy block's stack is its newest history entry's)."""
    segs = raw if isinstance(raw, list) else raw["segments"]
    for seg in segs:
        for b in seg.get("blocks") or []:
            history = b.get("history") or [{}]
            yield from b.get("frames") or history[-1].get("frames") or []
    if isinstance(raw, dict):
        for trace in raw.get("device_traces") or []:
            for e in trace:
                yield from e.get("frames") or []


@pytest.mark.parametrize("path", ALL_SNAPSHOTS)
def test_no_real_snapshot_is_refused(path):
    """A real capture is never refused for a value PyTorch can write: each loads, and a
    frame whose line PyTorch wrote as "none" (2**64 - 1 or -1) is read as line 0 with a
    warning that the report shows."""
    capture = load(path)  # raises InputError when refused
    raw = raw_load(path)
    odd = {id(f) for f in _raw_frames(raw) if not 0 <= f.get("line", 0) < MAX_LINE}
    warned = [w for w in capture.warnings if "no line number" in w]
    if odd:
        assert warned and warned[0].startswith(f"{len(odd)} stack frame"), capture.warnings
        lines = [f[2] for f in capture.stacks.frames]
        assert all(0 <= ln < MAX_LINE for ln in lines)
    else:
        assert not warned


@pytest.mark.parametrize("path", ALL_SNAPSHOTS + SAMPLE_FILES)
def test_replayed_final_state_equals_segments(path):
    raw = raw_load(path)
    capture = load(path)
    for device in capture.devices:
        dr = replay(capture, device)
        # a trace that ends before the snapshot was taken (a trimmed fixture) leaves blocks
        # allocated that the segments hold free: the replay names each, and nothing else
        assert dr.mismatches == [f"block 0x{a:x} is live in the trace but not in the segments"
                                 for a in _open_in_trace_only(raw, device)]
        final = dr.blocks_at(dr.final)
        replayed = {a: (s, r, st) for a, s, r, st in
                    final.select("address", "size", "requested_size", "state").iter_rows()}
        expected = {a: (s, r, st.replace("awaiting", "pending"))
                    for a, (s, r, st) in final_blocks(raw, device).items()}
        if dr.mismatches:  # the end of the trace, as the trace has it
            trace = raw["device_traces"][device]
            live = live_after(raw, device, len(trace) - 1)
            requested = {e["addr"]: e["size"] for e in trace if e["action"] == "alloc"}
            expected |= {a: (live[a], requested[a], "active_allocated")
                         for a in _open_in_trace_only(raw, device)}
        assert replayed == expected
        if dr.n_events:
            assert dr.allocated.min() >= 0 and dr.reserved.min() >= 0
            # undoing every event leaves exactly the blocks alive before recording
            first = dr.blocks_at(dr.at(-1))
            assert int(first["size"].sum()) == dr.baseline_allocated


def _open_in_trace_only(raw, device) -> list[int]:
    """Addresses the raw trace allocates and never frees that hold no live block in the
    final segments, in the order of their allocations."""
    trace = (raw.get("device_traces") or [[]] * (device + 1))[device] if isinstance(
        raw, dict) else []
    open_at: dict[int, int] = {}
    for i, e in enumerate(trace):
        if e["action"] == "alloc":
            open_at[e["addr"]] = i
        elif e["action"] in ("free_completed", "free"):
            open_at.pop(e["addr"], None)
    final = final_blocks(raw, device)
    return [a for a, _ in sorted(open_at.items(), key=lambda x: x[1]) if a not in final]


def _largest_gap(blocks, segs):
    best = 0
    for sa, total in segs.items():
        cursor = sa
        for a in sorted(b for b in blocks if sa <= b < sa + total):
            best = max(best, a - cursor)
            cursor = a + blocks[a]
        best = max(best, sa + total - cursor)
    return best


@pytest.mark.parametrize("path", ALL_SNAPSHOTS)
def test_headline_equals_sums_from_raw_pickle(path):
    raw = raw_load(path)
    result = invoke("summary", str(path), "--format", "json")
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    for dev in summary["devices"]:
        r = raw_replay(raw, dev["device"])  # the allocator's split rule and request padding
        idx, live, segs, pending, peak = r.moment, r.live, r.segments, r.pending, r.peak
        trace = (raw.get("device_traces") or [[]] * (dev["device"] + 1))[dev["device"]] \
            if isinstance(raw, dict) else []
        oom = any(e["action"] == "oom" for e in trace)
        assert (dev["oom"] is not None) == oom  # with no OOM, the peak is diagnosed
        if not any(e["action"] == "alloc" for e in trace):
            # no history: the snapshot is the state, and its peak
            assert dev["moment"]["kind"] == "snapshot" and not dev["history"]
            final = final_blocks(raw, dev["device"])
            live = {a: s for a, (s, _, st) in final.items() if st == "active_allocated"}
            segs = {s["address"]: s["total_size"] for s in
                    (raw if isinstance(raw, list) else raw["segments"])
                    if s.get("device", 0) == dev["device"]}
            peak = sum(live.values())
            pending = sum(s for s, _, st in final.values() if st != "active_allocated")
        else:
            kind = "oom" if oom else "peak"
            assert (dev["moment"]["kind"], dev["moment"]["event_index"]) == (kind, idx)
        reserved = sum(segs.values())
        allocated = sum(live.values())
        assert dev["reserved_bytes"] == reserved
        assert dev["allocated_bytes"] == allocated
        assert dev["peak_allocated_bytes"] == peak
        assert dev["pending_free_bytes"] == pending
        assert dev["cached_unallocated_bytes"] == reserved - allocated - pending
        assert dev["largest_free_block_bytes"] == _largest_gap(live, segs)
        assert sum(g["bytes"] for g in dev["groups"]) == allocated
        assert sum(g["blocks"] for g in dev["groups"]) == len(live)


@pytest.mark.parametrize("path", ALL_SNAPSHOTS)
def test_report_succeeds(path, tmp_path):
    out = tmp_path / "r.html"
    result = invoke("report", str(path), "-o", str(out))
    assert result.returncode == 0, result.stderr
    html = out.read_text()
    assert "Plotly.newPlot" in html and "plotly-gz" in html
    assert analyse(load(path))  # the API path agrees it is readable


@pytest.mark.parametrize("path", ALL_SNAPSHOTS + SAMPLE_FILES)
def test_every_command_prints_the_peak_of_an_independent_replay(path, tmp_path):
    """Issue 56: `summary`, `report`, `check` and `whatif` (as recorded) print one peak
    allocated, byte for byte, and it is the one a replay of the raw pickle written here
    finds (blocks cut by the allocator's split rule, requests padded as the final blocks
    show), at the same event."""
    raw = raw_load(path)
    summary = json.loads(invoke("summary", str(path), "--format", "json").stdout)
    out = tmp_path / "report.html"
    assert invoke("report", str(path), "-o", str(out)).returncode == 0
    report = out.read_text()
    budget = tmp_path / "budget.toml"
    budget.write_text('peak_allocated = "1024TiB"\n')
    whatif = invoke("whatif", str(path), "--capacity", "512GiB", "-f", "json")
    modelled = {d["device"]: d for d in json.loads(whatif.stdout)["devices"]} \
        if whatif.returncode == 0 else {}
    for dev in summary["devices"]:
        device = dev["device"]
        expected = raw_replay(raw, device)
        if expected.moment is None or not any(
                e["action"] == "alloc" for e in raw["device_traces"][device]):
            # no history: the snapshot is the state, and its peak
            expected.peak = sum(s for s, _, st in final_blocks(raw, device).values()
                                if st == "active_allocated")
        assert dev["peak_allocated_bytes"] == expected.peak
        assert fmt_bytes(expected.peak) in report
        if dev["moment"]["kind"] == "peak" and expected.moment is not None:
            assert dev["moment"]["event_index"] == expected.moment
        check = json.loads(invoke("check", str(path), "--budget", str(budget), "--device",
                                  str(device), "-f", "json").stdout)
        (measured,) = [c["measured_value"] for c in check["checks"]]
        assert measured == expected.peak
        model = modelled.get(device)
        if model and model["reproduced"] and not model["as_recorded"]["stopped"]:
            assert model["as_recorded"]["peak_allocated_bytes"] == expected.peak
