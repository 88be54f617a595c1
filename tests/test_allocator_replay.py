"""Issue 45, the allocator model re-run on a recorded trace: on small hand-worked traces (each
segment event the allocator's documented rules make, worked out here), and on the corpus,
where PyTorch's own recorded segment events are the expectation."""

from __future__ import annotations

import json
from typing import Any

import polars as pl
import pytest
from snapana.analysis.allocator_replay import Before, Setting, before_window, rerun
from snapana.units import fmt_bytes

from .conftest import corpus_params

MIB = 1 << 20


def _trace(*steps: tuple[str, int, int]) -> list[dict[str, Any]]:
    """Events from (action, address, size); stream 0, indices in order."""
    return [{"action": a, "addr": addr, "size": size, "stream": 0, "idx": i,
             "device_free": None} for i, (a, addr, size) in enumerate(steps)]


def _alloc(addr: int, size: int) -> list[tuple[str, int, int]]:
    return [("alloc", addr, size)]


def _free(addr: int, size: int) -> list[tuple[str, int, int]]:
    return [("free_requested", addr, size), ("free_completed", addr, size)]


def _worked() -> list[tuple[str, int, int]]:
    """What CUDACachingAllocator does, by its rules: a 3 MiB request (large pool, under
    kMinLargeAlloc) gets a 20 MiB segment (kLargeBuffer); 500 KB (small pool) a 2 MiB one
    (kSmallBuffer); 18 MiB, more than the 17 MiB left in the first segment, a segment of
    itself rounded to 2 MiB; once the 3 MiB block is freed (and coalesced with the rest of
    its segment), a 4 MiB request is carved from that 20 MiB free block (best fit: the
    smallest free block that holds it), so no new segment; 30 MiB, more than any free
    block, needs one of 30 MiB."""
    a, b, c, d, e = 0x1000_0000, 0x2000_0000, 0x3000_0000, 0x1000_0000, 0x4000_0000
    return [("segment_alloc", a, 20 * MIB), *_alloc(a, 3 * MIB),
            ("segment_alloc", b, 2 * MIB), *_alloc(b, 500_000),
            ("segment_alloc", c, 18 * MIB), *_alloc(c, 18 * MIB - 100),
            *_free(a, 3 * MIB), *_alloc(d, 4 * MIB),
            ("segment_alloc", e, 30 * MIB), *_alloc(e, 30 * MIB)]


def test_a_hand_worked_trace_is_reproduced_event_for_event() -> None:
    r = rerun(_trace(*_worked()), 0, Setting(False))
    assert r.exact, (r.divergence, r.recorded, r.simulated)
    assert r.simulated == [("segment_alloc", n) for n in (20 * MIB, 2 * MIB, 18 * MIB, 30 * MIB)]
    assert r.peak_reserved == 70 * MIB
    assert r.final_segments == sorted([20 * MIB, 2 * MIB, 18 * MIB, 30 * MIB])


def test_a_trace_the_rules_cannot_make_is_a_divergence_said_where() -> None:
    """The same trace with the 18 MiB request recorded as taking a 22 MiB segment: the
    model parts from it at that segment event, and says both sizes."""
    steps = _worked()
    steps[4] = ("segment_alloc", 0x3000_0000, 22 * MIB)
    r = rerun(_trace(*steps), 0, Setting(False))
    assert not r.exact
    position, index, why = r.divergence  # type: ignore[misc]
    assert position == 2 and index == 4
    assert f"{22 * MIB:,}" in why and f"{18 * MIB:,}" in why


def test_a_proof_cut_at_its_divergence_says_what_the_whole_run_says() -> None:
    """A proof that only decides whether a prediction is made stops simulating where the
    model parts from the recording (issue 55: nothing after it is used); it says the same
    divergence and counts every recorded segment event, as the whole run does, and says
    where it was cut: at the 18 MiB request (event 5), where the model made its own
    segment. Both the dict form and the polars frame."""
    steps = _worked()
    steps[4] = ("segment_alloc", 0x3000_0000, 22 * MIB)
    for events in (_trace(*steps), pl.DataFrame(_trace(*steps))):
        whole = rerun(events, 0, Setting(False))
        cut = rerun(events, 0, Setting(False), until_divergence=True)
        assert cut.divergence == whole.divergence and not cut.exact
        assert cut.recorded == whole.recorded and cut.recorded_at == whole.recorded_at
        assert whole.cut_at is None and cut.cut_at == 5
        assert len(cut.simulated) < len(whole.simulated)


def test_a_recorded_oom_is_reproduced_and_a_larger_card_removes_it() -> None:
    """Two 20 MiB segments held, 10 MiB free on the device: a 24 MiB request needs a 24 MiB
    segment and fails (nothing cached is free to release). The capacity that makes the
    recorded free true is 40 + 10 MiB; with 80 MiB the request fits."""
    steps = [("segment_alloc", 0x1000_0000, 20 * MIB), *_alloc(0x1000_0000, 20 * MIB),
             ("segment_alloc", 0x2000_0000, 20 * MIB), *_alloc(0x2000_0000, 20 * MIB),
             ("oom", 0, 24 * MIB)]
    trace = _trace(*steps)
    trace[-1]["device_free"] = 10 * MIB
    r = rerun(trace, 0, Setting(False))
    assert r.exact and r.oom_reproduced
    assert r.simulated_ooms == [(4, 24 * MIB)]
    bigger = rerun(trace, 0, Setting(False, capacity=80 * MIB), compare=False)
    assert bigger.simulated_ooms == [] and bigger.peak_reserved == 64 * MIB


def test_a_free_of_a_block_from_before_the_window_stops_the_model_unless_it_is_seeded() -> None:
    """The ring buffer dropped the allocation: freed in the window, held before it. Without
    the state before the window the model stops and says why; given it (the analysis's
    reconstruction), the free lands and the cached block is reused."""
    steps = [*_free(0x1000_0000, 6 * MIB), *_alloc(0x1000_0000, 5 * MIB)]
    r = rerun(_trace(*steps), 0, Setting(False))
    assert r.stopped.startswith("a block allocated before the recorded window")
    before = before_window(
        [{"address": 0x1000_0000, "total_size": 20 * MIB, "stream": 0, "pool": "0,0",
          "segment_type": "large", "expandable": False}],
        [{"address": 0x1000_0000, "size": 6 * MIB, "requested_size": 6 * MIB,
          "segment_address": 0x1000_0000}])
    r = rerun(_trace(*steps), 0, Setting(False), before)
    assert r.exact and r.simulated == [] and r.final_segments == [20 * MIB]
    assert Before(()).reserved == 0


@pytest.mark.parametrize("path", corpus_params(
    "torch_snapshots", "*kkaitlyn111+cs336-a2-systems__memory_files_memory_ctx512*"))
def test_a_real_trace_is_reproduced_from_the_state_before_its_window(path) -> None:
    """PyTorch's recorded segment events of a real training step are the expectation: all
    1,379 of them come out of the model, size for size, in order, starting from the state
    the analysis reconstructs before the window."""
    from snapana.analysis.replay import Moment
    from snapana.session import Session

    session = Session.open(path)
    state = session.replay
    start = Moment("event", -1)
    before = before_window(state.segments_at(start).to_dicts(),
                           state.blocks_at(start).to_dicts())
    events = session.capture.device_events(session.device).to_dicts()
    recorded = [(e["action"], e["size"]) for e in events if e["action"].startswith("segment_")]
    r = rerun(events, session.device, Setting(False), before)
    assert r.simulated == recorded and r.exact
    final = sorted(session.capture.segments["total_size"].to_list())
    assert r.final_segments == final


def _fragmented() -> list[dict[str, Any]]:
    """A fragmentation OOM, worked by the rules: a 98 MiB request gets a 98 MiB segment
    (>= kMinLargeAlloc: its own size rounded to 2 MiB); freed, a 4 MiB request is carved
    from it (best fit: the only free block), leaving 94 MiB free that cannot be released
    (the segment is not wholly free); a 110 MiB request then needs a new 110 MiB segment
    and the device has 30 MiB free: OOM, with 94 MiB cached."""
    trace = _trace(("segment_alloc", 0x1000_0000, 98 * MIB), *_alloc(0x1000_0000, 98 * MIB),
                   *_free(0x1000_0000, 98 * MIB), *_alloc(0x1000_0000, 4 * MIB),
                   ("oom", 0, 110 * MIB))
    trace[-1]["device_free"] = 30 * MIB
    return trace


def test_expandable_segments_remove_a_fragmentation_oom_and_not_a_demand_one() -> None:
    """With expandable segments every large request lives in one range mapped in 20 MiB
    pages: 98 MiB maps 100 MiB; the 4 MiB block is carved from it; 110 MiB takes the 96 MiB
    free tail and maps 20 MiB more: 120 MiB mapped within the 128 MiB PyTorch could hold
    (98 MiB reserved + 30 MiB free at the OOM). A demand OOM (the recorded
    `test_a_recorded_oom...` trace: both segments wholly in use) stays."""
    from snapana.analysis.allocator_replay import predict

    p = predict(_fragmented(), 0, Setting(False), Setting(True), None)
    assert p.trusted and p.recorded_capacity == 128 * MIB
    assert p.changed is not None and p.changed.simulated_ooms == []
    assert p.changed.peak_reserved == 120 * MIB
    steps = [("segment_alloc", 0x1000_0000, 20 * MIB), *_alloc(0x1000_0000, 20 * MIB),
             ("segment_alloc", 0x2000_0000, 20 * MIB), *_alloc(0x2000_0000, 20 * MIB),
             ("oom", 0, 24 * MIB)]
    demand = _trace(*steps)
    demand[-1]["device_free"] = 10 * MIB
    p = predict(demand, 0, Setting(False), Setting(True), None)
    assert p.trusted and p.changed is not None
    assert [i for i, _ in p.changed.simulated_ooms] == [4]


def test_no_prediction_from_a_model_that_does_not_reproduce_the_trace() -> None:
    from snapana.analysis.allocator_replay import predict

    steps = _worked()
    steps[4] = ("segment_alloc", 0x3000_0000, 22 * MIB)
    p = predict(_trace(*steps), 0, Setting(False), Setting(True), None)
    assert not p.trusted and p.changed is None


def test_the_whatif_command(tmp_path) -> None:
    """On a bundled OOM sample: the proof first, then the verdict; a larger card (in JSON)
    removes the OOM, the recorded card's implied capacity is reserved + device free at the
    OOM (recomputed here from the raw pickle); a setting with no rule is said, not guessed;
    nonsense is one line, exit 2."""
    import json

    from .conftest import ROOT, invoke, raw_load

    sample = ROOT / "sample_snapshots" / "slime-tp1-logits-fp32-oom.pickle"
    snap = raw_load(sample)
    trace = snap["device_traces"][0]
    delta = {"segment_alloc": 1, "segment_map": 1, "segment_free": -1, "segment_unmap": -1}
    oom_at = max(i for i, e in enumerate(trace) if e["action"] == "oom")
    reserved_at_oom = sum(delta.get(e["action"], 0) * e["size"] for e in trace[:oom_at])
    before = sum(s["total_size"] for s in snap["segments"]) - sum(
        delta.get(e["action"], 0) * e["size"] for e in trace)
    implied = before + reserved_at_oom + trace[oom_at]["device_free"]
    text = invoke("whatif", str(sample), "--set", "expandable_segments:True").stdout
    assert "The model reproduces this window" in text
    assert "still runs out of memory, at the recorded request" in text
    data = json.loads(invoke("whatif", str(sample), "--capacity", "141GiB", "-f",
                             "json").stdout)
    (d,) = data["devices"]
    assert d["reproduced"] and d["recorded_capacity_bytes"] == implied
    assert d["changed"]["ooms"] == [] and "goes away" in d["verdict"]
    out = invoke("whatif", str(sample), "--set", "garbage_collection_threshold:0.6")
    assert out.returncode == 0 and "not simulated: garbage_collection_threshold:0.6" in out.stdout
    assert "set_per_process_memory_fraction" in out.stdout
    small = invoke("whatif", str(sample), "--set", "max_split_size_mb:20")
    assert small.returncode == 2 and "must be > 20" in small.stderr
    bad = invoke("whatif", str(sample), "--set", "expandable_segments:maybe")
    assert bad.returncode == 2 and "True or False" in bad.stderr
    assert invoke("whatif", str(sample)).returncode == 2


def _fidelity(path) -> list[tuple[str, int, bool, bool, bool | None, bool]]:
    """(file, device, segment events equal, final segments equal, OOMs reproduced, mapped
    before the window) for each device of a capture whose trace records segment events; the
    expectations are read from the raw pickle here: its trace's segment events in order, its
    snapshot's segments, the request padding its final blocks and its requests' pools show,
    and whether an expandable segment holds more mapped bytes than the trace maps (mapped
    before it)."""
    from snapana.analysis.allocator_replay import SEGMENT_ACTIONS
    from snapana.session import Session
    from snapana.sources import load

    from .conftest import raw_load
    from .raw_replay import final_blocks, learned_pad, pool_witnesses

    raw = raw_load(path)
    traces = raw.get("device_traces") if isinstance(raw, dict) else None
    if not traces:
        return []
    capture = load(path)
    expandable = bool((raw.get("allocator_settings") or {}).get("expandable_segments"))
    rows = []
    for device, trace in enumerate(traces):
        recorded = [(e["action"], e["size"]) for e in trace if e["action"] in SEGMENT_ACTIONS]
        if not recorded:
            continue
        final = sorted(s["total_size"] for s in raw["segments"] if s["device"] == device)
        ooms = [i for i, e in enumerate(trace) if e["action"] == "oom"]
        events = capture.device_events(device).to_dicts()
        pad = learned_pad(final_blocks(raw, device).values(), pool_witnesses(raw, device))
        r = rerun(events, device, Setting(expandable, request_pad=pad),
                  Session(capture, device).window_start)
        mapped = sum(e["size"] * (1 if e["action"] == "segment_map" else -1) for e in trace
                     if e["action"] in ("segment_map", "segment_unmap"))
        premapped = sum(s["total_size"] for s in raw["segments"]
                        if s["device"] == device and s.get("is_expandable")) > mapped
        rows.append((path.name, device, r.simulated == recorded and not r.stopped,
                     r.final_segments == final,
                     None if not ooms else [i for i, _ in r.simulated_ooms] == ooms,
                     premapped))
        # the model says so when it cannot start from what the window inherits
        assert (r.stopped_at == -1) == premapped, (path.name, r.stopped)
    return rows


@pytest.mark.corpus
def test_the_fidelity_table_of_the_corpus() -> None:
    """Issue 45's bar: at least 90% of the real captures' devices with segment events come
    out of the model exactly (every cudaMalloc / cudaFree / map / unmap, size for size, in
    order), with the snapshot's final segments and each recorded OOM at its request; the
    real 3-GPU OOM with expandable segments among them."""
    from .conftest import corpus_files

    files = corpus_files("torch_snapshots", "*.p*")
    if not files:
        pytest.skip("../shared/corpus absent")
    # a window that opens on expandable segments mapped before it is one the model
    # declines to start from, and says so (checked in `_fidelity`): the bar is the rest
    rows = [row for f in files for row in _fidelity(f) if not row[5]]
    exact = [r for r in rows if r[2]]
    assert len(rows) >= 10 and len(exact) >= 0.9 * len(rows), rows
    assert all(r[3] and r[4] in (None, True) for r in exact), rows
    oom = [r for r in rows if r[0].startswith("Constructor-Sun") and r[4] is not None]
    assert oom and all(r[2] and r[4] for r in oom), oom


@pytest.mark.parametrize("name", [
    "expandable-segments-oom.pickle", "slime-tp1-logits-fp32-oom.pickle",
    "slime-tp1-long-episode-softmax-oom.pickle", "slime-tp2-chunked-logprob-oom.pickle"])
def test_the_bundled_oom_samples_are_reproduced(name) -> None:
    from .conftest import ROOT

    (row,) = _fidelity(ROOT / "sample_snapshots" / name)
    assert row[2:] == (True, True, True, False)


def test_a_request_goes_to_the_private_pool_its_address_lies_in() -> None:
    """The trace does not name pools; the snapshot does, for the segments it ends with.
    Worked by hand: a 20 MiB default-pool segment is cached free; a 6 MiB request lands in
    a new 20 MiB segment the snapshot lists under pool (1, 0) (a CUDA graph's), so it gets
    its own cudaMalloc; blocks of a private pool never serve the default pool, so a later
    6 MiB default-pool request takes the cached default segment (no third cudaMalloc).
    Without the pool the model would put the first 6 MiB in the cached segment and part
    from the trace at the second cudaMalloc."""
    a, b = 0x1000_0000, 0x2000_0000
    steps = [("segment_alloc", a, 20 * MIB), *_alloc(a, 20 * MIB), *_free(a, 20 * MIB),
             ("segment_alloc", b, 20 * MIB), *_alloc(b, 6 * MIB), *_alloc(a, 6 * MIB)]
    final = [{"address": a, "total_size": 20 * MIB, "pool": "0,0"},
             {"address": b, "total_size": 20 * MIB, "pool": "1,0"}]
    before = before_window([], [], final, _trace(*steps))
    assert before.pools == {5: (1, 0)}
    r = rerun(_trace(*steps), 0, Setting(False), before)
    assert r.exact and r.final_segments == [20 * MIB, 20 * MIB]
    assert not rerun(_trace(*steps), 0, Setting(False)).exact


def test_the_colocated_sample_with_cuda_graph_pools_is_reproduced() -> None:
    """The colocated vLLM sample holds two CUDA-graph pools: with each request's pool taken
    from the segment its recorded address lies in, all its segment events and its OOM come
    out of the model; expandable segments (which private pools do not use) do not save it."""
    from snapana.session import Session

    from .conftest import ROOT

    session = Session.open(ROOT / "sample_snapshots" / "swift-vllm-colocate-oom.pickle")
    assert set(session.window_start.pools.values()) == {(0, 1), (0, 2)}
    p = session.whatif("expandable_segments:True")
    assert p.trusted and p.changed is not None and p.changed.simulated_ooms


def test_equal_free_blocks_go_by_the_addresses_the_driver_gave() -> None:
    """Best fit breaks ties by address, and the driver hands cudaMalloc ranges out downwards:
    S1 (40 MiB, high address) is split into two 20 MiB blocks; S2 (20 MiB) comes below it.
    With S1's first half and S2 both free, a 20 MiB request takes S2 (the lower address), so
    once S1's second half is freed a 40 MiB request fits S1 whole: no new segment. Had S2 been
    placed above S1, the request would split S1 and the 40 MiB one would need a cudaMalloc."""
    s1, s2 = 0x2000_0000, 0x1000_0000
    steps = [("segment_alloc", s1, 40 * MIB), *_alloc(s1, 40 * MIB), *_free(s1, 40 * MIB),
             *_alloc(s1, 20 * MIB), *_alloc(s1 + 20 * MIB, 20 * MIB),
             ("segment_alloc", s2, 20 * MIB), *_alloc(s2, 20 * MIB),
             *_free(s1, 20 * MIB), *_free(s2, 20 * MIB), *_alloc(s2, 20 * MIB),
             *_free(s1 + 20 * MIB, 20 * MIB), *_alloc(s1, 40 * MIB)]
    r = rerun(_trace(*steps), 0, Setting(False))
    assert r.exact and r.simulated == [("segment_alloc", 40 * MIB), ("segment_alloc", 20 * MIB)]


def test_equal_free_blocks_go_by_addresses_anywhere_the_device_gave_them() -> None:
    """The same trace where the driver handed the ranges out upwards, low in the address
    space (as torch_npu's Ascend ranges lie, near 0x12c0_0000_0000, far under CUDA's usual
    0x7f..): S2 lies above S1, so the 20 MiB request splits S1 (its first half, the lower
    address) and the 40 MiB one finds no 40 MiB block: a third cudaMalloc. The model must
    put each segment where the job's own was to break the tie as the allocator did."""
    s1 = 0x12C0_4120_0000
    s2, s3 = s1 + 40 * MIB, s1 + 60 * MIB
    steps = [("segment_alloc", s1, 40 * MIB), *_alloc(s1, 40 * MIB), *_free(s1, 40 * MIB),
             *_alloc(s1, 20 * MIB), *_alloc(s1 + 20 * MIB, 20 * MIB),
             ("segment_alloc", s2, 20 * MIB), *_alloc(s2, 20 * MIB),
             *_free(s1, 20 * MIB), *_free(s2, 20 * MIB), *_alloc(s1, 20 * MIB),
             *_free(s1 + 20 * MIB, 20 * MIB),
             ("segment_alloc", s3, 40 * MIB), *_alloc(s3, 40 * MIB)]
    r = rerun(_trace(*steps), 0, Setting(False))
    assert r.exact, (r.divergence, r.simulated)
    assert r.simulated == [("segment_alloc", n) for n in (40 * MIB, 20 * MIB, 40 * MIB)]


@pytest.mark.corpus
@pytest.mark.parametrize("path", corpus_params(
    "torch_snapshots", "codeasier+MemSnapDump__tests_test_data_snapshot_1768*"))
def test_the_npu_capture_is_reproduced_where_its_ranges_lie(path) -> None:
    """torch_npu's capture (Ascend: ranges from 0x12c0_0000_0000 upwards, 32 B pad): every
    segment event its raw trace records comes out of the what-if's proof run, size for size,
    in order. It parted at the 52nd (a 2 MiB segment for a 984,064 B request the job fitted
    into a free block), since two equal free small blocks tied the other way round in a
    model that placed the segments in its own downward range."""
    from snapana.session import Session

    from .conftest import raw_load

    raw = raw_load(path)
    (trace,) = [t for t in raw["device_traces"] if t]
    recorded = [(e["action"], e["size"]) for e in trace if e["action"].startswith("segment_")]
    assert len(recorded) >= 52
    r = Session.open(path).whatif("expandable_segments:True").recorded
    assert r.divergence is None and r.simulated == recorded


def test_expandable_best_fit_counts_the_unmapped_room_after_a_block() -> None:
    """get_free_block with expandable segments: a free block followed by unmapped pages
    counts as the size it can grow to. Worked by that rule (20 MiB pages): 10 MiB maps one
    page; 2 MiB follows it; the 10 MiB block is freed, leaving X (10 MiB, before the 2 MiB
    block) and Y (8 MiB, at the mapped end). 6 MiB fits both; Y is smaller but can grow, X
    cannot, so X is taken. 9 MiB then fits neither the 4 MiB left of X nor Y: Y grows by one
    page. Best fit by size alone would put 6 MiB in Y and 9 MiB in X, mapping nothing."""
    base = 0x1000_0000
    steps = [("segment_map", base, 20 * MIB), *_alloc(base, 10 * MIB),
             *_alloc(base + 10 * MIB, 2 * MIB), *_free(base, 10 * MIB),
             *_alloc(base, 6 * MIB),
             ("segment_map", base + 20 * MIB, 20 * MIB), *_alloc(base + 12 * MIB, 9 * MIB)]
    r = rerun(_trace(*steps), 0, Setting(True))
    assert r.exact, (r.divergence, r.simulated)
    assert r.simulated == [("segment_map", 20 * MIB)] * 2
    assert r.final_segments == [40 * MIB]


def test_max_split_size_keeps_oversize_blocks_whole_and_frees_one_before_giving_up() -> None:
    """max_split_size_mb:64, worked by get_free_block and release_available_cached_blocks on a
    260 MiB card: 200 MiB and 30 MiB segments are cached free. The 200 MiB block is oversize
    and serves only requests within 20 MiB of it, so 100 MiB asks cudaMalloc for 100 MiB;
    that fails (230 + 100 > 260), and only the smallest cached block of at least
    max(100, 64) MiB, the 200 MiB one, is cudaFreed before the retry: the 30 MiB segment
    stays (emptying the whole cache would have freed it too). Without the setting the
    100 MiB is carved from the cached block: no further segment event."""
    from snapana.allocator_model.simulator import CachingAllocatorSim

    def run(max_split: int | None) -> tuple[list[tuple[str, int]], list[int]]:
        sim = CachingAllocatorSim(260 * MIB, max_split_size=max_split)
        a, b = sim.malloc(200 * MIB), sim.malloc(30 * MIB)
        sim.free(a)
        sim.free(b)
        sim.malloc(100 * MIB)
        events = [(str(t["action"]), int(t["size"])) for t in sim.trace  # type: ignore[call-overload]
                  if str(t["action"]).startswith("segment_")]
        return events, sim.segment_sizes()

    assert run(64 * MIB) == ([("segment_alloc", 200 * MIB), ("segment_alloc", 30 * MIB),
                              ("segment_free", 200 * MIB), ("segment_alloc", 100 * MIB)],
                             [30 * MIB, 100 * MIB])
    assert run(None) == ([("segment_alloc", 200 * MIB), ("segment_alloc", 30 * MIB)],
                         [30 * MIB, 200 * MIB])


def test_roundup_power2_divisions_round_a_request_to_its_interval_step() -> None:
    """roundup_power2_divisions:4: 1,100 MiB lies between 1 and 2 GiB, cut in four 256 MiB
    steps, so it becomes 1,280 MiB and its segment is that size; 512-byte rounding would
    have given 1,100 MiB."""
    from snapana.allocator_model import config

    conf, _ = config.parse(["roundup_power2_divisions:4"])
    trace = _trace(("segment_alloc", 0x1000_0000, 1280 * MIB), *_alloc(0x1000_0000, 1100 * MIB))
    setting = Setting.of(config.recorded({}), conf)
    assert rerun(trace, 0, setting).exact
    assert rerun(trace, 0, Setting(False), compare=False).simulated == [
        ("segment_alloc", 1100 * MIB)]
    listed, _ = config.parse(["roundup_power2_divisions:[256:1,512:2,>:4]"])
    assert listed.roundup_divisions == (1,) * 9 + (2,) + (4,) * 6


def test_the_smallest_capacity_is_the_least_20_mib_step_with_no_oom() -> None:
    """Worked by hand: the demand OOM (40 MiB held, a 24 MiB request) fits from 64 MiB on,
    so in 20 MiB steps 80 MiB, with or without expandable segments (20 MiB pages: 20 + 20 +
    40 mapped would also be 80). The fragmentation OOM needs 98 + 110 = 208 MiB as
    recorded (the 98 MiB segment cannot be released while 4 MiB of it is held): 220 MiB;
    with expandable segments 120 MiB mapped suffice: 120 MiB."""
    from snapana.analysis.allocator_replay import smallest_capacity

    steps = [("segment_alloc", 0x1000_0000, 20 * MIB), *_alloc(0x1000_0000, 20 * MIB),
             ("segment_alloc", 0x2000_0000, 20 * MIB), *_alloc(0x2000_0000, 20 * MIB),
             ("oom", 0, 24 * MIB)]
    demand = _trace(*steps)
    demand[-1]["device_free"] = 10 * MIB
    assert smallest_capacity(demand, 0, Setting(False), None) == (80 * MIB, "")
    assert smallest_capacity(_fragmented(), 0, Setting(False), None) == (220 * MIB, "")
    assert smallest_capacity(_fragmented(), 0, Setting(True), None) == (120 * MIB, "")


def _stranded(path) -> None:
    """A fragmentation OOM written by the allocator model on a 24 GiB card: twenty times a
    980 MiB tensor is made and freed and a 600 MiB one kept in its segment (best fit), so
    each segment strands 380 MiB; a 6 GiB request then finds 4.86 GiB free and no cached
    block large enough."""
    import pickle

    from snapana.allocator_model.simulator import CachingAllocatorSim, SimulatedOOM

    sim = CachingAllocatorSim(24 << 30)
    for _ in range(20):
        sim.free(sim.malloc(980 * MIB))
        sim.malloc(600 * MIB)
    with pytest.raises(SimulatedOOM):
        sim.malloc(6 << 30)
    path.write_bytes(pickle.dumps(sim.snapshot()))


def test_the_report_replays_its_allocator_knob_and_leads_with_it(tmp_path) -> None:
    """With expandable segments the twenty 600 MiB tensors pack into one range mapped in
    20 MiB pages: the last 980 MiB tensor's 380 MiB tail is free at the mapped end, so the
    6 GiB request maps 6,144 - 380 = 5,764 MiB, rounded up to 5,780: 12,000 + 380 + 5,780 =
    18,160 MiB reserved, within the 24 GiB card. The knob table says so, in every format,
    and the verdict's knob is the one the replay shows to work."""
    import json

    from snapana.session import Session

    from .conftest import invoke

    path = tmp_path / "stranded.pickle"
    _stranded(path)
    d = Session.open(path).report.diagnosis
    first = d.knobs[0]
    assert first.id == "torch.expandable_segments"
    replayed = d.replays[first.id]
    assert replayed.oom_gone is True and replayed.prediction is not None
    assert replayed.prediction.changed.peak_reserved == 18_160 * MIB
    text = invoke("summary", str(path), "--full").stdout
    assert "replay: the recorded OOM goes away" in text
    assert "the OOM goes away (peak reserved 17.73 GiB)" in " ".join(text.split())
    (dev,) = json.loads(invoke("summary", str(path), "-f", "json").stdout)["devices"]
    knob = dev["diagnosis"]["knobs"][0]
    assert knob["replay"]["oom_gone"] is True
    assert knob["replay"]["peak_reserved_bytes"] == 18_160 * MIB
    markdown = invoke("summary", str(path), "-f", "markdown").stdout
    first_knob = next(line for line in markdown.splitlines() if line.startswith("1. "))
    assert "predicted by replay: the recorded OOM goes away" in first_knob
    whatif = invoke("whatif", str(path), "--set", "expandable_segments:True").stdout
    assert "The recorded OOM goes away" in whatif


def test_knobs_the_replay_contradicts_go_last_and_big_windows_are_not_replayed(
        tmp_path, monkeypatch) -> None:
    """Ordering is by what the replay shows: a knob it contradicts goes after every argued
    one. Beyond REPLAY_EVENTS the report does not replay, and says where to run it."""
    from dataclasses import replace as swap

    from snapana.analysis import allocator_replay as ar
    from snapana.session import Session

    path = tmp_path / "stranded.pickle"
    _stranded(path)
    d = Session.open(path).report.diagnosis
    knob = d.knobs[0]
    other = swap(knob, id="x.argued", simulate=())
    stays = swap(d.replays[knob.id], prediction=swap(
        d.replays[knob.id].prediction,
        changed=swap(d.replays[knob.id].prediction.changed, simulated_ooms=[(100, 1)])))
    assert stays.helps is False
    assert ar.by_replay((knob, other), {knob.id: stays}) == (other, knob)
    monkeypatch.setattr(ar, "REPLAY_EVENTS", 10)
    late = Session.open(path).report.diagnosis
    assert late.replays[knob.id].prediction is None
    assert "snapana whatif" in late.replays[knob.id].note


def test_a_family_dropped_from_the_window_with_its_frees() -> None:
    """The demand OOM (two 20 MiB blocks held, 10 MiB free, a 24 MiB request: 50 MiB PyTorch
    could hold) without the first block's allocation: 20 + 24 = 44 MiB fits in 50, and the
    peak allocated counts the request once it fits."""
    steps = [("segment_alloc", 0x1000_0000, 20 * MIB), *_alloc(0x1000_0000, 20 * MIB),
             ("segment_alloc", 0x2000_0000, 20 * MIB), *_alloc(0x2000_0000, 20 * MIB),
             ("oom", 0, 24 * MIB)]
    demand = _trace(*steps)
    demand[-1]["device_free"] = 10 * MIB
    from snapana.analysis.allocator_replay import predict

    p = predict(demand, 0, Setting(False), Setting(False, drop=frozenset({1})), None)
    assert p.trusted and p.recorded_capacity == 50 * MIB
    assert p.changed is not None and p.changed.simulated_ooms == []
    assert p.changed.peak_reserved == 44 * MIB and p.changed.peak_allocated == 44 * MIB


def test_whatif_drop_agrees_with_the_static_what_if(tmp_path) -> None:
    """On the fp32-logits sample the report's what-if table says the request fits without
    grad_buffer and not without saved_activations; replaying the window with each left out
    says the same, and an unknown family is one line, exit 2, naming those present."""
    import json

    from snapana.session import Session

    from .conftest import ROOT, invoke

    sample = ROOT / "sample_snapshots" / "slime-tp1-logits-fp32-oom.pickle"
    fits = {w.family: w.fits for w in Session.open(sample).report.diagnosis.what_ifs}
    for family in ("grad_buffer", "saved_activations"):
        (d,) = json.loads(invoke("whatif", str(sample), "--drop", family, "-f",
                                 "json").stdout)["devices"]
        assert d["reproduced"] and (d["changed"]["ooms"] == []) is fits[family], family
    bad = invoke("whatif", str(sample), "--drop", "nope")
    assert bad.returncode == 2 and "grad_buffer" in bad.stderr
    early = invoke("whatif", str(ROOT / "sample_snapshots" / "fsdp-train-step.pickle"),
                   "--free-before-forward", "gradients", "--empty-cache-before-forward")
    assert early.returncode == 0 and "gradients freed before each forward" in early.stdout
    assert "The model reproduces this window" in early.stdout


def test_a_family_freed_where_the_forward_starts() -> None:
    """Worked by hand: a 20 MiB gradient is held when the forward starts (event 2) and a
    20 MiB activation needs a segment; a 24 MiB request then fails with 10 MiB free (50 MiB
    PyTorch could hold). Freed at the boundary, the gradient's cached block takes the
    activation (best fit, no cudaMalloc), and the request's 24 MiB segment fits: 44 MiB.
    Emptying the cache there instead frees nothing (the gradient is still held)."""
    from snapana.analysis.allocator_replay import predict

    steps = [("segment_alloc", 0x1000_0000, 20 * MIB), *_alloc(0x1000_0000, 20 * MIB),
             ("segment_alloc", 0x2000_0000, 20 * MIB), *_alloc(0x2000_0000, 20 * MIB),
             ("oom", 0, 24 * MIB)]
    trace = _trace(*steps)
    trace[-1]["device_free"] = 10 * MIB
    early = Setting(False, free_at=frozenset({2}), free_allocs=frozenset({1}))
    p = predict(trace, 0, Setting(False), early, None)
    assert p.trusted and p.changed is not None
    assert p.changed.simulated_ooms == [] and p.changed.peak_reserved == 44 * MIB
    assert p.changed.simulated == [("segment_alloc", 20 * MIB), ("segment_alloc", 24 * MIB)]
    emptied = predict(trace, 0, Setting(False), Setting(False, empty_at=frozenset({2})), None)
    assert emptied.changed is not None and [i for i, _ in emptied.changed.simulated_ooms] == [4]


@pytest.mark.parametrize("name", [
    "expandable-segments-oom.pickle", "slime-tp1-logits-fp32-oom.pickle",
    "slime-tp1-long-episode-softmax-oom.pickle", "slime-tp2-chunked-logprob-oom.pickle"])
def test_the_what_if_table_and_the_window_replay_agree(name) -> None:
    """Two independent answers to "without this family, would the job have fit?": the
    static placement of the failed request in the state at the OOM, and the whole recorded
    window replayed without the family's allocations. On the bundled OOMs (and the real
    3-GPU one, measured in the note) they agree family for family; the row says both."""
    from snapana.render.wording import what_if_rows
    from snapana.session import Session

    from .conftest import ROOT

    report = Session.open(ROOT / "sample_snapshots" / name).report
    d = report.diagnosis
    checked = 0
    for w, row in zip(d.what_ifs, what_if_rows(report), strict=True):
        p = d.whatif_replays[w.family]
        assert p.changed is not None
        assert (not p.changed.simulated_ooms) is w.fits, w.family
        assert "replaying the window without it" in row[2]
        checked += 1
    assert checked >= 3


def test_the_causes_tell_the_story_the_knob_table_tells(tmp_path) -> None:
    """Issue 60: where the knob table shows an allocator setting the replay predicts removes
    the OOM, the cause checks say so too, with the margin (the 24 GiB card less the replayed
    peak of 18,160 MiB: 6,416 MiB) and that the window ends at the OOM; the headline offers
    it first, and every format carries the row."""
    import json

    from .conftest import invoke

    path = tmp_path / "stranded.pickle"
    _stranded(path)
    (dev,) = json.loads(invoke("summary", str(path), "-f", "json").stdout)["devices"]
    d = dev["diagnosis"]
    margin = fmt_bytes(24 * 1024 * MIB - 18_160 * MIB)
    (row,) = [c for c in d["causes"] if c["id"] == "allocator_placement"]
    assert row["holds"] and d["knobs"][0]["knob"] in row["status"]
    assert f"{margin} to spare" in row["reason"] and "the window ends at the OOM" in row["reason"]
    assert f"{margin} to spare" in d["headline"] and d["knobs"][0]["knob"] in d["headline"]
    text = " ".join(invoke("summary", str(path), "--full").stdout.split())
    assert f"the allocator's placement — {d['knobs'][0]['knob']} removes it (replay)" in text
    assert f"{margin} to spare" in invoke("summary", str(path), "-f", "markdown").stdout


def test_whatif_of_a_setting_already_in_force_says_so_and_stops(tmp_path) -> None:
    """The stranded capture records the default settings (expandable segments off): asking
    for them again changes nothing; a capture written with expandable segments on (the
    simulator's, like the corpus's 3-GPU DataParallel OOM) says it is already in force."""
    import pickle

    from snapana.allocator_model.simulator import CachingAllocatorSim, SimulatedOOM

    from .conftest import invoke

    sim = CachingAllocatorSim(2 << 30, expandable_segments=True)
    with pytest.raises(SimulatedOOM):
        for _ in range(100):
            sim.malloc(300 * MIB)
    snap = sim.snapshot()
    assert snap["allocator_settings"]["expandable_segments"] is True
    path = tmp_path / "expandable.pickle"
    path.write_bytes(pickle.dumps(snap))
    run = invoke("whatif", str(path), "--set", "expandable_segments:True")
    assert run.returncode == 0, run.stderr
    assert "expandable_segments:True: already in force" in run.stdout
    assert "goes away" not in run.stdout and "still runs out" not in run.stdout
    js = json.loads(invoke("whatif", str(path), "--set", "expandable_segments:True",
                           "-f", "json").stdout)
    assert js["already_in_force"] == ["expandable_segments:True"]
    other = invoke("whatif", str(path), "--set", "expandable_segments:False").stdout
    assert "already in force" not in other


@pytest.mark.corpus
def test_whatif_on_the_corpus_dataparallel_oom_says_expandable_is_already_on() -> None:
    """The corpus's 3-GPU DataParallel OOM ran with PYTORCH_CUDA_ALLOC_CONF=
    expandable_segments:True (SOURCES.md; its allocator_settings record it)."""
    from .conftest import CORPUS, invoke, raw_load

    path = CORPUS / "torch_snapshots" / "Constructor-Sun+code_location__memory_snapshot.pickle"
    if not path.is_file():
        pytest.skip("../shared/corpus absent")
    assert raw_load(path)["allocator_settings"]["expandable_segments"] is True
    run = invoke("whatif", str(path), "--set", "expandable_segments:True")
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("expandable_segments:True: already in force")
    assert "The recorded OOM" not in run.stdout


def _window_without_segment_events(tmp_path) -> str:
    """One 20 MiB segment held before the window; the window allocates 4 MiB in it and frees
    it: the job made no cudaMalloc / cudaFree, nor should the model."""
    import pickle

    base, seg, req = 0x7F0000000000, 20 << 20, 4 << 20
    trace = [{"action": a, "addr": base, "size": req, "stream": 0, "frames": []}
             for a in ("alloc", "free_requested", "free_completed")]
    segment = {"device": 0, "address": base, "total_size": seg, "stream": 0,
               "segment_type": "large", "allocated_size": 0, "active_size": 0,
               "requested_size": 0, "blocks": [{"address": base, "size": seg,
                                                "requested_size": 0, "state": "inactive",
                                                "frames": []}]}
    path = tmp_path / "quiet.pickle"
    path.write_bytes(pickle.dumps({"segments": [segment], "device_traces": [trace]},
                                  protocol=4))
    return str(path)


def test_a_window_without_segment_events_proves_nothing(tmp_path) -> None:
    """Zero recorded segment events are nothing to reproduce: the proof says the replay is
    not checked, never that it reproduces "all 0"."""
    from .conftest import invoke

    out = invoke("whatif", _window_without_segment_events(tmp_path), "--set",
                 "expandable_segments:True", columns=400).stdout
    assert "records no segment events" in out and "not checked against the recording" in out
    assert "reproduces this window" not in out and "all 0" not in out


def test_where_the_model_parts_is_an_english_ordinal(tmp_path) -> None:
    """A profiler trace records no segment events; the model makes one at its first
    request, so the runs part at the first segment event: "1st", not "1th"."""
    from .conftest import invoke

    events = [{"ph": "i", "s": "t", "cat": "cpu_instant_event", "name": "[memory]", "pid": 1,
               "tid": 1, "ts": 10 + i, "args": {"Device Type": 0, "Device Id": -1,
                                               "Bytes": b, "Addr": 0x1000}}
              for i, b in enumerate((4096, -4096))]
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": events}))
    out = invoke("whatif", str(path), "--set", "expandable_segments:True", columns=400).stdout
    assert "at the 1st, event" in out, out
    assert "1th" not in out
