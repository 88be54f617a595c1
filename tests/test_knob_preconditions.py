"""A knob is offered only where its declared preconditions hold, and says why it applies:
a framework's knob needs that framework in the frames of the blocks it targets (not a marker
seen elsewhere in the capture), an optimizer knob needs an optimizer that keeps state, sharding
a process group, torch.optim's foreach knob torch.optim's foreach path, an allocator setting
not already on, empty_cache() a segment it would give back. Each capture is simulated, so the
truth is the simulator's, not snapana's."""

from __future__ import annotations

import pickle

import pytest
from snapana.session import analyse
from snapana.sources import load
from snapana.synth import CachingAllocatorSim, SimulatedOOM

MiB = 2**20
SITE = "/usr/lib/python3.10/site-packages"
CALL = (f"{SITE}/torch/nn/modules/module.py", 1790, "_call_impl")
BACKWARD = [(f"{SITE}/torch/autograd/graph.py", 768, "_engine_run_backward"),
            (f"{SITE}/torch/autograd/__init__.py", 347, "backward"),
            (f"{SITE}/torch/_tensor.py", 581, "backward")]


def _report(tmp_path, sim: CachingAllocatorSim):
    path = tmp_path / "capture.pickle"
    path.write_bytes(pickle.dumps(sim.snapshot(), protocol=4))
    (r,) = analyse(load(path))
    return r


def _oom_report(tmp_path, capacity: int, held: list, failing: tuple):
    """The report of a simulated OOM: `held` allocations ((count, size, stack, family)),
    then the `failing` one ((size, stack, family)), which must run out of memory."""
    sim = CachingAllocatorSim(capacity=capacity)
    for count, size, stack, family in held:
        for _ in range(count):
            sim.malloc(size, stack, family=family)
    size, stack, family = failing
    with pytest.raises(SimulatedOOM):
        sim.malloc(size, stack, family=family)
    return _report(tmp_path, sim)


def _ids(r) -> list[str]:
    return [k.id for k in r.diagnosis.knobs]


def test_a_framework_detected_elsewhere_lends_no_knob(tmp_path) -> None:
    """A diffusers UNet trained beside a transformers CLIP text encoder: the activations
    are the UNet's, so transformers' checkpointing knob is not offered for them; diffusers'
    is, with the UNet frame as its evidence."""
    driver = ("/job/train_unet.py", 80, "train_loop")
    text = [(f"{SITE}/transformers/models/clip/modeling_clip.py", 300, "forward"), CALL,
            driver]
    unet = [(f"{SITE}/diffusers/models/unets/unet_2d_blocks.py", 1200, "forward"), CALL,
            driver]
    # the UNet's blocks keep activations of several ops (resnets, attention): checkpointing
    # has a block boundary to cut at
    attn = [(f"{SITE}/diffusers/models/attention.py", 372, "forward"), CALL] + unet
    r = _oom_report(tmp_path, (256 + 8 * 512 + 256) * MiB,
                    [(1, 256 * MiB, text, "saved_activations"),
                     (4, 512 * MiB, unet, "saved_activations"),
                     (4, 512 * MiB, attn, "saved_activations")],
                    (1024 * MiB, unet, "saved_activations"))
    d = r.diagnosis
    assert d.workload == "training"
    assert not any(k.framework == "transformers" for k in d.knobs), _ids(r)
    assert "diffusers.gradient_checkpointing" in _ids(r)
    assert "diffusers/models/unets/unet_2d_blocks.py" in \
        d.applies["diffusers.gradient_checkpointing"]
    # the pipeline-only knobs need a pipeline: a training script drives the UNet itself
    assert "diffusers.model_cpu_offload" not in _ids(r)


def test_a_backward_without_optimizer_or_process_group_gets_no_optimizer_knob(
        tmp_path) -> None:
    """One process, no model optimizer, no process group: the backward of a hand-written
    function makes gradients, but ZeRO / FSDP, 8-bit or offloaded optimizers have nothing to
    act on."""
    forward = [("/job/softmax.py", 12, "forward"), ("/job/bench.py", 40, "main")]
    grads = BACKWARD + [("/job/bench.py", 44, "main")]
    sim = CachingAllocatorSim(capacity=4096 * MiB)
    for _ in range(3):
        sim.malloc(256 * MiB, forward, family="saved_activations")
    for _ in range(3):
        sim.malloc(512 * MiB, grads, family="gradients")
    r = _report(tmp_path, sim)
    ids = _ids(r)
    assert r.diagnosis.workload == "training"
    assert not {"torch.optimizer_sharding", "torch.optimizer_8bit",
                "torch.optimizer_cpu_offload", "torch.optimizer_foreach"} & set(ids), ids
    assert "process_group" not in r.diagnosis.evidence.facts


def _optimizer_step(tmp_path, optimizer_frames: list, distributed: bool):
    params = [(f"{SITE}/torch/nn/modules/module.py", 1174, "to"), ("/job/train.py", 12, "main")]
    grads = BACKWARD + [("/job/train.py", 50, "main")]
    state = optimizer_frames + [("/job/train.py", 60, "main")]
    if distributed:
        params = [(f"{SITE}/torch/distributed/distributed_c10d.py", 2400, "broadcast")] + params
    sim = CachingAllocatorSim(capacity=16384 * MiB)
    for _ in range(4):
        sim.malloc(512 * MiB, params, family="parameters")
    for _ in range(4):
        sim.malloc(512 * MiB, grads, family="gradients")
    with sim.annotate("Optimizer.step#AdamW.step"):
        for _ in range(8):
            sim.malloc(512 * MiB, state, family="optimizer_state")
    return _report(tmp_path, sim)


def test_torch_optims_foreach_knob_only_for_its_foreach_path(tmp_path) -> None:
    """A hand-written optimizer class keeps Adam's moments: the 8-bit optimizer and
    offloading act on them, fused=True / foreach=False (torch.optim's own) does not; with
    torch.optim's multi-tensor path it does. Sharding needs a process group either way."""
    own = _optimizer_step(tmp_path, [("/job/my_optim.py", 30, "step")], distributed=False)
    ids = _ids(own)
    assert "torch.optimizer_foreach" not in ids and "torch.optimizer_sharding" not in ids
    assert {"torch.optimizer_8bit", "torch.optimizer_cpu_offload"} <= set(ids), ids
    assert "optimizer_state" in own.diagnosis.applies["torch.optimizer_8bit"]
    foreach = [(f"{SITE}/torch/optim/adamw.py", 500, "_multi_tensor_adamw"),
               (f"{SITE}/torch/optim/adamw.py", 200, "step"),
               (f"{SITE}/torch/optim/optimizer.py", 485, "wrapper")]
    torch_optim = _optimizer_step(tmp_path, foreach, distributed=True)
    ids = _ids(torch_optim)
    assert "torch.optimizer_sharding" in ids, ids
    applies = torch_optim.diagnosis.applies["torch.optimizer_sharding"]
    assert "torch/distributed/distributed_c10d.py" in applies


def test_allocator_knobs_read_the_recorded_settings_and_what_is_free(tmp_path) -> None:
    """Expandable segments already on: never offered again; empty_cache / the gc threshold
    only where a segment holds no live block, with the bytes it would give back."""
    fwd = [("/job/model.py", 54, "forward"), CALL, ("/job/eval.py", 30, "evaluate")]
    for expandable in (False, True):
        sim = CachingAllocatorSim(capacity=8192 * MiB, expandable_segments=expandable)
        blocks = [sim.malloc(300 * MiB, fwd, family="activation_temporaries")
                  for _ in range(12)]
        for addr in blocks[::2]:
            sim.free(addr, fwd)
        sim.malloc(4000 * MiB, fwd, family="activation_temporaries")  # the peak, after them
        r = _report(tmp_path, sim)
        ev = r.diagnosis.evidence
        assert ev.expandable == expandable
        ids = _ids(r)
        if expandable:
            assert "torch.expandable_segments" not in ids
        else:  # six whole 300 MiB segments free: the cache is large, and can be given back;
            # none of it is stranded in a partly used segment, so expandable segments would
            # change nothing
            assert ev.free_segment_bytes == {"0,0": 6 * 300 * MiB}
            assert "torch.empty_cache" in ids and "torch.expandable_segments" not in ids, ids
            assert "stranded_cache" not in ev.facts
        if not ev.free_segment_bytes:
            assert "torch.empty_cache" not in ids and "torch.gc_threshold" not in ids
        for kid in ("torch.empty_cache", "torch.gc_threshold"):
            if kid in ids:
                assert ev.releasable_bytes > 0 and "holding no live block" in \
                    r.diagnosis.applies[kid]


def test_the_loss_chain_in_the_programs_own_code_gets_the_fused_cross_entropy_knob(
        tmp_path) -> None:
    """F.cross_entropy called by the program's own loss (no framework's modelling code) keeps a
    vocabulary-sized log-softmax: it is the logits family, and a fused or chunked
    cross-entropy is offered for it, saying which blocks it acts on."""
    driver = ("/job/train.py", 90, "train_step")
    layer = [("/job/model.py", 54, "forward"), CALL, driver]
    loss = [(f"{SITE}/torch/nn/functional.py", 3479, "cross_entropy"),
            ("/job/loss.py", 22, "compute_loss"), driver]
    r = _oom_report(tmp_path, (6 * 256 + 1024 + 512) * MiB,
                    [(6, 256 * MiB, layer, "saved_activations"), (1, 1024 * MiB, loss, "logits")],
                    (1024 * MiB, loss, "logits"))
    d = r.diagnosis
    assert d.request_family == "logits"
    assert "torch.fused_cross_entropy" in _ids(r)
    assert d.workload == "training"


DECORATED = (f"{SITE}/torch/utils/_contextlib.py", 116, "decorate_context")


@pytest.mark.parametrize("guided", [True, False])
def test_a_no_grad_decorator_speaks_for_the_blocks_made_under_it(tmp_path, guided) -> None:
    """Guided diffusion: a text encoder runs under @torch.no_grad(), the UNet outside it
    (its activations are kept for the guidance backward). The decorator's frame is in the
    capture, but not in the frames of the UNet's blocks, so the job is not called inference
    and torch.inference_mode() (which would break the guidance) is not advised outright.
    When the UNet too runs under the decorator, it speaks for them: inference."""
    main = ("/job/main.py", 124, "<module>")
    text = [(f"{SITE}/transformers/models/clip/modeling_clip.py", 261, "forward"), CALL,
            ("/job/ptp_utils.py", 471, "compute_embeddings"), DECORATED, main]
    unet = [(f"{SITE}/diffusers/models/unets/unet_2d_blocks.py", 2423, "forward"), CALL,
            ("/job/ptp_utils.py", 258, "lcm_diffusion_step"),
            *([] if guided else [DECORATED]), ("/job/guided_diffusion.py", 35, "guide"),
            main]
    sim = CachingAllocatorSim(capacity=8192 * MiB)
    for _ in range(2):
        sim.malloc(8 * MiB, text, family="saved_activations")
    for _ in range(12):
        sim.malloc(300 * MiB, unet, family="saved_activations")
    snapshot = sim.snapshot()
    # a second device the process touched but holds nothing on: the same job, the same answer
    snapshot["device_traces"].append([{"action": "snapshot", "addr": 0, "size": 0,
                                       "stream": 0, "time_us": 1, "frames": []}])
    path = tmp_path / "guided.pickle"
    path.write_bytes(pickle.dumps(snapshot, protocol=4))
    reports = analyse(load(path))
    assert len(reports) == 2 and reports[1].diagnosis.empty
    for r in reports:
        d = r.diagnosis
        if not guided:
            assert d.workload == "inference"
            assert "grad_mode_decorator" in d.evidence.facts
            continue
        assert d.workload != "inference", d.workload
        assert "grad_mode_decorator" not in d.evidence.facts
        said = d.evidence.facts["scoped_elsewhere"]
        assert "ptp_utils.py:compute_embeddings" in said and "16.00 MiB of the" in said
    first = _ids(reports[0])[:1]
    assert first != ["torch.inference_mode"] or not guided, _ids(reports[0])


@pytest.mark.parametrize("own", [True, False])
def test_an_out_of_place_optimizer_of_the_programs_own_gets_the_in_place_knob(
        tmp_path, own) -> None:
    """A hand-written AdamW (a torch.optim.Optimizer subclass) whose step allocates a new
    tensor per expression: the peak is inside the step, its temporaries made by the
    program's own optimizer.py. The in-place knob is offered, with that frame as evidence;
    for torch.optim's own foreach update it is not (fused=True is that one's knob)."""
    wrapper = (f"{SITE}/torch/optim/optimizer.py", 485, "wrapper")
    driver = ("/job/bench.py", 54, "train")
    if own:
        update = [("/job/cs336_basics/optimizer.py", 74, "step"), wrapper, driver]
    else:
        update = [(f"{SITE}/torch/optim/adamw.py", 500, "_multi_tensor_adamw"),
                  (f"{SITE}/torch/optim/adamw.py", 200, "step"), wrapper, driver]
    params = [(f"{SITE}/torch/nn/modules/module.py", 1174, "to"), driver]
    sim = CachingAllocatorSim(capacity=16384 * MiB)
    for _ in range(4):
        sim.malloc(256 * MiB, params, family="parameters")
    for _ in range(4):
        sim.malloc(256 * MiB, BACKWARD + [driver], family="gradients")
    with sim.annotate("Optimizer.step#AdamW.step"):
        state = [sim.malloc(256 * MiB, update, family="optimizer_state") for _ in range(8)]
        temps = [sim.malloc(256 * MiB, update, family="optimizer_temporaries")
                 for _ in range(6)]
        for t in temps:
            sim.free(t, update)
    assert state
    r = _report(tmp_path, sim)
    d = r.diagnosis
    assert d.phase == "optimizer", d.phase
    if own:
        assert "torch.own_optimizer_in_place" in _ids(r), _ids(r)
        assert "cs336_basics/optimizer.py:step" in d.applies["torch.own_optimizer_in_place"]
    else:
        assert "torch.own_optimizer_in_place" not in _ids(r)


def test_a_peak_inside_the_foreach_update_is_the_optimizer_phase(tmp_path) -> None:
    """Issue 56: the peak sits inside torch.optim's `_multi_tensor_adamw` <- `step` with
    its foreach temporaries live, beside more bytes of gradients the backward made. The
    job is in the optimizer step there (the allocation the peak follows), so the phase is
    the optimizer's and torch.optim's free fix (fused=True / foreach=False) is offered;
    the gradients' bytes must not make it "backward" (which hid the fix on a real capture)."""
    wrapper = (f"{SITE}/torch/optim/optimizer.py", 485, "wrapper")
    driver = ("/job/train.py", 90, "train")
    update = [(f"{SITE}/torch/optim/adamw.py", 500, "_multi_tensor_adamw"),
              (f"{SITE}/torch/optim/adamw.py", 200, "step"), wrapper, driver]
    init = [(f"{SITE}/torch/optim/adamw.py", 120, "_init_group"),
            (f"{SITE}/torch/optim/adamw.py", 200, "step"), wrapper, driver]
    params = [(f"{SITE}/torch/nn/modules/module.py", 1174, "to"), driver]
    fwd = [("/job/model.py", 40, "forward"), CALL, driver]
    sim = CachingAllocatorSim(capacity=65536 * MiB)
    for _ in range(4):
        sim.malloc(256 * MiB, params, family="parameters")
    with sim.annotate("Optimizer.step#AdamW.step"):  # the first step made the moments
        for _ in range(8):
            sim.malloc(256 * MiB, init, family="optimizer_state")
    acts = [sim.malloc(512 * MiB, fwd, family="saved_activations") for _ in range(6)]
    grads = []
    for k, a in enumerate(acts):  # the backward frees each activation as it goes
        sim.free(a, BACKWARD + [driver])
        if k < 4:  # 4 GiB of gradients, more than the step's temporaries
            grads.append(sim.malloc(1024 * MiB, BACKWARD + [driver], family="gradients"))
    with sim.annotate("Optimizer.step#AdamW.step"):
        temps = [sim.malloc(256 * MiB, update, family="optimizer_temporaries")
                 for _ in range(6)]  # the peak: the last of these
        for t in temps:
            sim.free(t, update)
    assert grads
    r = _report(tmp_path, sim)
    assert r.moment.kind == "peak"
    assert r.diagnosis.phase == "optimizer", r.diagnosis.phase
    assert "torch.optimizer_foreach" in _ids(r), _ids(r)


def test_one_ops_outputs_kept_many_times_get_no_checkpointing_knob(tmp_path) -> None:
    """A sampler's forward hook keeps every attention output of many UNet forwards in a
    list: 64 blocks from one line of diffusers' attention processor, nothing else of those
    forwards alive. There is no block boundary in them to checkpoint at (one op's output is
    its own checkpoint), so neither diffusers' nor torch's activation checkpointing is
    offered; kept activations of two ops of the same UNet (previous test) get it."""
    driver = ("/job/guided_diffusion.py", 65, "guide_diffusion")
    attn = [(f"{SITE}/diffusers/models/attention_processor.py", 1262, "__call__"),
            (f"{SITE}/diffusers/models/attention_processor.py", 512, "forward"), CALL,
            (f"{SITE}/diffusers/models/attention.py", 335, "forward"), CALL,
            (f"{SITE}/diffusers/models/unets/unet_2d_condition.py", 1186, "forward"), CALL,
            driver]
    sim = CachingAllocatorSim(capacity=65536 * MiB)
    for _ in range(64):
        sim.malloc(16 * MiB, attn, family="unknown")
    r = _report(tmp_path, sim)
    ids = _ids(r)
    assert "layered_activations" not in r.diagnosis.evidence.facts
    assert "diffusers.gradient_checkpointing" not in ids, ids
    assert "torch.activation_checkpointing" not in ids, ids
