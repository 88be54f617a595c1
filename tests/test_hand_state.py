"""Model state a program wrote itself (issue 67): the weights its own modules make in their
``__init__`` and the moments its own optimizer makes in its ``step`` are parameters and
optimizer state (inferred, by size and lifetime), not the program's own tensors; last step's
gradients that torch.optim's ``zero_grad`` frees at the window's start are gradients, not
``unknown``, in how memory got to the moment.

Checked against the simulator's ground truth (which address it made as what), never
against snapana's own output."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import snapana
from snapana.allocator_model.rules import round_size
from snapana.analysis.attribution.hand_state import Row, find
from snapana.session import Session
from snapana.synth.scenarios import write_snapshot
from snapana.synth.scenarios.handwritten import handwritten_train, weights

from .conftest import SNAPSHOTS, raw_load


def _synth(tmp: Path, **kw: object) -> tuple[snapana.api.Analysis, dict]:
    path, truth = write_snapshot(*handwritten_train(**kw), tmp / "hand.pickle")  # type: ignore[arg-type]
    return snapana.load(path), json.loads(truth.read_text())["facts"]


def _addresses(blocks: pl.DataFrame, family: str) -> set[int]:
    return set(blocks.filter(pl.col("family") == family)["address"].to_list())


@pytest.mark.parametrize(("per", "steps"), [(2, 2), (1, 3)], ids=["adam", "momentum-sgd"])
def test_hand_written_parameters_and_moments(tmp_path: Path, per: int, steps: int) -> None:
    """At the end, the blocks named parameters are the weights the program's own __init__
    made, those named optimizer_state the moments its own step made (per_parameter per
    weight); both said to be inferred, and why."""
    a, facts = _synth(tmp_path, per_parameter=per, steps=steps)
    blocks = a.at(moment="end").blocks
    assert len(facts["moments"]) == per * len(facts["params"]) == per * len(weights())
    assert _addresses(blocks, "parameters") == set(facts["params"])
    assert _addresses(blocks, "optimizer_state") == set(facts["moments"])
    assert _addresses(blocks, "gradients") == set(facts["grads"])
    assert "user_tensors" not in blocks["family"].to_list()
    state = blocks.filter(pl.col("family") == "optimizer_state")
    params = blocks.filter(pl.col("family") == "parameters")
    assert set(state["evidence"].to_list()) == set(params["evidence"].to_list()) == {"inferred"}
    assert all(r.startswith(f"inferred: {per} blocks per weight size")
               and "the program's own code, in its own step function" in r
               for r in state["reason"].to_list())
    assert all(r.startswith("inferred: made by the program's own code before the window's "
                            "first gradient") for r in params["reason"].to_list())


def test_moments_need_one_count_per_parameter(tmp_path: Path) -> None:
    """The program's own blocks made after the backward are state only when every weight
    size has the same number of them per weight: a moment dropped for one weight (two for
    most, one for it) leaves that size's blocks unnamed."""
    sizes = [4096, 8192, 16384]
    grads = {s: 2 for s in sizes}
    rows = [Row(s, "user_tensors", 1, True) for s in sizes for _ in range(2)]  # params
    rows += [Row(s, "user_tensors", 20, True) for s in sizes for _ in range(4)]  # 2 / weight
    found = find(rows, Counter(grads), first=10)
    assert {f.family for f in found.values()} == {"parameters", "optimizer_state"}
    rows.pop()  # one moment fewer for the last size: 3 blocks for its 2 weights
    found = find(rows, Counter(grads), first=10)
    assert {f.family for f in found.values()} == {"parameters"}


def test_last_steps_gradients_freed_by_zero_grad_are_gradients(tmp_path: Path) -> None:
    """Recorded from the second step on: torch.optim's zero_grad frees the first step's
    gradients (alive before recording, no frames) at the window's start. The timeline
    counts them as gradients from the start, not unknown, whatever the moment shown."""
    a, facts = _synth(tmp_path, zero_grad_late=True)
    timeline = a.device_report.timeline.families
    old = timeline.lifetimes.filter(pl.col("address").is_in(facts["old_grads"])
                                    & (pl.col("alloc_idx") < 0))
    assert old.height == len(facts["old_grads"]) == len(weights())
    assert set(old["family"].to_list()) == {"gradients"}
    growth = {g.family: g for g in timeline.growth(a.moment.idx, a.moment.idx)}
    # exactly the truth's blocks (in the replay's block sizes: the allocator's rounding)
    assert growth["gradients"].start_bytes == int(old["size"].sum())
    assert int(old["size"].sum()) >= sum(round_size(n) for n in weights())
    assert "unknown" not in growth or growth["unknown"].start_bytes == 0
    assert "gradients: " in a.summary() and "unknown: " not in a.summary()


# --- real captures ----------------------------------------------------------------------

def _program_made_kept(path: Path) -> set[int]:
    """Independently of snapana: the blocks live at the end that the window made by stacks
    with no frame of torch or an installed library (the program's own code) and never freed:
    the only blocks the hand-written state can be."""
    snap = raw_load(path)
    trace = snap["device_traces"][0]
    made: dict[int, dict] = {}
    for e in trace:
        if e["action"] == "alloc":
            made[e["addr"]] = e
        elif e["action"] in ("free_requested", "free_completed"):
            made.pop(e["addr"], None)
    own = {a for a, e in made.items() if e.get("frames") and all(
        "/torch/" not in f["filename"].replace("\\", "/") and "-packages/" not in f["filename"]
        for f in e["frames"] if f["filename"].endswith(".py"))}
    return own


#: CS336 training captures: torch.optim-wrapped hand-written AdamW (kkaitlyn111, Wedsonlin,
#: notHanmin), the program's own AdamW under the wrapper (bcrafton), no optimizer (MAGMA27)
TRAINING = ["kkaitlyn111+cs336-a2-systems__memory_files_memory_ctx512_fullstep_.pickle",
            "kkaitlyn111+cs336-a2-systems__memory_files_memory_ctx256_fullstep_.pickle",
            "Wedsonlin+assignment2-systems__results_medium_512_training_memory_snapshot.pickle",
            "bcrafton+assignment2-systems__memory_snapshot.pickle",
            "notHanmin+assignment2-systems__memory_snapshot.pickle",
            "MAGMA27+assignment2-systems__memory_snapshot.pickle",
            "ZidongLiu+DeComFL__memory.pickle"]


def _corpus(name: str) -> Path:
    path = SNAPSHOTS / name
    if not path.exists():
        pytest.skip(f"corpus capture {name} absent")
    return path


@pytest.mark.corpus
@pytest.mark.parametrize("name", TRAINING)
def test_corpus_hand_state_only_on_the_programs_own_blocks(name: str) -> None:
    """On real captures the rule was not written from, what the hand-written-state methods
    name at the end is among the blocks the raw trace shows the program's own code made and
    kept (none of these programs builds its optimizer state outside torch.optim's wrapper
    with a gradient to mirror, so nothing is named)."""
    path = _corpus(name)
    blocks = snapana.load(path).at(moment="end").blocks
    named = set(blocks.filter(pl.col("method").str.starts_with("size-mirror:hand"))
                ["address"].to_list())
    assert named <= _program_made_kept(path)
    assert named == set()


@pytest.mark.corpus
def test_corpus_zero_grad_frees_last_steps_gradients() -> None:
    """notHanmin's step: optimizer.zero_grad (torch/optim/optimizer.py) frees the gradients
    of the step before recording (no alloc event) after the forward. Recounted from the raw
    trace: the timeline calls exactly those gradients from the start, shown at the end
    (after they are freed) as at the peak."""
    path = _corpus("notHanmin+assignment2-systems__memory_snapshot.pickle")
    trace = raw_load(path)["device_traces"][0]
    first: dict[int, dict] = {}
    for e in trace:
        if e["action"] in ("alloc", "free_requested"):
            first.setdefault(e["addr"], e)
    by_zero_grad = {a: e["size"] for a, e in first.items() if e["action"] == "free_requested"
                    and any(f["name"] == "zero_grad" and f["filename"].replace("\\", "/")
                            .endswith("torch/optim/optimizer.py") for f in e["frames"])}
    assert len(by_zero_grad) > 100
    for moment in ("end", "peak"):
        timeline = Session.open(path, at=moment).report.timeline.families
        assert timeline is not None
        old = timeline.lifetimes.filter((pl.col("alloc_idx") < 0)
                                        & pl.col("address").is_in(list(by_zero_grad)))
        assert old.height == len(by_zero_grad)
        assert set(old["family"].to_list()) == {"gradients"}


# --- parameters re-bound every step ---------------------------------------------------------

@pytest.mark.parametrize(("per", "wrapped"), [(0, False), (2, False), (1, True), (2, True)],
                         ids=["sgd", "adam", "momentum-wrapped", "adam-wrapped"])
def test_rebound_parameters_are_parameters(tmp_path: Path, per: int, wrapped: bool) -> None:
    """`p.data = p - lr * g` every step: the weights held at the end were made in the last
    step, each made before the same function freed the old block of its size. They are
    named parameters (inferred, by that lifetime), the moments (if any) optimizer state, and
    neither is left to the program's own tensors, the torch.optim wrapper's rule or the
    momentum-SGD reading of one block per weight."""
    a, facts = _synth(tmp_path, per_parameter=per, steps=3, out_of_place=True,
                      wrapped=wrapped)
    blocks = a.at(moment="end").blocks
    assert len(facts["params"]) == len(weights())
    assert _addresses(blocks, "parameters") == set(facts["params"])
    assert _addresses(blocks, "optimizer_state") == set(facts["moments"])
    assert len(facts["moments"]) == per * len(weights())
    params = blocks.filter(pl.col("family") == "parameters")
    assert set(params["evidence"].to_list()) == {"inferred"}
    assert all("the same function freed in the same step" in r
               for r in params["reason"].to_list())
    assert "user_tensors" not in blocks["family"].to_list()


REBIND_LINE = 31  # handwritten.py: the step's `p.data = p - lr * g` line


def test_rebound_parameters_in_the_timeline(tmp_path: Path) -> None:
    """Every step's new weights are parameters, at the peak (inside the last update) as at
    the end, and in the window's timeline: its parameters' bytes are the attribution's at
    the peak, the weights' at the end, and between them the weights' plus at most the one
    being replaced."""
    a, facts = _synth(tmp_path, per_parameter=0, steps=3, out_of_place=True)
    end = a.at(moment="end").blocks
    weights_bytes = int(end.filter(pl.col("address").is_in(facts["params"]))["size"].sum())
    assert weights_bytes >= sum(round_size(n) for n in weights())
    # the peak falls inside an update: the weight being replaced and its replacement are
    # both held, each made by the simulator as a parameter (the rebinding line of the step)
    peak = a.at(moment="peak").blocks
    rebinding = peak.filter(pl.col("site").str.ends_with(f"optim.py:{REBIND_LINE} step"))
    assert rebinding.height and set(rebinding["family"].to_list()) == {"parameters"}
    timeline = a.device_report.timeline.families
    n = a.replay.n_events
    series = timeline.bytes_at("parameters", np.arange(n))
    assert int(series[a.moment.idx]) == int(
        peak.filter(pl.col("family") == "parameters")["size"].sum())
    assert int(series[n - 1]) == weights_bytes
    # from the peak on (the last step: every weight held was made by a step's update), the
    # parameters' requested bytes are the weights' plus at most the one being replaced
    spans = timeline.spans.filter(pl.col("family") == "parameters")
    for e in range(a.moment.idx, n):
        held = spans.filter((pl.col("start") <= e) & (pl.col("end") > e))
        got = int(held["requested_size"].sum())
        assert sum(weights()) <= got <= sum(weights()) + max(weights()), e


def test_state_updated_out_of_place_is_no_parameter() -> None:
    """An optimizer that replaces its moments out of place swaps them like re-bound
    weights, but their chains begin in its first step (after the first gradient), not
    before it: only the chain begun by a block made before the first gradient is a
    parameter; a gradient freed (zero_grad) pairs with nothing; a temporary of the step
    replaces nothing."""
    from snapana.analysis.attribution.hand_state import Event, rebound_roots

    step = ("/w/optim.py", "step")
    ev = [Event(0, True, 100, 64, False, ("/w/model.py", "__init__")),   # the weight
          Event(1, True, 200, 64, True, None),                             # its gradient
          Event(2, True, 300, 64, False, step),                            # moment, step 1
          Event(3, True, 400, 64, False, step),                            # lr * g
          Event(4, True, 500, 64, False, step),                            # the new weight
          Event(5, False, 400, 64, False, step),                           # lr * g freed
          Event(6, False, 100, 64, False, step),                           # old weight freed
          Event(7, False, 200, 64, False, ("/torch/optim/optimizer.py", "zero_grad")),
          Event(8, True, 201, 64, True, None),                             # next gradient
          Event(9, True, 600, 64, False, step),                            # new moment
          Event(10, True, 700, 64, False, step),                           # new weight
          Event(11, False, 500, 64, False, step),                          # old weight freed
          Event(12, False, 300, 64, False, step)]                          # old moment freed
    roots, replaced = rebound_roots(ev)
    assert roots == {4: 0, 10: 0, 9: 2}
    assert replaced == {0, 4, 2}
    rows = [Row(64, "user_tensors", 10, True, root=0), Row(64, "user_tensors", 9, True, root=2)]
    grads = Counter({64: 1, 128: 1, 256: 1})
    rows += [Row(n, "user_tensors", 10, True, root=0) for n in (128, 256)]
    found = find(rows, grads, first=1)
    assert {i for i, f in found.items() if f.family == "parameters"} == {0, 2, 3}
    assert 1 not in found or found[1].family != "parameters"
