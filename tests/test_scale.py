"""Large-snapshot paths: the scale generator, the vectorised replay and the compact report.

No timing assertions (the machines are shared): benchmarks/scale.py measures speed.
"""

from __future__ import annotations

import pickle
import random
import re

import numpy as np
import polars as pl
import pytest
from snapana.analysis.replay import NEVER, OVER_RESERVED, replay
from snapana.model import EMPTY_STACK
from snapana.render import render
from snapana.render.views import capture_view
from snapana.session import analyse
from snapana.sources import load
from snapana.sources.torch_snapshot import from_snapshot_dict
from snapana.synth.scale import scale_snapshot, write_scale_snapshot

from .conftest import raw_load

ENTRIES = 20_000


@pytest.fixture(scope="module")
def scale_file(tmp_path_factory):
    return write_scale_snapshot(ENTRIES, tmp_path_factory.mktemp("scale") / "s.pickle", seed=3)


def test_generator_is_deterministic(tmp_path, scale_file):
    again = write_scale_snapshot(ENTRIES, tmp_path / "again.pickle", seed=3)
    assert again.read_bytes() == scale_file.read_bytes()
    other = write_scale_snapshot(ENTRIES, tmp_path / "other.pickle", seed=4)
    assert other.read_bytes() != scale_file.read_bytes()


def test_generator_shape(scale_file):
    raw = raw_load(scale_file)
    trace = raw["device_traces"][0]
    assert len(trace) == ENTRIES
    actions = {e["action"] for e in trace}
    assert {"alloc", "free_requested", "free_completed", "segment_alloc"} <= actions
    frames = {(f["filename"], f["line"], f["name"]) for e in trace for f in e["frames"]}
    assert 150 <= len(frames) <= 1000  # a few hundred distinct frames
    assert all(30 <= len(e["frames"]) <= 100 for e in trace)
    assert any(not f["filename"].endswith(".py") for f in trace[0]["frames"])  # C++ frames
    assert any(f["filename"].endswith(".py") for f in trace[0]["frames"])


def test_generator_shares_frames_like_pytorch():
    data = scale_snapshot(5_000, seed=1)
    trace = data["device_traces"][0]
    lists = {id(e["frames"]) for e in trace}
    dicts = {id(f) for e in trace for f in e["frames"]}
    distinct = {tuple((f["filename"], f["line"], f["name"]) for f in e["frames"]) for e in trace}
    assert len(lists) == len(distinct)  # one list object per distinct stack
    assert len(dicts) == len({(f["filename"], f["line"], f["name"]) for e in trace
                              for f in e["frames"]})
    # pickle's memo writes each stack once: far smaller than the unshared equivalent
    shared = len(pickle.dumps(data))
    unshared = len(pickle.dumps(pickle.loads(pickle.dumps(data)) | {
        "device_traces": [[dict(e, frames=[dict(f) for f in e["frames"]]) for e in trace]]}))
    assert shared * 5 < unshared


def test_a_list_per_entry_is_the_same_trace_laid_out_as_pytorch_writes_it(tmp_path):
    """`list_per_entry`: every entry's frame list a new list (PyTorch makes one per captured
    traceback) of the same shared frame dicts; the same entries otherwise, and the same
    capture once read."""
    shared = scale_snapshot(5_000, seed=1)
    apart = scale_snapshot(5_000, seed=1, list_per_entry=True)
    trace = apart["device_traces"][0]
    assert len({id(e["frames"]) for e in trace}) == len(trace)
    assert len({id(f) for e in trace for f in e["frames"]}) == len(
        {id(f) for e in shared["device_traces"][0] for f in e["frames"]})
    assert pickle.loads(pickle.dumps(apart)) == pickle.loads(pickle.dumps(shared))
    paths = []
    for name, data in (("shared", shared), ("apart", apart)):
        paths.append(tmp_path / f"{name}.pickle")
        paths[-1].write_bytes(pickle.dumps(data, protocol=4))
    a, b = load(paths[0]), load(paths[1])
    assert a.events.equals(b.events) and a.stacks.stacks == b.stacks.stacks


def test_replay_reproduces_final_segments_exactly(scale_file):
    capture = load(scale_file)
    dr = replay(capture, 0)
    assert dr.mismatches == []
    raw = raw_load(scale_file)
    expected = {b["address"]: (b["size"], b["requested_size"], b["state"])
                for s in raw["segments"] for b in s["blocks"] if b["state"] != "inactive"}
    assert any(st == "active_pending_free" for _, _, st in expected.values())
    final = dr.blocks_at(dr.final)
    got = {a: (s, r, st) for a, s, r, st in
           final.select("address", "size", "requested_size", "state").iter_rows()}
    assert got == expected
    assert dr.reserved[-1] == sum(s["total_size"] for s in raw["segments"])
    assert dr.allocated.min() >= 0 and dr.reserved.min() >= 0
    assert int(dr.blocks_at(dr.at(-1))["size"].sum()) == dr.baseline_allocated > 0


def test_consuming_load_gives_the_same_capture(scale_file):
    consumed = load(scale_file)
    kept = from_snapshot_dict(raw_load(scale_file), str(scale_file))
    assert consumed.events.equals(kept.events)
    assert consumed.blocks.equals(kept.blocks)
    assert consumed.stacks.stacks == kept.stacks.stacks


def test_report_is_compact_and_keeps_the_peak(scale_file):
    capture = load(scale_file)
    (report,) = analyse(capture)
    dr = replay(capture, 0)
    view = capture_view([report], title="scale")
    t = view.devices[0].timeline
    assert len(t.x) <= 2100 < dr.n_events
    assert max(t.allocated) == int(dr.allocated.max()) == report.peak_allocated_bytes
    out = render(view, "html")
    assert len(out.encode()) < 3 * 2**20
    assert len(re.findall(r"<script", out)) < 20


# ----- the vectorised pairing against the per-event state machine it replaces -------------

def round_size(size: int, gran: int) -> int:
    """kMinBlockSize's rounding, written here apart from the analyzer's rules: up to a
    multiple of `gran`, at least one."""
    return max(gran, -(-size // gran) * gran)


def _reference_rows(actions, addrs, sizes, stacks, streams, gran=512):
    """The original per-event loop of replay(): rows in creation order, and mismatches.
    A clashing alloc ends the live row (no longer allocated either, issue #27), and a free
    of another (rounded) size than its alloc is a mismatch."""
    rows, open_blocks, mismatches = [], {}, []
    for i, act in enumerate(actions):
        a = addrs[i]
        row = open_blocks.get(a)
        if (act in ("free_requested", "free_completed", "free") and row is not None
                and row[4] >= 0 and sizes[i] > 0 and round_size(sizes[i], gran) != row[1]):
            mismatches.append(f"event {i}: free at 0x{a:x} of {sizes[i]} bytes, allocated "
                              f"as {row[7]}")
        if act == "alloc":
            if a in open_blocks:
                mismatches.append(f"event {i}: alloc at 0x{a:x} which is already live")
                ended = open_blocks.pop(a)
                ended[6] = i
                ended[5] = min(ended[5], i)
            row = [a, round_size(sizes[i], gran), stacks[i], streams[i], i, NEVER, NEVER,
                   sizes[i]]
            rows.append(row)
            open_blocks[a] = row
        elif act == "free_requested":
            row = open_blocks.get(a)
            if row is None:
                row = [a, round_size(sizes[i], gran), EMPTY_STACK, streams[i], -1, NEVER, NEVER,
                       sizes[i]]
                rows.append(row)
                open_blocks[a] = row
            row[5] = i
        elif act in ("free_completed", "free"):
            row = open_blocks.pop(a, None)
            if row is None:
                row = [a, round_size(sizes[i], gran), EMPTY_STACK, streams[i], -1, i, NEVER,
                       sizes[i]]
                rows.append(row)
            if row[5] == NEVER:
                row[5] = i
            row[6] = i
    return rows, open_blocks, mismatches


@pytest.mark.parametrize("seed", range(12))
def test_vectorised_pairing_matches_the_event_loop(seed):
    rng = random.Random(seed)
    n = rng.choice([1, 5, 60, 400])
    kinds = ["alloc", "free_requested", "free_completed", "free", "segment_alloc", "oom"]
    actions = [rng.choice(kinds) for _ in range(n)]
    addrs = [0x1000 * rng.randrange(1, 6) for _ in range(n)]
    sizes = [rng.randrange(1, 5000) for _ in range(n)]
    stacks = [rng.randrange(0, 4) for _ in range(n)]
    streams = [rng.randrange(0, 2) for _ in range(n)]
    data = {"segments": [], "device_traces": [[
        {"action": act, "addr": a, "size": s, "stream": st, "frames": []}
        for act, a, s, st in zip(actions, addrs, sizes, streams, strict=True)]]}
    capture = from_snapshot_dict(data, "fuzz")
    capture.events = capture.events.with_columns(pl.Series("stack_id", stacks, pl.Int64))
    dr = replay(capture, 0)
    rows, open_blocks, mismatches = _reference_rows(actions, addrs, sizes, stacks, streams)
    for a, row in open_blocks.items():
        mismatches.append(f"block 0x{a:x} is live in the trace but not in the segments")
        row[6] = n
    assert dr.lifetimes.rows() == [tuple(r) for r in rows]
    assert [m for m in dr.mismatches if "goes negative" not in m
            and not m.startswith(OVER_RESERVED)] == mismatches
    # segment events but no final segments: live blocks may exceed what the segments
    # reserve, and the replay says so (before the first event, then after each)
    live = [sum(r[1] for r in rows if r[4] <= i < r[6]) for i in range(-1, n)]
    reserved = [0, *(int(x) for x in dr.reserved)]
    over = "segment_alloc" in actions and any(a > b for a, b in zip(live, reserved,
                                                                    strict=True))
    assert over == any(m.startswith(OVER_RESERVED) for m in dr.mismatches)
    size = np.array([r[1] for r in rows], dtype=np.int64)
    assert len(dr.allocated) == n and dr.allocated[-1] == int(
        size[[r[4] >= 0 and r[5] == NEVER for r in rows]].sum()
        + size[[r[4] < 0 and r[5] == NEVER for r in rows]].sum())


def test_segment_map_caps_ranges_with_bytes_exact():
    from snapana.render.views import SEGMENT_BLOCK_LIMIT, SegmentRange, cap_ranges

    seg = 2 << 20
    blocks = [SegmentRange(offset=k * 1024, size=512, label="x",
                           state="active_allocated" if k % 3 else "active_pending_free")
              for k in range(seg // 1024)]
    out = cap_ranges(blocks, seg)
    assert len(out) <= SEGMENT_BLOCK_LIMIT
    for state in ("active_allocated", "active_pending_free"):
        drawn = sum(b.by_state.get(state, 0) if b.by_state is not None
                    else b.size * (b.state == state) for b in out)
        assert drawn == sum(b.size for b in blocks if b.state == state)
    ends = [(b.offset, b.offset + b.size) for b in out]
    assert all(e <= s2 for (_, e), (s2, _) in zip(ends, ends[1:], strict=False))
    few = blocks[:10]
    assert cap_ranges(few, seg) == few  # small segments are drawn block by block
