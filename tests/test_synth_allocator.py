"""The allocator simulator obeys the caching allocator's rules on small direct cases."""

from __future__ import annotations

import pytest
from snapana.allocator_model.rules import allocation_size, round_size, should_split
from snapana.allocator_model.simulator import CachingAllocatorSim, SimulatedOOM

KiB, MiB, GiB = 1024, 1024**2, 1024**3
STACK = (("/w/train.py", 10, "step"), ("/w/train.py", 1, "<module>"))


def actions(sim: CachingAllocatorSim) -> list[tuple[str, int]]:
    return [(e["action"], e["size"]) for e in sim.trace]


def segments(sim: CachingAllocatorSim) -> list[dict]:
    return sim.snapshot()["segments"]


@pytest.mark.parametrize(("size", "rounded"), [
    (1, 512), (512, 512), (513, 1024), (1000, 1024), (3 * MiB + 1, 3 * MiB + 512)])
def test_round_size(size: int, rounded: int) -> None:
    assert round_size(size) == rounded


@pytest.mark.parametrize(("rounded", "segment"), [
    (512, 2 * MiB), (MiB, 2 * MiB), (MiB + 512, 20 * MiB), (10 * MiB - 512, 20 * MiB),
    (10 * MiB, 10 * MiB), (10 * MiB + 512, 12 * MiB), (7.5 * GiB, 7.5 * GiB)])
def test_allocation_size(rounded: int, segment: int) -> None:
    assert allocation_size(int(rounded)) == segment


def test_split_thresholds() -> None:
    assert should_split(2 * MiB, 2 * MiB - 512, small=True)  # 512 left in the small pool
    assert not should_split(2 * MiB, 2 * MiB - 256, small=True)
    assert not should_split(20 * MiB, 19 * MiB, small=False)  # exactly 1 MiB left: kept
    assert should_split(20 * MiB, 19 * MiB - 512, small=False)


def test_small_requests_share_a_2mib_segment() -> None:
    sim = CachingAllocatorSim(GiB)
    a = sim.malloc(100, STACK)
    b = sim.malloc(700, STACK)
    assert b == a + 512
    assert actions(sim) == [("segment_alloc", 2 * MiB), ("alloc", 100), ("alloc", 700)]
    (seg,) = segments(sim)
    assert seg["segment_type"] == "small"
    assert [(x["size"], x["state"]) for x in seg["blocks"]] == [
        (512, "active_allocated"), (1024, "active_allocated"),
        (2 * MiB - 1536, "inactive")]


def test_large_split_then_coalesce_on_free() -> None:
    sim = CachingAllocatorSim(GiB)
    a = sim.malloc(3 * MiB, STACK)
    b = sim.malloc(5 * MiB, STACK)
    (seg,) = segments(sim)
    assert seg["total_size"] == 20 * MiB
    assert [x["size"] for x in seg["blocks"]] == [3 * MiB, 5 * MiB, 12 * MiB]
    sim.free(a)
    sim.free(b)
    (seg,) = segments(sim)
    assert [(x["size"], x["state"]) for x in seg["blocks"]] == [(20 * MiB, "inactive")]
    assert seg["blocks"][0]["frames"] == []


def test_large_remainder_of_one_mib_is_not_split() -> None:
    sim = CachingAllocatorSim(GiB)
    sim.free(sim.malloc(3 * MiB, STACK))  # leaves a cached 20 MiB block
    sim.malloc(19 * MiB, STACK)
    (seg,) = segments(sim)
    assert [(x["size"], x["requested_size"]) for x in seg["blocks"]] == [(20 * MiB, 19 * MiB)]


def test_best_fit_picks_smallest_cached_block() -> None:
    sim = CachingAllocatorSim(GiB)
    big = sim.malloc(30 * MiB, STACK)
    small = sim.malloc(24 * MiB, STACK)
    sim.free(big)
    sim.free(small)
    assert sim.malloc(22 * MiB, STACK) == small
    assert [a for a, _ in actions(sim)].count("segment_alloc") == 2


def test_streams_and_pools_do_not_share_cached_blocks() -> None:
    sim = CachingAllocatorSim(GiB)
    sim.free(sim.malloc(12 * MiB, STACK))
    sim.malloc(12 * MiB, STACK, stream=7)
    sim.malloc(12 * MiB, STACK, pool=(0, 1))
    segs = segments(sim)
    assert len(segs) == 3
    assert sorted((s["stream"], s["segment_pool_id"]) for s in segs) == [
        (0, (0, 0)), (0, (0, 1)), (7, (0, 0))]


def test_oom_releases_cached_segments_then_records_oom() -> None:
    sim = CachingAllocatorSim(100 * MiB, outside_pytorch=10 * MiB)
    keep = sim.malloc(40 * MiB, STACK)
    sim.free(sim.malloc(30 * MiB, STACK))
    sim.malloc(40 * MiB, STACK)  # fits only once the cached 30 MiB segment is released
    assert ("segment_free", 30 * MiB) in actions(sim)
    with pytest.raises(SimulatedOOM) as err:
        sim.malloc(20 * MiB, STACK)
    oom = sim.trace[-1]
    assert oom["action"] == "oom" and "addr" not in oom
    assert oom["size"] == 20 * MiB
    assert oom["device_free"] == 100 * MiB - 80 * MiB - 10 * MiB == err.value.device_free
    assert keep in {s["address"] for s in segments(sim)}


def test_record_stream_defers_the_free() -> None:
    sim = CachingAllocatorSim(GiB)
    a = sim.malloc(12 * MiB, STACK, stream=5)
    sim.record_stream(a, 0)
    sim.free(a)
    assert sim.trace[-1]["action"] == "free_requested"
    (seg,) = segments(sim)
    assert seg["blocks"][0]["state"] == "active_pending_free"
    assert seg["active_size"] == 12 * MiB and seg["allocated_size"] == 0
    assert sim.malloc(12 * MiB, STACK, stream=5) != a  # not reusable yet
    sim.complete_pending()
    assert sim.trace[-1]["action"] == "free_completed"


def test_expandable_segments_map_and_unmap_pages() -> None:
    sim = CachingAllocatorSim(GiB, expandable_segments=True)
    a = sim.malloc(30 * MiB, STACK)
    b = sim.malloc(25 * MiB, STACK)
    assert b == a + 30 * MiB  # one growing segment, no gap
    assert [x for x in actions(sim) if x[0] == "segment_map"] == [
        ("segment_map", 40 * MiB), ("segment_map", 20 * MiB)]  # 20 MiB pages
    (seg,) = segments(sim)
    assert seg["is_expandable"] and seg["total_size"] == 60 * MiB
    assert sim.snapshot()["allocator_settings"]["expandable_segments"] is True
    sim.free(b)
    sim.empty_cache()
    assert ("segment_unmap", 20 * MiB) in actions(sim)
    (seg,) = segments(sim)
    assert seg["total_size"] == 40 * MiB


def test_frames_are_shared_objects() -> None:
    sim = CachingAllocatorSim(GiB)
    a = sim.malloc(100, STACK)
    sim.malloc(100, STACK)
    t = sim.trace
    assert t[1]["frames"] is t[2]["frames"]
    assert t[1]["frames"][0] == {"filename": "/w/train.py", "line": 10, "name": "step"}
    block = segments(sim)[0]["blocks"][0]
    assert block["address"] == a and block["frames"] is t[1]["frames"]


def test_a_request_pad_moves_a_mebibyte_request_to_the_large_pool() -> None:
    """torch_npu adds 32 bytes to every request before rounding: 1 MiB is then a large-pool
    request (a 20 MiB segment), not a small one (2 MiB)."""
    cuda, npu = CachingAllocatorSim(GiB), CachingAllocatorSim(GiB, request_pad=32)
    cuda.malloc(MiB, STACK)
    npu.malloc(MiB, STACK)
    assert actions(cuda)[0] == ("segment_alloc", 2 * MiB)
    assert actions(npu)[0] == ("segment_alloc", 20 * MiB)
    assert [b.size for b in npu.live_blocks()] == [MiB + 512]


@pytest.mark.parametrize("conf", [{}, {"request_pad": 32}, {"max_split_size": 40 * MiB},
                                  {"expandable_segments": True}])
def test_the_replay_sizes_a_block_the_trace_alone_holds_as_the_model_cut_it(
        tmp_path, conf) -> None:
    """Issue 56: a 20,480,000-byte request takes a whole 20 MiB segment (what would remain
    is too small to split off); freed before the snapshot, only the trace holds it, and the
    replay must size it as the allocator did, so that the peak is the simulator's own. With
    a request pad, with max_split_size_mb (a request of that size or more is never split)
    and with expandable segments (everything from 512 bytes is split) too."""
    import pickle

    from snapana.analysis.replay import replay
    from snapana.sources import load

    sim = CachingAllocatorSim(80 * GiB, **conf)
    kept = [sim.malloc(3 * MiB + 1000, STACK) for _ in range(3)]  # witnesses of the pad
    sizes = {}
    for request in (20_480_000, 41 * MiB - 4096, 12 * MiB + 100, 5 * MiB):
        a = sim.malloc(request, STACK)
        sizes[a] = sim._live[a].size
    for a in sizes:
        sim.free(a)
    snap = sim.snapshot()
    if "max_split_size" in conf:
        snap["allocator_settings"] = {"max_split_size": conf["max_split_size"]}
    path = tmp_path / "cut.pickle"
    path.write_bytes(pickle.dumps(snap, protocol=4))
    dr = replay(load(path), 0)
    assert dr.mismatches == [] and kept
    got = dict(dr.lifetimes.filter(dr.lifetimes["alloc_idx"] >= 0)
               .select("address", "size").iter_rows())
    assert {a: got[a] for a in sizes} == sizes
    assert dr.peak_allocated_bytes == sim.peak_allocated
    if not conf.get("expandable_segments"):
        assert sizes[next(iter(sizes))] == 20 * MiB  # the remainder stayed in the block
