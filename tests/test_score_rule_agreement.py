"""One rule for which blocks are [batch, heads, seq, seq] score matrices (issues 67, 70): the
knob list's `score_matrices` fact (what offers fused attention) and `whatif --scale`'s
resized replay read `scaling.score_blocks`, so on a job that already runs a fused attention
(SDPA / flash: its largest block under the attention function is its output [batch, seq,
hidden]) neither takes that output for scores, and the summary does not offer the fused
attention the job already has. SDPA's math fallback (aten `_scaled_dot_product_attention_math`,
which writes attn = matmul(q, kᵀ) and its softmax) does make scores: fused attention is offered
and says the fallback ran."""

from __future__ import annotations

import pickle
import re
from dataclasses import replace

import pytest
from snapana.analysis.scaling import Size
from snapana.session import sessions
from snapana.sources import load
from snapana.synth import CachingAllocatorSim
from snapana.synth.scenarios import write_snapshot
from snapana.synth.scenarios.sized import Job, sized_job

from .conftest import corpus_files, corpus_params

MiB = 2**20
FUSED = "torch.fused_attention"

#: (job, batch, seq): the sized step's shapes whose peak lies past the forward's attention
#: (the saved softmax of each layer held), over precision, mode and frames
JOBS = [
    (Job(), 2, 2048),
    (Job(hidden=512, heads=8, vocab=50_000, autocast=True, frames="handwritten"), 1, 2048),
    (Job(mode="forward"), 2, 2048),
    (Job(frames="linear", autocast=True), 2, 2048),
]


@pytest.mark.parametrize("fused", [False, True], ids=["unfused", "fused"])
@pytest.mark.parametrize(("job", "batch", "seq"), JOBS,
                         ids=[f"{j.label()} b{b}s{s}" for j, b, s in JOBS])
def test_summary_offers_fused_attention_only_without_it(tmp_path, job, batch, seq, fused):
    """The simulator's own truth: its unfused attention keeps one fp32 softmax
    [batch, heads, seq, seq] per layer (sized.py line 42), its fused one none. The summary
    holds exactly those bytes as score matrices and offers fused attention only on the
    unfused job; whatif's replay at the recorded sizes grows blocks as scores only there."""
    job = replace(job, fused=fused)
    path, _ = write_snapshot(*sized_job(batch, seq, job=job), tmp_path / "job.pickle")
    (sess,) = sessions(load(path))
    d = sess.report.diagnosis
    assert d.evidence is not None
    ids = [k.id for k in d.knobs]
    expected = 0 if fused else job.layers * batch * job.heads * seq * seq * 4
    assert d.evidence.fact_bytes.get("score_matrices", 0) == expected, d.evidence.facts
    assert (FUSED in ids) == (not fused), ids
    w = sess.scaling({"batch": Size("batch", batch), "seq": Size("seq", seq)})
    grown = w.growth.blocks.filter(w.growth.blocks["how"].is_in(["scores", "ambiguous"]))
    assert (grown.height > 0) == (not fused), grown


SITE = "/usr/lib/python3.10/site-packages"
CALL = (f"{SITE}/torch/nn/modules/module.py", 1790, "_call_impl")
ARGS = "(at::Tensor const&, at::Tensor const&, at::Tensor const&, double, bool)"
EMPTY = ("??", 0, "at::detail::empty_cuda(c10::ArrayRef<long>, c10::ScalarType)")


def _sdpa_job(tmp_path, kernel: str, math: bool):
    """A trained forward whose layers call F.scaled_dot_product_attention from the program's
    `forward` (a name no Python rule takes for attention): on the math path each layer keeps
    attn = matmul(q, kᵀ) and its softmax [b, h, s, s] (fp32) and the output; on a fused
    kernel the output [b, h, s, d] and a log-sum-exp [b, h, s]. Weights held first (their
    norms give the hidden size)."""
    b, h, s, hidden = 2, 8, 2048, 512
    sim = CachingAllocatorSim(capacity=80 * 1024 * MiB)
    init = [(f"{SITE}/torch/nn/modules/module.py", 1174, "to"), ("/job/train.py", 12, "main")]
    for _ in range(4):
        for n in (3 * hidden * hidden, hidden * hidden, hidden, hidden):
            sim.malloc(n * 4, init, family="parameters")
    train = ("/job/train.py", 40, "train")
    op = [EMPTY, ("??", 0, f"at::native::{kernel}{ARGS}"),
          ("??", 0, "at::native::scaled_dot_product_attention" + ARGS),
          ("python_nn_functions.cpp", 0,
           "torch::autograd::THPVariable_scaled_dot_product_attention(_object*)")]
    for layer in range(4):
        caller = [("/job/model.py", 77, "forward"), CALL, train]
        sim.malloc(b * s * hidden * 4, [("/job/model.py", 70 + layer % 2, "forward"), CALL,
                                        train], family="saved_activations")  # layer norm
        sim.malloc(b * s * 3 * hidden * 4, [("/job/model.py", 74, "forward"), CALL, train],
                   family="saved_activations")  # qkv
        if math:
            sim.malloc(b * h * s * s * 4, [*op, *caller])  # matmul(q, kᵀ)
            sim.malloc(b * h * s * s * 4, [*op, *caller])  # softmax
        else:
            sim.malloc(b * h * s * 4, [*op, *caller])  # log-sum-exp
        sim.malloc(b * s * hidden * 4, [*op, *caller])  # the output
    path = tmp_path / f"{kernel}.pickle"
    path.write_bytes(pickle.dumps(sim.snapshot(), protocol=4))
    (sess,) = sessions(load(path))
    return sess, b * h * s * s * 4


def test_math_fallback_scores_are_offered_fused_attention_saying_so(tmp_path):
    """SDPA's math path (its C++ frame; the Python caller named `forward`) keeps two
    [b, h, s, s] matrices per layer: held as score matrices, fused attention offered, its
    evidence naming the fallback; whatif grows the same blocks as scores."""
    sess, scores = _sdpa_job(tmp_path, "_scaled_dot_product_attention_math", math=True)
    d = sess.report.diagnosis
    assert d.evidence is not None
    assert d.evidence.fact_bytes.get("score_matrices") == 8 * scores, d.evidence.facts
    assert "math fallback" in d.evidence.facts["score_matrices"]
    assert FUSED in [k.id for k in d.knobs]
    w = sess.scaling({"seq": Size("seq", 2048)})
    grown = w.growth.blocks.filter(w.growth.blocks["how"] == "scores")
    assert grown.height == 8 and set(grown["requested"]) == {scores}, grown


def test_efficient_kernel_makes_no_scores(tmp_path):
    """The same job on SDPA's memory-efficient kernel: nothing [b, h, s, s] is held, nothing
    offered, nothing grown with seq²."""
    sess, _ = _sdpa_job(tmp_path, "_scaled_dot_product_efficient_attention_cuda", math=False)
    d = sess.report.diagnosis
    assert d.evidence is not None and "score_matrices" not in d.evidence.facts
    assert FUSED not in [k.id for k in d.knobs]
    w = sess.scaling({"seq": Size("seq", 2048)})
    assert not w.growth.blocks["how"].is_in(["scores", "ambiguous"]).any()


#: SDPA's kernels, named in a raw snapshot's C++ frames (aten attention.cpp's dispatch)
KERNELS = re.compile(rb"_scaled_dot_product_(flash|efficient|cudnn)_attention|flash_attn")
MATH = b"_scaled_dot_product_attention_math"


@pytest.mark.corpus
def test_corpus_sdpa_kernels_are_not_offered_fused_attention():
    """Every real capture whose frames show SDPA's flash / efficient kernels and never its
    math path (found by its raw bytes) holds no score matrices and is not offered fused
    attention. The corpus holds such captures: finding none is a failure, not a pass."""
    files = corpus_files("torch_snapshots", "*.p*")
    if not files:
        pytest.skip("../shared/corpus absent")
    kernels = [f for f in files if KERNELS.search(raw := f.read_bytes()) and MATH not in raw]
    assert kernels, "no corpus capture shows SDPA's kernels"
    for path in kernels:
        for sess in sessions(load(path)):
            d = sess.report.diagnosis
            assert d.evidence is None or "score_matrices" not in d.evidence.facts, path.name
            assert FUSED not in [k.id for k in d.knobs], path.name


@pytest.mark.corpus
@pytest.mark.parametrize("path", corpus_params("torch_snapshots", "sungdk0822*attn*.pickle"))
def test_corpus_unfused_attention_op_is_offered_fused_attention(path):
    """sungdk0822's attention-op benchmark (its own softmax(QKᵀ), no SDPA kernel frames):
    score matrices held and fused attention offered."""
    assert not KERNELS.search(path.read_bytes())
    for sess in sessions(load(path)):
        d = sess.report.diagnosis
        assert d.evidence is not None and d.evidence.fact_bytes.get("score_matrices", 0) > 0
        assert FUSED in [k.id for k in d.knobs]
