"""Every real corpus snapshot: exact replay, and headline figures recomputed from the raw pickle."""

from __future__ import annotations

import json

import pytest
from snapana.diagnosis import analyse
from snapana.replay import replay
from snapana.sources import load

from .conftest import corpus_params, raw_load, run_cli

ACTIVE = {"active_allocated", "active_pending_free", "active_awaiting_free"}


def _raw_active_blocks(raw, device):
    segs = raw if isinstance(raw, list) else raw["segments"]
    out = {}
    for seg in segs:
        if seg.get("device", 0) != device:
            continue
        addr = seg["address"]  # older layouts give blocks no address: they are contiguous
        for b in seg["blocks"]:
            if b["state"] in ACTIVE:
                out[b.get("address", addr)] = (b["size"], b.get("requested_size", b["size"]),
                                               b["state"])
            addr += b["size"]
    return out


@pytest.mark.parametrize("path", corpus_params("torch_snapshots", "*.pickle"))
def test_replayed_final_state_equals_segments(path):
    raw = raw_load(path)
    capture = load(path)
    for device in capture.devices:
        dr = replay(capture, device)
        assert dr.mismatches == []
        final = dr.blocks_at(dr.final)
        replayed = {a: (s, r, st) for a, s, r, st in
                    final.select("address", "size", "requested_size", "state").iter_rows()}
        expected = {a: (s, r, st.replace("awaiting", "pending"))
                    for a, (s, r, st) in _raw_active_blocks(raw, device).items()}
        assert replayed == expected
        if dr.n_events:
            assert dr.allocated.min() >= 0 and dr.reserved.min() >= 0
            # undoing every event leaves exactly the blocks alive before recording
            first = dr.blocks_at(dr.at(-1))
            assert int(first["size"].sum()) == dr.baseline_allocated


def _raw_peak(raw, device):
    """Independent running sum over the raw trace (sizes rounded as the allocator rounds)."""
    trace = (raw.get("device_traces") or [])[device] if isinstance(raw, dict) else []
    final = _raw_active_blocks(raw, device)
    # size each lifetime: the final block's size if it survives, else requested rounded to 512
    last_alloc = {}
    for i, e in enumerate(trace):
        if e["action"] == "alloc":
            last_alloc[e["addr"]] = i
    running, live, peak = 0, {}, None
    alive_before = 0
    requested = set()
    for i, e in enumerate(trace):
        a = e["addr"]
        if e["action"] == "alloc":
            size = max(512, -(-e["size"] // 512) * 512)
            if a in final and last_alloc[a] == i:
                size = final[a][0]
            live[a] = size
            running += size
        elif e["action"] == "free_requested" or (
            e["action"] in ("free_completed", "free") and a not in requested
        ):
            requested.add(a)
            if a in live:
                running -= live.pop(a)
            else:
                size = max(512, -(-e["size"] // 512) * 512)
                alive_before += size
                running -= size
        elif e["action"] in ("free_completed", "free"):
            requested.discard(a)
        peak = max(running, 0 if peak is None else peak)
    untouched = sum(s for a, (s, _, st) in final.items() if a not in last_alloc
                    and st == "active_allocated")
    base = alive_before + untouched
    # the state before the first event is a moment too (running == 0 there)
    return None if peak is None else peak + base


@pytest.mark.parametrize("path", corpus_params("torch_snapshots", "*.pickle"))
def test_headline_equals_sums_from_raw_pickle(path):
    raw = raw_load(path)
    result = run_cli("summary", str(path), "--format", "json")
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    segs = raw if isinstance(raw, list) else raw["segments"]
    for dev in summary["devices"]:
        d = dev["device"]
        mine = [s for s in segs if s.get("device", 0) == d]
        reserved = sum(s["total_size"] for s in mine)
        allocated = sum(b["size"] for s in mine for b in s["blocks"]
                        if b["state"] == "active_allocated")
        largest_free = max((b["size"] for s in mine for b in s["blocks"]
                            if b["state"] == "inactive"), default=0)
        assert dev["oom"] is None  # no corpus file recorded an OOM
        assert dev["reserved_bytes"] == reserved
        assert dev["allocated_bytes"] == allocated
        assert dev["cached_unallocated_bytes"] == reserved - allocated
        assert dev["largest_free_block_bytes"] == largest_free
        assert sum(g["bytes"] for g in dev["groups"]) == allocated
        assert sum(g["blocks"] for g in dev["groups"]) == sum(
            1 for s in mine for b in s["blocks"] if b["state"] == "active_allocated")
        peak = _raw_peak(raw, d)
        assert dev["peak_allocated_bytes"] == (allocated if peak is None else max(peak, 0))


@pytest.mark.parametrize("path", corpus_params("torch_snapshots", "*.pickle"))
def test_report_succeeds(path, tmp_path):
    out = tmp_path / "r.html"
    result = run_cli("report", str(path), "-o", str(out))
    assert result.returncode == 0, result.stderr
    html = out.read_text()
    assert "Plotly.newPlot" in html and "plotly-gz" in html
    assert analyse(load(path))  # the API path agrees it is readable
