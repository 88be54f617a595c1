"""Issue 67, workload evidence: a diffusion sampler whose guidance backpropagates to its latents
through frozen weights runs a backward and trains nothing. inference_mode would break the
guidance, and no knob made for a training step (micro-batches, checkpointing a step's
backward) applies. The attention outputs a forward hook keeps from its torch.no_grad forwards
are held by the program, not saved for a backward (no graph holds them). Each capture is
simulated (snapana.synth.scenarios.guided), so the truth is the simulator's, not snapana's."""

from __future__ import annotations

import pickle

import polars as pl
import pytest
from snapana.analysis.knobs import load_knobs
from snapana.session import sessions
from snapana.sources import load
from snapana.synth.scenarios.guided import guided_sampler

TRAINING_KNOBS = {k.id for k in load_knobs() if k.workload == "training"}


def _analyse(tmp_path, snap: dict, truth: dict):
    """Device 0's report and its blocks at the capture's end, on a card the end nearly fills
    (so the report prescribes knobs), with family and method."""
    path = tmp_path / "guided.pickle"
    path.write_bytes(pickle.dumps(snap, protocol=4))
    card = int(truth["reserved_bytes"]) + 64 * 2**20
    (s,) = sessions(load(path), at="end", capacity=card)
    return s.report, s.attributed_blocks(s.moment)


def _families(held: pl.DataFrame, addresses: list[int]) -> set[str]:
    got = held.filter(pl.col("address").is_in(addresses))
    assert got.height == len(addresses)
    return set(got["family"].to_list())


@pytest.mark.parametrize("history", [True, False])
def test_outputs_a_hook_keeps_from_no_grad_forwards_are_not_saved_activations(
        tmp_path, history) -> None:
    """The no_grad forwards' attention outputs, one per layer, all from one site: what the
    program's list holds (user_tensors), so no knob for saved activations is offered."""
    snap, truth = guided_sampler(history=history)
    r, held = _analyse(tmp_path, snap, truth)
    kept = truth["facts"]["kept_outputs"]
    assert kept and _families(held, kept) == {"user_tensors"}
    assert "saved_activations" not in held["family"].to_list()
    ids = [k.id for k in r.diagnosis.knobs]
    assert ids, "a state that must shrink gets knobs"
    assert "torch.inference_mode" not in ids and not TRAINING_KNOBS & set(ids), ids


def test_a_backward_to_the_latents_rules_out_training_knobs(tmp_path) -> None:
    """With history the guidance's backward shows (the autograd thread's allocations) and no
    parameter gradient or optimizer does: autograd ran, nothing trains. Not training, never
    inference_mode, and no training knob, even conditionally."""
    snap, truth = guided_sampler(history=True, graph_held=True)
    assert truth["facts"]["backward_ran"] and not truth["facts"]["trains"]
    r, held = _analyse(tmp_path, snap, truth)
    d = r.diagnosis
    assert d.workload != "training", d.evidence.workload
    assert "autograd_ran" in d.evidence.facts
    ids = [k.id for k in d.knobs]
    assert ids, "a state that must shrink gets knobs"
    assert "torch.inference_mode" not in ids and not TRAINING_KNOBS & set(ids), ids
    # the guided forward's graph is held for its backward: saved activations, many sites
    assert _families(held, truth["facts"]["graph"]) == {"saved_activations"}


def test_a_graph_kept_beside_graph_free_forwards_of_the_same_model_is_kept_on_purpose(
        tmp_path) -> None:
    """No history (the final state only): no backward shows. The unguided forwards' outputs
    are kept with no graph, while the same UNet called from the guided path keeps one: the
    program turns autograd off where it does not need it, so inference_mode is not offered
    for the graph it keeps, and nothing speaks for training."""
    snap, truth = guided_sampler(history=False, graph_held=True)
    r, held = _analyse(tmp_path, snap, truth)
    d = r.diagnosis
    assert _families(held, truth["facts"]["kept_outputs"]) == {"user_tensors"}
    assert _families(held, truth["facts"]["graph"]) == {"saved_activations"}
    assert d.workload == "inference", d.evidence.workload
    assert "graph_beside_no_graph" in d.evidence.facts
    ids = [k.id for k in d.knobs]
    assert ids, "a state that must shrink gets knobs"
    assert "torch.inference_mode" not in ids and not TRAINING_KNOBS & set(ids), ids


def test_outputs_a_graph_holds_stay_saved_activations(tmp_path) -> None:
    """The control: the same steps all with grad, no backward for the unguided half, so each
    forward's graph holds its attention outputs with everything else it saved (many sites):
    saved activations, not outputs kept by the program."""
    snap, truth = guided_sampler(history=False, no_grad=False)
    _, held = _analyse(tmp_path, snap, truth)
    assert not truth["facts"]["kept_outputs"]
    assert _families(held, truth["facts"]["graph"]) == {"saved_activations"}
