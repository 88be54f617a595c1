"""Every snapshot layout PyTorch has written loads, with hand-made snapshots whose truth is
known by construction."""

from __future__ import annotations

import gzip
import pickle

import pytest
from snapana.analysis.replay import replay
from snapana.session import analyse
from snapana.sources import load

MiB = 2**20
F1 = [{"filename": "/app/train.py", "line": 10, "name": "step"},
      {"filename": "/app/train.py", "line": 99, "name": "<module>"}]


def _segment(device=0, address=0x1000_0000, blocks=((2 * MiB, "active_allocated"),),
             pool=(0, 0), **extra):
    out, addr = [], address
    for size, state in blocks:
        out.append({"address": addr, "size": size, "requested_size": size, "state": state,
                    "frames": F1 if state != "inactive" else []})
        addr += size
    seg = {"device": device, "address": address, "total_size": addr - address, "stream": 0,
           "segment_type": "large", "segment_pool_id": pool, "is_expandable": False,
           "allocated_size": sum(s for s, st in blocks if st == "active_allocated"),
           "active_size": 0, "requested_size": 0, "frames": [], "blocks": out}
    seg.update(extra)
    return seg


def _trace_for(seg, with_time=True, with_frames=True):
    ev = []
    for i, b in enumerate(seg["blocks"]):
        if b["state"] == "inactive":
            continue
        e = {"action": "alloc", "addr": b["address"], "size": b["size"], "stream": 0}
        if with_time:
            e["time_us"] = 1000 + i
        if with_frames:
            e["frames"] = F1
        ev.append(e)
    return ev


def _write(tmp_path, data, name="s.pickle", protocol=4, compress=False):
    p = tmp_path / name
    raw = pickle.dumps(data, protocol=protocol)
    p.write_bytes(gzip.compress(raw) if compress else raw)
    return p


def _one(tmp_path, data, **kw):
    reports = analyse(load(_write(tmp_path, data, **kw)))
    return reports


BLOCKS = ((4 * MiB, "active_allocated"), (2 * MiB, "inactive"), (6 * MiB, "active_allocated"))


@pytest.mark.parametrize("variant", ["modern", "no_traces", "no_time", "no_frames",
                                     "no_settings", "gzip", "protocol5", "protocol2"])
def test_variants_give_the_same_headline(tmp_path, variant):
    seg = _segment(blocks=BLOCKS)
    data = {"segments": [seg], "device_traces": [_trace_for(seg)],
            "allocator_settings": {"expandable_segments": False}}
    kw = {}
    if variant == "no_traces":
        del data["device_traces"]
    elif variant == "no_time":
        data["device_traces"] = [_trace_for(seg, with_time=False)]
    elif variant == "no_frames":
        data["device_traces"] = [_trace_for(seg, with_frames=False)]
    elif variant == "no_settings":
        del data["allocator_settings"]
    elif variant == "gzip":
        kw["compress"] = True
    elif variant == "protocol5":
        kw["protocol"] = 5
    elif variant == "protocol2":
        kw["protocol"] = 2
    (r,) = _one(tmp_path, data, **kw)
    assert r.reserved_bytes == 12 * MiB
    assert r.allocated_bytes == 10 * MiB
    assert r.largest_free_block_bytes == 2 * MiB
    assert r.peak_allocated_bytes == 10 * MiB


def test_bare_list_of_segments_torch_1_13(tmp_path):
    seg = _segment(blocks=BLOCKS)
    del seg["segment_pool_id"]
    (r,) = _one(tmp_path, [seg])
    assert r.allocated_bytes == 10 * MiB and r.n_events == 0


def test_legacy_history_instead_of_frames(tmp_path):
    seg = _segment(blocks=BLOCKS)
    for b in seg["blocks"]:
        frames = b.pop("frames")
        b["history"] = [{"addr": b["address"], "real_size": b["size"], "frames": frames}]
    capture = load(_write(tmp_path, {"segments": [seg]}))
    sids = capture.blocks.filter(capture.blocks["state"] == "active_allocated")["stack_id"]
    assert all(capture.stacks.stack(s)[0][1] == "step" for s in sids)


@pytest.mark.parametrize("spelling", ["active_pending_free", "active_awaiting_free"])
def test_pending_free_states(tmp_path, spelling):
    seg = _segment(blocks=((4 * MiB, "active_allocated"), (2 * MiB, spelling)))
    (r,) = _one(tmp_path, {"segments": [seg]})
    assert r.allocated_bytes == 4 * MiB and r.pending_free_bytes == 2 * MiB


@pytest.mark.parametrize("where", ["top", "settings"])
def test_trace_overflow_is_warned(tmp_path, where):
    seg = _segment(blocks=BLOCKS)
    data = {"segments": [seg], "device_traces": [_trace_for(seg)[1:]],
            "allocator_settings": {}}
    if where == "top":
        data["trace_alloc_overflowed"] = True
    else:
        data["allocator_settings"]["trace_alloc_overflowed"] = True
    (r,) = _one(tmp_path, data)
    assert any("overflowed" in w for w in r.warnings)
    assert r.before_recording_bytes == 4 * MiB  # its alloc event was dropped


def test_several_devices_reported_separately(tmp_path):
    s0 = _segment(device=0, blocks=BLOCKS)
    s1 = _segment(device=1, address=0x9000_0000, blocks=((8 * MiB, "active_allocated"),))
    data = {"segments": [s0, s1], "device_traces": [_trace_for(s0), _trace_for(s1)],
            "external_annotations": [], "compile_context": "x", "user_metadata": "y"}
    r0, r1 = _one(tmp_path, data)
    assert (r0.device, r0.allocated_bytes) == (0, 10 * MiB)
    assert (r1.device, r1.allocated_bytes) == (1, 8 * MiB)


def test_oom_entry_sets_the_moment(tmp_path):
    seg = _segment(blocks=BLOCKS)
    trace = _trace_for(seg)
    trace.append({"action": "free_requested", "addr": seg["blocks"][2]["address"],
                  "size": 6 * MiB, "stream": 0, "time_us": 2000, "frames": F1})
    trace.append({"action": "free_completed", "addr": seg["blocks"][2]["address"],
                  "size": 6 * MiB, "stream": 0, "time_us": 2001, "frames": F1})
    # the snapshot was dumped after the OOM: the 6 MiB block was freed later
    trace.insert(2, {"action": "oom", "addr": 0, "size": 64 * MiB, "stream": 0,
                     "device_free": 3 * MiB, "time_us": 1500, "frames": F1})
    seg["blocks"][2]["state"] = "inactive"
    (r,) = _one(tmp_path, {"segments": [seg], "device_traces": [trace]})
    assert r.moment.kind == "oom"
    assert r.oom is not None
    assert r.oom.requested_bytes == 64 * MiB and r.oom.device_free_bytes == 3 * MiB
    assert r.allocated_bytes == 10 * MiB  # the 6 MiB block was still live at the OOM


def test_replay_undoes_segment_free(tmp_path):
    seg = _segment(blocks=((2 * MiB, "active_allocated"),))
    trace = [
        {"action": "segment_alloc", "addr": 0x5000_0000, "size": 20 * MiB, "stream": 0},
        {"action": "segment_free", "addr": 0x5000_0000, "size": 20 * MiB, "stream": 0},
    ] + _trace_for(seg, with_time=False)
    capture = load(_write(tmp_path, {"segments": [seg], "device_traces": [trace]}))
    dr = replay(capture, 0)
    assert list(dr.reserved) == [22 * MiB, 2 * MiB, 2 * MiB]
    assert dr.mismatches == []


def test_a_device_whose_trace_carries_no_time_beside_one_that_does(tmp_path):
    """A capture has a clock when some event carries a time; a device whose own trace
    carries none is drawn by event index, not read as a clock of NaNs (it was an internal
    error), and its HTML report is written."""
    from snapana.render import render
    from snapana.render.views import capture_view

    segs = [_segment(device=d, blocks=BLOCKS) for d in (0, 1)]
    data = {"segments": segs,
            "device_traces": [_trace_for(segs[0]), _trace_for(segs[1], with_time=False)],
            "allocator_settings": {"expandable_segments": False}}
    capture = load(_write(tmp_path, data))
    assert capture.has_time
    timed, untimed = analyse(capture)
    assert timed.timeline.times_us is not None and untimed.timeline.times_us is None
    assert untimed.allocated_bytes == 10 * MiB
    view = capture_view([untimed], title="s")
    assert not view.devices[0].timeline.x_is_time
    assert "<html" in render(view, "html")
