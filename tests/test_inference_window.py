"""Inference that depends on what the window does, against simulated ground truth.

Sibling captures of one program (fp32 / mixed precision, recording begun at different
points) must give the same family to the same sizes with the same lifetimes, and `diff` on
them must invent no change; an inference window keeps the model's weights; an adapter
fine-tune's frozen base weights survive a backward that gives them no gradient; every
frameless block no method names is labelled with what is known about it; blocks whose
allocation fell out of the trace are worded so, not as predating recording."""

from __future__ import annotations

import pickle
from collections import Counter
from pathlib import Path

import polars as pl
import pytest
import snapana
from snapana.allocator_model.simulator import CachingAllocatorSim
from snapana.errors import InputError
from snapana.render.wording import growth_lines
from snapana.synth.recording import ring_buffer, start_late

from .conftest import corpus_params

MiB = 1 << 20
TORCH = "/usr/lib/python3/site-packages/torch"
HF = "/usr/lib/python3/site-packages/transformers"
INIT = ((f"{TORCH}/nn/modules/linear.py", 106, "__init__"), ("/work/model.py", 12, "__init__"),
        ("/work/train.py", 8, "main"))
FORWARD = (("/work/model.py", 40, "forward"), (f"{TORCH}/nn/modules/module.py", 1750,
                                                "_call_impl"), ("/work/train.py", 20, "main"))
OPT = ((f"{TORCH}/optim/adamw.py", 160, "_init_group"),
       (f"{TORCH}/optim/optimizer.py", 533, "wrapper"), ("/work/train.py", 30, "main"))
ZERO = ((f"{TORCH}/optim/optimizer.py", 980, "zero_grad"), ("/work/train.py", 32, "main"))
#: `model.generate(...)`: transformers' generate is decorated @torch.no_grad(), which torch
#: runs through `torch/utils/_contextlib.py` decorate_context
GENERATE = (("/work/model.py", 40, "forward"),
            (f"{TORCH}/nn/modules/module.py", 1750, "_call_impl"),
            (f"{HF}/generation/utils.py", 2460, "_sample"),
            (f"{HF}/generation/utils.py", 2215, "generate"),
            (f"{TORCH}/utils/_contextlib.py", 116, "decorate_context"),
            ("/work/infer.py", 20, "main"))
LAYERS = 4
#: one layer of a small transformer-ish model (q, k, v, o, mlp up, mlp down, two norms)
LAYER = [4 * MiB, 4 * MiB, 4 * MiB, 4 * MiB, 6 * MiB, 6 * MiB, 16 * 1024, 16 * 1024]
WEIGHTS = [8 * MiB] + LAYER * LAYERS + [16 * 1024]  # embedding, layers, final norm
#: what one layer's forward saves for the backward (batch x sequence x width: other sizes)
ACTS = [3 * MiB, 3 * MiB, 12 * MiB, 5 * MiB, 24 * 1024] * LAYERS
#: LoRA adapters on two projections per layer: A (r x in), B (out x r), fp32
ADAPTERS = [32 * 1024, 40 * 1024, 32 * 1024, 48 * 1024] * LAYERS


def _save(tmp_path: Path, snapshot: dict, name: str) -> Path:
    path = tmp_path / f"{name}.pickle"
    path.write_bytes(pickle.dumps(snapshot, protocol=4))
    return path


def _at_end(path: Path) -> pl.DataFrame:
    return snapana.load(path).at(moment="end").blocks.filter(
        pl.col("state") == "active_allocated")


class Training:
    """A training job: AdamW, gradients on the autograd thread (no frames), zero_grad with
    set_to_none. `mixed`: activations in half precision and autocast's half-precision copies
    of the weights, which are cached for the backward; weights, gradients and state fp32."""

    def __init__(self, steps: int, mixed: bool, adapters: bool = False) -> None:
        self.sim = sim = CachingAllocatorSim(80 * 1024 * MiB)
        self.marks: dict[str, int] = {}
        self.truth: dict[int, str] = {}
        base = [sim.malloc(s, INIT, family="parameters") for s in WEIGHTS]
        trained = WEIGHTS
        if adapters:  # the base model is frozen: only the adapters get gradients
            trained = ADAPTERS
            base += [sim.malloc(s, INIT, family="parameters") for s in ADAPTERS]
        self.marks["after_model"] = len(sim.trace)
        shrink = 2 if mixed else 1
        states: list[int] = []
        for step in range(steps):
            saved = [sim.malloc(s // shrink, FORWARD, family="saved_activations")
                     for s in ACTS]
            if mixed:
                saved += [sim.malloc(s // 2, FORWARD, family="saved_activations")
                          for s in WEIGHTS]
            grads = []
            for s in reversed(trained):
                grads.append(sim.malloc(s, None, family="gradients"))  # autograd thread
            for a in reversed(saved):
                sim.free(a)
            if not states:
                with sim.annotate("Optimizer.step#AdamW.step"):
                    states = [sim.malloc(s, OPT, family="optimizer_state")
                              for s in trained for _ in range(2)]
            if step == 0:
                self.marks["after_first_step"] = len(sim.trace)
            if step < steps - 1:
                for g in grads:
                    sim.free(g, ZERO)
        self.truth = {b.address: b.family for b in sim.live_blocks()}


def _per_size(blocks: pl.DataFrame) -> dict[int, Counter[str]]:
    """The families the blocks of each requested size got, counted."""
    out: dict[int, Counter[str]] = {}
    for size, family in blocks.select("requested_size", "family").iter_rows():
        out.setdefault(int(size), Counter())[family] += 1
    return out


def test_sibling_captures_give_the_same_family_per_size_and_lifetime(tmp_path: Path) -> None:
    """fp32 recorded from after the model was built, and mixed precision recorded from after
    the first optimizer step: at the end both hold the model state (every block alive since
    the first step and never freed); every size gets the same families in the same numbers
    in both, and those of the truth."""
    fp32 = Training(steps=3, mixed=False)
    mixed = Training(steps=3, mixed=True)
    a = _at_end(_save(tmp_path, start_late(fp32.sim.snapshot(), fp32.marks["after_model"]),
                      "fp32"))
    b = _at_end(_save(tmp_path, start_late(mixed.sim.snapshot(),
                                           mixed.marks["after_first_step"]), "mixed"))
    assert a.filter(pl.col("family") == "unknown").is_empty()
    assert b.filter(pl.col("family") == "unknown").is_empty()
    truth_a = _per_size(a.with_columns(pl.col("address").replace_strict(
        fp32.truth, return_dtype=pl.Utf8).alias("family")))
    assert _per_size(a) == _per_size(b) == truth_a
    # the model state both name without frames says how
    for blocks in (a, b):
        inferred = blocks.filter((pl.col("evidence") == "inferred")
                                 & (pl.col("family") != "gradients"))
        assert not inferred.is_empty()
        assert all(m.startswith("size-mirror:") for m in inferred["method"])


def test_diff_of_sibling_captures_invents_no_change(tmp_path: Path) -> None:
    """`diff` of the two captures at the same point of the program (the end): the model
    state families are equal, nothing is new or gone, no unknown appears."""
    fp32 = Training(steps=3, mixed=False)
    mixed = Training(steps=3, mixed=True)
    before = snapana.load(_save(tmp_path, start_late(fp32.sim.snapshot(),
                                                     fp32.marks["after_model"]), "fp32"))
    after = snapana.load(_save(tmp_path, start_late(mixed.sim.snapshot(),
                                                    mixed.marks["after_first_step"]),
                               "mixed"))
    held = before.blocks  # at its moment of interest (the peak), as the diff compares
    fams = before.diff(after).families
    for family in ("parameters", "gradients", "optimizer_state"):
        row = fams.filter(pl.col("family") == family)
        want = int(held.filter(pl.col("family") == family)["size"].sum())
        if family != "gradients":
            assert want > 0, family
        if not want:
            assert row.is_empty() or row["after"][0] == 0, family
            continue
        assert row.height == 1, family
        assert row["before"][0] == row["after"][0] == want, family
        assert row["change"][0] == 0 and row["status"][0] not in ("new", "gone"), family
    assert fams.filter((pl.col("family") == "unknown") & (pl.col("after") > 0)).is_empty()


class Generation:
    """Inference: weights loaded before recording, then `tokens` decoding steps, each
    allocating and freeing its temporaries; `prompt` is an input tensor put on the device
    before recording. `no_grad_frames`: the steps run under `generate` (no autograd).
    `kept_sizes`: each step also keeps blocks of these sizes (a forward that saves them)."""

    def __init__(self, tokens: int, no_grad_frames: bool = True,
                 kept_sizes: tuple[int, ...] = (), frameless: int = 0) -> None:
        self.sim = sim = CachingAllocatorSim(80 * 1024 * MiB)
        for s in WEIGHTS:
            sim.malloc(s, INIT, family="parameters")
        self.prompt = sim.malloc(12 * 1024, INIT[-1:], family="inputs")
        self.mark = len(sim.trace)
        stack = GENERATE if no_grad_frames else FORWARD
        for _ in range(tokens):
            for s in kept_sizes:
                sim.malloc(s, stack, family="saved_activations")
            if frameless:  # a thread without a Python stack (no autograd thread here)
                sim.malloc(frameless, None, family="unknown")
            tmp = [sim.malloc(s, stack, family="activation_temporaries")
                   for s in (96 * 1024, 256 * 1024, 96 * 1024)]
            for t in tmp:
                sim.free(t)


def test_inference_window_names_the_weights_it_keeps(tmp_path: Path) -> None:
    """No backward, no optimizer step, a window under `generate` (no autograd): the blocks
    held since before recording in layer-repeating sizes are the weights (inferred, with
    why); the one-off input stays unknown, labelled."""
    run = Generation(tokens=5, frameless=20 * 1024)  # too few allocations for a steady loop
    blocks = _at_end(_save(tmp_path, start_late(run.sim.snapshot(), run.mark), "gen"))
    params = blocks.filter(pl.col("family") == "parameters")
    assert params.height == sum(1 for s in WEIGHTS if WEIGHTS.count(s) >= 4)
    assert set(params["method"].to_list()) == {"lifetime:persistent-no-grad"}
    assert set(params["evidence"].to_list()) == {"inferred"}
    why = params["reason"][0]
    assert "`generate`" in why and "no backward" in why and "repeated per layer" in why
    # frameless allocations of a window with no backward are not called the autograd's
    late = blocks.filter((pl.col("alloc_idx") >= 0) & (pl.col("requested_size") == 20 * 1024))
    assert late.height == 5 and set(late["family"].to_list()) == {"unknown"}
    assert all("not by the autograd thread" in r for r in late["reason"].to_list())
    assert not any("during backward" in r for r in late["label"].to_list())
    prompt = blocks.filter(pl.col("address") == run.prompt)
    assert prompt["family"][0] == "unknown"
    assert "persistent since before recording" in prompt["reason"][0]
    assert "likely the model's weights" in prompt["label"][0]
    # no block got a family the truth contradicts
    truth = {b.address: b.family for b in run.sim.live_blocks()}
    for address, family in blocks.select("address", "family").iter_rows():
        assert family in (truth[address], "unknown")


def test_a_long_inference_window_agrees_with_a_short_one(tmp_path: Path) -> None:
    """The same program recorded longer (a steady loop) names the same blocks the same."""
    short, long = Generation(tokens=5), Generation(tokens=60)
    a = _at_end(_save(tmp_path, start_late(short.sim.snapshot(), short.mark), "short"))
    b = _at_end(_save(tmp_path, start_late(long.sim.snapshot(), long.mark), "long"))
    named = b.filter(pl.col("requested_size").is_in(
        a.filter(pl.col("family") == "parameters")["requested_size"].to_list()))
    assert set(named["family"].to_list()) == {"parameters"}


def test_a_forward_window_that_allocates_none_of_their_sizes_names_the_weights(
        tmp_path: Path) -> None:
    """No frames say the window runs without autograd, but it is a recorded forward whose
    allocations have none of the layer-repeating sizes held since before recording: no
    forward it continued left those (its later layers would allocate them again)."""
    run = Generation(tokens=8, no_grad_frames=False)
    blocks = _at_end(_save(tmp_path, start_late(run.sim.snapshot(), run.mark), "fwd"))
    params = blocks.filter(pl.col("family") == "parameters")
    assert set(params["method"].to_list()) == {"lifetime:persistent-forward"}
    assert params.height == sum(1 for s in WEIGHTS if WEIGHTS.count(s) >= 4)
    assert "allocates none of those sizes" in params["reason"][0]


def test_a_forward_that_keeps_the_weights_sizes_leaves_them_a_labelled_unknown(
        tmp_path: Path) -> None:
    """The same window keeping blocks of the weights' sizes (a forward that saves
    activations, which could have begun before recording): nothing is named, everything
    held since before recording is labelled "persistent since before recording; ... likely
    the model's weights"."""
    run = Generation(tokens=8, no_grad_frames=False, kept_sizes=(4 * MiB, 6 * MiB, 16 * 1024))
    blocks = _at_end(_save(tmp_path, start_late(run.sim.snapshot(), run.mark), "keeps"))
    early = blocks.filter(pl.col("alloc_idx") < 0)
    assert set(early["family"].to_list()) == {"unknown"}
    for label in early["label"].to_list():
        assert "persistent since before recording" in label
        assert "likely the model's weights" in label


def test_adapter_fine_tune_frozen_base_weights(tmp_path: Path) -> None:
    """LoRA: recording begins after the first step. The base weights survive the backward
    and no gradient mirrors them: parameters (frozen-weights); the adapters and their AdamW
    state mirror the gradients. No block gets a family the truth contradicts."""
    run = Training(steps=3, mixed=False, adapters=True)
    blocks = _at_end(_save(tmp_path, start_late(run.sim.snapshot(),
                                                run.marks["after_first_step"]), "lora"))
    wrong = [(a, run.truth[a], f) for a, f in blocks.select("address", "family").iter_rows()
             if f not in (run.truth[a], "unknown")
             and {f, run.truth[a]} != {"parameters", "optimizer_state"}]
    assert not wrong
    frozen = blocks.filter(pl.col("method") == "lifetime:frozen-weights")
    layered = {s for s in WEIGHTS if WEIGHTS.count(s) >= 4}
    assert set(frozen["requested_size"].to_list()) == layered
    assert "frozen" in frozen["reason"][0] and "backward" in frozen["reason"][0]
    mirrored = blocks.filter(pl.col("method").str.starts_with("size-mirror:"))
    assert set(mirrored["requested_size"].to_list()) == set(ADAPTERS)
    # the embedding (one block, its size repeats nowhere) is labelled, not named
    embedding = blocks.filter(pl.col("requested_size") == 8 * MiB)
    assert embedding["family"].to_list() == ["unknown"]
    assert "no gradient of the window mirrors it" in embedding["reason"][0]


def test_every_frameless_unknown_is_labelled(tmp_path: Path) -> None:
    """Across these captures, no frameless unknown block is left with a bare reason."""
    runs = [(Generation(tokens=5, no_grad_frames=False, kept_sizes=(4 * MiB,)), None),
            (Training(steps=2, mixed=True, adapters=True), "after_first_step"),
            (Training(steps=1, mixed=False), "after_model")]
    bare = {"no rule matched (no frames)", "no frames: allocated before recording began"}
    for k, (run, mark) in enumerate(runs):
        first = run.mark if mark is None else run.marks[mark]  # type: ignore[attr-defined]
        path = _save(tmp_path, start_late(run.sim.snapshot(), first), f"run{k}")
        blocks = snapana.load(path).blocks
        for reason, sid in blocks.filter(pl.col("family") == "unknown").select(
                "reason", "stack_id").iter_rows():
            if not snapana.load(path).stack(sid):
                assert not any(reason.endswith(b) for b in bare), reason


def test_allocations_lost_from_the_trace_are_not_called_pre_recording(
        tmp_path: Path) -> None:
    """A wrapped ring buffer: the optimizer state (allocated in the first step, with frames)
    lost its allocation event. Its family comes from its frames and the summary says its
    allocation events are not in the trace, not that it predates recording."""
    run = Training(steps=3, mixed=False)
    trace = run.sim.snapshot()["device_traces"][0]
    path = _save(tmp_path, ring_buffer(run.sim.snapshot(), len(trace) // 3), "wrapped")
    a = snapana.load(path)
    state = a.blocks.filter(pl.col("family") == "optimizer_state")
    assert not state.is_empty() and set(state["evidence"].to_list()) == {"frames"}
    assert (state["alloc_idx"] < 0).all()
    line = next(g for g in growth_lines(a.device_report)
                if g.startswith("optimizer_state"))
    assert "allocation events are not in the trace" in line and "max_entries" in line
    assert "before recording began" not in line


def test_without_history_layered_blocks_say_likely_weights_but_stay_unknown(
        tmp_path: Path) -> None:
    """No trace entries at all: nothing is named; the blocks whose sizes repeat like a
    layered model's weights say so in their label, the rest keep "no allocation history"."""
    run = Generation(tokens=2)
    snap = start_late(run.sim.snapshot(), len(run.sim.trace))  # every entry dropped
    blocks = _at_end(_save(tmp_path, snap, "nohistory"))
    assert set(blocks["family"].to_list()) == {"unknown"}
    layered = {s for s in WEIGHTS if WEIGHTS.count(s) >= 4}
    for size, label in blocks.select("requested_size", "label").iter_rows():
        assert "no allocation history was recorded" in label
        assert ("likely the model's weights" in label) == (size in layered), (size, label)


#: what a frameless unknown block must never be left with: words that say nothing of it
BARE = ("no rule matched (no frames)", "no frames: allocated before recording began")


@pytest.mark.parametrize("path", corpus_params("torch_snapshots"))
def test_every_frameless_unknown_of_a_corpus_capture_is_labelled(path: Path) -> None:
    """On every real capture: each frameless block left unknown says what is known about it
    (persistent since before recording, freed in the window, no history recorded, likely
    the model's weights, ...), and every inferred one says how (a method and its why)."""
    try:
        a = snapana.load(path)
    except InputError as exc:  # the boundary's own corpus test counts refusals
        pytest.skip(f"refused at the boundary: {exc}")
    blocks = a.blocks
    frameless = blocks.filter(pl.col("stack_id").map_elements(
        lambda s: not a.stack(s), return_dtype=pl.Boolean))
    unknown = frameless.filter(pl.col("family") == "unknown")
    for reason, label in unknown.select("reason", "label").iter_rows():
        assert not reason.endswith(BARE) and not label.endswith(BARE), reason
    inferred = frameless.filter(pl.col("evidence") == "inferred")
    for method, reason in inferred.select("method", "reason").iter_rows():
        assert method and len(reason) > len(method), (method, reason)


def test_gib_sized_repeats_without_history_are_not_called_weights(tmp_path: Path) -> None:
    """A history-less dump at an OOM holding five 3.19 GiB, five 816 MiB and twelve 408 MiB
    blocks: sizes that repeat a few times, but a per-layer weight of several GiB is not
    plausible, so no block is labelled "likely the model's weights"."""
    sim = CachingAllocatorSim(capacity=80 * 1024 * MiB)
    sizes = [3264 * MiB] * 5 + [816 * MiB] * 5 + [408 * MiB] * 12
    for size in sizes:
        sim.malloc(size)
    snap = start_late(sim.snapshot(), len(sim.trace))  # every entry dropped: no history
    blocks = _at_end(_save(tmp_path, snap, "gib"))
    assert blocks.height == len(sizes)
    assert not any("likely the model's weights" in label for label in blocks["label"])
