"""whatif --scale on simulated jobs of shapes nobody tuned it for (issue 70): a small, fixed
subset of benchmarks/scale_stress.py's grid, each failure it found fixed among them (autocast's
weight copies in a training step, a fused attention's output, a chunked loss over batch × seq
tokens), predicted from the smaller capture uncalibrated and held within 10% of the
simulator's own peak at the larger size (its truth sidecar). Where the sizes cannot tell
scores from the attention's output (seq = head dim), the order within the attention's call
does; where that says nothing either, --fit gives no largest size."""

from __future__ import annotations

import json
from dataclasses import replace

import polars as pl
import pytest
from snapana.analysis import scaling
from snapana.analysis.scaling import parse_sizes
from snapana.session import Session
from snapana.synth.scenarios import write_snapshot
from snapana.synth.scenarios.sized import sized_job

from .conftest import benchmark

BENCH = benchmark("scale_stress")


@pytest.mark.parametrize("case", BENCH.QUICK, ids=lambda c: c.name())
def test_within_ten_percent_of_the_simulator(tmp_path, case):
    row = BENCH.measure(case, tmp_path)
    assert row is not None
    assert abs(row.error) <= BENCH.BAR, f"{case.name()}: {row.error:+.2%}"


def test_scores_the_size_of_the_output_told_apart_by_the_call(tmp_path, monkeypatch):
    """At seq = head dim the score matrices have the bytes of the attention's output
    [batch, seq, hidden] (the fp32 step at 1 × 64, 6 layers, hidden 1,024, 16 heads): the
    output is told apart by its place in the call (made after the softmax the call keeps),
    so nothing is ambiguous and --fit gives a largest size. Where a call shows no such order
    (here: the rule's `output_after_softmax` off, as for a call whose locals all die at its
    return), they are grown with seq² (an upper bound) and --fit withholds a size that far
    from the recorded one."""
    case = BENCH.HEAD_DIM
    row = BENCH.measure(case, tmp_path)
    assert row is not None and abs(row.error) <= BENCH.BAR and not row.refused
    batch, seq = case.small
    path, _ = write_snapshot(*sized_job(batch, seq, job=case.job), tmp_path / "fit.pickle")
    p = Session.open(path).resize(parse_sizes([f"seq={seq}"]), card="80GiB", fit="seq")
    assert p.shares.share("ambiguous") == 0
    assert p.fit is not None and p.fit.largest is not None
    rules = scaling.load_rules()
    blind = replace(rules, scores=tuple(replace(r, output_after_softmax=False)
                                        for r in rules.scores))
    monkeypatch.setattr(scaling, "load_rules", lambda: blind)
    p = Session.open(path).resize(parse_sizes([f"seq={seq}"]), card="80GiB", fit="seq")
    assert p.shares.share("ambiguous") > 0
    assert p.fit is not None and p.fit.largest is None
    assert "score matrices" in p.fit.withheld
    # the same capture asked for batch: the scores grow linearly in it either way
    q = Session.open(path).resize(parse_sizes([f"batch={batch}", f"seq={seq}"]),
                                  card="80GiB", fit="batch")
    assert q.fit is not None and q.fit.largest is not None


def test_activation_gradient_the_size_of_a_weight_gradient_is_no_weight(tmp_path):
    """Hidden 512 at 2 × 256 (tokens = hidden): the logits' gradient [tokens, vocab] (fp32)
    has the bytes of the embedding's gradient [vocab, hidden]. The autograd engine frees it
    inside the backward (an activation's gradient); AccumulateGrad keeps the embedding's
    .grad past it. Only the kept one mirrors a weight, so the blocks of that size held from
    before recording are one weight and its two Adam moments, as the simulator made them
    (its truth, by address; the moment: the end, every one of them held), and the
    prediction at 2 × 1,024 is within 10% of the simulator's peak."""
    job = replace(BENCH.B, hidden=512, heads=8)
    case = BENCH.Case(job, (2, 256), (2, 1024))
    row = BENCH.measure(case, tmp_path)
    assert row is not None and abs(row.error) <= BENCH.BAR, f"{row.error:+.2%}"
    path, truth_path = write_snapshot(*sized_job(2, 256, job=job), tmp_path / "t.pickle")
    embedding = job.vocab * job.hidden * 4
    truth = {b["address"]: b["family"] for b in json.loads(truth_path.read_text())["blocks"]
             if b["size"] == embedding}
    assert sorted(truth.values()) == ["optimizer_state", "optimizer_state", "parameters"]
    sess = Session.open(path)
    held = sess.attributed_blocks(sess.moment).filter(
        (pl.col("size") == embedding) & (pl.col("alloc_idx") < 0))
    assert dict(zip(held["address"], held["family"], strict=True)) == truth
