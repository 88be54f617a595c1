"""Every real corpus snapshot: exact replay, and headline figures recomputed from the raw pickle."""

from __future__ import annotations

import json

import pytest
from snapana.analysis.replay import replay
from snapana.limits import MAX_LINE
from snapana.session import analyse
from snapana.sources import load

from .conftest import SAMPLES, corpus_params, invoke, raw_load

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


def _rounded(n):
    return max(512, -(-n // 512) * 512)


def _raw_replay(raw, device):
    """Independent replay of the raw trace: (index of the moment — the last OOM, else the
    peak —, allocated blocks, segments and pending-free bytes there, peak bytes).

    A block's size is the final segments' size when it survives to the end, else its request
    rounded up to 512 bytes (the allocator's rounding). The state before the first event is a
    moment too (index -1).
    """
    trace = (raw.get("device_traces") or [[]] * (device + 1))[device] if isinstance(
        raw, dict) else []
    final = _raw_active_blocks(raw, device)
    segs = raw if isinstance(raw, list) else raw["segments"]
    final_segs = {s["address"]: s["total_size"] for s in segs if s.get("device", 0) == device}
    last_alloc = {e["addr"]: i for i, e in enumerate(trace) if e["action"] == "alloc"}
    freed_before, seen_alloc = {}, set()  # blocks freed before any alloc of their address
    for e in trace:
        a = e.get("addr")  # an oom entry has none (device_free instead)
        if e["action"] == "alloc":
            seen_alloc.add(a)
        elif e["action"] in ("free_requested", "free_completed", "free") and (
                a not in seen_alloc and a not in freed_before):
            freed_before[a] = _rounded(e["size"])
    # initial live set: untouched final blocks (allocated, not pending) + freed-before blocks
    live = {a: s for a, (s, _, st) in final.items()
            if a not in last_alloc and st == "active_allocated"}
    live.update(freed_before)
    # freed before recording, still waiting on a stream at the end: pending all along
    pending = {a: s for a, (s, _, st) in final.items()
               if a not in last_alloc and st != "active_allocated"}
    states, pendings = [dict(live)], [sum(pending.values())]
    for i, e in enumerate(trace):
        a = e.get("addr")
        if e["action"] == "alloc":
            live[a] = final[a][0] if a in final and last_alloc[a] == i else _rounded(e["size"])
        elif e["action"] == "free_requested" or (
                e["action"] in ("free_completed", "free") and a not in pending):
            pending[a] = live.pop(a, 0)
        if e["action"] in ("free_completed", "free"):
            pending.pop(a, None)
        states.append(dict(live))
        pendings.append(sum(pending.values()))
    totals = [sum(st.values()) for st in states]
    peak_pos = max(range(len(totals)), key=lambda k: (totals[k], -k))
    ooms = [i for i, e in enumerate(trace) if e["action"] == "oom"]
    if ooms:  # the report's moment is the (last) OOM
        peak_pos = ooms[-1] + 1
    idx = peak_pos - 1
    seg_now = dict(final_segs)
    for e in trace[idx + 1:][::-1]:  # undo segment events after the moment
        if e["action"] in ("segment_alloc", "segment_map"):
            seg_now.pop(e["addr"], None)
        elif e["action"] in ("segment_free", "segment_unmap"):
            seg_now[e["addr"]] = e["size"]
    return (idx if trace else None), states[peak_pos], seg_now, pendings[peak_pos], max(totals)


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
        idx, live, segs, pending, peak = _raw_replay(raw, dev["device"])
        trace = (raw.get("device_traces") or [[]] * (dev["device"] + 1))[dev["device"]] \
            if isinstance(raw, dict) else []
        oom = any(e["action"] == "oom" for e in trace)
        assert (dev["oom"] is not None) == oom  # with no OOM, the peak is diagnosed
        if not any(e["action"] == "alloc" for e in trace):
            # no history: the snapshot is the state, and its peak
            assert dev["moment"]["kind"] == "snapshot" and not dev["history"]
            final = _raw_active_blocks(raw, dev["device"])
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
