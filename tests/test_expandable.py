"""Expandable segments and multi-device captures (issue 19): figures that hold on every file.

Invariants per device and per pool on every bundled sample, every corpus snapshot, the
3-GPU DataParallel scenario and simulator map/unmap sequences (growth, shrink after
empty_cache, OOM while mapping); the failing device first in every format; placement's
expandable rule checked against re-running the simulator.
"""

from __future__ import annotations

import json
import pickle
import re
from functools import cache
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from snapana.analysis.diagnosis.causes import Fragmentation
from snapana.analysis.diagnosis.findings import DeviceReport
from snapana.analysis.placement import MAP_PAGES, would_fit
from snapana.analysis.replay import replay
from snapana.session import Session, analyse, device_order, sessions
from snapana.sources import load
from snapana.synth import CachingAllocatorSim, SimulatedOOM
from snapana.synth.scenarios import MULTI_DEVICE, run_scenario

from .conftest import SAMPLES, corpus_params, invoke, raw_load

MiB, GiB = 2**20, 2**30
DP = "dataparallel-3gpu-expandable-oom"
STACK = [("/w/model.py", 54, "forward"), ("/w/train.py", 10, "main")]


@cache
def _dp_files(tmp: str) -> tuple[Path, dict[str, Any]]:
    snap, truth = run_scenario(DP)
    path = Path(tmp) / f"{DP}.pickle"
    path.write_bytes(pickle.dumps(snap, protocol=4))
    return path, truth


@pytest.fixture(scope="module")
def dp(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    return _dp_files(str(tmp_path_factory.mktemp("dp")))


def _write(tmp_path: Path, sim: CachingAllocatorSim, name: str = "s") -> Path:
    path = tmp_path / f"{name}.pickle"
    path.write_bytes(pickle.dumps(sim.snapshot(), protocol=4))
    return path


# ----- the invariants ----------------------------------------------------------------------
def check_report(r: DeviceReport, capacity: int | None = None) -> None:
    """Pools sum to the device; largest free <= free cached; a what-if's spare never exceeds
    what the device could hold (capacity when known, else reserved + device free)."""
    where = f"{r.path} device {r.device}"
    assert sum(p.reserved_bytes for p in r.pools) == r.reserved_bytes, where
    assert sum(p.free_bytes for p in r.pools) == r.cached_unallocated_bytes, where
    assert r.reserved_bytes == (r.allocated_bytes + r.pending_free_bytes
                                + r.cached_unallocated_bytes), where
    for p in r.pools:
        assert 0 <= p.largest_free_bytes <= p.free_bytes <= p.reserved_bytes, (where, p)
    assert r.largest_free_block_bytes <= r.cached_unallocated_bytes, where
    assert int(r.segments["total_size"].sum()) == r.reserved_bytes, where
    segs = r.segments.sort("address").select("address", "total_size").rows()
    for (a, s), (b, _) in zip(segs, segs[1:], strict=False):
        assert a + s <= b, f"{where}: segments 0x{a:x} and 0x{b:x} overlap"
    if r.oom is None:
        return
    free = r.oom.device_free_bytes or 0
    bound = capacity if capacity is not None else r.reserved_bytes + free
    for w in r.diagnosis.what_ifs:
        if w.fits:
            assert w.spare_bytes is not None and w.spare_bytes <= bound, (where, w)


def check_moments(path: Path) -> None:
    """At every recorded moment (sampled): reserved is the sum of the live segments, which
    never overlap, and free ranges are what the segments do not hold."""
    capture = load(path)
    for device in capture.devices:
        dr = replay(capture, device)
        assert dr.segment_mismatches == [], (path, device)
        step = max(1, dr.n_events // 60)
        for i in [-1, *range(0, dr.n_events, step), dr.n_events - 1]:
            m = dr.at(i)
            segs = dr.segments_at(m)
            assert dr.reserved_at(m) == int(segs["total_size"].sum()), (path, device, i)
            free = dr.free_blocks_at(m)
            live = dr.blocks_at(m)
            if not segs.is_empty():
                held = int(live.filter(pl.col("segment_address").is_not_null())["size"].sum())
                assert int(free["size"].sum()) + held == dr.reserved_at(m), (path, device, i)


SAMPLE_FILES = [pytest.param(p, id=p.name) for p in sorted(SAMPLES.glob("*.pickle"))]


@pytest.mark.parametrize("path", SAMPLE_FILES)
def test_invariants_on_every_sample(path: Path) -> None:
    truth = json.loads(path.with_name(path.name.replace(".pickle", ".truth.json")).read_text())
    for r in analyse(load(path), capacity=truth["capacity_bytes"]):
        check_report(r, truth["capacity_bytes"])
    for r in analyse(load(path)):
        check_report(r)
    check_moments(path)


@pytest.mark.parametrize("path", corpus_params("torch_snapshots", "*.pickle"))
def test_invariants_on_every_corpus_snapshot(path: Path) -> None:
    for r in analyse(load(path)):
        check_report(r)
    check_moments(path)


def test_invariants_on_the_dataparallel_scenario(dp: tuple[Path, dict[str, Any]]) -> None:
    path, truth = dp
    capacity = truth["devices"][0]["capacity_bytes"]
    for r in analyse(load(path), capacity=capacity):
        check_report(r, capacity)
    for r in analyse(load(path)):
        check_report(r)
    check_moments(path)


# ----- simulator map / unmap sequences --------------------------------------------------------
def _replay_matches_sim(path: Path, reserved_after: dict[int, int]) -> None:
    """The replay's reserved (mapped) bytes after trace entry i equal the simulator's own."""
    capture = load(path)
    dr = replay(capture, 0)
    assert dr.mismatches == [] and dr.segment_mismatches == []
    for i, reserved in reserved_after.items():
        assert int(dr.reserved[i]) == reserved, i
    check_moments(path)
    for r in analyse(capture):
        check_report(r)


def _step(sim: CachingAllocatorSim, seen: dict[int, int], fn, *args) -> Any:
    out = fn(*args)
    seen[len(sim.trace) - 1] = sim.reserved
    return out


def test_growth_maps_pages_at_the_end_of_one_segment(tmp_path: Path) -> None:
    sim = CachingAllocatorSim(GiB, expandable_segments=True)
    seen: dict[int, int] = {}
    addrs = [_step(sim, seen, sim.malloc, n * MiB, STACK) for n in (30, 25, 64, 3, 100)]
    assert addrs[1] == addrs[0] + 30 * MiB  # one growing range, no gap
    path = _write(tmp_path, sim)
    dr = replay(load(path), 0)
    final = dr.segments_at(dr.final)
    # one large range (and the small pool's own), not one segment per segment_map
    assert final.filter(pl.col("segment_type") == "large").height == 1
    maps = sum(1 for e in sim.trace if e["action"] == "segment_map")
    assert maps > final.height
    _replay_matches_sim(path, seen)


def test_shrink_after_empty_cache_unmaps_whole_free_pages(tmp_path: Path) -> None:
    sim = CachingAllocatorSim(GiB, expandable_segments=True)
    seen: dict[int, int] = {}
    a = [_step(sim, seen, sim.malloc, n * MiB, STACK) for n in (30, 50, 70, 41)]
    _step(sim, seen, sim.free, a[1])
    _step(sim, seen, sim.free, a[3])
    before = sim.reserved
    sim.empty_cache(STACK)
    seen[len(sim.trace) - 1] = sim.reserved
    unmaps = [e for e in sim.trace if e["action"] == "segment_unmap"]
    assert unmaps and sim.reserved < before
    _step(sim, seen, sim.malloc, 10 * MiB, STACK)
    path = _write(tmp_path, sim)
    capture = load(path)
    dr = replay(capture, 0)
    # a hole in the middle: the snapshot reports two mapped ranges of one segment
    large = dr.segments_at(dr.final).filter(pl.col("segment_type") == "large")
    assert large.height == len([s for s in raw_load(path)["segments"]
                                if s["segment_type"] == "large"]) >= 2
    _replay_matches_sim(path, seen)


def test_oom_while_mapping(tmp_path: Path) -> None:
    """The allocator maps a hole, then fails to map the rest: it unmaps what it just mapped
    with the other free pages and fails again. The OOM follows segment_map and segment_unmap
    events; the replay keeps reserved = mapped bytes through them, and the state at the OOM
    cannot place the request."""
    sim = CachingAllocatorSim(GiB, outside_pytorch=GiB - 110 * MiB, expandable_segments=True)
    seen: dict[int, int] = {}
    a, b, c = (_step(sim, seen, sim.malloc, n * MiB, STACK) for n in (60, 20, 20))
    _step(sim, seen, sim.free, b)
    sim.empty_cache(STACK)  # a one-page hole after `a`
    seen[len(sim.trace) - 1] = sim.reserved
    _step(sim, seen, sim.free, c)  # a free mapped page between the hole and the unmapped rest
    with pytest.raises(SimulatedOOM):
        sim.malloc(100 * MiB, STACK)
    seen[len(sim.trace) - 1] = sim.reserved
    tail = [(e["action"], int(str(e["size"])) // MiB) for e in sim.trace[-3:]]
    assert tail == [("segment_map", 20), ("segment_unmap", 40), ("oom", 100)]
    path = _write(tmp_path, sim)
    _replay_matches_sim(path, seen)
    (r,) = analyse(load(path))
    assert r.oom is not None and r.reserved_bytes == 60 * MiB
    assert not any("would have fit" in w for w in r.warnings)
    assert a in r.live_blocks["address"].to_list()


# ----- placement's expandable rule --------------------------------------------------------------
def _state(segments: list[tuple[int, int]], blocks: list[tuple[int, int]],
           expandable: bool = True) -> tuple[pl.DataFrame, pl.DataFrame]:
    segs = pl.DataFrame({"address": [a for a, _ in segments],
                         "total_size": [s for _, s in segments],
                         "pool": ["0,0"] * len(segments), "stream": [0] * len(segments),
                         "segment_type": ["large"] * len(segments),
                         "expandable": [expandable] * len(segments)})
    seg_of = [max(a for a, _ in segments if a <= b) for b, _ in blocks]
    live = pl.DataFrame({"address": [a for a, _ in blocks], "size": [s for _, s in blocks],
                         "segment_address": seg_of}, schema={"address": pl.Int64,
                                                             "size": pl.Int64,
                                                             "segment_address": pl.Int64})
    return segs, live


def test_expandable_request_maps_pages_instead_of_needing_a_contiguous_block() -> None:
    base = 1 << 40
    # 200 MiB mapped: 60 used, 40 free, 60 used, 40 free at the end
    segs, live = _state([(base, 200 * MiB)], [(base, 60 * MiB), (base + 100 * MiB, 60 * MiB)])
    fit = would_fit(70 * MiB, 40 * MiB, segs, live)
    # maps 40 MiB (two 20 MiB pages) after the 40 MiB free end: no 70 MiB block needed
    assert fit.fits and fit.how == MAP_PAGES and fit.map_bytes == 40 * MiB
    assert fit.largest_free_block == 40 * MiB
    plain = would_fit(70 * MiB, 40 * MiB, *_state([(base, 200 * MiB)],
                                                  [(base, 60 * MiB),
                                                   (base + 100 * MiB, 60 * MiB)], False))
    assert not plain.fits  # the plain allocator needs a new 70 MiB segment
    # after unmapping the whole free pages (80 MiB), a 100 MiB request fits with 20 MiB free
    after = would_fit(100 * MiB, 20 * MiB, segs, live)
    assert after.fits and after.releasable_bytes == 80 * MiB
    assert after.spare_bytes <= 20 * MiB + after.releasable_bytes
    short = would_fit(200 * MiB, 20 * MiB, segs, live)
    assert not short.fits and short.spare_bytes < 0


SITE = "/usr/lib/python3.10/site-packages"
FAMILY_STACKS = {
    "parameters": [(f"{SITE}/torch/nn/modules/module.py", 930, "_apply"),
                   ("/job/train.py", 10, "main")],
    "saved_activations": [("/job/model.py", 54, "forward"),
                          (f"{SITE}/torch/nn/modules/module.py", 1790, "_call_impl"),
                          ("/job/train.py", 30, "main")],
    "saved_logprob_softmax": [(f"{SITE}/slime/utils/ppo_utils.py", 371, "vocab_parallel_softmax"),
                              (f"{SITE}/slime/utils/ppo_utils.py", 402,
                               "calculate_log_probs_and_entropy"),
                              ("/job/train.py", 40, "main")],
}


def _program(capacity: int, skip: str | None = None) -> tuple[CachingAllocatorSim, bool]:
    sim = CachingAllocatorSim(capacity=capacity, outside_pytorch=512 * MiB,
                              expandable_segments=True)

    def malloc(size: int, family: str) -> int | None:
        if family == skip:
            return None
        return sim.malloc(size, FAMILY_STACKS[family], family=family)

    for _ in range(6):
        malloc(700 * MiB, "parameters")
    acts = [malloc(s, "saved_activations") for s in (300 * MiB, 5 * MiB, 96 * MiB, 3 * MiB)]
    for a in acts[1::2]:
        if a is not None:
            sim.free(a)
    for _ in range(4):
        malloc(256 * MiB, "saved_logprob_softmax")
    try:
        sim.malloc(900 * MiB, FAMILY_STACKS["saved_logprob_softmax"],
                   family="saved_logprob_softmax")
    except SimulatedOOM:
        return sim, False
    return sim, True


@pytest.mark.parametrize("capacity_mib", [6300, 6650, 6700, 7000])
def test_expandable_what_if_agrees_with_rerunning_the_simulator(tmp_path: Path,
                                                                capacity_mib: int) -> None:
    sim, fitted = _program(capacity_mib * MiB)
    assert not fitted
    (r,) = analyse(load(_write(tmp_path, sim)), capacity=capacity_mib * MiB)
    check_report(r, capacity_mib * MiB)
    by_family = {w.family: w for w in r.diagnosis.what_ifs}
    assert set(by_family) == set(FAMILY_STACKS)
    for family in FAMILY_STACKS:
        _, fits_without = _program(capacity_mib * MiB, skip=family)
        assert by_family[family].fits == fits_without, family


# ----- the bundled expandable sample against segment_map semantics ----------------------------
def test_bundled_expandable_sample_follows_segment_map_semantics() -> None:
    """Independently of snapana: maps only unmapped pages, unmaps only mapped whole pages,
    the final segments are exactly the contiguous mapped ranges, reserved is the mapped bytes,
    and at the OOM no whole free page is left mapped (the allocator unmapped them first)."""
    raw = raw_load(SAMPLES / "expandable-segments-oom.pickle")
    mapped: set[tuple[int, int]] = set()  # (page start, page size)
    for e in raw["device_traces"][0]:
        page = 2 * MiB if e["size"] % (20 * MiB) else 20 * MiB
        if e["action"] in ("segment_map", "segment_unmap"):
            assert e["addr"] % (2 * MiB) == 0 and e["size"] % (2 * MiB) == 0
        if e["action"] == "segment_map":
            pages = {(a, page) for a in range(e["addr"], e["addr"] + e["size"], page)}
            assert not {a for a, _ in pages} & {a for a, _ in mapped}
            mapped |= pages
        elif e["action"] == "segment_unmap":
            gone = {m for m in mapped if e["addr"] <= m[0] < e["addr"] + e["size"]}
            assert sum(s for _, s in gone) == e["size"]
            mapped -= gone
        assert e["action"] not in ("segment_alloc", "segment_free")
    assert sum(s for _, s in mapped) == sum(s["total_size"] for s in raw["segments"])
    runs: list[list[int]] = []
    for a, s in sorted(mapped):
        if runs and runs[-1][0] + runs[-1][1] == a:
            runs[-1][1] += s
        else:
            runs.append([a, s])
    assert [tuple(r) for r in runs] == sorted((s["address"], s["total_size"])
                                              for s in raw["segments"])
    for seg in raw["segments"]:  # the snapshot is taken at the OOM
        page = 2 * MiB if seg["segment_type"] == "small" else 20 * MiB
        addr = seg["address"]
        for b in seg["blocks"]:
            if b["state"] == "inactive":
                first = addr + -(-(b["address"] - addr) // page) * page
                assert first + page > b["address"] + b["size"], "a whole free page is mapped"


def test_bundled_expandable_sample_report_is_consistent() -> None:
    path = SAMPLES / "expandable-segments-oom.pickle"
    truth = json.loads((SAMPLES / "expandable-segments-oom.truth.json").read_text())
    (r,) = analyse(load(path), capacity=truth["capacity_bytes"])
    assert r.reserved_bytes == truth["reserved_bytes"]
    assert r.cached_unallocated_bytes == truth["cached_unallocated_bytes"]
    assert [p.expandable for p in r.pools] == [True]
    check_report(r, truth["capacity_bytes"])
    d = r.diagnosis
    frag = d.cause(Fragmentation)
    assert frag is not None and not frag.holds
    assert any(w.how == MAP_PAGES for w in d.what_ifs)  # freed pages are remapped at the end


# ----- the 3-GPU DataParallel capture ----------------------------------------------------------
def test_dataparallel_scenario_shape(dp: tuple[Path, dict[str, Any]]) -> None:
    path, truth = dp
    raw = raw_load(path)
    assert len(raw["device_traces"]) == 3 and {s["device"] for s in raw["segments"]} == {0, 1, 2}
    assert all(s["is_expandable"] for s in raw["segments"])
    assert raw["allocator_settings"]["expandable_segments"] is True
    acts = [e["action"] for t in raw["device_traces"] for e in t]
    assert acts.count("segment_map") > 100 and acts.count("segment_unmap") >= 3
    assert "segment_alloc" not in acts
    ooms = [(d, e) for d, t in enumerate(raw["device_traces"]) for e in t if e["action"] == "oom"]
    assert [d for d, _ in ooms] == [1] == truth["failed_devices"]
    oom = ooms[0][1]
    assert f"{oom['size'] / GiB:.2f}" == "4.94" and f"{oom['device_free'] / MiB:.2f}" == "91.25"
    names = [f["name"] for f in oom["frames"]]
    assert names[0] == "relu" and "_worker" in names and names[-1] == "_bootstrap"


def test_dataparallel_failing_device_first_and_verdict_consistent(
        dp: tuple[Path, dict[str, Any]]) -> None:
    path, truth = dp
    capacity = truth["devices"][1]["capacity_bytes"]
    capture = load(path)
    assert device_order(capture) == [1, 0, 2]
    reports = analyse(capture, capacity=capacity)
    assert [r.device for r in reports] == [1, 0, 2]
    assert [r.failed for r in reports] == [True, False, False]
    r = reports[0]
    t = truth["devices"][1]
    assert r.oom is not None and r.oom.requested_bytes == t["oom"]["requested_bytes"]
    assert r.reserved_bytes == t["reserved_bytes"] and r.allocated_bytes == t["allocated_bytes"]
    assert r.largest_free_block_bytes <= r.cached_unallocated_bytes
    check_report(r, capacity)
    free = r.oom.device_free_bytes or 0
    for w in r.diagnosis.what_ifs:
        if w.fits:
            assert w.spare_bytes is not None
            assert w.spare_bytes <= min(capacity, r.reserved_bytes + free)
    families = {g.name for g in r.groups}
    assert {"saved_activations", "parameters"} <= families  # the replicas are parameters
    assert r.diagnosis.request_family == "saved_activations"
    for other, t in zip(reports[1:], (truth["devices"][0], truth["devices"][2]), strict=True):
        dr = replay(capture, other.device)  # the truth is the end of the capture
        assert other.oom is None and dr.reserved_at(dr.final) == t["reserved_bytes"]
    assert Session(capture).device == 1


def test_every_format_leads_with_the_failing_device(dp: tuple[Path, dict[str, Any]],
                                                    tmp_path: Path) -> None:
    path, _ = dp
    js = invoke("summary", str(path), "--format", "json")
    assert js.returncode == 0, js.stderr
    devices = json.loads(js.stdout)["devices"]
    assert [(d["device"], d["failed"]) for d in devices] == [(1, True), (0, False), (2, False)]
    for p in devices[0]["pools"]:
        assert p["expandable"] is True
    for fmt in ("markdown", "text"):
        out = invoke("summary", str(path), "--format", fmt, "--full")
        assert out.returncode == 0, out.stderr
        found = [int(m) for m in re.findall(r"(?:cuda:|device )(\d)", out.stdout)]
        assert found and found[0] == 1, fmt
        assert out.stdout.find("Out of memory") < out.stdout.find("No OOM recorded"), fmt
    html = tmp_path / "r.html"
    assert invoke("report", str(path), "-o", str(html)).returncode == 0
    page = html.read_text()
    assert '<option value="1" selected>' in page
    sections = re.findall(r'<section class="device" data-device="(\d)"', page)
    assert sections == ["1", "0", "2"]
    assert "never needs one contiguous cached block" in page


def test_without_an_oom_the_largest_peak_leads(dp: tuple[Path, dict[str, Any]],
                                               tmp_path: Path) -> None:
    path, _ = dp
    raw = raw_load(path)
    for trace in raw["device_traces"]:
        trace[:] = [e for e in trace if e["action"] != "oom"]
    quiet = tmp_path / "no-oom.pickle"
    quiet.write_bytes(pickle.dumps(raw, protocol=4))
    capture = load(quiet)
    peaks = {d: replay(capture, d).peak_allocated_bytes for d in capture.devices}
    lead = max(peaks, key=lambda d: (peaks[d], -d))
    order = [s.device for s in sessions(capture)]
    assert order[0] == lead == 1 and sorted(order) == [0, 1, 2]
    assert [s.device for s in Session(capture, 0).devices()] == order


def test_multi_device_scenarios_are_listed() -> None:
    assert DP in MULTI_DEVICE
