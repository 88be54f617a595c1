"""Activations sized for a padded token count (issue 70): slime's get_batch pads the packed
tokens up to a multiple of tp × pad_multiplier (slime/backends/megatron_utils/data.py:
pad = (m − T % m) % m) before the model runs, so the layers' activations and the logits are
sized for the padded count while the log-prob runs on the real tokens. The simulated slime /
Megatron step (synth/scenarios/parallel.py `megatron_step_job`, `pad_to`) recorded at 8,148
tokens padded to a multiple of 256 (8,192) and replayed at another token count: the blocks
that divide by 8,192 and not by 8,148 grow from 8,192 above the recorded size (within 2% of
the simulator's own peak) and keep their size below it (never under the simulator's)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from snapana.analysis.scaling import PADDED, parse_sizes
from snapana.session import Session
from snapana.synth.scenarios import write_snapshot
from snapana.synth.scenarios.parallel import megatron_step_job

from .conftest import ROOT

MULTIPLE = 2 * 128  # tp × slime's default pad_multiplier
RECORDED = 8148


def _padded(tokens: int) -> int:
    return -(-tokens // MULTIPLE) * MULTIPLE


def _job(tmp: Path, tokens: int) -> tuple[Path, int]:
    path, truth = write_snapshot(*megatron_step_job(2, tokens=tokens, extra_tp2=0,
                                                    pad_to=MULTIPLE),
                                 tmp / f"padded-{tokens}.pickle")
    return path, json.loads(truth.read_text())["peak_allocated_bytes"]


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> Session:
    path, _ = _job(tmp_path_factory.mktemp("padded"), RECORDED)
    return Session.open(path)


def test_padded_blocks_are_found(recorded):
    p = recorded.resize(parse_sizes([f"seq={RECORDED}:12000"]))
    assert p.growth.padded == _padded(RECORDED)
    padded = p.growth.blocks.filter(p.growth.blocks["how"] == PADDED)
    assert padded.height
    assert (padded["requested"] % _padded(RECORDED) == 0).all()
    assert (padded["requested"] % RECORDED != 0).all()
    assert p.shares.share("held fixed") < 0.01
    assert f"sized for {_padded(RECORDED):,} tokens" in p.growth.padded_for()


@pytest.mark.parametrize("tokens", [12000, 16000])
def test_a_larger_seq_grows_from_the_padded_count(tmp_path, recorded, tokens):
    _, truth = _job(tmp_path, tokens)
    p = recorded.resize(parse_sizes([f"seq={RECORDED}:{tokens}"]))
    assert abs(p.target.replay.peak_allocated / truth - 1) <= 0.02


@pytest.mark.parametrize("tokens", [6000, 8000])
def test_a_smaller_seq_is_never_under_the_simulator(tmp_path, recorded, tokens):
    _, truth = _job(tmp_path, tokens)
    p = recorded.resize(parse_sizes([f"seq={RECORDED}:{tokens}"]))
    assert p.target.replay.peak_allocated >= truth


def test_the_sample_swiglu_blocks_grow_as_padded():
    """The sample's fused SwiGLU intermediates (megatron/core/fusions/fused_bias_swiglu.py)
    divide by 8,192 (= 8,148 padded to tp 2 × 128) and not by 8,148: at seq 16,384 they are
    no longer held fixed, and the share of the peak held fixed drops below what they were."""
    session = Session.open(ROOT / "sample_snapshots" / "slime-tp2-chunked-logprob-oom.pickle")
    p = session.resize(parse_sizes(["seq=8148:16384"]))
    b = p.growth.blocks
    swiglu = b.filter(b["site"].str.contains("fused_bias_swiglu.py"))
    big = swiglu.filter(swiglu["requested"] % 8148 != 0)
    assert big.height and (big["requested"] % _padded(8148) == 0).all()
    assert (big["how"] == PADDED).all()
    assert big["why"].str.contains("padded").all()
    live_swiglu = int(big["requested"].max()) / p.shares.peak
    assert p.shares.share("held fixed") < live_swiglu
    head = " ".join(session.resize(parse_sizes(["seq=8148:16384"])).growth.padded_for().split())
    assert "sized for 8,192 tokens" in head


def test_a_second_capture_measures_the_padded_blocks(tmp_path, recorded):
    """Calibrated on a capture at 12,000 tokens, the padded blocks are measured, not
    assumed: nothing is said padded any more, and 16,000 is within 2% of the simulator."""
    other, _ = _job(tmp_path, 12000)
    _, truth = _job(tmp_path, 16000)
    p = recorded.resize(parse_sizes([f"seq={RECORDED}:16000"]),
                        calibrate=(Session.open(other), "seq", 12000))
    assert not p.growth.padded_seq() and not p.growth.padded_for()
    assert abs(p.target.replay.peak_allocated / truth - 1) <= 0.02
