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
