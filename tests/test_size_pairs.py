"""`whatif --scale` on like-for-like size sets (issue 70): each larger member's peak
allocated predicted from the set's smallest, uncalibrated, against that capture's own peak
by the independent raw replay (benchmarks/size_pairs.py); and a simulated autocast forward
at two sizes against the simulator's own peak."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
from snapana.analysis.scaling import parse_sizes
from snapana.session import Session
from snapana.synth.scenarios import write_snapshot
from snapana.synth.scenarios.autocast import autocast_forward

from .conftest import CORPUS, ROOT

#: benchmarks/size_pairs.py measures every pair within 2.75% (the attention op at seq 1,024,
#: whose few MiB of fixed inputs and outputs weigh most at the smallest target); before
#: issue 70 the autocast pairs were +23% / +45% and the attention op -72% to -99.9%. 4%
#: keeps a margin over the measured worst and fails every one of the old errors.
TOLERANCE = 0.04


def _bench():
    name = "size_pairs"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


BENCH = _bench()
PAIRS = [pytest.param(BENCH.SNAPS / s.files[a], BENCH.SNAPS / s.files[b], a, b,
                      id=f"{s.name}:{a}->{b}")
         for s in BENCH.SETS for a, b in BENCH.pairs(s)] or [
    pytest.param(None, None, 0, 0, marks=pytest.mark.skip(reason="../shared/corpus absent"))]


@pytest.mark.parametrize(("small", "big", "seq_small", "seq_big"), PAIRS)
def test_corpus_size_pair(small: Path, big: Path, seq_small: int, seq_big: int):
    """Predicted from the smallest of the set, within TOLERANCE of the larger capture's own
    peak allocated as the raw replay (tests/raw_replay.py) finds it."""
    assert small.is_relative_to(CORPUS)
    p = Session.open(small).resize(parse_sizes([f"seq={seq_small}:{seq_big}"]))
    truth = BENCH.captured_peak(big)
    assert abs(p.target.replay.peak_allocated / truth - 1) <= TOLERANCE


@pytest.mark.parametrize(("small", "big"), [((3, 100), (3, 400)), ((2, 250), (2, 1000))])
def test_simulated_autocast_forward_at_two_sizes(tmp_path, small, big):
    """The simulator's no-grad autocast forward at two sequence lengths: the bf16 weight
    copies (one per weight, the same bytes at every size) are held fixed, so the peak
    predicted from the smaller is the larger run's own to within 1% (the copies are most of
    what the forward adds). Sizes where no activation has a copy's bytes (at batch 3 × seq
    128 the bf16 logits are a qkv copy's size, and the matcher then names no copy of it)."""
    path, _ = write_snapshot(*autocast_forward(*small), tmp_path / "small.pickle")
    _, truth = write_snapshot(*autocast_forward(*big), tmp_path / "big.pickle")
    expected = json.loads(truth.read_text())["peak_allocated_bytes"]
    p = Session.open(path).resize(parse_sizes([f"seq={small[1]}:{big[1]}"]))
    copies = p.growth.blocks.filter(p.growth.blocks["family"] == "autocast_weight_copies")
    assert copies.height and set(copies["e_seq"].to_list()) == {0.0}
    assert abs(p.target.replay.peak_allocated / expected - 1) <= 0.01
