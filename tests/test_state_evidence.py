"""Model state told by its structure (issue 67): a snapshot with no frames and no history
whose sizes are each held k times over (parameters, gradients, optimizer moments) with a
cuBLAS workspace per thread says it trains; state the program's own step replaces out of
place (a new tensor per parameter, the old one freed right after) is an optimizer step, its
temporaries the step's, and its free in-place fix the first knob.

Checked against the simulator's ground truth (what it made as what) and against figures
recomputed from the raw captures, never against snapanas own output."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import polars as pl
import pytest
import snapana
from snapana.analysis.attribution.state_copies import held_copies, spec
from snapana.session import Session
from snapana.synth.scenarios import write_snapshot
from snapana.synth.scenarios.handwritten import CUBLAS_WORKSPACE, handwritten_train, weights
from snapana.synth.scenarios.zeroth_order import zeroth_order

from .conftest import SNAPSHOTS, invoke, raw_load


def _workload(path: Path) -> tuple[str | None, dict]:
    got = invoke("summary", "--format", "json", str(path))
    assert got.returncode == 0, got.stderr
    d = json.loads(got.stdout)["devices"][0]["diagnosis"]
    return d["workload"], d


# --- copies of model state in a snapshot without history ------------------------------------

@pytest.mark.parametrize("per", [2, 1], ids=["adam", "momentum-sgd"])
def test_state_only_training_snapshot_says_it_trains(tmp_path: Path, per: int) -> None:
    """A hand-written model and optimizer after its steps, dumped with no history: every
    block is frame-less, but each weight size is held 2 + per times (the simulator made
    them as parameters, gradients and moments) and two cuBLAS workspaces (the forward's
    thread, the autograd engine's): the workload is training."""
    snap, truth = handwritten_train(steps=2, per_parameter=per, workspaces=True,
                                    no_history=True)
    path, _ = write_snapshot(snap, truth, tmp_path / "state.pickle")
    assert snap["device_traces"] == [[]]
    made = Counter(b["family"] for b in truth["blocks"])  # type: ignore[union-attr]
    assert made["parameters"] == made["gradients"] == len(weights())
    assert made["optimizer_state"] == per * len(weights())
    assert made["workspace"] == 2
    got, d = _workload(path)
    assert got == truth["facts"]["workload"] == "training"  # type: ignore[index]
    assert f"a multiple of {2 + per} times" in d["workload_statement"]


def test_state_only_without_the_backwards_workspace_is_not_decided(tmp_path: Path) -> None:
    """The same sizes without the second workspace: sizes alone match a layered model's
    buffers as well, so nothing is decided."""
    snap, truth = handwritten_train(steps=2, per_parameter=2, no_history=True)
    path, _ = write_snapshot(snap, truth, tmp_path / "state.pickle")
    assert _workload(path)[0] is None


def test_held_copies_need_a_model_held_k_times() -> None:
    """By construction: a model's sizes (an embedding held once, layers repeating) held 4
    times with two workspaces are copies; held once (inference), held 4 × 24 times by a
    24-layer engine with no single weight, or with one workspace, they are not; a tensor
    size that is also a workspace's but held many times is a tensor's."""
    model = [n for n in weights() if n >= spec().min_bytes]
    two = [CUBLAS_WORKSPACE] * 2
    assert held_copies(model * 4 + two)
    assert not held_copies(model + two)
    assert not held_copies(model * 4 + two[:1])
    layered = [n for n in weights()[1:] if n >= spec().min_bytes]
    assert not held_copies(layered * 4 * 24 + two)
    assert not held_copies(model * 4 + [33554432] * 96 + [CUBLAS_WORKSPACE])


def _sizes_held(path: Path) -> Counter[int]:
    snap = raw_load(path)
    return Counter(int(b["requested_size"]) for seg in snap["segments"] for b in seg["blocks"]
                   if b["state"] == "active_allocated")


def test_corpus_voxelflex_state_only_training() -> None:
    """Felixburton7/voxelflex d58159b (written from it): 240 frame-less blocks, every weight
    size ≥ 4 KiB held a multiple of 4 times and two 8519680 B blocks, recomputed from the raw
    pickle: training. Its c5c1ba2 capture (one copy of the model, one workspace) and
    llm-1.3b-no-history (a 24-layer inference engine's sizes, multiples of 4, one
    workspace), both not written from, stay undecided or inference."""
    path = SNAPSHOTS / "Felixburton7+voxelflex__dump_snapshot.pickle__d58159b"
    if not path.exists():
        pytest.skip("corpus capture absent")
    held = _sizes_held(path)
    assert held[CUBLAS_WORKSPACE] == 2
    big = {n: c for n, c in held.items() if n >= 4096 and n != CUBLAS_WORKSPACE}
    assert len(big) >= 4 and all(c % 4 == 0 for c in big.values())
    assert _workload(path)[0] == "training"
    for name in ("Felixburton7+voxelflex__dump_snapshot.pickle__c5c1ba2",
                 "llm-1.3b-no-history.pickle"):
        other = SNAPSHOTS / name
        if other.exists():
            assert _workload(other)[0] in (None, "undetermined", "inference"), name


# --- state replaced out of place by the program's own step ---------------------------------

def test_zeroth_order_state_update(tmp_path: Path) -> None:
    """The simulator's zeroth-order job: at the peak (the largest parameter's K update) the
    blocks named optimizer_temporaries are exactly the update's temporaries the simulator
    made and that are live then; the new state tensor is made in the optimizer phase and
    stays the program's own (no torch.optim state to name); the state made in __init__ is
    neither parameters nor optimizer_state."""
    path, tpath = write_snapshot(*zeroth_order(), tmp_path / "zo.pickle")
    facts = json.loads(tpath.read_text())["facts"]
    a = snapana.load(path)
    peak = a.at(moment="peak").blocks
    temps = set(facts["temporary_events"])
    named = peak.filter(pl.col("family") == "optimizer_temporaries")
    made = peak.filter(pl.col("alloc_idx").is_in(list(temps)))
    assert made.height >= 4  # the largest parameter's four, live at the peak
    assert set(named["alloc_idx"].to_list()) == set(made["alloc_idx"].to_list())
    assert set(named["phase"].to_list()) == {"optimizer"}
    new = peak.filter(pl.col("alloc_idx").is_in(facts["state_events"]))
    assert new.height and set(new["family"].to_list()) == {"user_tensors"}
    assert set(new["phase"].to_list()) == {"optimizer"}
    assert "optimizer_state" not in peak["family"].to_list()
    end = a.at(moment="end").blocks
    state = end.filter(pl.col("address").is_in(facts["state"]))
    assert state.height == len(weights()) and set(state["family"].to_list()) == {"user_tensors"}
    assert "optimizer_temporaries" not in end["family"].to_list()


def test_corpus_decomfl_out_of_place_update() -> None:
    """ZidongLiu/DeComFL (written from it): recomputed from the raw trace, the blocks live at
    the peak that the window made under the program's own K update and frees later are the
    update's temporaries; snapana names exactly those optimizer_temporaries, says the peak
    is an optimizer step and offers the in-place update first."""
    path = SNAPSHOTS / "ZidongLiu+DeComFL__memory.pickle"
    if not path.exists():
        pytest.skip("corpus capture absent")
    s = Session.open(path)
    peak = s.moment.idx
    trace = raw_load(path)["device_traces"][0]
    live: dict[int, tuple[int, bool]] = {}
    for i, e in enumerate(trace[:peak + 1]):
        if e["action"] == "alloc":
            under = any(f["name"] == "update_K_param_paramwise" for f in e["frames"])
            live[e["addr"]] = (i, under)
        elif e["action"] == "free_requested":
            live.pop(e["addr"], None)
    freed_later = {e["addr"] for e in trace[peak + 1:] if e["action"] == "free_requested"}
    want = {i for addr, (i, under) in live.items() if under and addr in freed_later}
    assert len(want) == 4
    blocks = s.attributed_blocks(s.moment)
    named = blocks.filter(pl.col("family") == "optimizer_temporaries")
    assert set(named["alloc_idx"].to_list()) == want
    d = s.report.diagnosis
    assert d.phase == "optimizer"
    assert d.knobs[0].id == "torch.own_optimizer_in_place"
