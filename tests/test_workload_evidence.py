"""Issue 56, evidence hygiene: each workload fact counts only what proves it. A backward with
no parameter gradient or optimizer is autograd's (guidance, an attack, a benchmark), not a
training step's; a frameless allocation is in backward only where the trace places it there;
a forward's kept graph that the window drops without a backward was never trained; a
forward's tensors freed within the same forward were its temporaries, not activations saved
for a backward. Each capture is simulated (snapana.synth's allocator, or a profiler trace
written event by event), so the truth is the test's, not snapana's."""

from __future__ import annotations

import json
import pickle

import polars as pl
import pytest
from snapana.session import sessions
from snapana.sources import load
from snapana.synth import CachingAllocatorSim

from .test_source_kineto import _mem, _op, _trace_with

MiB = 2**20
SITE = "/usr/lib/python3.10/site-packages"
CALL = (f"{SITE}/torch/nn/modules/module.py", 1790, "_call_impl")
PARAMS = [(f"{SITE}/torch/nn/modules/module.py", 1174, "to"), ("/job/sample.py", 12, "main")]
#: the guidance's backward on the autograd thread (stacks="all": C++ frames only), as a real
#: capture of an img2img sampler guided by torch.autograd.grad shows it
AUTOGRAD_THREAD = ("", 0, "torch::autograd::Engine::thread_main(std::shared_ptr<"
                   "torch::autograd::GraphTask> const&)")
WORKSPACE = [("", 0, "at::cuda::getNewWorkspace()"),
             ("", 0, "at::cuda::getCurrentCUDABlasHandle()"),
             ("", 0, "torch::autograd::generated::AddmmBackward0::apply("
                     "std::vector<at::Tensor>&&)"), AUTOGRAD_THREAD]
ACCUMULATE = [("", 0, "torch::autograd::AccumulateGrad::apply(std::vector<at::Tensor>&&)"),
              AUTOGRAD_THREAD]


def _no_history(sim: CachingAllocatorSim) -> dict:
    """The snapshot as a dump taken with history off writes it: the final state only."""
    snap = sim.snapshot()
    snap["device_traces"] = [[]]
    return snap


def _analyse(tmp_path, snap: dict, name: str = "capture.pickle"):
    """The report of device 0 and its blocks at the moment, with family and phase."""
    path = tmp_path / name
    path.write_bytes(pickle.dumps(snap, protocol=4))
    (s,) = sessions(load(path))
    return s.report, s.attributed_blocks(s.moment)


@pytest.mark.parametrize("trains", [False, True])
def test_a_backward_alone_is_autograd_not_training(tmp_path, trains) -> None:
    """A guided sampler: frozen weights, a forward's outputs, and the 8 MiB cuBLAS workspace
    its guidance's backward made on the autograd thread (AddmmBackward0). No weight has a
    gradient, no optimizer shows: the workload is not "training" (autograd ran), and no
    training knob is offered as if it were. The same capture with parameter gradients made
    by AccumulateGrad trains."""
    sim = CachingAllocatorSim(capacity=16384 * MiB)
    for _ in range(6):
        sim.malloc(64 * MiB, PARAMS, family="parameters")
    unet = [("/job/unet.py", 40, "forward"), CALL, ("/job/pipeline.py", 300, "__call__"),
            ("/job/sample.py", 90, "run_img2img")]
    for _ in range(4):
        sim.malloc(32 * MiB, unet, family="saved_activations")
    sim.malloc(8 * MiB + 4096, WORKSPACE, family="workspace")
    if trains:
        for _ in range(6):
            sim.malloc(64 * MiB, ACCUMULATE, family="gradients")
    r, held = _analyse(tmp_path, _no_history(sim))
    d = r.diagnosis
    backward = held.filter(pl.col("family") == "workspace")
    assert backward["phase"].to_list() == ["backward"]  # the truth: the autograd thread made it
    if trains:
        assert d.workload == "training", d.evidence.workload
        return
    assert d.workload == "undetermined", d.evidence.workload
    assert "backward phase" in d.evidence.workload.sentence
    assert "no optimizer" in d.evidence.workload.sentence
    first = d.knobs[0] if d.knobs else None
    assert first is None or first.workload != "training" or "only if this job trains" in \
        d.applies[first.id], [(k.id, d.applies[k.id]) for k in d.knobs]


def _profiled_forward(tmp_path, *, backward: bool = False, step: bool = False):
    """A CPU profiler trace (profile_memory, no stacks) of one forward: conv / batch-norm
    outputs allocated inside their ops, kept (grad mode on), and a few small allocations
    outside any op, as the profiler records them. `backward`: a backward op follows and
    frees them; `step`: an optimizer step follows."""
    events, total, ts, addr = [], 0, 0, 1 << 20
    kept = []
    events.append(_mem(ts, 64, addr=addr, total=64, dev=(0, -1)))  # outside every op
    total, addr = 64, addr + 4096
    for op in ("aten::conv2d", "aten::batch_norm") * 6:
        ts += 10
        events.append(_op(ts, 8, op))
        total += 4 * MiB
        events.append(_mem(ts + 1, 4 * MiB, addr=addr, total=total, dev=(0, -1)))
        kept.append(addr)
        addr += 4 * MiB
        ts += 10
        events.append(_mem(ts, 8, addr=addr, total=total + 8, dev=(0, -1)))  # between ops
        events.append(_mem(ts + 1, -8, addr=addr, total=total, dev=(0, -1)))
        addr += 4096
    if backward:
        ts += 10
        events.append(_op(ts, 200, "autograd::engine::evaluate_function: "
                                   "ConvolutionBackward0"))
        for a in kept:
            ts += 2
            total -= 4 * MiB
            events.append(_mem(ts, -4 * MiB, addr=a, total=total, dev=(0, -1)))
    if step:
        ts += 300
        events.append(_op(ts, 50, "Optimizer.step#SGD.step"))
        events.append(_mem(ts + 1, 1 * MiB, addr=addr, total=total + MiB, dev=(0, -1)))
    path = tmp_path / "trace.json"
    path.write_text(json.dumps(_trace_with(events)))
    return [(s.report, s.attributed_blocks(s.moment)) for s in sessions(load(path))]


@pytest.mark.parametrize("case", ["forward", "backward", "step"])
def test_a_profiled_forward_without_a_backward_op_is_no_training(tmp_path, case) -> None:
    """A profiler trace records every op; one with no backward op has no block made in the
    backward phase, whatever the allocations outside every op (no frames) are: its
    workload is not training. With a backward op, autograd ran (still not training by
    itself); with an optimizer step, it trains."""
    reports = _profiled_forward(tmp_path, backward=case != "forward", step=case == "step")
    for r, held in reports:
        d = r.diagnosis
        if case == "step":
            assert d.workload == "training", d.evidence.workload
            continue
        assert d.workload != "training", d.evidence.workload
        if case == "forward":
            assert "backward" not in held["phase"].to_list()
            assert not any("backward phase" in e for e in d.evidence.workload.evidence)


@pytest.mark.parametrize("dropped", [False, True])
def test_a_kept_graph_dropped_without_a_backward_is_not_trained(tmp_path, dropped) -> None:
    """A forward-only benchmark with grad mode on: every layer's output is kept (autograd
    saves it), then the program drops the whole graph unused (its own frame frees them, no
    backward runs). That forward is not trained: the workload is inference and
    torch.inference_mode, which would have kept nothing, leads; activation checkpointing (a
    training knob) is not offered. When the window stops before the graph is dropped, whether
    a backward follows is not recorded."""
    sim = CachingAllocatorSim(capacity=65536 * MiB)
    for _ in range(8):
        sim.malloc(128 * MiB, PARAMS, family="parameters")
    bench = ("/job/bench.py", 116, "<lambda>")
    outs = []
    for layer in range(64):
        layer_stack = [("/job/model.py", 100 + layer % 4, "forward"), CALL,
                       ("/job/bench.py", 60, "forward_step"), bench]
        outs.append(sim.malloc(128 * MiB, layer_stack, family="saved_activations"))
    if dropped:
        for a in outs:
            sim.free(a, [bench])
    r, held = _analyse(tmp_path, sim.snapshot())
    d = r.diagnosis
    ids = [k.id for k in d.knobs]
    if dropped:
        assert d.workload == "inference", d.evidence.workload
        assert "forward_graph_dropped" in d.evidence.facts
        assert ids and ids[0] == "torch.inference_mode", ids
        assert "torch.activation_checkpointing" not in ids
    else:
        assert d.workload == "undetermined", d.evidence.workload
        assert "forward_graph_dropped" not in d.evidence.facts


def test_a_forwards_temporaries_freed_in_the_same_forward_are_not_saved(tmp_path) -> None:
    """An inference forward whose peak is inside one layer's attention: the scores and their
    softmax are freed a few allocations later, in the same forward, by the forward's own
    frames; the layer outputs before them were freed the same way. None of them was saved for
    a backward, so none is saved_activations at the peak: they are the forward's
    temporaries, and inference_mode (which acts on saved activations) is not the fix."""
    sim = CachingAllocatorSim(capacity=65536 * MiB)
    for _ in range(8):
        sim.malloc(128 * MiB, PARAMS, family="parameters")
    attn = [("/job/model.py", 80, "forward"), CALL, ("/job/model.py", 200, "forward"),
            CALL, ("/job/run.py", 30, "generate_batch")]
    peak_blocks = []
    for layer in range(30):
        scores = sim.malloc(512 * MiB, attn, family="activation_temporaries")
        probs = sim.malloc(512 * MiB, attn, family="activation_temporaries")
        out = sim.malloc(16 * MiB, attn, family="activation_temporaries")
        if layer == 29:
            peak_blocks = [scores, probs]
        sim.free(scores, attn)
        sim.free(probs, attn)
        sim.free(out, attn)
    assert peak_blocks
    r, held = _analyse(tmp_path, sim.snapshot())
    assert r.moment.kind == "peak"
    fwd = held.filter(pl.col("phase") == "forward")
    assert fwd.height >= 2
    assert set(fwd["family"].to_list()) == {"activation_temporaries"}, \
        fwd.select("family", "size").to_dicts()
    assert "torch.inference_mode" not in [k.id for k in r.diagnosis.knobs]


def test_a_peak_in_the_programs_own_update_is_not_model_init(tmp_path) -> None:
    """A zeroth-order trainer loads its model inside the window (module.to: model init),
    runs forwards, then updates its own per-parameter state out of place in its own code
    (no library, module or optimizer frame): the peak is that update's new copies. The
    model's bytes, made at init, do not place the peak: its phase is not identified (not
    "model init", and not the forward that ran before it)."""
    sim = CachingAllocatorSim(capacity=65536 * MiB)
    driver = ("/job/server.py", 168, "train_one_step")
    params = [sim.malloc(256 * MiB, PARAMS, family="parameters") for _ in range(6)]
    fwd = [("/job/model.py", 160, "forward"), CALL, ("/job/client.py", 90, "local_update"),
           driver]
    for _ in range(30):
        out = sim.malloc(4 * MiB, fwd, family="activation_temporaries")
        sim.free(out, fwd)
    update = [("/job/estimator.py", 267, "update_state_paramwise"),
              ("/job/client.py", 206, "pull_model"), driver]
    for _ in range(3):  # the new state beside the old: the peak is the last of these
        sim.malloc(256 * MiB, update, family="optimizer_temporaries")
    assert params
    r, held = _analyse(tmp_path, sim.snapshot())
    assert r.moment.kind == "peak"
    assert r.diagnosis.phase not in ("init", "forward"), r.diagnosis.phase
    assert held.filter(pl.col("family") == "parameters")["phase"].unique().to_list() == ["init"]


def test_a_family_seen_only_over_the_window_is_not_summed_as_if_held_at_once(tmp_path) -> None:
    """Gradients made by each step's backward and freed by its zero_grad: the workload's
    words count the blocks the window made and the most of them live at once (one step's),
    never their sum over four steps, which no moment held. The truth is the simulation's:
    six 64 MiB gradients a step."""
    from snapana.units import fmt_bytes

    sim = CachingAllocatorSim(capacity=16384 * MiB)
    for _ in range(6):
        sim.malloc(64 * MiB, PARAMS, family="parameters")
    layer = [("/job/model.py", 30, "forward"), CALL, ("/job/train.py", 50, "train_step")]
    zero_grad = [(f"{SITE}/torch/optim/optimizer.py", 980, "zero_grad"),
                 ("/job/train.py", 48, "train_step")]
    steps, grads = 4, 6
    for _ in range(steps):
        made = [sim.malloc(64 * MiB, ACCUMULATE, family="gradients") for _ in range(grads)]
        for addr in made:
            sim.free(addr, zero_grad)
        acts = [sim.malloc(128 * MiB, layer, family="saved_activations") for _ in range(8)]
        for addr in acts:
            sim.free(addr, layer)
    r, _ = _analyse(tmp_path, sim.snapshot())
    said = " ".join(r.diagnosis.evidence.workload.evidence)
    one_step, every_step = fmt_bytes(grads * 64 * MiB), fmt_bytes(steps * grads * 64 * MiB)
    assert f"{steps * grads} gradients blocks made over the window" in said, said
    assert f"at most {one_step} live at once" in said, said
    assert every_step not in said, said


def _dropped_forward(sim: CachingAllocatorSim, extra: list | None = None) -> None:
    """A grad-enabled forward whose every layer output is kept (autograd saves it), then
    dropped unused by the program's own frame (the graph freed, no backward)."""
    for _ in range(8):
        sim.malloc(128 * MiB, PARAMS, family="parameters")
    bench = ("/job/bench.py", 116, "<lambda>")
    outs = [sim.malloc(128 * MiB, [("/job/model.py", 100 + layer % 4, "forward"), CALL,
                                   ("/job/bench.py", 60, "forward_step"), bench],
                       family="saved_activations") for layer in range(64)]
    for frames, size in extra or []:
        sim.malloc(size, frames, family="unknown")
    for a in outs:
        sim.free(a, [bench])


def _annotated(snap: dict, *names: str) -> dict:
    """The snapshot with record_function ranges as torch writes them (START / END)."""
    snap["external_annotations"] = [
        {"device": 0, "stage": stage, "name": n, "time_us": i}
        for i, n in enumerate(names) for stage in ("START", "END")]
    return snap


@pytest.mark.parametrize("built", [False, True])
def test_zero_grad_or_a_built_optimizer_is_no_training(tmp_path, built) -> None:
    """Optimizer.zero_grad before a grad-enabled forward whose graph the window drops unused,
    with no backward and no step (optionally with an optimizer built: apex's FusedAdam
    __init__ makes its overflow buffer on the device): nothing stepped, so the workload is
    inference and the free torch.inference_mode leads; a training knob is not offered and no
    sentence says an optimizer stepped."""
    sim = CachingAllocatorSim(capacity=65536 * MiB)
    fused = [(f"{SITE}/apex/optimizers/fused_adam.py", 80, "__init__"),
             ("/job/bench.py", 30, "main")]
    _dropped_forward(sim, [(fused, 512)] if built else [])
    r, _ = _analyse(tmp_path, _annotated(sim.snapshot(), "Optimizer.zero_grad#AdamW.zero_grad"))
    d = r.diagnosis
    ids = [k.id for k in d.knobs]
    assert "optimizer_zero_grad" in d.evidence.facts  # seen, but it says nothing here
    assert d.workload == "inference", d.evidence.workload
    assert ids and ids[0] == "torch.inference_mode", ids
    assert "torch.activation_checkpointing" not in ids
    assert not any("stepped" in e for e in d.evidence.workload.evidence)
    if built:
        assert d.evidence.facts["optimizer_built"] == "apex/optimizers/fused_adam.py:__init__"
        assert "optimizer" not in d.evidence.facts


def test_a_backward_and_a_step_are_training(tmp_path) -> None:
    """The same forward, then a backward (torch.autograd.backward's engine run frees the
    graph) and an AdamW step that makes its state: training, by the step."""
    sim = CachingAllocatorSim(capacity=65536 * MiB)
    params = [sim.malloc(128 * MiB, PARAMS, family="parameters") for _ in range(8)]
    step = ("/job/train.py", 50, "run")
    outs = [sim.malloc(128 * MiB, [("/job/model.py", 100 + layer % 4, "forward"), CALL, step],
                       family="saved_activations") for layer in range(64)]
    backward = [(f"{SITE}/torch/autograd/graph.py", 829, "_engine_run_backward"),
                (f"{SITE}/torch/autograd/__init__.py", 347, "backward"),
                (f"{SITE}/torch/_tensor.py", 626, "backward"), step]
    grads = [sim.malloc(128 * MiB, ACCUMULATE, family="gradients") for _ in params]
    for a in reversed(outs):
        sim.free(a, backward)
    adam = [(f"{SITE}/torch/optim/adamw.py", 170, "_init_group"),
            (f"{SITE}/torch/optim/adamw.py", 220, "step"),
            (f"{SITE}/torch/optim/optimizer.py", 485, "wrapper"), step]
    for _ in range(2 * len(params)):
        sim.malloc(128 * MiB, adam, family="optimizer_state")
    r, _ = _analyse(tmp_path, _annotated(sim.snapshot(), "Optimizer.step#AdamW.step"))
    d = r.diagnosis
    assert len(grads) == 8
    assert d.workload == "training", d.evidence.workload
    assert {"optimizer", "torch_optimizer", "backward"} <= d.evidence.facts.keys()
    assert "forward_graph_dropped" not in d.evidence.facts
    assert "torch.inference_mode" not in [k.id for k in d.knobs]


def test_an_rl_forward_only_log_prob_pass_is_no_training(tmp_path) -> None:
    """slime's forward_only (@torch.no_grad) runs Megatron's forward_backward_func with
    forward_only=True: the log-prob chunks it makes (under ppo_utils'
    calculate_log_probs_and_entropy) are the family a trained loss saves, but no backward
    follows. Made in that pass, they say nothing of training."""
    sim = CachingAllocatorSim(capacity=65536 * MiB)
    for _ in range(8):
        sim.malloc(128 * MiB, PARAMS, family="parameters")
    slime = f"{SITE}/slime"
    pass_ = [(f"{slime}/utils/ppo_utils.py", 140, "calculate_log_probs_and_entropy"),
             (f"{slime}/backends/megatron_utils/loss.py", 90, "get_log_probs_and_entropy"),
             (f"{SITE}/megatron/core/pipeline_parallel/schedules.py", 290, "forward_step"),
             (f"{SITE}/megatron/core/pipeline_parallel/schedules.py", 520,
              "forward_backward_no_pipelining"),
             (f"{slime}/backends/megatron_utils/model.py", 330, "forward_only"),
             (f"{SITE}/torch/utils/_contextlib.py", 116, "decorate_context"),
             ("/job/run.py", 10, "main")]
    for _ in range(4):
        sim.malloc(256 * MiB, pass_, family="saved_logprob_softmax")
    r, held = _analyse(tmp_path, sim.snapshot())
    d = r.diagnosis
    ours = held.filter(pl.col("size") == 256 * MiB)
    assert ours.height == 4 and set(ours["phase"]) == {"logprobs"}, ours
    assert "forward_only_pass" in d.evidence.facts
    assert d.workload != "training", d.evidence.workload
    assert not any("saved_logprob_softmax" in e for e in d.evidence.workload.evidence)
