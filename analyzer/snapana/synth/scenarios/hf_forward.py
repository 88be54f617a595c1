"""One forward of a Hugging Face Llama-style causal LM that does not generate (a scoring or
evaluation pass), called with ``use_cache`` left on (issue 67): each attention keeps its
layer's keys (made by the rotary embedding, ``apply_rotary_pos_emb``) and values (the v
projection's output) for the returned ``past_key_values`` (transformers <= 4.55
``DynamicCache.update`` appends them without allocating), so the forward ends holding
2 x layers blocks of batch x kv_heads x seq x head_dim, freed together when the output is
dropped.

The weights exist before recording starts (no frames). ``use_cache=False`` is the twin whose
keys and values go with their layer; ``grad=True`` runs the same forward with autograd on, so
every layer keeps its activations too and the cache is one kept site among many. Ground truth
(`facts["kv"]`: the cache's addresses) is the simulator's own bookkeeping, never an analysis.
"""

from __future__ import annotations

from snapana.allocator_model.frames import Frame
from snapana.allocator_model.simulator import CachingAllocatorSim

from .. import stacks as S
from .common import Facts, drop_together, run_recorded_late

NAME = "hf-llama-forward-use-cache"
LAYERS, HIDDEN, KV_HEADS, HEAD_DIM, FFN, VOCAB = 8, 4096, 8, 128, 14336, 32000
BF16 = 2
LLAMA = f"{S.SITE}/transformers/models/llama/modeling_llama.py"
DRIVER: S.Chain = [("/workspace/eval/score.py", 61, "<module>"),
                   (f"{S.TORCH}/utils/_contextlib.py", 116, "decorate_context"),
                   ("/workspace/eval/score.py", 33, "score"),
                   *S.call_module(LLAMA, 1190), *S.call_module(LLAMA, 940)]
#: a layer's weights (numel): q, k, v, o, gate, up, down, two norms
WEIGHTS = (HIDDEN * HIDDEN, HIDDEN * KV_HEADS * HEAD_DIM, HIDDEN * KV_HEADS * HEAD_DIM,
           HIDDEN * HIDDEN, HIDDEN * FFN, HIDDEN * FFN, FFN * HIDDEN, HIDDEN, HIDDEN)


#: the same forward as generate()'s prefill: GenerationMixin.generate (decorated
#: @torch.no_grad()) calls its decoding loop `_sample`, which calls the model
GENERATE: S.Chain = [("/workspace/eval/chat.py", 48, "<module>"),
                     (f"{S.TORCH}/utils/_contextlib.py", 116, "decorate_context"),
                     (f"{S.SITE}/transformers/generation/utils.py", 2215, "generate"),
                     (f"{S.SITE}/transformers/generation/utils.py", 3206, "_sample"),
                     *S.call_module(LLAMA, 1190), *S.call_module(LLAMA, 940)]


def _attn(driver: S.Chain, line: int, *inner: Frame) -> tuple[Frame, ...]:
    """A frame of LlamaAttention.forward (a projection: through nn.Linear)."""
    chain = [*driver, *S.call_module(LLAMA, 640), *S.call_module(LLAMA, 300), (LLAMA, line,
                                                                               "forward")]
    return S.stack(chain, list(inner))


def _linear(driver: S.Chain, line: int) -> tuple[Frame, ...]:
    return _attn(driver, line, *S.call_module(f"{S.TORCH}/nn/modules/linear.py", 125))


def _layer(driver: S.Chain, line: int) -> tuple[Frame, ...]:
    """A frame of LlamaDecoderLayer.forward (norms, residual adds, the MLP)."""
    return S.stack([*driver, *S.call_module(LLAMA, 640), (LLAMA, line, "forward")])


def hf_forward(batch: int = 8, seq: int = 8192, *, use_cache: bool = True,
               grad: bool = False, generate: bool = False
               ) -> tuple[dict[str, object], dict[str, object]]:
    """(snapshot, truth): the forward's end holds the weights, the cache (with `use_cache`),
    the final hidden states and the logits; the cache is freed together after it. With
    `generate` the forward is generate()'s prefill (its frames on every stack)."""
    drv = GENERATE if generate else DRIVER
    start: list[int] = []
    t = batch * seq
    kv_bytes = t * KV_HEADS * HEAD_DIM * BF16

    def script(sim: CachingAllocatorSim, facts: Facts) -> None:
        sim.malloc(VOCAB * HIDDEN * BF16 * 2, None, family="parameters")  # embed + lm_head
        for _ in range(LAYERS):
            for n in WEIGHTS:
                sim.malloc(n * BF16, None, family="parameters")
        start.append(len(sim.trace))
        sim.advance(1_000_000)
        act = "saved_activations" if grad else "activation_temporaries"
        x = sim.malloc(t * HIDDEN * BF16, S.stack(drv), family=act)
        cache: list[int] = []
        kept: list[int] = []

        def temp(size: int, stack: tuple[Frame, ...]) -> int:
            a = sim.malloc(size, stack, family=act)
            kept.append(a)
            return a

        def done(*addrs: int) -> None:
            if not grad:  # no graph: a layer's temporaries go once used
                for a in addrs:
                    sim.free(a)
                    kept.remove(a)

        for _ in range(LAYERS):
            h = temp(t * HIDDEN * BF16, _layer(drv, 610))  # input_layernorm
            q = temp(t * HIDDEN * BF16, _linear(drv, 318))
            k = temp(kv_bytes, _linear(drv, 319))
            fam = "kv_cache" if use_cache else act
            v = sim.malloc(kv_bytes, _linear(drv, 320), family=fam)
            rope = (LLAMA, 150, "apply_rotary_pos_emb")
            qe = temp(t * HIDDEN * BF16, _attn(drv, 324, rope))
            ke = sim.malloc(kv_bytes, _attn(drv, 324, rope), family=fam)
            done(k)
            o = temp(t * HIDDEN * BF16, _attn(drv, 340))  # sdpa output
            done(q, qe, h)
            if use_cache:
                cache += [v, ke]
            else:
                kept.extend((v, ke))
                done(v, ke)
            p = temp(t * HIDDEN * BF16, _linear(drv, 352))  # o_proj
            done(o)
            x2 = temp(t * HIDDEN * BF16, _layer(drv, 620))  # residual add
            done(p)
            h2 = temp(t * HIDDEN * BF16, _layer(drv, 625))  # post_attention_layernorm
            g = temp(t * FFN * BF16, _layer(drv, 630))
            u = temp(t * FFN * BF16, _layer(drv, 631))
            done(h2)
            m = temp(t * FFN * BF16, _layer(drv, 632))
            done(g, u)
            d = temp(t * HIDDEN * BF16, _layer(drv, 633))
            done(m)
            y = sim.malloc(t * HIDDEN * BF16, _layer(drv, 636), family=act)  # residual add
            done(d, x2)
            if grad:
                kept.append(x)
            else:
                sim.free(x)
            x = y
            sim.advance(2000)
        logits = sim.malloc(t * VOCAB * BF16, S.stack([*drv[:-3], *S.call_module(
            f"{S.TORCH}/nn/modules/linear.py", 125)]), family="logits")
        facts["kv"] = list(cache)
        facts["kv_bytes"] = len(cache) * kv_bytes
        # the returned output dropped: DynamicCache and its lists go
        drop_together(sim, cache, kept, (x, logits))

    return run_recorded_late(NAME, script, start)
