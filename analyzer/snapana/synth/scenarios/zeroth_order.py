"""Zeroth-order fine-tuning with state the program updates out of place (issue 67).

The model (`handwritten.weights`' sizes) is moved to the GPU by ``Module.to``
(torch/nn/modules/module.py ``_apply``). The program's own gradient estimator keeps one state
tensor per parameter (a second-moment estimate ``K``, made in its ``__init__``:
``[torch.ones_like(p) for p in params]``). Each step runs two forwards under no_grad (each
layer's tensors freed within the layer: no graph, no backward), updates the weights in place
from the loss difference, then updates ``K`` parameter by parameter *out of place*::

    z = randn_like(p) / sqrt(K[i])          # the perturbation, regenerated
    g2 = (d * z) ** 2                       # a parameter-sized square
    K[i] = h * K[i] + (1 - h) * g2          # h * K[i], (1 - h) * g2, their sum: 3 more

so five tensors of each parameter's size are made while the old ``K[i]`` still lives, and
the rebinding frees it right after the sum is made. The peak falls in the largest
parameter's update. Ground truth (`facts`) is the simulator's own bookkeeping: the trace
positions of the update's temporaries and of each new state tensor.
"""

from __future__ import annotations

from snapana.allocator_model.frames import Frame
from snapana.allocator_model.simulator import CachingAllocatorSim

from .. import stacks as S
from .common import A800_CAPACITY, Facts, Outcome, run, truth
from .handwritten import FFN, FP32, LAYERS, weights

NAME = "zeroth-order-state-update"
TOKENS = 512
MAIN = "/workspace/zo/main.py"
CLIENT = "/workspace/zo/client.py"
ESTIMATOR = "/workspace/zo/estimator.py"
MODEL = "/workspace/zo/model.py"


def _at(*chain: Frame) -> tuple[Frame, ...]:
    return S.stack([(MAIN, 40, "<module>"), *chain])


def _last_alloc(sim: CachingAllocatorSim) -> int:
    """The trace position of the allocation just made (a new segment's event precedes it)."""
    assert sim.trace[-1]["action"] == "alloc"
    return len(sim.trace) - 1


def zeroth_order(steps: int = 2) -> tuple[dict[str, object], dict[str, object]]:
    """(snapshot, truth) after `steps` zeroth-order steps."""
    to_gpu = _at((MAIN, 20, "<module>"), (f"{S.TORCH}/nn/modules/module.py", 1357, "convert"),
                 (f"{S.TORCH}/nn/modules/module.py", 957, "_apply"))
    make_k = _at((ESTIMATOR, 167, "__init__"), (ESTIMATOR, 168, "<listcomp>"))
    local = (CLIENT, 130, "local_update")
    forward = S.stack([(MAIN, 40, "<module>"), local, *S.call_module(MODEL, 120)])
    update = (ESTIMATOR, 287, "update_state")

    def perturb(caller: Frame) -> tuple[Frame, ...]:
        return _at(local, caller, (ESTIMATOR, 185, "perturbation"))

    def line(n: int) -> tuple[Frame, ...]:
        return _at(local, update, (ESTIMATOR, n, "update_k"))

    def script(sim: CachingAllocatorSim, facts: Facts) -> None:
        params = [sim.malloc(n, to_gpu, family="parameters") for n in weights()]
        k = [sim.malloc(n, make_k, family="user_tensors") for n in weights()]
        temps: list[int] = []
        news: list[int] = []
        for _ in range(steps):
            for _ in range(2):  # two forwards under no_grad: each layer frees its tensors
                for _ in range(LAYERS):
                    h = sim.malloc(TOKENS * FFN * FP32, forward, family="activation_temporaries")
                    sim.free(h)
                sim.advance(5000)
            for n in weights():  # the weights, updated in place from the loss difference
                z = sim.malloc(n, perturb((ESTIMATOR, 251, "update_weights")),
                               family="user_tensors")
                sim.free(z)
            for i, n in enumerate(weights()):  # K, out of place, parameter by parameter
                made = []
                for stack in (perturb((ESTIMATOR, 262, "update_k")), line(265), line(267),
                              line(268)):
                    made.append(sim.malloc(n, stack, family="optimizer_temporaries"))
                    temps.append(_last_alloc(sim))
                new = sim.malloc(n, line(267), family="user_tensors")
                news.append(_last_alloc(sim))
                sim.free(made[2], line(267))
                sim.free(made[3], line(267))
                sim.free(k[i], line(266))  # the rebinding: the old K[i] goes
                sim.free(made[0], line(270))
                sim.free(made[1], line(265))
                k[i] = new
            sim.advance(5000)
        facts.update(params=params, state=k, temporary_events=temps, state_events=news,
                     workload="training")

    out: Outcome = run(script, A800_CAPACITY, 0)
    return out.sim.snapshot(), truth(NAME, out)
