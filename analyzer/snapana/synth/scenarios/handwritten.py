"""Training steps of a model and an optimizer the program wrote itself (issue 67).

The modules make their weights in their own ``__init__`` (``nn.Parameter(torch.empty(...))``:
no torch/nn/modules frame), the optimizer makes its moments in its own ``step`` at the first
step (``torch.zeros_like(p)``, `per_parameter` per weight: 2 for Adam, 1 for momentum SGD;
no torch/optim frame) and updates in place. The backward makes one gradient per weight on
the autograd thread (AccumulateGrad); the program drops them (``p.grad = None``) before
the next backward.

`out_of_place` updates each weight out of place, as ``p.data = p - lr * g`` does: the
step allocates ``lr * g`` (freed once subtracted) and the new weight, then the rebinding frees
the old one, every step, so the weights the window ends with were made in its last step;
`per_parameter` may then be 0 (plain SGD: no state). `wrapped` runs the program's step
inside torch.optim's ``Optimizer.step`` wrapper (a subclass of torch.optim.Optimizer:
torch/optim/optimizer.py ``wrapper`` on every stack of the step).

`workspaces` has the first forward's matmul make its thread's cuBLAS workspace (the default
CUBLAS_WORKSPACE_CONFIG :4096:2:16:8, 8519680 B, one per handle and stream) and the first
backward make the autograd engine thread's own (each thread takes its own cuBLAS handle).
`no_history` drops the history afterwards, as a `_dump_snapshot` without
`_record_memory_history` writes it: no trace, no stacks (`recording.state_only`).

`zero_grad_late` is another capture (issue 67): recording begins at the second step,
whose first act is torch.optim's ``zero_grad(set_to_none=True)`` freeing the gradients of
the step before (alive before recording: no frames, no allocation event). Ground truth
(`facts`) is the simulator's own bookkeeping: which address it made as what.
"""

from __future__ import annotations

from snapana.allocator_model.frames import Frame
from snapana.allocator_model.simulator import CachingAllocatorSim

from .. import stacks as S
from ..recording import start_late, state_only
from .common import A800_CAPACITY, Facts, Outcome, run, truth

NAME = "handwritten-train"
LAYERS, HIDDEN, FFN, VOCAB, TOKENS = 4, 512, 2048, 8192, 2048
FP32 = 4
MODEL = "/workspace/lm/model.py"
OPTIM = "/workspace/lm/optim.py"
TRAIN = "/workspace/lm/train.py"
#: one layer's weights (numel), made in the program's own Block.__init__
LAYER = (HIDDEN * 3 * HIDDEN, HIDDEN * HIDDEN, HIDDEN * FFN, FFN * HIDDEN, HIDDEN)
AUTOGRAD = ("??", 0, "torch::autograd::Engine::thread_main(std::shared_ptr<"
                    "torch::autograd::GraphTask> const&)")
ACCUMULATE = ("??", 0, "torch::autograd::AccumulateGrad::apply(std::vector<at::Tensor>&&)")
#: cuBLAS's default workspace (CUBLAS_WORKSPACE_CONFIG :4096:2:16:8) and the frame making it
CUBLAS_WORKSPACE = 4096 * 1024 * 2 + 16 * 1024 * 8
CUBLAS = ("??", 0, "at::cuda::getCurrentCUDABlasHandle()")


def _at(*chain: Frame) -> tuple[Frame, ...]:
    return S.stack([(TRAIN, 60, "<module>"), *chain])


def weights() -> list[int]:
    """The model's weight sizes in bytes, embedding first."""
    return [VOCAB * HIDDEN * FP32] + [n * FP32 for _ in range(LAYERS) for n in LAYER]


def handwritten_train(steps: int = 2, per_parameter: int = 2, *, zero_grad_late: bool = False,
                      out_of_place: bool = False, wrapped: bool = False,
                      workspaces: bool = False, no_history: bool = False
                      ) -> tuple[dict[str, object], dict[str, object]]:
    """(snapshot, truth) after `steps` steps; with `zero_grad_late`, recorded from the
    second step's zero_grad on (torch.optim's, freeing last step's gradients)."""
    start: list[int] = []
    init = _at((MODEL, 80, "__init__"), (MODEL, 30, "__init__"))
    stepping: list[Frame] = [(TRAIN, 70, "<module>")]
    if wrapped:
        stepping.append((f"{S.TORCH}/optim/optimizer.py", 487, "wrapper"))
    state = [_at(*stepping, (OPTIM, 20 + k, "step")) for k in range(per_parameter)]
    update = _at(*stepping, (OPTIM, 30, "step"))
    rebind = _at(*stepping, (OPTIM, 31, "step"))
    forward = S.stack([(TRAIN, 64, "<module>"), *S.call_module(MODEL, 120),
                       *S.call_module(MODEL, 50)])
    zero_grad = _at((f"{S.TORCH}/optim/optimizer.py", 990, "zero_grad"))
    drop = _at((TRAIN, 62, "<module>"))

    def script(sim: CachingAllocatorSim, facts: Facts) -> None:
        params = [sim.malloc(n, init, family="parameters") for n in weights()]
        grads: list[int] = []
        moments: list[int] = []
        old: list[int] = []
        spaces: list[int] = []
        for step in range(steps):
            if step == 1 and zero_grad_late:
                start.append(len(sim.trace))
                sim.advance(1_000_000)
            for g in grads:  # the gradients of the step before go before its forward
                sim.free(g, zero_grad if zero_grad_late else drop)
            old, grads = grads, []
            if workspaces and step == 0:  # the forward's first matmul, on the main thread
                spaces.append(sim.malloc(CUBLAS_WORKSPACE, (CUBLAS, *forward),
                                         family="workspace"))
            acts = [(sim.malloc(TOKENS * w * FP32, forward, family="saved_activations"),
                     TOKENS * w * FP32) for _ in range(LAYERS) for w in (HIDDEN, FFN)]
            sim.advance(5000)
            if workspaces and step == 0:  # the backward's first matmul, autograd's thread
                spaces.append(sim.malloc(CUBLAS_WORKSPACE, (CUBLAS, AUTOGRAD),
                                         family="workspace"))
            for a, n in reversed(acts):  # backward: each activation's gradient
                da = sim.malloc(n, (AUTOGRAD,), family="activation_gradients")
                sim.free(a)
                sim.free(da)
            grads = [sim.malloc(n, (ACCUMULATE, AUTOGRAD), family="gradients")
                     for n in weights()]
            sim.advance(5000)
            for i, n in enumerate(weights()):  # each parameter in turn
                if step == 0:  # the first step makes the moments and keeps them
                    moments += [sim.malloc(n, s, family="optimizer_state") for s in state]
                tmp = sim.malloc(n, update, family="optimizer_temporaries")
                if out_of_place:  # p.data = p - lr * g: the new weight, then the old goes
                    new = sim.malloc(n, rebind, family="parameters")
                    sim.free(tmp)
                    sim.free(params[i], rebind)
                    params[i] = new
                else:
                    sim.free(tmp)
            sim.advance(5000)
        facts["params"] = params
        facts["moments"] = moments
        facts["grads"] = grads
        facts["old_grads"] = old
        facts["workspaces"] = spaces
        facts["workload"] = "training"

    out: Outcome = run(script, A800_CAPACITY, 0)
    snapshot = out.sim.snapshot()
    if zero_grad_late:
        snapshot = start_late(snapshot, start[0])
    if no_history:
        snapshot = state_only(snapshot)
    return snapshot, truth(NAME, out)
