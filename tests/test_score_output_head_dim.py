"""At seq = head dim an unfused attention's score matrices [b, h, s, s] have the bytes of its
output [b, s, h·d] (issue 70, benchmarks/scale_stress.py: the fp32 step at 1 × 64, +15.44%
when every block of that size was grown with seq²). The output is told apart by its place in
one call of the attention function, as torch's `_scaled_dot_product_attention_math` and
transformers' `eager_attention_forward` write it: the scores are consumed inside the call,
the softmax is kept past it (saved for the backward, or returned), the output is made last.
Where a call shows no such order, the upper bound stays, counted as ambiguous."""

from __future__ import annotations

import json

import numpy as np
import polars as pl
import pytest
from snapana.analysis.replay import NEVER
from snapana.analysis.scaling import _outputs_after_softmax, parse_sizes
from snapana.session import Session
from snapana.synth.scenarios import write_snapshot
from snapana.synth.scenarios.sized import Job, sized_job


@pytest.mark.parametrize(("hidden", "heads", "mode", "frames"), [
    (1024, 16, "train", "module"), (1024, 16, "train", "handwritten"),
    (1024, 16, "inference", "module"), (1024, 16, "inference", "handwritten"),
    (1024, 16, "forward", "handwritten"), (512, 8, "train", "handwritten")])
def test_seq_equal_to_head_dim_predicts_the_simulators_peak(tmp_path, hidden, heads, mode,
                                                             frames):
    """The simulator's job at seq = hidden / heads, predicted ×8 in seq from the smaller
    capture, against the simulator's own peak at the larger size (its truth sidecar): to
    within 0.5% (the growth is exact where each block is decided right), and no share of
    the peak is left ambiguous."""
    job = Job(hidden=hidden, heads=heads, mode=mode, frames=frames, vocab=8192)
    seq = hidden // heads
    small, _ = write_snapshot(*sized_job(2, seq, job=job), tmp_path / "small.pickle")
    _, truth = write_snapshot(*sized_job(2, 8 * seq, job=job), tmp_path / "large.pickle")
    actual = json.loads(truth.read_text())["peak_allocated_bytes"]
    p = Session.open(small).resize(parse_sizes([f"seq={seq}:{8 * seq}"]))
    assert p.target is not None
    error = p.target.replay.peak_allocated / actual - 1
    assert abs(error) <= 0.005, f"{job.label()}: {error:+.2%}"
    assert p.shares.share("ambiguous") == 0
    assert any("is the output" in a for a in p.growth.assumptions)


def _call(order: list[tuple[bool, int]], tail: int = 1) -> tuple[pl.DataFrame, np.ndarray,
                                                                  np.ndarray]:
    """A trace of one attention call: each entry a block of the scores' bytes made in turn
    under the function, with the index (0-based, in allocations) of the allocation before
    which it is freed (−1: held past the trace). The call is followed by `tail` allocations
    outside the function (its consumer: the out-projection). Trace indices: allocation i at
    10·i, a free before allocation j at 10·j − 5."""
    n = len(order) + tail
    rows = [(10 * i, 0x1000 * (i + 1), NEVER if i >= len(order) or order[i][1] < 0
             else 10 * order[i][1] - 5) for i in range(n)]
    blocks = pl.DataFrame(rows, schema={"alloc_idx": pl.Int64, "address": pl.Int64,
                                        "free_idx": pl.Int64}, orient="row")
    under = np.array([i < len(order) for i in range(n)])
    return blocks, under.copy(), under


# Each call as its blocks of one size, in order: (name, freed before allocation k, or -1: kept).
# The call's end is allocation len(call) (the first outside it).
CASES = {
    # transformers eager_attention_forward, training: matmul, × scaling, + mask (each freed
    # as the next is made), softmax (saved), matmul with value (freed once copied),
    # transpose(1, 2).contiguous() (saved by the out-projection): the last two are the output
    "hf_eager_train": ([("matmul", 2), ("scaled", 3), ("masked", 4), ("softmax", -1),
                        ("attn@v", 6), ("contiguous", -1)], {"attn@v", "contiguous"}),
    # inference: the softmax is returned as the attention weights (freed by the caller after
    # the out-projection)
    "hf_eager_inference": ([("matmul", 2), ("scaled", 3), ("masked", 4), ("softmax", 7),
                            ("attn@v", 6), ("contiguous", 7)], {"attn@v", "contiguous"}),
    # torch's math path, training with dropout: q and k scaled (saved by the matmul), the
    # scores (freed by the softmax), the softmax (saved), dropout's output (saved by the
    # matmul), the output (returned); q and k scaled stay undecided (made before the scores)
    "math_train_dropout": ([("q_scaled", -1), ("k_scaled", -1), ("scores", 4),
                            ("softmax", -1), ("dropout", -1), ("output", -1)], {"output"}),
    # torch's math path, inference: its locals all die at its return, right after the output
    # is made: nothing says which block the output is
    "math_inference": ([("q_scaled", 3), ("k_scaled", 3), ("scores", 4), ("softmax", 5),
                        ("output", -1)], None),
    # a function that makes the scores only (its caller multiplies by v): the softmax is the
    # last block; nothing after it is an output
    "scores_only_train": ([("matmul", 2), ("scaled", 3), ("softmax", -1)], None),
}


@pytest.mark.parametrize("name", list(CASES))
def test_the_output_is_made_after_a_softmax_kept_past_the_call(name):
    """`_outputs_after_softmax` on hand-written call traces of the two libraries' unfused
    attentions (and two where the order says nothing): the outputs are the blocks the
    library's code makes after its softmax; the others of the call from the scores on are
    scores, sure; a call with no such order decides nothing (the upper bound stays)."""
    order, outputs = CASES[name]
    blocks, scores, under = _call([(True, k) for _, k in order])
    out, sure = _outputs_after_softmax(blocks, scores, under)
    names = [n for n, _ in order]
    got = {names[i] for i in np.flatnonzero(out[:len(order)])}
    if outputs is None:
        assert not out.any() and not sure.any()
        return
    assert got == outputs
    first = next(i for i, n in enumerate(names) if n in ("matmul", "scores"))
    assert {names[i] for i in np.flatnonzero(sure)} == set(names[first:]) - outputs
