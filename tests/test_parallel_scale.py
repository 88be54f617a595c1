"""`whatif --scale tp= / dp= / sp= --zero` (issue 70): one rank's peak at another parallel
layout, by a replay of the resized window. Expected figures come from the papers' formulas,
computed here (ZeRO: Rajbhandari et al. 2020, Figure 1; Megatron: Korthikanti et al. 2022),
and from the simulator's own peak at the other layout (synth/scenarios/parallel.py)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from snapana.synth.scenarios import write_snapshot
from snapana.synth.scenarios.megatron import DenseModel
from snapana.synth.scenarios.parallel import megatron_layers_job, megatron_step_job, zero_job

from .conftest import ROOT, invoke

SLIME = ROOT / "sample_snapshots" / "slime-tp2-chunked-logprob-oom.pickle"


def _asked(path: Path, *args: str) -> dict:
    """The replay at the asked layout, from whatif's JSON."""
    out = invoke("whatif", str(path), *args, "--format", "json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)["devices"][0]


@pytest.fixture(scope="module")
def zero_capture(tmp_path_factory) -> Path:
    """One rank's model state of Ψ = 7.5B, mixed-precision Adam, Nd = 64, no ZeRO."""
    path, _ = write_snapshot(*zero_job(0, 64), tmp_path_factory.mktemp("z") / "z0.pickle")
    return path


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_zero_figure_1(zero_capture, stage):
    """Figure 1's 120 / 31.4 / 16.6 / 1.9 GB from (2 + 2 + K)Ψ with the stage's parts over
    Nd, and whatif's replay from the stage-0 capture within 1% of it."""
    psi, k, nd = 7.5e9, 12, 64
    parts = (2 * psi / (nd if stage >= 3 else 1), 2 * psi / (nd if stage >= 2 else 1),
             k * psi / (nd if stage >= 1 else 1))
    formula = sum(parts)
    assert round(formula / 1e9, 1) == {0: 120.0, 1: 31.4, 2: 16.6, 3: 1.9}[stage]
    got = _asked(zero_capture, "--scale", "dp=64", "--zero", f"0:{stage}")
    assert got["at_asked_size"]["sizes"] == {"dp": 64, "zero": stage}
    assert abs(got["at_asked_size"]["peak_allocated_bytes"] / formula - 1) < 0.01


def test_zero_stage_read_from_frames(tmp_path):
    """A capture with Megatron's distributed optimizer is stage 1 by its frames, and says so;
    `--zero 3` alone then predicts stage 3 from it."""
    path, truth = write_snapshot(*zero_job(1, 64), tmp_path / "z1.pickle")
    got = _asked(path, "--scale", "dp=64", "--zero", "3")
    said = " ".join(got["assumptions"])
    assert "ZeRO stage read from frames" in said and "distributed optimizer" in said
    simulated = json.loads(write_snapshot(*zero_job(3, 64), tmp_path / "z3.pickle")[1]
                           .read_text())["peak_allocated_bytes"]
    assert abs(got["at_asked_size"]["peak_allocated_bytes"] / simulated - 1) < 0.01
    assert json.loads(truth.read_text())["peak_allocated_bytes"] == \
        got["at_recorded_size"]["peak_allocated_bytes"]


@pytest.mark.parametrize(("t", "sp"), [(2, False), (4, False), (8, False), (4, True)])
def test_megatron_activations_per_layer(tmp_path, t, sp):
    """Korthikanti et al.'s per-layer activations, sbh(10 + 24/t + 5as/(ht)) with tensor
    parallelism and sbh(34 + 5as/h)/t with sequence parallelism too, from the replay of a
    tp=1 capture of two GPT-3 layers (s 2048, b 1, h 12288, a 96), within 1%."""
    s, b, h, a, layers = 2048, 1, 12288, 96, 2
    path, truth = write_snapshot(*megatron_layers_job(1, layers=layers), tmp_path / "m.pickle")
    whole = s * b * h * (34 + 5 * a * s / h)
    assert json.loads(truth.read_text())["peak_allocated_bytes"] / layers == \
        pytest.approx(whole, rel=0.01)
    formula = whole / t if sp else s * b * h * (10 + 24 / t + 5 * a * s / (h * t))
    got = _asked(path, "--scale", f"tp=1:{t}", *(["--scale", "sp=0:1"] if sp else []))
    assert abs(got["at_asked_size"]["peak_allocated_bytes"] / layers / formula - 1) < 0.01


def test_megatron_step_tp4_within_ten_percent(tmp_path):
    """The slime sample's model, one step simulated at tp=2 and at tp=4: the tp=4 peak
    predicted from the tp=2 capture within 10% of the simulator's."""
    small, _ = write_snapshot(*megatron_step_job(2), tmp_path / "tp2.pickle")
    _, truth = write_snapshot(*megatron_step_job(4), tmp_path / "tp4.pickle")
    simulated = json.loads(truth.read_text())["peak_allocated_bytes"]
    got = _asked(small, "--scale", "tp=2:4")
    assert abs(got["at_asked_size"]["peak_allocated_bytes"] / simulated - 1) <= 0.10


def test_slime_sample_would_tp4_fit():
    """'Would TP=4 fit': the sample's OOM replayed at tp=4 on the card the OOM implies, from
    its recorded tp (the simulator's vocabulary per rank against the model's: its truth);
    the replay at the recorded tp reproduces the recorded peak and its OOM."""
    truth = json.loads(SLIME.with_name(SLIME.name.replace(".pickle", ".truth.json"))
                       .read_text())
    tp = DenseModel().vocab // truth["chunks"]["vocab_per_rank"]
    assert tp == 2
    got = _asked(SLIME, "--scale", f"tp={tp}:4", "--fit")
    assert got["at_recorded_size"]["peak_allocated_bytes"] == \
        got["recorded_peak_allocated_bytes"]
    assert not got["at_recorded_size"]["fits"]
    asked = got["at_asked_size"]
    assert asked["fits"] and asked["peak_allocated_bytes"] < got["capacity_bytes"]
    assert asked["peak_allocated_bytes"] < got["recorded_peak_allocated_bytes"]
    # every large activation is split by the op that made it (the vocab-parallel log-prob
    # softmax's temporaries too): what no op rule names is the per-token row max / log-prob
    said = " ".join(got["assumptions"])
    unmatched = re.search(r"made by no op a rule names[^:]*: [^:]*: ([\d,]+) blocks, "
                          r"([\d,]+) bytes", said)
    assert unmatched is not None and int(unmatched[2].replace(",", "")) < 2**20


@pytest.mark.parametrize("args", [("--scale", "tp=0"), ("--scale", "tp=2:0"),
                                  ("--scale", "dp=8", "--zero", "5"),
                                  ("--scale", "pp=x"), ("--zero", "0:3"),
                                  ("--scale", "sp=0:2", "--scale", "tp=2")])
def test_bad_layout_refused(args):
    """A layout that is not one: one line on stderr, exit 2, before the capture is read."""
    out = invoke("whatif", str(SLIME), *args)
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1 and "Traceback" not in out.stderr


def test_fsdp_names_and_pipeline(zero_capture):
    """FSDP's NO_SHARD → FULL_SHARD is ZeRO 0 → 3 (Figure 1's 1.9 GB at Nd = 64); four
    pipeline stages hold a quarter of the model state each (16Ψ / 4, the layers split)."""
    psi = 7.5e9
    fsdp = _asked(zero_capture, "--scale", "dp=64", "--zero", "no_shard:full_shard")
    assert abs(fsdp["at_asked_size"]["peak_allocated_bytes"] / (16 * psi / 64) - 1) < 0.01
    pp = _asked(zero_capture, "--scale", "pp=1:4")
    assert abs(pp["at_asked_size"]["peak_allocated_bytes"] / (16 * psi / 4) - 1) < 0.01
