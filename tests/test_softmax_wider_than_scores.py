"""At seq = head dim the attention's blocks have the bytes of a [batch, seq, hidden] activation
in some dtype (issue 70, benchmarks/scale_stress.py `_head_dim`). Under autocast the matmuls
run in bf16 and softmax in fp32 (aten/src/ATen/autocast_mode.cpp's op lists), so the fp32
softmax is the one block of the largest size under the attention function, made at one line,
with the bytes of a fused attention's output; the bf16 scores before it and the bf16 output
after it are half of it. And in a forward whose weights no window names, the hidden size is
unknown, so the output's bytes were never looked for. Each case is predicted ×8 or ×16 in
seq from the smaller capture and held to the simulator's own peak at the larger size (its truth
sidecar, recomputed here): −15.84%, −14.80%, +10.10%, +20.59%, +21.21%, +26.90%, +10.41%
before."""

from __future__ import annotations

import json

import pytest
from snapana.analysis.scaling import parse_sizes
from snapana.session import Session
from snapana.synth.scenarios import write_snapshot
from snapana.synth.scenarios.sized import Job, sized_job

CASES = [
    # seq = head dim under autocast, a training step: the softmax taken for the output
    (Job(autocast=True), 1, 64, 1024),
    (Job(hidden=512, heads=8, vocab=8192, autocast=True, frames="handwritten"), 2, 64, 512),
    # a forward with its weights unnamed (no hidden size) under autocast
    (Job(vocab=8192, autocast=True, mode="forward"), 2, 64, 512),
    # the same in fp32: the output grown with seq² beside the scores
    (Job(hidden=512, heads=8, vocab=8192, mode="forward"), 2, 64, 512),
    (Job(vocab=8192, mode="inference", frames="linear"), 16, 64, 512),
    # and a fused attention's output (SDPA: no scores at all) grown as scores
    (Job(hidden=512, heads=8, vocab=8192, mode="forward", fused=True), 2, 64, 512),
    # seq = 2 × head dim under autocast: the fp32 softmax is 4 × the bf16 output
    (Job(hidden=256, heads=4, vocab=8192, autocast=True, mode="forward"), 2, 128, 1024),
]


@pytest.mark.parametrize(("job", "batch", "seq", "target"), CASES,
                         ids=[f"{j.label()} b{b}s{s}->{t}" for j, b, s, t in CASES])
def test_predicts_the_simulators_peak(tmp_path, job, batch, seq, target):
    """Within 0.5% of the simulator's peak at the target seq, none of it ambiguous."""
    small, _ = write_snapshot(*sized_job(batch, seq, job=job), tmp_path / "small.pickle")
    _, truth = write_snapshot(*sized_job(batch, target, job=job), tmp_path / "large.pickle")
    actual = json.loads(truth.read_text())["peak_allocated_bytes"]
    p = Session.open(small).resize(parse_sizes([f"seq={seq}:{target}"]))
    assert p.target is not None
    error = p.target.replay.peak_allocated / actual - 1
    assert abs(error) <= 0.005, f"{job.label()} b{batch}s{seq}: {error:+.2%}"
    assert p.shares.share("ambiguous") == 0


def test_the_softmax_grows_with_seq_squared_and_the_output_linearly(tmp_path):
    """The autocast step at seq = head dim (1 × 64, hidden 1,024, 16 heads): per layer the
    simulator makes bf16 scores [1, 16, 64, 64] (128 KiB), an fp32 softmax (256 KiB) and a
    bf16 output [1, 64, 1024] (128 KiB) under `attention`. The softmax and the scores grow
    with seq², the output with seq, and the assumption says why."""
    job, seq = Job(autocast=True), 64
    path, _ = write_snapshot(*sized_job(1, seq, job=job), tmp_path / "job.pickle")
    p = Session.open(path).resize(parse_sizes([f"seq={seq}:{8 * seq}"]))
    rows = p.growth.blocks.filter(p.growth.blocks["site"].str.contains(" attention"))
    scores = job.heads * seq * seq
    output = seq * job.hidden
    by = {(r["requested"], r["e_seq"]) for r in rows.iter_rows(named=True)
          if r["requested"] in (scores * 2, scores * 4, output * 2)}
    # the bf16 scores and the bf16 output have one size: 6 layers of each, told apart
    assert by == {(scores * 4, 2.0), (scores * 2, 2.0), (output * 2, 1.0)}
    assert rows.filter((rows["requested"] == output * 2) & (rows["e_seq"] == 1.0)).height \
        == job.layers
    assert any("is the output" in a and "softmax" in a for a in p.growth.assumptions)


def test_a_fused_attention_under_autocast_still_makes_no_scores(tmp_path):
    """SDPA's flash path under autocast at seq = head dim: its bf16 output is the largest
    block under the function and nothing of half its bytes is made there (its log-sum-exp is
    [batch, heads, seq] fp32), so nothing is grown with seq²."""
    job = Job(autocast=True, fused=True)
    path, _ = write_snapshot(*sized_job(1, 64, job=job), tmp_path / "job.pickle")
    p = Session.open(path).resize(parse_sizes(["seq=64:512"]))
    assert not p.growth.blocks.filter(p.growth.blocks["how"].is_in(["scores", "ambiguous"])
                                      ).height
