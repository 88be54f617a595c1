"""A diffusion sampler with autograd guidance (issue 67): a backward to the *inputs* through
frozen weights, and nothing trained.

The UNet's weights exist before recording starts (no frames; ``requires_grad=False``, one copy
each, no gradient ever made for them, no optimizer). Each guided step runs the UNet with the
latents requiring grad, so every layer keeps what it saved for the backward (the graph: a
norm's, the projections' and the feed-forward's outputs, many sites per layer); then
``loss.backward()`` runs on the autograd thread (C++ frames only): each layer's activation
gradients made and freed as it goes, the graph freed, one latents-sized gradient made, which
the step's update then frees. The unguided steps run under ``torch.no_grad``: each layer's
tensors go once used, except the attention output a forward hook appends to a list the
program never empties (the leak): one site per layer, no graph behind it.

``history=False`` writes the final state only (the dump a job with history off leaves), and
``graph_held=True`` ends on a guided forward whose backward has not run yet (its graph held
beside the unguided steps' kept outputs). ``no_grad=False`` is the control: the same steps
all run with grad, the kept attention outputs part of each step's graph. Ground truth
(`facts`: the kept outputs' addresses, the graph's, whether a backward ran and whether
anything trains) is the simulator's own bookkeeping, never an analysis.
"""

from __future__ import annotations

from snapana.allocator_model.frames import Frame
from snapana.allocator_model.simulator import CachingAllocatorSim

from .. import stacks as S
from .common import Facts, run_recorded_late

NAME = "guided-sampler-frozen-weights"
LAYERS, TOKENS, HIDDEN, FFN = 8, 16384, 1280, 5120
FP16 = 2
ACT = TOKENS * HIDDEN * FP16
UNET = f"{S.SITE}/diffusers/models/unets/unet_2d_condition.py"
BLOCK = f"{S.SITE}/diffusers/models/attention.py"
PROC = f"{S.SITE}/diffusers/models/attention_processor.py"
LINEAR = f"{S.TORCH}/nn/modules/linear.py"
#: the program's two call paths into the UNet: the guided half and the no_grad half
GUIDED: S.Chain = [("/srv/editing/run.py", 124, "<module>"), ("/srv/editing/loop.py", 35, "go")]
UNGUIDED: S.Chain = [("/srv/editing/run.py", 124, "<module>"),
                     ("/srv/editing/loop.py", 65, "go")]
LATENTS: S.Chain = [("/srv/editing/run.py", 124, "<module>"), ("/srv/editing/loop.py", 30, "go")]
#: the backward on the autograd device thread: no Python frame
AUTOGRAD: tuple[Frame, ...] = (
    ("", 0, "torch::autograd::generated::AddmmBackward0::apply(std::vector<at::Tensor>&&)"),
    ("", 0, "torch::autograd::Engine::thread_main(std::shared_ptr<torch::autograd::GraphTask>"
            " const&)"))
#: a layer's weights (numel): norm, q, k, v, out, ff in, ff out
WEIGHTS = (HIDDEN, HIDDEN * HIDDEN, HIDDEN * HIDDEN, HIDDEN * HIDDEN, HIDDEN * HIDDEN,
           HIDDEN * FFN, FFN * HIDDEN)


def _in_layer(driver: S.Chain, layer: int, *inner: Frame) -> tuple[Frame, ...]:
    """A frame inside the attention block of UNet layer `layer` (its processor's `__call__`
    or the block's own forward)."""
    chain = [*driver, *S.call_module(UNET, 1186), *S.call_module(BLOCK, 335 + 37 * (layer % 2))]
    return S.stack(chain, list(inner))


def _proc(driver: S.Chain, layer: int, line: int, linear: bool = False) -> tuple[Frame, ...]:
    inner = [*S.call_module(PROC, 512), (PROC, line, "__call__")]
    if linear:
        inner += S.call_module(LINEAR, 125)
    return _in_layer(driver, layer, *inner)


def guided_sampler(guided: int = 2, unguided: int = 4, *, history: bool = True,
                   graph_held: bool = False, no_grad: bool = True
                   ) -> tuple[dict[str, object], dict[str, object]]:
    """(snapshot, truth) after `guided` guided steps and `unguided` no_grad steps (one more
    guided forward, its backward not yet run, with `graph_held`)."""
    start: list[int] = []

    def forward(sim: CachingAllocatorSim, driver: S.Chain, grad: bool) -> list[int]:
        """One UNet forward; returns what stays: with `grad` every layer's saved tensors
        (the graph, the hooked attention outputs among them), without only the attention
        outputs the hook keeps."""
        act = "saved_activations" if grad else "activation_temporaries"
        stays: list[int] = []
        for layer in range(LAYERS):
            made = [sim.malloc(ACT, _in_layer(driver, layer, (BLOCK, 320, "forward")),
                               family=act),  # norm1
                    *(sim.malloc(ACT, _proc(driver, layer, line, linear=True), family=act)
                      for line in (1240, 1241, 1242))]  # q, k, v
            # Guide.fw_hook appends the attention output to its list
            stays.append(sim.malloc(ACT, _proc(driver, layer, 1262),
                                    family="saved_activations" if grad else "user_tensors"))
            made.append(sim.malloc(TOKENS * FFN * FP16,
                                   _in_layer(driver, layer, (BLOCK, 380, "forward")),
                                   family=act))
            if grad:
                stays.extend(made)
            else:
                for a in made:
                    sim.free(a)
            sim.advance(500)
        return stays

    def script(sim: CachingAllocatorSim, facts: Facts) -> None:
        for _ in range(LAYERS):
            for n in WEIGHTS:
                sim.malloc(n * FP16, None, family="parameters")
        start.append(len(sim.trace))
        sim.advance(1_000_000)
        latents = sim.malloc(4 * 64 * 64 * FP16, S.stack(LATENTS), family="user_tensors")
        for _ in range(guided):
            graph = forward(sim, GUIDED, True)
            for _layer in range(LAYERS):  # loss.backward() to the latents, layer by layer
                sim.free(sim.malloc(ACT, AUTOGRAD, family="activation_gradients"))
            for a in graph:  # the graph's saved tensors go; reset_step() empties the list
                sim.free(a)
            # the latents' gradient; the update (latents - lr * grad.sign()) frees it
            sim.free(sim.malloc(4 * 64 * 64 * FP16, AUTOGRAD, family="activation_gradients"))
            sim.advance(10_000)
        leaked: list[int] = []
        for _ in range(unguided):  # reset_step() is never called: the list grows
            leaked += forward(sim, UNGUIDED, not no_grad)
            sim.advance(10_000)
        held = forward(sim, GUIDED, True) if graph_held else []
        facts["kept_outputs"] = leaked if no_grad else []
        facts["graph"] = held + ([] if no_grad else leaked)
        facts["backward_ran"] = guided > 0
        facts["trains"] = False
        facts["latents"] = latents

    snapshot, truth = run_recorded_late(NAME, script, start)
    if not history:
        snapshot["device_traces"] = [[]]
    return snapshot, truth
