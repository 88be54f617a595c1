"""One small GPT training step, written at any batch and sequence length (issue 61): the same
job at several sizes, each with its own ground-truth peak, for `whatif --scale` to predict one
size's peak from another's.

Plain PyTorch, fp32, an unfused attention (softmax(QKᵀ) materialised: scores [b, h, s, s]),
AdamW. The weights and the optimizer state exist before recording starts (no frames, as when
`_record_memory_history` is called after the model is built); the window holds one forward,
backward and optimizer step.

`Job` varies what the default job fixes (issue 70, benchmarks/scale_stress.py): the model's
dimensions; bf16 autocast (fp32 weights; a bf16 copy of each matmul weight cached at its
first use, made at the op's call site right before its output, aten autocast_mode.cpp
``cached_cast``: in training the copy is also saved for the matmul's backward; matmul outputs
bf16, softmax and the loss fp32); the mode (a training step, a forward with grad kept to the
end as a forward benchmark holds it, an inference forward under no_grad); the frames (the
program's own modules called through nn.Module, nn.Linear for the matmuls, or hand-written
functions with no torch.nn frame at all); fused attention (SDPA: no score matrix, a
[b, h, s] fp32 log-sum-exp saved); a chunked loss (the lm_head and the loss run `CHUNK`
tokens of the packed batch at a time, a fixed chunk as slime's chunked log-prob takes, the
gradient of the hidden states accumulated as Liger's fused linear cross-entropy does; Liger
itself sizes its chunk from the tokens).
"""

from __future__ import annotations

from dataclasses import dataclass

from snapana.allocator_model.simulator import CachingAllocatorSim

from .. import stacks as S
from .common import Facts, Script, drop_together, run_recorded_late

NAME = "gpt-train-sized"
LAYERS, HIDDEN, HEADS, FFN, VOCAB = 6, 1024, 16, 4096, 32768
FP32, BF16 = 4, 2
#: tokens per chunk of a chunked loss
CHUNK = 1024
MODEL = "/workspace/gpt/model.py"
STEP: S.Chain = [("/workspace/gpt/train.py", 90, "<module>"),
                 ("/workspace/gpt/train.py", 64, "train_step")]
BACKWARD: S.Chain = []  # built-in backward ops run on the autograd thread: no Python frames
OPTIM: S.Chain = [*STEP, ("/workspace/gpt/train.py", 70, "train_step"),
                  (f"{S.TORCH}/optim/optimizer.py", 485, "wrapper"),
                  (f"{S.TORCH}/optim/adam.py", 230, "step")]
LINEAR = S.call_module(f"{S.TORCH}/nn/modules/linear.py", 125)
MODES = ("train", "forward", "inference")
FRAMES = ("module", "linear", "handwritten")


@dataclass(frozen=True)
class Job:
    """What one simulated job is: the default is the issue-61 step (fp32, trained, the
    program's modules, unfused attention, one whole loss)."""

    layers: int = LAYERS
    hidden: int = HIDDEN
    heads: int = HEADS
    vocab: int = VOCAB
    autocast: bool = False
    mode: str = "train"
    frames: str = "module"
    fused: bool = False
    chunked_loss: bool = False

    @property
    def ffn(self) -> int:
        return 4 * self.hidden

    @property
    def weights(self) -> tuple[int, ...]:
        """One layer's weights (numel): qkv, out, up, down (the matmuls), two norms."""
        h = self.hidden
        return (h * 3 * h, h * h, h * self.ffn, self.ffn * h, h, h)

    @property
    def act(self) -> int:
        """Bytes per element of a matmul's output."""
        return BF16 if self.autocast else FP32

    def label(self) -> str:
        return (f"L{self.layers} h{self.hidden} a{self.heads} V{self.vocab} "
                f"{'bf16' if self.autocast else 'fp32'} {self.mode} {self.frames}"
                f"{' fused' if self.fused else ''}{' chunked' if self.chunked_loss else ''}")


DEFAULT = Job()


def _wrap(job: Job, path: str, line: int) -> S.Chain:
    """A module call: through nn.Module's call wrappers, or a plain call (hand-written)."""
    return [(path, line, "forward")] if job.frames == "handwritten" else \
        S.call_module(path, line)


def _layer(i: int, line: int, fn: str = "forward", job: Job = DEFAULT) -> S.Chain:
    return [*STEP, *_wrap(job, MODEL, 200), *_wrap(job, MODEL, 120 + i % 2), (MODEL, line, fn)]


def _matmul(i: int, line: int, job: Job) -> S.Chain:
    """A matmul of layer `i`: at the program's line, or inside nn.Linear's forward."""
    return [*_layer(i, line, job=job), *LINEAR] if job.frames == "linear" else \
        _layer(i, line, job=job)


def _attention(i: int, line: int, job: Job = DEFAULT) -> S.Chain:
    return [*_layer(i, 80, job=job), (MODEL, line, "attention")]


class _Forward:
    """One layer's forward, its allocations placed as the job's frames and precision say."""

    def __init__(self, sim: CachingAllocatorSim, job: Job, wrap: S.Chain | None,
                 copies: dict[tuple[int, int], int] | None) -> None:
        self.sim, self.job, self.wrap, self.copies = sim, job, wrap, copies

    def at(self, chain: S.Chain) -> tuple:
        return S.stack([*self.wrap, *chain]) if self.wrap else S.stack(chain)

    def matmul(self, i: int, line: int, k: int, nbytes: int, family: str) -> int:
        """The matmul's output; under autocast its weight's bf16 copy first, at the same
        call site, at the weight's first use (the cache keeps it to the context's exit)."""
        stack = self.at(_matmul(i, line, self.job))
        if self.copies is not None and (i, k) not in self.copies:
            self.copies[(i, k)] = self.sim.malloc(self.job.weights[k] * BF16, stack,
                                                  family="autocast_weight_copies")
        return self.sim.malloc(nbytes, stack, family=family)

    def layer(self, i: int, t: int, batch: int, seq: int) -> list[int]:
        """Layer `i`'s forward; what it saves for backward, its input's layer norm first."""
        sim, job, at = self.sim, self.job, self.at
        h, heads, act = job.hidden, job.heads, job.act
        saved = [sim.malloc(t * h * FP32, at(_layer(i, 78, job=job)),
                            family="saved_activations")]  # layer norm
        saved.append(self.matmul(i, 79, 0, t * 3 * h * act, "saved_activations"))  # qkv
        if job.fused:  # SDPA: the output and the log-sum-exp, no scores
            saved.append(sim.malloc(batch * heads * seq * FP32, at(_attention(i, 42, job)),
                                    family="saved_activations"))
        else:
            scores = sim.malloc(batch * heads * seq * seq * act, at(_attention(i, 40, job)),
                                family="activation_temporaries")
            rowmax = sim.malloc(batch * heads * seq * FP32, at(_attention(i, 41, job)),
                                family="activation_temporaries")
            saved.append(sim.malloc(batch * heads * seq * seq * FP32,
                                    at(_attention(i, 42, job)), family="saved_activations"))
            sim.free(rowmax)
            sim.free(scores)
        saved.append(sim.malloc(t * h * act, at(_attention(i, 43, job)),
                                family="saved_activations"))  # probs @ v
        saved.append(self.matmul(i, 84, 2, t * job.ffn * act, "saved_activations"))  # up
        saved.append(sim.malloc(t * job.ffn * act, at(_layer(i, 85, job=job)),
                                family="saved_activations"))  # gelu
        return saved

    def inference_layer(self, i: int, t: int, batch: int, seq: int, x: int) -> int:
        """Layer `i` under no_grad: each intermediate freed once the next op used it."""
        made = self.layer(i, t, batch, seq)
        out = self.matmul(i, 86, 3, t * self.job.hidden * FP32, "activation_temporaries")
        self.sim.free(x)
        for a in made:
            self.sim.free(a)
        return out


def _loss(sim: CachingAllocatorSim, job: Job, t: int, top: S.Chain, fwd: _Forward
          ) -> list[int]:
    """The lm_head and the loss: the logits and their log-softmax kept for backward, or
    (`chunked_loss`) `CHUNK` tokens at a time, each chunk's logits and gradient freed before
    the next, the hidden states' gradient [t, hidden] kept."""
    loss_fn = [*STEP, ("/workspace/gpt/train.py", 66, "train_step"),
               (f"{S.TORCH}/nn/functional.py", 3494, "cross_entropy")]
    head = [*top, (MODEL, 210, "forward")]
    if job.frames == "linear":
        head += LINEAR
    if not job.chunked_loss:
        if fwd.copies is not None:
            fwd.copies[(-1, 0)] = sim.malloc(job.vocab * job.hidden * BF16, S.stack(head),
                                             family="autocast_weight_copies")
        logits = sim.malloc(t * job.vocab * job.act, S.stack(head), family="logits")
        return [logits, sim.malloc(t * job.vocab * FP32, S.stack(loss_fn), family="logits")]
    chunked = [*STEP, ("/workspace/gpt/train.py", 66, "train_step"),
               ("/workspace/gpt/loss.py", 30, "chunked_cross_entropy")]
    grad = sim.malloc(t * job.hidden * FP32, S.stack([*chunked[:-1], (chunked[-1][0], 24,
                                                      chunked[-1][2])]),
                      family="gradients")
    cast = None
    for start in range(0, t, CHUNK):
        n = min(CHUNK, t - start)
        site = S.stack([*chunked, *(LINEAR if job.frames == "linear" else [])])
        if fwd.copies is not None and cast is None:
            cast = sim.malloc(job.vocab * job.hidden * BF16, site,
                              family="autocast_weight_copies")
        logits = sim.malloc(n * job.vocab * job.act, site, family="logits")
        logp = sim.malloc(n * job.vocab * FP32, S.stack([*chunked[:-1], (chunked[-1][0], 32,
                                                         chunked[-1][2])]), family="logits")
        sim.free(logits)
        sim.free(logp)
        sim.advance(500)
    if cast is not None:
        sim.free(cast)
    return [grad]


def _script(batch: int, seq: int, checkpointed: bool = False, job: Job = DEFAULT
            ) -> tuple[list[int], Script]:
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
        weights = [sim.malloc(job.vocab * job.hidden * FP32, None, family="parameters")]
        for _ in range(job.layers):
            weights += [sim.malloc(n * FP32, None, family="parameters") for n in job.weights]
        if job.mode == "train":
            for w in list(weights):  # AdamW exp_avg, exp_avg_sq
                size = next(b.requested for b in sim.live_blocks() if b.address == w)
                sim.malloc(size, None, family="optimizer_state")
                sim.malloc(size, None, family="optimizer_state")
        start.append(len(sim.trace))
        sim.advance(1_000_000)
        facts["batch"], facts["seq"], facts["checkpointed"] = batch, seq, checkpointed
        copies: dict[tuple[int, int], int] | None = {} if job.autocast else None
        top = [*STEP, *_wrap(job, MODEL, 200)]
        embed = S.stack(top, [(MODEL, 190, "forward")])
        if job.mode == "inference":
            fwd = _Forward(sim, job, None, copies)
            x = sim.malloc(t * job.hidden * FP32, embed, family="activation_temporaries")
            for i in range(job.layers):
                x = fwd.inference_layer(i, t, batch, seq, x)
                sim.advance(2000)
            out = _loss(sim, job, t, top, fwd)
            drop_together(sim, (copies or {}).values(), [x], out)
            return
        saved = [sim.malloc(t * job.hidden * FP32, embed, family="saved_activations")]
        layers: list[list[int]] = []
        fwd = _Forward(sim, job, wrap if checkpointed else None, copies)
        for i in range(job.layers):
            made = fwd.layer(i, t, batch, seq)
            if checkpointed:  # the holders keep nothing: only the layer's input stays
                for a in made[1:]:
                    sim.free(a)
                made = made[:1]
            layers.append(made)
            saved += made
            sim.advance(2000)
        out = _loss(sim, job, t, top, fwd)
        sim.advance(10_000)
        if job.mode == "forward":  # the benchmark drops the output, and the graph with it
            drop_together(sim, (copies or {}).values(), saved, out)
            return
        _backward(sim, job, out, saved, layers, weights, copies, checkpointed, t, batch, seq)

    return start, script


def _backward(sim: CachingAllocatorSim, job: Job, out: list[int], saved: list[int],
              layers: list[list[int]], weights: list[int],
              copies: dict[tuple[int, int], int] | None, checkpointed: bool,
              t: int, batch: int, seq: int) -> None:
    """The logits' gradient, then each layer's, freeing what it saved (and, under autocast,
    the weight copies it saved); then AdamW's update and zero_grad."""
    copies = copies or {}
    if job.chunked_loss:  # the loss's gradient was made in the forward, chunk by chunk
        grad = out[0]
    else:
        grad = sim.malloc(t * job.vocab * FP32, None, family="gradients")
        for a in reversed(out):
            sim.free(a)
    grads = [sim.malloc(job.vocab * job.hidden * FP32, None, family="gradients")]
    sim.free(grad)
    if (-1, 0) in copies:
        sim.free(copies.pop((-1, 0)))
    if checkpointed:
        _checkpointed_backward(sim, layers, grads, t, batch, seq, job)
        saved = saved[:1]
    else:
        for i in reversed(range(job.layers)):
            g = sim.malloc(t * job.ffn * FP32, None, family="gradients")
            grads += [sim.malloc(n * FP32, None, family="gradients") for n in job.weights]
            for _ in range(6):  # the layer's six saved tensors
                sim.free(saved.pop())
            for k in (0, 2):
                if (i, k) in copies:
                    sim.free(copies.pop((i, k)))
            sim.free(g)
            sim.advance(2000)
    sim.free(saved.pop())
    for w in weights:  # the update's temporaries, one parameter at a time
        size = next(b.requested for b in sim.live_blocks() if b.address == w)
        sim.free(sim.malloc(size, S.stack(OPTIM), family="optimizer_state"))
    for g in grads:  # zero_grad(set_to_none=True)
        sim.free(g)


def _checkpointed_backward(sim: CachingAllocatorSim, layers: list[list[int]],
                           grads: list[int], t: int, batch: int, seq: int,
                           job: Job = DEFAULT) -> None:
    """Each layer from the last: its forward rerun (`recompute_fn`), its gradients, then
    what the rerun made and the layer's kept input freed."""
    rerun = _Forward(sim, job, [*S.RECOMPUTE], None)
    for i in reversed(range(job.layers)):
        again = rerun.layer(i, t, batch, seq)
        sim.free(again[0])  # the rerun's layer norm: the kept input is what is unpacked
        g = sim.malloc(t * job.ffn * FP32, None, family="gradients")
        grads += [sim.malloc(n * FP32, None, family="gradients") for n in job.weights]
        for a in [*again[1:], *layers[i]]:
            sim.free(a)
        sim.free(g)
        sim.advance(2000)


def sized_job(batch: int, seq: int, checkpointed: bool = False, job: Job = DEFAULT
              ) -> tuple[dict[str, object], dict[str, object]]:
    """(snapshot, truth) of the step at `batch` × `seq` (`checkpointed`: each layer under
    torch.utils.checkpoint; `job`: the model, precision, mode and frames): truth's
    `peak_allocated_bytes` is the simulator's own peak over the whole run (the weights
    included)."""
    start, script = _script(batch, seq, checkpointed, job)
    return run_recorded_late(NAME, script, start)
