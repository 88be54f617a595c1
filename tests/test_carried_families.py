"""One block, one family in one report (issue 67): the families inference decides among the
blocks held together at a moment (autocast's weight copies, a forward's returned K/V pairs,
hand-written parameters and optimizer state) carry over to the same allocations in the
window's family timeline, so the growth narrative and the chart say what the attribution says.

Checked against the simulators' ground truth (which blocks they made as copies / cache) and
on a real mixed-precision forward, where the attribution at each moment the report shows (its
moment and the peak) is the reference: the timeline's family bytes there must equal it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import snapana
from snapana.analysis.replay import Moment
from snapana.session import Session
from snapana.synth.scenarios import write_snapshot
from snapana.synth.scenarios.autocast import autocast_forward
from snapana.synth.scenarios.hf_forward import hf_forward

from .conftest import SNAPSHOTS

SCENARIOS = {"autocast": (autocast_forward, "copies", "copy_bytes", "autocast_weight_copies"),
             "hf_forward": (hf_forward, "kv", "kv_bytes", "kv_cache")}


def _attributed(s: Session, moment: Moment) -> dict[str, int]:
    """Bytes per family the attribution gives the blocks allocated at `moment`."""
    live = s.attributed_blocks(moment).filter(pl.col("state") == "active_allocated")
    return dict(live.group_by("family").agg(pl.col("size").sum()).iter_rows())


def _in_timeline(s: Session, idx: int) -> dict[str, int]:
    """Bytes per family the report's timeline holds after event `idx`."""
    ft = s.report.timeline.families
    assert ft is not None
    got = {f: int(ft.bytes_at(f, np.array([idx]))[0]) for f in ft.families}
    return {f: b for f, b in got.items() if b}


@pytest.mark.parametrize("name", SCENARIOS)
@pytest.mark.parametrize("at", ["peak", "end"])
def test_simulated_family_carries_over_to_the_timeline(tmp_path: Path, name: str,
                                                       at: str) -> None:
    """Whichever moment the report shows (the peak, or the end after the blocks were freed),
    its timeline holds the simulator's copies / cache under their family at the peak, with
    the simulator's bytes, as the attribution at the peak does."""
    make, facts_key, bytes_key, family = SCENARIOS[name]
    path, truth_path = write_snapshot(*make(), tmp_path / f"{name}.pickle")
    truth = json.loads(truth_path.read_text())["facts"]
    s = Session.open(path, at=at)
    peak = s.replay.peak
    assert _attributed(s, peak)[family] == truth[bytes_key]
    assert _in_timeline(s, peak.idx) == _attributed(s, peak)
    assert _in_timeline(s, s.report.moment.idx) == _attributed(s, s.report.moment)
    grown = {g.family: g for g in s.report.timeline.families.growth(s.report.moment.idx,
                                                                     peak.idx)}
    assert grown[family].peak_bytes == truth[bytes_key]
    # the same allocations, wherever the window shows them: none of the simulator's blocks
    # is counted under another family at any event
    lt = s.report.timeline.families.lifetimes
    mine = lt.filter(pl.col("address").is_in(truth[facts_key])
                     & pl.col("alloc_idx").is_between(0, peak.idx)
                     & ((pl.col("free_req_idx") > peak.idx) | (pl.col("free_req_idx") < 0)))
    assert mine.height == len(truth[facts_key])
    assert set(mine["family"].to_list()) == {family}


MIXED = sorted(SNAPSHOTS.glob("kkaitlyn111+*_forward_mixed.pickle")) if SNAPSHOTS.is_dir() \
    else []
BF16 = [p for p in [SNAPSHOTS / "silmont2000+assignment2-systems__memory_forward_bf16_128.pickle"]
        if p.exists()]


@pytest.mark.parametrize("path", MIXED[:1] + BF16, ids=lambda p: p.name)
@pytest.mark.parametrize("at", ["peak", "end"])
def test_corpus_timeline_says_what_the_attribution_says(path: Path, at: str) -> None:
    """On a real mixed-precision forward (the rule was written from neither file), at the
    report's moment and at the peak the timeline's bytes per family equal the attribution's
    there, autocast's copies included."""
    s = Session.open(path, at=at)
    peak = s.replay.peak
    at_peak = _attributed(s, peak)
    assert at_peak.get("autocast_weight_copies", 0) > 0
    assert _in_timeline(s, peak.idx) == at_peak
    assert _in_timeline(s, s.report.moment.idx) == _attributed(s, s.report.moment)


def test_api_growth_matches(tmp_path: Path) -> None:
    """The notebook face reads the same timeline: the copies' bytes at the peak."""
    path, truth_path = write_snapshot(*autocast_forward(), tmp_path / "ac.pickle")
    truth = json.loads(truth_path.read_text())["facts"]
    a = snapana.load(path)
    t = a.timeline.filter(pl.col("family") == "autocast_weight_copies")
    assert int(t["bytes"].max()) == truth["copy_bytes"]
