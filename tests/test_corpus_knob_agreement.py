"""summary and whatif --fit name one set of knobs: where the resized replay finds the score
matrices of an unfused attention, the summary at its moment offers fused attention under the
same id, ahead of every knob that costs something (issue 67)."""

from __future__ import annotations

import json
import pickle

import pytest
from snapana.analysis.knobs import load_knobs
from snapana.analysis.scaled_replay import _changes
from snapana.analysis.scaling import Size, load_rules
from snapana.session import sessions
from snapana.sources import load
from snapana.synth import CachingAllocatorSim

from .conftest import corpus_params, invoke

MiB = 2**20
SITE = "/usr/lib/python3.10/site-packages"
CALL = (f"{SITE}/torch/nn/modules/module.py", 1790, "_call_impl")


def test_every_next_step_of_whatif_is_a_pack_knob() -> None:
    """The knobs `whatif --fit` replays are named by the packs' ids, so the summary's list
    and whatif's say the same names."""
    ids = {k.id for k in load_knobs()}
    steps = [s.id for s in load_rules().next_steps]
    assert steps and all(s in ids for s in steps), set(steps) - ids


def test_held_score_matrices_get_fused_attention_first(tmp_path) -> None:
    """A trained forward's unfused attention keeps, per layer, a [batch, heads, seq, seq]
    score matrix and its softmax (the largest blocks under `attention`) beside a smaller
    [batch, seq, d] output. At the peak the summary offers fused attention (free) first,
    ranked by the score bytes it removes, before checkpointing (extra compute)."""
    b, h, s, d = 4, 16, 1024, 1024
    scores, out = b * h * s * s * 4, b * s * d * 4
    sim = CachingAllocatorSim(capacity=80 * 1024 * MiB)
    for _ in range(8):
        sim.malloc(64 * MiB, [(f"{SITE}/torch/nn/modules/module.py", 1174, "to"),
                              ("/job/train.py", 12, "main")], family="parameters")
    train = ("/job/train.py", 40, "train")
    for layer in range(6):
        attn = [("/job/model.py", 70, "attention"), ("/job/model.py", 100, "forward"), CALL,
                train]
        sim.malloc(scores, attn, family="saved_activations")  # QKᵀ
        sim.malloc(scores, attn, family="saved_activations")  # softmax
        sim.malloc(out, attn, family="saved_activations")
        sim.malloc(out, [("/job/model.py", 120 + layer % 2, "forward"), CALL, train],
                   family="saved_activations")
    path = tmp_path / "attn.pickle"
    path.write_bytes(pickle.dumps(sim.snapshot(), protocol=4))
    (sess,) = sessions(load(path))
    d = sess.report.diagnosis
    ids = [k.id for k in d.knobs]
    assert d.evidence.fact_bytes["score_matrices"] == 12 * scores
    assert ids and ids[0] == "torch.fused_attention", ids
    steps = [st.id for st, _ in _changes(sess.scaling({"seq": Size("seq", 1)}))]
    assert ids[0] in steps, steps


@pytest.mark.parametrize("path", corpus_params("torch_snapshots", "*.p*"))
def test_summary_offers_what_whatif_replays_for_unfused_attention(path) -> None:
    """Per corpus device: where whatif's resized replay drops score matrices (fused
    attention among its next steps) and the summary prescribes knobs with score matrices held
    at its moment, the summary offers fused attention under whatif's id, and only free knobs
    (inference_mode, a lower-precision copy of the weights) come before it; where the summary's
    first knob is one whatif also replays, fused attention is that knob."""
    for sess in sessions(load(path)):
        d = sess.report.diagnosis
        steps = [st.id for st, _ in _changes(sess.scaling({"seq": Size("seq", 1)}))]
        ids = [k.id for k in d.knobs]
        held = d.evidence.fact_bytes.get("score_matrices", 0) if d.evidence else 0
        if "torch.fused_attention" not in steps or not d.prescribe or not held:
            continue
        assert "torch.fused_attention" in ids, (ids, steps)
        before = d.knobs[:ids.index("torch.fused_attention")]
        assert all(k.cost == "free" for k in before), [(k.id, k.cost) for k in before]
        assert not any(k in steps for k in ids[:ids.index("torch.fused_attention")]), ids


@pytest.mark.parametrize("backward", [True, False])
def test_score_gradients_and_own_attention_scores_are_held_scores(tmp_path, backward) -> None:
    """The program's own attention (every frame its own code: `user_tensors`, a family with
    no scaling rule) makes one [batch, heads, seq, seq] score matrix per layer; at the peak,
    in backward, the autograd thread holds their gradients (no Python frames, the scores'
    bytes, freed in the same backward: activations' gradients). whatif's resized replay
    takes all of them for scores (made under the attention function, or of their shape
    elsewhere), so the summary holds them as score matrices too and offers fused attention
    first, ranked by those bytes; without the backward too (the scores alone, all
    `user_tensors`)."""
    b, h, s = 8, 4, 4096
    scores = b * h * s * s * 4
    sim = CachingAllocatorSim(capacity=80 * 1024 * MiB)
    own = [("/job/model.py", 70, "scaled_dot_product_attention"),
           ("/job/bench.py", 12, "main")]
    engine = [("??", 0, "torch::autograd::Engine::thread_main(std::shared_ptr<GraphTask> "
                        "const&)")]
    kept = [sim.malloc(scores, own) for _ in range(2)]
    sim.malloc(b * s * 32 * 4, own)  # the output [batch, seq, d]: smaller, not a score
    grads = [sim.malloc(scores, engine) for _ in range(3 if backward else 0)]
    for addr in [*grads, *kept]:  # the backward ends: the peak was before
        sim.free(addr)
    path = tmp_path / "own_attention.pickle"
    path.write_bytes(pickle.dumps(sim.snapshot(), protocol=4))
    (sess,) = sessions(load(path))
    d = sess.report.diagnosis
    assert d.evidence is not None
    n = 5 if backward else 2
    assert d.evidence.fact_bytes.get("score_matrices") == n * scores, d.evidence.facts
    ids = [k.id for k in d.knobs]
    assert ids and ids[0] == "torch.fused_attention", ids
    w = sess.scaling({"seq": Size("seq", s)})
    held = w.growth.blocks.filter(w.growth.blocks["requested"] == scores)
    assert held.height == n and set(held["how"]) == {"scores"}, held


def _fit_names(sess) -> list[str]:  # noqa: ANN001 - a snapana Session
    """The knobs `whatif --scale KEY=1 --fit` names, over the keys the window grows with:
    its next steps that act on this window and the knobs whose setting the largest size is."""
    rules = load_rules()
    names: list[str] = []
    for key in ("batch", "seq"):
        window = sess.scaling({key: Size(key, 1)})
        if (window.growth.blocks[f"e_{key}"] > 0).any():
            names += [*rules.fit_size.get(key, ()), *(s.id for s, _ in _changes(window))]
    return names


@pytest.mark.corpus
@pytest.mark.parametrize("path", corpus_params("torch_snapshots", "*.p*"))
def test_first_knob_is_what_whatif_fit_names_or_the_summary_says_why(path) -> None:
    """Issue 67's "done when", per corpus device: the summary's first knob is among the
    knobs whatif --fit names (by its id, or a framework's flag for the step's mechanism),
    or the summary's JSON says which whatif replays it instead (--set, a flag of its own) or
    that none has a model of it, in the knob table's "predicted by replay" words."""
    data = json.loads(invoke("summary", str(path), "--format", "json").stdout)
    knobs = {dv["device"]: dv["diagnosis"]["knobs"] for dv in data["devices"]}
    for sess in sessions(load(path)):
        if not knobs.get(sess.device):
            continue
        first = knobs[sess.device][0]
        via, names = first["replayed_by"], _fit_names(sess)
        if first["id"] in names or (via["step"] and via["step"] in names):
            continue
        assert via["how"] in ("set", "flag", "none"), (first["id"], via, names)
        said = via["predicted"]
        if via["how"] == "none":
            assert said == "not simulated (no mechanical model of it)", said
        elif via["how"] == "flag":
            assert via["command"] in said and "not --fit" in said, said
        else:
            assert first["replay"] is not None or via["command"] in said, (first, said)


def test_whatif_fit_names_the_batch_knob(tmp_path) -> None:
    """--scale batch=N --fit finds the largest batch that fits: that size is the setting of
    the summary's batch knobs, named by their pack names (and ids) in every format of
    whatif."""
    sim = CachingAllocatorSim(capacity=80 * 1024 * MiB)
    fwd = [("/job/model.py", 100, "forward"), CALL, ("/job/infer.py", 40, "main")]
    sim.malloc(64 * MiB, [(f"{SITE}/torch/nn/modules/module.py", 1174, "to"),
                          ("/job/infer.py", 12, "main")])
    for _ in range(4):
        sim.free(sim.malloc(256 * MiB, fwd))
    path = tmp_path / "batch.pickle"
    path.write_bytes(pickle.dumps(sim.snapshot(), protocol=4))
    out = json.loads(invoke("whatif", str(path), "--scale", "batch=4", "--fit",
                            "--capacity", "2GiB", "--format", "json").stdout)
    fit = out["devices"][0]["fit"]
    ids = ["torch.micro_batch", "torch.inference_batch"]
    assert [k["id"] for k in fit["knobs"]] == ids, fit
    names = {x.id: x.knob for x in load_knobs()}
    assert all(k["knob"] == names[k["id"]] for k in fit["knobs"])
    words = invoke("whatif", str(path), "--scale", "batch=4", "--fit", "--capacity", "2GiB")
    said = " / ".join(f"{names[k]} ({k})" for k in ids)
    assert said in " ".join(words.stdout.split())
