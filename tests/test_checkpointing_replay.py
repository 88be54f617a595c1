"""Activation checkpointing's replay (issue 70): each repeated block keeps its input, frees
the rest at its end, and one block's forward is rerun when the backward reaches it. Judged
against the simulator's checkpointed job (synth/scenarios/sized.py, written from
torch/utils/checkpoint.py's non-reentrant path), whose peak is the simulator's own."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from snapana.analysis.scaled_replay import _changes, largest_fit
from snapana.analysis.scaling import parse_sizes
from snapana.session import Session
from snapana.synth.scenarios import write_snapshot
from snapana.synth.scenarios.sized import sized_job

from .conftest import ROOT

CKPT = "torch.activation_checkpointing"


def _job(tmp: Path, seq: int, checkpointed: bool, tag: str = "") -> tuple[Path, int]:
    path, truth = write_snapshot(*sized_job(2, seq, checkpointed),
                                 tmp / f"{tag}s{seq}-{checkpointed}.pickle")
    return path, json.loads(truth.read_text())["peak_allocated_bytes"]


def _window(tmp: Path):  # type: ignore[no-untyped-def]
    path, _ = _job(tmp, 256, False, "recorded-")
    return Session.open(path).scaling(parse_sizes(["seq=256"]))


@pytest.mark.parametrize("seq", [256, 1024, 2048])
def test_checkpointed_peak_within_ten_percent(tmp_path, seq):
    """The plain capture at seq 256, replayed with checkpointing at `seq`, peaks within 10%
    of the checkpointed job's own peak at `seq` (and well below the plain job's there)."""
    window = _window(tmp_path)
    change = dict((s.id, c) for s, c in _changes(window))[CKPT]
    predicted = window.run({"seq": seq}, None, change).replay.peak_allocated
    _, truth = _job(tmp_path, seq, True)
    _, plain = _job(tmp_path, seq, False)
    assert abs(predicted / truth - 1) <= 0.10
    if seq >= 1024:  # where the activations dominate, checkpointing shows
        assert predicted < 0.8 * plain


def test_fit_claims_a_size_the_checkpointed_job_fits(tmp_path):
    """--fit gives a largest seq with checkpointing, and the checkpointed job at that seq
    fits the card (its own peak), one that the plain job at that seq does not."""
    window = _window(tmp_path)
    _, at_1024 = _job(tmp_path, 1024, False)
    fit = largest_fit(window, "seq", at_1024)  # a card the plain job at 1024 just fills
    step = next(k for k in fit.steps if k.step == CKPT)
    assert step.largest is not None and step.largest > fit.largest, step.note
    _, truth = _job(tmp_path, step.largest, True)
    _, plain = _job(tmp_path, step.largest, False)
    assert truth <= at_1024 < plain


def test_a_window_ending_in_the_forward_claims_no_size():
    """The slime sample's window ends at its OOM in the forward: the recompute of one block
    in the backward is not in it, so checkpointing backs no largest size, and says why."""
    session = Session.open(ROOT / "sample_snapshots" / "slime-tp2-chunked-logprob-oom.pickle")
    p = session.resize(parse_sizes(["seq=8148"]), fit="seq")
    step = next(k for k in p.fit.steps if k.step == CKPT)
    assert step.largest is None and "window ends before" in step.note
