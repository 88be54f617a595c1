"""One small GPT training step, written at any batch and sequence length (issue 61): the same
job at several sizes, each with its own ground-truth peak, for `whatif --scale` to predict one
size's peak from another's.

Plain PyTorch, fp32, an unfused attention (softmax(QKᵀ) materialised: scores [b, h, s, s]),
AdamW. The weights and the optimizer state exist before recording starts (no frames, as when
`_record_memory_history` is called after the model is built); the window holds one forward,
backward and optimizer step.
"""

from __future__ import annotations

from snapana.allocator_model.simulator import CachingAllocatorSim

from .. import stacks as S
from .common import Facts, Script, run_recorded_late

NAME = "gpt-train-sized"
LAYERS, HIDDEN, HEADS, FFN, VOCAB = 6, 1024, 16, 4096, 32768
FP32 = 4
MODEL = "/workspace/gpt/model.py"
STEP: S.Chain = [("/workspace/gpt/train.py", 90, "<module>"),
                 ("/workspace/gpt/train.py", 64, "train_step")]
BACKWARD: S.Chain = []  # built-in backward ops run on the autograd thread: no Python frames
OPTIM: S.Chain = [*STEP, ("/workspace/gpt/train.py", 70, "train_step"),
                  (f"{S.TORCH}/optim/optimizer.py", 485, "wrapper"),
                  (f"{S.TORCH}/optim/adam.py", 230, "step")]
WEIGHTS = (HIDDEN * 3 * HIDDEN, HIDDEN * HIDDEN, HIDDEN * FFN, FFN * HIDDEN, HIDDEN, HIDDEN)


def _layer(i: int, line: int, fn: str = "forward") -> S.Chain:
    return [*STEP, *S.call_module(MODEL, 200), *S.call_module(MODEL, 120 + i % 2),
            (MODEL, line, fn)]


def _attention(i: int, line: int) -> S.Chain:
    return [*_layer(i, 80), (MODEL, line, "attention")]


def _layer_forward(sim: CachingAllocatorSim, i: int, t: int, batch: int, seq: int,
                   wrap: S.Chain | None = None) -> list[int]:
    """Layer `i`'s forward (under `wrap`: checkpoint's frames); what it saves for backward,
    its input's layer norm first."""
    def at(chain: S.Chain) -> tuple[S.Frame, ...]:
        return S.stack([*wrap, *chain]) if wrap else S.stack(chain)

    saved = [sim.malloc(t * HIDDEN * FP32, at(_layer(i, 78)),
                        family="saved_activations")]  # layer norm
    saved.append(sim.malloc(t * 3 * HIDDEN * FP32, at(_layer(i, 79)),
                            family="saved_activations"))  # qkv
    scores = sim.malloc(batch * HEADS * seq * seq * FP32, at(_attention(i, 40)),
                        family="activation_temporaries")
    rowmax = sim.malloc(batch * HEADS * seq * FP32, at(_attention(i, 41)),
                        family="activation_temporaries")
    saved.append(sim.malloc(batch * HEADS * seq * seq * FP32, at(_attention(i, 42)),
                            family="saved_activations"))
    sim.free(rowmax)
    sim.free(scores)
    saved.append(sim.malloc(t * HIDDEN * FP32, at(_attention(i, 43)),
                            family="saved_activations"))  # probs @ v
    saved.append(sim.malloc(t * FFN * FP32, at(_layer(i, 84)),
                            family="saved_activations"))  # up projection
    saved.append(sim.malloc(t * FFN * FP32, at(_layer(i, 85)),
                            family="saved_activations"))  # gelu
    return saved


def _script(batch: int, seq: int, checkpointed: bool = False) -> tuple[list[int], Script]:
    """The script and the trace position where recording starts (after model and optimizer
    state are built). `checkpointed`: each layer under torch.utils.checkpoint
    (non-reentrant, torch/utils/checkpoint.py: the pack hook keeps a holder, not the tensor,
    so a layer's intermediates die with it and only its input is kept; in backward the first
    unpack reruns the layer's forward under `recompute_fn`, whose tensors live until that
    layer's backward is done)."""
    start: list[int] = []
    t = batch * seq
    wrap = [*STEP, *S.call_module(MODEL, 200), *S.CHECKPOINT]

    def script(sim: CachingAllocatorSim, facts: Facts) -> None:
        weights = [sim.malloc(VOCAB * HIDDEN * FP32, None, family="parameters")]
        for _ in range(LAYERS):
            weights += [sim.malloc(n * FP32, None, family="parameters") for n in WEIGHTS]
        for w in list(weights):  # AdamW exp_avg, exp_avg_sq
            size = next(b.size for b in sim.live_blocks() if b.address == w)
            sim.malloc(size, None, family="optimizer_state")
            sim.malloc(size, None, family="optimizer_state")
        start.append(len(sim.trace))
        sim.advance(1_000_000)
        top = [*STEP, *S.call_module(MODEL, 200)]
        saved = [sim.malloc(t * HIDDEN * FP32, S.stack(top, [(MODEL, 190, "forward")]),
                            family="saved_activations")]
        layers: list[list[int]] = []
        for i in range(LAYERS):
            made = _layer_forward(sim, i, t, batch, seq, wrap if checkpointed else None)
            if checkpointed:  # the holders keep nothing: only the layer's input stays
                for a in made[1:]:
                    sim.free(a)
                made = made[:1]
            layers.append(made)
            saved += made
            sim.advance(2000)
        logits = sim.malloc(t * VOCAB * FP32, S.stack(top, [(MODEL, 210, "forward")]),
                            family="logits")
        loss_fn = [*STEP, ("/workspace/gpt/train.py", 66, "train_step"),
                   (f"{S.TORCH}/nn/functional.py", 3494, "cross_entropy")]
        logp = sim.malloc(t * VOCAB * FP32, S.stack(loss_fn), family="logits")
        sim.advance(10_000)
        # backward: the logits' gradient, then each layer's, freeing what it saved
        grad = sim.malloc(t * VOCAB * FP32, None, family="gradients")
        sim.free(logp)
        sim.free(logits)
        grads = [sim.malloc(VOCAB * HIDDEN * FP32, None, family="gradients")]
        sim.free(grad)
        if checkpointed:
            _checkpointed_backward(sim, layers, grads, t, batch, seq)
            saved = saved[:1]
        else:
            for _ in range(LAYERS):
                g = sim.malloc(t * FFN * FP32, None, family="gradients")
                grads += [sim.malloc(n * FP32, None, family="gradients") for n in WEIGHTS]
                for _ in range(6):  # the layer's six saved tensors
                    sim.free(saved.pop())
                sim.free(g)
                sim.advance(2000)
        sim.free(saved.pop())
        facts["batch"], facts["seq"], facts["checkpointed"] = batch, seq, checkpointed
        for w in weights:  # the update's temporaries, one parameter at a time
            size = next(b.size for b in sim.live_blocks() if b.address == w)
            sim.free(sim.malloc(size, S.stack(OPTIM), family="optimizer_state"))
        for g in grads:  # zero_grad(set_to_none=True)
            sim.free(g)

    return start, script


def _checkpointed_backward(sim: CachingAllocatorSim, layers: list[list[int]],
                           grads: list[int], t: int, batch: int, seq: int) -> None:
    """Each layer from the last: its forward rerun (`recompute_fn`), its gradients, then
    what the rerun made and the layer's kept input freed."""
    for i in reversed(range(LAYERS)):
        again = _layer_forward(sim, i, t, batch, seq, [*S.RECOMPUTE])
        sim.free(again[0])  # the rerun's layer norm: the kept input is what is unpacked
        g = sim.malloc(t * FFN * FP32, None, family="gradients")
        grads += [sim.malloc(n * FP32, None, family="gradients") for n in WEIGHTS]
        for a in [*again[1:], *layers[i]]:
            sim.free(a)
        sim.free(g)
        sim.advance(2000)


def sized_job(batch: int, seq: int, checkpointed: bool = False
              ) -> tuple[dict[str, object], dict[str, object]]:
    """(snapshot, truth) of the step at `batch` × `seq` (`checkpointed`: each layer under
    torch.utils.checkpoint): truth's `peak_allocated_bytes` is the simulator's own peak over
    the whole run (the weights included)."""
    start, script = _script(batch, seq, checkpointed)
    return run_recorded_late(NAME, script, start)
