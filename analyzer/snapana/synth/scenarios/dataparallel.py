"""A 3-GPU ``nn.DataParallel`` job with ``expandable_segments:True`` that runs out of memory on
device 1, in a ``relu`` forward under ``parallel_apply``: the shape of a real capture (every
segment expandable, hundreds of ``segment_map`` and a few ``segment_unmap`` events, an ``oom``
entry in the second device's trace only).

The model is a DGCNN-style point-cloud network: each EdgeConv block builds edge features
``[E, 2C]`` over the k-nearest-neighbour graph of its replica's points, runs a shared MLP over
the edges and max-pools back to the points. ``E`` depends on the data, so the replicas do not
hold the same memory: in the second step the crowded scene lands on device 1, whose edge MLP
needs ten times what devices 0 and 2 need. DataParallel replicates the parameters to devices
1 and 2 (``Broadcast`` on the main thread), scatters the batch, runs each replica on its own
thread (``parallel_apply._worker``, under ``threading`` bootstrap frames) and gathers the
outputs on device 0, which alone holds gradients and Adam state. Between the steps the job
calls ``torch.cuda.empty_cache()``, which unmaps the free pages of every device.

The simulator models one device per run, so each device is its own run (devices 0 and 2 finish
the forward their threads were running when device 1 failed; ``parallel_apply`` re-raises only
after every thread is done) and the runs are combined into one multi-device snapshot:
``device_traces`` is a list per device and every segment carries its ``device``.
"""

from __future__ import annotations

from typing import Any

from snapana.allocator_model.rules import MiB
from snapana.allocator_model.simulator import CachingAllocatorSim

from .. import stacks as S
from .common import A800_CAPACITY, Facts, Outcome, Script, calibrate_outside, failing_request, run
from .common import truth as device_truth

CAPACITY = A800_CAPACITY  # 80 GB cards: "79.25 GiB"
DEVICES = 3
FAILING_DEVICE = 1
FREE = 91_25 * MiB // 100  # "91.25 MiB free" on device 1 at the OOM
POINTS = 16_384  # points per batch: 8192 per replica
K = 20  # neighbours per point
#: the EdgeConv blocks' edge-MLP widths (conv -> batch norm -> relu per layer); each block
#: reads the concatenation of every earlier block's output (dense connections)
BLOCKS: list[tuple[int, ...]] = [(64,), (64,), (64,), (256,), (512,), (512,), (1024, 1024)]
EMBED, CLASSES = 1024, 13
#: edges per replica: a normal scene, and the crowded one device 1 gets in step 2
EDGES_NORMAL = POINTS // 2 * K
EDGES_CROWDED = 1_294_336  # its [E, 1024] fp32 relu output: "4.94 GiB"
FAILING_LAYER = (6, 1)  # the second relu of the last block
FP32 = 4

PY = "/usr/lib/python3.10"
PAR = f"{S.TORCH}/nn/parallel"
MAIN: S.Chain = [("/workspace/train_dgcnn.py", 214, "<module>"),
                 ("/workspace/train_dgcnn.py", 167, "train_epoch")]
DP: S.Chain = [*MAIN, *S.call_module(f"{PAR}/data_parallel.py", 184)]  # DataParallel.forward
REPLICATE: S.Chain = [*DP, (f"{PAR}/data_parallel.py", 189, "replicate"),
                      (f"{PAR}/replicate.py", 111, "replicate"),
                      (f"{PAR}/replicate.py", 81, "_broadcast_coalesced_reshape"),
                      *S.apply_function(f"{PAR}/_functions.py", 23),  # Broadcast.forward
                      (f"{PAR}/comm.py", 67, "broadcast_coalesced")]
SCATTER: S.Chain = [*DP, (f"{PAR}/data_parallel.py", 203, "scatter"),
                    (f"{PAR}/scatter_gather.py", 77, "scatter_kwargs"),
                    (f"{PAR}/scatter_gather.py", 57, "scatter"),
                    (f"{PAR}/scatter_gather.py", 36, "scatter_map"),
                    *S.apply_function(f"{PAR}/_functions.py", 105),  # Scatter.forward
                    (f"{PAR}/comm.py", 205, "scatter")]
GATHER: S.Chain = [*DP, (f"{PAR}/data_parallel.py", 209, "gather"),
                   (f"{PAR}/scatter_gather.py", 105, "gather"),
                   (f"{PAR}/scatter_gather.py", 91, "gather_map"),
                   *S.apply_function(f"{PAR}/_functions.py", 71),  # Gather.forward
                   (f"{PAR}/comm.py", 231, "gather")]
#: a replica's thread: no frame of the main thread above it
WORKER: S.Chain = [(f"{PY}/threading.py", 973, "_bootstrap"),
                   (f"{PY}/threading.py", 1016, "_bootstrap_inner"),
                   (f"{PY}/threading.py", 953, "run"),
                   (f"{PAR}/parallel_apply.py", 83, "_worker")]
DGCNN = "/workspace/models/dgcnn.py"
MODEL: S.Chain = [*WORKER, *S.call_module(DGCNN, 131)]  # DGCNN.forward
LOSS: S.Chain = [*MAIN, *S.call_module(f"{S.TORCH}/nn/modules/loss.py", 1295)]
REDUCE: S.Chain = [(f"{S.TORCH}/autograd/function.py", 307, "apply"),
                   (f"{PAR}/_functions.py", 37, "backward"),  # Broadcast.backward
                   *S.apply_function(f"{PAR}/_functions.py", 52),  # ReduceAddCoalesced
                   (f"{PAR}/comm.py", 125, "reduce_add_coalesced")]
OPT: S.Chain = [*MAIN, (f"{S.TORCH}/optim/optimizer.py", 485, "wrapper"),
                (f"{S.TORCH}/optim/adam.py", 213, "step"),
                (f"{S.TORCH}/optim/adam.py", 150, "_init_group")]
INIT: S.Chain = [("/workspace/train_dgcnn.py", 214, "<module>"),
                 ("/workspace/train_dgcnn.py", 120, "main"),
                 *S.call_module(f"{S.TORCH}/nn/modules/module.py", 1355, "to"),
                 (f"{S.TORCH}/nn/modules/module.py", 930, "_apply"),
                 (f"{S.TORCH}/nn/modules/module.py", 1341, "convert")]


def _block(i: int) -> S.Chain:
    return [*MODEL, *S.call_module(DGCNN, 62)]  # EdgeConv.forward


def _param_sizes() -> list[int]:
    sizes, c_in = [], 3
    for widths in BLOCKS:
        width_in = 2 * c_in
        for w in widths:  # conv weight, batch-norm weight and bias
            sizes += [width_in * w * FP32, w * FP32, w * FP32]
            width_in = w
        c_in += widths[-1]
    sizes += [c_in * EMBED * FP32, EMBED * CLASSES * FP32]
    return sizes


def _forward(sim: CachingAllocatorSim, device: int, edges: int, fail: bool) -> None:
    """One replica's forward: the scattered points, then the EdgeConv blocks. With `fail`,
    the relu of FAILING_LAYER is the incident's failing request."""
    points = POINTS // 2
    sim.malloc(points * 3 * FP32, S.stack(SCATTER), family="saved_activations")
    c_in = 3
    for i, widths in enumerate(BLOCKS):
        block = _block(i)
        knn = [*block, (DGCNN, 40, "get_graph_feature"), (DGCNN, 28, "knn")]
        dist = sim.malloc(points * points * FP32, S.stack(knn), family="activation_temporaries")
        idx = sim.malloc(points * K * 8, S.stack(knn), family="activation_temporaries")
        sim.free(dist)
        feat = [*block, (DGCNN, 52, "get_graph_feature")]
        sim.malloc(edges * 2 * c_in * FP32, S.stack(feat), family="saved_activations")
        sim.free(idx)
        for j, w in enumerate(widths):
            layer = [*block, *S.call_module(f"{S.TORCH}/nn/modules/container.py", 250)]
            conv = [*layer, *S.call_module(f"{S.TORCH}/nn/modules/conv.py", 554)]
            sim.malloc(edges * w * FP32, S.stack(conv), family="saved_activations")
            bn = [*layer, *S.call_module(f"{S.TORCH}/nn/modules/batchnorm.py", 193),
                  (f"{S.TORCH}/nn/functional.py", 2822, "batch_norm")]
            sim.malloc(edges * w * FP32, S.stack(bn), family="saved_activations")
            relu = [*layer, *S.call_module(f"{S.TORCH}/nn/modules/activation.py", 133),
                    (f"{S.TORCH}/nn/functional.py", 1704, "relu")]
            if fail and (i, j) == FAILING_LAYER:
                failing_request(sim, edges * w * FP32, S.stack(relu), "saved_activations")
            sim.malloc(edges * w * FP32, S.stack(relu), family="saved_activations")
        pool = [*block, (DGCNN, 66, "forward")]  # max over the neighbours
        sim.malloc(points * widths[-1] * FP32, S.stack(pool), family="saved_activations")
        sim.malloc(points * widths[-1] * 8, S.stack(pool), family="saved_activations")
        c_in += widths[-1]
        sim.advance(800 + 100 * device)
    head = [*MODEL, *S.call_module(f"{S.TORCH}/nn/modules/linear.py", 125)]
    sim.malloc(points * EMBED * FP32, S.stack(head), family="saved_activations")
    sim.malloc(points * CLASSES * FP32, S.stack(head), family="saved_activations")


def _script(device: int, crowded: int | None) -> Script:
    """Device `device`'s run: step 1 (normal scenes everywhere), empty_cache, and step 2 with
    `crowded` edges on this device (None: a normal scene; the forward completes)."""

    def script(sim: CachingAllocatorSim, facts: Facts) -> None:
        params: list[int] = []
        if device == 0:  # model.to("cuda:0"): DataParallel's module lives on device 0
            params = [sim.malloc(n, S.stack(INIT), family="parameters")
                      for n in _param_sizes()]
        sim.advance(2_000_000)
        for step in (1, 2):
            before = {b.address for b in sim.live_blocks()}
            replicas = ([] if device == 0 else
                        [sim.malloc(n, S.stack(REPLICATE), family="parameters")
                         for n in _param_sizes()])
            fail = step == 2 and crowded is not None
            edges = crowded if fail and crowded is not None else EDGES_NORMAL
            if fail:
                facts["failing_edges"] = edges
            _forward(sim, device, edges, fail)
            if device == 0:  # gather the replicas' outputs on the output device
                sim.malloc(DEVICES * POINTS // 2 * CLASSES * FP32, S.stack(GATHER),
                           family="saved_activations")
            if step == 2:
                return  # device 1 failed: parallel_apply re-raises once the threads finish
            if device == 0:
                sim.malloc(512, S.stack(LOSS), family="activation_temporaries")
            _backward(sim, device, before, params, replicas)
            sim.empty_cache(S.stack([*MAIN, (f"{S.TORCH}/cuda/memory.py", 192,
                                              "empty_cache")]))
            sim.advance(3_000_000)

    return script


def _backward(sim: CachingAllocatorSim, device: int, before: set[int], params: list[int],
              replicas: list[int]) -> None:
    """Backward (the autograd thread: no Python frames, except Broadcast's backward reducing
    the replicas' gradients onto device 0), Adam on device 0, replicas dropped."""
    step_blocks = [b for b in sim.live_blocks() if b.address not in before
                   and b.address not in replicas]
    for b in reversed(step_blocks):
        grad = sim.malloc(b.size, None, family="activation_temporaries")
        sim.free(b.address)
        sim.free(grad)
    if device == 0:
        sizes = _param_sizes()
        grads = [sim.malloc(n, S.stack(REDUCE), family="gradients") for n in sizes]
        with sim.annotate("Optimizer.step#Adam.step"):
            for n in sizes:
                sim.malloc(n, S.stack(OPT), family="optimizer_state")
                sim.malloc(n, S.stack(OPT), family="optimizer_state")
        del grads, params
    for a in replicas:
        sim.free(a)


def _device_run(device: int, outside: int) -> Outcome:
    return run(_script(device, None), CAPACITY, outside, expandable=True)


def dataparallel_3gpu_oom() -> tuple[dict[str, Any], dict[str, Any]]:
    """(snapshot, truth): the failing device calibrated to the incident's free bytes, the
    others run with the same memory outside PyTorch (a CUDA context each)."""
    i, j = FAILING_LAYER
    request = EDGES_CROWDED * BLOCKS[i][j] * FP32
    failing = calibrate_outside(_script(FAILING_DEVICE, EDGES_CROWDED), CAPACITY, FREE,
                                request, expandable=True)
    outside = failing.sim.outside_pytorch
    outcomes = {d: failing if d == FAILING_DEVICE else _device_run(d, outside)
                for d in range(DEVICES)}
    return combine(outcomes), multi_truth("dataparallel-3gpu-expandable-oom", outcomes)


def combine(outcomes: dict[int, Outcome]) -> dict[str, Any]:
    """One snapshot of several single-device runs, in PyTorch's multi-device layout."""
    segments: list[dict[str, Any]] = []
    traces: list[list[dict[str, object]]] = []
    annotations: list[dict[str, object]] = []
    for device in sorted(outcomes):
        snap = outcomes[device].sim.snapshot()
        segments += [{**seg, "device": device} for seg in snap["segments"]]  # type: ignore[attr-defined]
        traces.append(list(snap["device_traces"][0]))  # type: ignore[index]
        annotations += [{**a, "device": device}
                        for a in snap["external_annotations"]]  # type: ignore[attr-defined]
    segments.sort(key=lambda s: (s["device"], s["address"]))
    first = outcomes[min(outcomes)].sim
    return {"segments": segments, "device_traces": traces,
            "allocator_settings": first.allocator_settings(),
            "external_annotations": annotations}


def multi_truth(name: str, outcomes: dict[int, Outcome]) -> dict[str, Any]:
    devices = []
    for device in sorted(outcomes):
        t = device_truth(name, outcomes[device])
        t["device"] = device
        devices.append(t)
    failed = [t["device"] for t in devices if t["oom"] is not None]
    return {"scenario": name, "devices": devices, "failed_devices": failed}


__all__ = ["dataparallel_3gpu_oom", "combine", "multi_truth"]
