"""S1: slime / Megatron GRPO on Qwen3.5-4B (vocab 248320), 4 x A800-80GB (SCENARIOS.md)."""

from __future__ import annotations

from snapana.allocator_model.rules import MiB
from snapana.allocator_model.simulator import CachingAllocatorSim

from .. import stacks as S
from .common import (
    A800_CAPACITY,
    Facts,
    Outcome,
    Script,
    calibrate_outside,
    failing_request,
    run,
)
from .megatron import (
    BF16,
    FP32,
    DenseModel,
    forward_layers,
    forward_layers_recomputed,
    init_training_state,
)

MODEL = DenseModel()
CHUNK = 1024  # --log-probs-chunk-size 1024
TP2_TOKENS = 8148  # 7 chunks of 1024 and a last one of 980 tokens
TP2_FREE = 207 * MiB  # "207 MiB free"
TP2_EXTRA = 685 * MiB  # fp32 SwiGLU intermediates per layer: sizes the step to 77.3 GiB
TP2_SLACK = 6 * MiB  # their workspace is this much larger: ~600 MiB cached at the OOM
TP1_TOKENS = 31890  # packed micro-batch: one [T, V] fp32 copy is 29.5 GiB
LONG_EPISODE = 14053  # one episode longer than the 8192-token box: [T, V] fp32 is 13 GiB
NCCL_AND_CONTEXT = 1200 * MiB  # CUDA context, cuBLAS workspaces, NCCL buffers


def _logits(sim: CachingAllocatorSim, tokens: int, vocab: int, keep_bf16: bool) -> int:
    """Output layer (bf16) then Float16Module's float16_to_fp32 copy. ``keep_bf16``: the
    bf16 output is still referenced (by the schedule's output list) while the loss runs."""
    top = S.SLIME_TRAIN + S.FORWARD_STEP
    bf16 = sim.malloc(tokens * vocab * BF16, S.stack(top, S.OUTPUT_LAYER), family="logits")
    fp32 = sim.malloc(tokens * vocab * FP32, S.stack(top, S.FLOAT16_TO_FP32), family="logits")
    if not keep_bf16:
        sim.free(bf16)
    return fp32


def _chunk_sizes(tokens: int, chunk: int) -> list[int]:
    return [min(chunk, tokens - i) for i in range(0, tokens, chunk)]


def _tp2_step(recompute_loss: bool, extra: int) -> Script:
    """Build the TP=2 script; with ``recompute_loss`` the loss runs under checkpoint."""
    vocab = MODEL.vocab // 2

    def script(sim: CachingAllocatorSim, facts: Facts) -> None:
        init_training_state(sim, MODEL, tp=2, dp=2)
        sim.advance(20_000_000)
        forward_layers(sim, MODEL, 2, TP2_TOKENS, extra, TP2_SLACK)
        _logits(sim, TP2_TOKENS, vocab, keep_bf16=True)
        sizes = _chunk_sizes(TP2_TOKENS, CHUNK)
        facts["chunks"] = {
            "count": len(sizes), "chunk_tokens": CHUNK, "tokens": TP2_TOKENS,
            "vocab_per_rank": vocab, "chunk_bytes": CHUNK * vocab * FP32,
            "last_chunk_tokens": sizes[-1], "last_chunk_bytes": sizes[-1] * vocab * FP32,
            "saved_chunks": 0,
        }
        ckpt = S.CHECKPOINT if recompute_loss else []
        fn = [S.LOGPROB_CHUNK_CALL, *S.LOGPROB_FUNCTION]
        top = [*S.SLIME_TRAIN, *S.LOSS, *ckpt, *fn]
        kept = "activation_temporaries" if recompute_loss else "saved_logprob_softmax"
        for i, n in enumerate(sizes):
            size = n * vocab * FP32
            mx = sim.malloc(n * FP32, S.stack(top, [S.SOFTMAX_MAX]),
                            family="activation_temporaries")
            tmp = sim.malloc(size, S.stack(top, [S.SOFTMAX_SUB]),
                             family="activation_temporaries")
            if i == len(sizes) - 1 and not recompute_loss:
                failing_request(sim, size, S.stack(top, [S.SOFTMAX]), kept)
            sm = sim.malloc(size, S.stack(top, [S.SOFTMAX]), family=kept)
            sim.free(tmp)
            sim.free(mx)
            sim.malloc(n * FP32, S.stack(top, [S.LOG_PROB]), family="saved_activations")
            if recompute_loss:
                sim.free(sm)  # checkpoint's forward runs without grad: nothing is saved
            else:
                facts["chunks"]["saved_chunks"] += 1  # type: ignore[index]
            sim.advance(4000)
        # backward: the last chunk's loss is recomputed first (one chunk at a time)
        sim.advance(30_000)
        n = sizes[-1]
        size = n * vocab * FP32
        rtop = [*S.RECOMPUTE, *fn]
        r_tmp = sim.malloc(size, S.stack(rtop, [S.SOFTMAX_SUB]), family="recompute")
        sim.malloc(size, S.stack(rtop, [S.SOFTMAX]), family="recompute")
        sim.free(r_tmp)
        # built-in backward ops on the autograd thread (empty Python stack): the chunk's
        # logits gradient and a same-sized workspace. Both are backward allocations, which
        # FAMILIES.md counts as gradients (activation_temporaries are forward intermediates)
        sim.malloc(size, None, family="gradients")
        sim.malloc(size, None, family="gradients")
        facts["snapshot_point"] = "loss backward, last chunk recomputed (step peak)"

    return script


def tp2_chunked_logprob_oom() -> Outcome:
    """S1 #3: chunking bounds the transient, not the 7 saved 485 MiB softmax chunks."""
    request = 980 * (MODEL.vocab // 2) * FP32
    return calibrate_outside(_tp2_step(False, TP2_EXTRA), A800_CAPACITY, TP2_FREE, request)


def tp2_recompute_loss_ok() -> Outcome:
    """The same step with --recompute-loss-function fits; snapshot at its peak."""
    ref = tp2_chunked_logprob_oom()
    return run(_tp2_step(True, TP2_EXTRA), A800_CAPACITY, ref.sim.outside_pytorch)


def _tp1_script(tokens: int, chunked: bool) -> Script:
    vocab = MODEL.vocab

    def script(sim: CachingAllocatorSim, facts: Facts) -> None:
        init_training_state(sim, MODEL, tp=1, dp=4)
        sim.advance(20_000_000)
        forward_layers_recomputed(sim, MODEL, 1, tokens)
        top = S.SLIME_TRAIN + S.FORWARD_STEP
        facts["chunks"] = {"count": 1, "tokens": tokens, "vocab_per_rank": vocab,
                           "chunk_bytes": tokens * vocab * FP32}
        if chunked:
            bf16 = sim.malloc(tokens * vocab * BF16, S.stack(top, S.OUTPUT_LAYER),
                              family="logits")
            failing_request(sim, tokens * vocab * FP32, S.stack(top, S.FLOAT16_TO_FP32),
                            "logits")
            sim.free(bf16)
            return
        _logits(sim, tokens, vocab, keep_bf16=False)
        fn = [*S.SLIME_TRAIN, *S.LOSS, S.LOGPROB_CHUNK_CALL, *S.LOGPROB_FUNCTION]
        sim.malloc(tokens * FP32, S.stack(fn, [S.SOFTMAX_MAX]), family="activation_temporaries")
        sim.malloc(tokens * vocab * FP32, S.stack(fn, [S.SOFTMAX_SUB]),
                   family="activation_temporaries")
        failing_request(sim, tokens * vocab * FP32, S.stack(fn, [S.SOFTMAX]),
                        "saved_logprob_softmax")

    return script


def tp1_logits_fp32_oom() -> Outcome:
    """S1 #1: float16_to_fp32 asks 29.5 GiB for the whole [T, V] fp32 logits."""
    out = run(_tp1_script(TP1_TOKENS, True), A800_CAPACITY, NCCL_AND_CONTEXT)
    out.facts["max_tokens_per_gpu"] = 32768
    return out


def tp1_long_episode_softmax_oom() -> Outcome:
    """S1 #2: one 14053-token episode alone in its micro-batch; the softmax copy is 13 GiB."""
    out = run(_tp1_script(LONG_EPISODE, False), A800_CAPACITY, NCCL_AND_CONTEXT)
    out.facts.update({"max_tokens_per_gpu": 8192, "episode_tokens": LONG_EPISODE})
    return out


__all__ = ["tp1_logits_fp32_oom", "tp1_long_episode_softmax_oom", "tp2_chunked_logprob_oom",
           "tp2_recompute_loss_ok"]
