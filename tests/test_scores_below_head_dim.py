"""Score matrices where seq is below the head dim (issue 70, benchmarks/scale_fuzz.py): the
scores [b, heads, s, s] are then smaller than the attention's output [b, s, hidden], so the
largest block under the attention function is the output, not the scores. They were grown
linearly as their family, an under-prediction with nothing held (--fit would have given a
size that does not fit). In each call the scores are the first block shaped batch × heads ×
seq², consumed inside the call, whose size the softmax repeats (torch's
`_scaled_dot_product_attention_math`, transformers' `eager_attention_forward`); the
output, made after the softmax, grows as its family. Checked against the simulator's own
peak at the larger size (its truth sidecar, simulated here) and against the shapes the
simulated job writes."""

from __future__ import annotations

from dataclasses import replace

import polars as pl
import pytest
from snapana.analysis import scaling
from snapana.analysis.scaling import SCORES, parse_sizes
from snapana.session import Session
from snapana.synth.scenarios import write_snapshot
from snapana.synth.scenarios.sized import FP32, sized_job

from .conftest import benchmark

BENCH = benchmark("scale_stress")
CASES = BENCH._small_seq() if hasattr(BENCH, "_small_seq") else [
    # s10-merge has no such group: the same fuzz draws, written out
    BENCH.Case(BENCH.Job(layers=16, hidden=1536, heads=6, vocab=3777, frames="linear",
                         mode="forward"), (4, 116), (12, 696)),
    BENCH.Case(BENCH.Job(layers=32, hidden=768, heads=12, vocab=53_501,
                         frames="handwritten"), (1, 27), (3, 432)),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name())
def test_peak_matches_the_simulator(tmp_path, case):
    """Seq below the head dim (hidden / heads), fp32: the prediction is the simulator's
    peak (the scores' bytes are whole multiples of batch × seq², so exact)."""
    b, s = case.small
    assert s < case.job.hidden // case.job.heads
    row = BENCH.measure(case, tmp_path)
    assert row is not None
    assert abs(row.error) < 0.005, f"{case.name()}: {row.error:+.2%}"


def _growth(tmp_path, job, small, large):
    path, _ = write_snapshot(*sized_job(*small, job=job), tmp_path / "small.pickle")
    scale = [f"batch={small[0]}:{large[0]}", f"seq={small[1]}:{large[1]}"]
    return Session.open(path).scaling(parse_sizes(scale)).growth.blocks


def test_scores_grow_with_seq_squared_and_the_output_linearly(tmp_path):
    """The blocks grown with seq² are exactly those the job writes as [b, heads, s, s] (the
    scores in the matmul's dtype, the fp32 softmax), one each per layer; the output
    [b, s, hidden], larger than both, is not among them."""
    job = BENCH.Job(layers=4, hidden=1536, heads=6, vocab=4096, frames="linear",
                    mode="forward")
    (b, s) = (4, 116)
    g = _growth(tmp_path, job, (b, s), (12, 696)).filter(pl.col("alloc_idx") >= 0)
    square = b * job.heads * s * s
    expected = {square * job.act: job.layers, square * FP32: job.layers}
    if job.act == FP32:
        expected = {square * FP32: 2 * job.layers}
    grown = g.filter(pl.col("e_seq") == 2)
    assert dict(grown.group_by("requested").len().iter_rows()) == expected
    assert set(grown["how"]) == {SCORES}
    output = b * s * job.hidden * job.act
    assert output > square * FP32
    out = g.filter(pl.col("requested") == output)
    assert out.height and (out["e_seq"] == 1).all()


def test_no_softmax_repeat_keeps_the_family_rule(tmp_path, monkeypatch):
    """Where no block of a call repeats the scores' size (the rule given no softmax ratios:
    no such evidence), nothing is taken for scores below the head dim: today's rule."""
    rules = scaling.load_rules()
    monkeypatch.setattr(scaling, "load_rules", lambda: replace(rules, scores=tuple(
        replace(r, softmax_repeats=()) for r in rules.scores)))
    job = BENCH.Job(layers=2, hidden=1536, heads=6, vocab=4096, frames="linear",
                    mode="forward")
    g = _growth(tmp_path, job, (4, 116), (12, 696))
    assert not (g["how"] == SCORES).any()
