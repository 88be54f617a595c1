"""Jobs written at any parallel layout (issue 70), each with its ground-truth peak, for
`whatif --scale tp= / dp= --zero` to predict one layout's peak from another's. The shapes are
the papers', written here independently of the analyzer's scaling rules:

- `zero_job`: mixed-precision Adam model state of Ψ parameters on one of Nd data-parallel
  ranks (Rajbhandari et al. 2020, §3 and Figure 1): fp16 parameters 2Ψ, fp16 gradients 2Ψ,
  fp32 parameters, momentum and variance 12Ψ (K = 12); ZeRO stage 1 keeps 1/Nd of the
  optimizer state, stage 2 of the gradients too, stage 3 of the parameters too.
- `megatron_layers_job`: a transformer layer's saved activations on one of t tensor-parallel
  ranks (Korthikanti et al. 2022, §4.1–4.2.2): per layer 11sbh + 5as²b in attention (QKV
  input 2sbh, Q and K 4sbh, softmax 2as²b, its dropout mask as²b, the dropout's output 2as²b,
  V 2sbh, the projection's input 2sbh, its dropout mask sbh), 19sbh in the MLP (input 2sbh,
  GeLU input 8sbh, second linear's input 8sbh, dropout mask sbh), the layer norms' inputs
  4sbh; fp16, masks one byte. Inside the tensor-parallel region (Q, K, V, softmax, dropout,
  projection input, GeLU and its output) a rank holds 1/t; the rest (10sbh) all of it, or
  1/t with sequence parallelism.
"""

from __future__ import annotations

from snapana.allocator_model.rules import GiB
from snapana.allocator_model.simulator import CachingAllocatorSim

from .. import stacks as S
from .common import Facts, Outcome, run, truth

FP16, FP32, MASK = 2, 4, 1
#: a card large enough for the paper's 120 GB baseline
CAPACITY = 256 * GiB
PRETRAIN: S.Chain = [("/workspace/Megatron-LM/pretrain_gpt.py", 330, "<module>"),
                     (f"{S.SITE}/megatron/training/training.py", 420, "pretrain")]
OPT_BUILD: S.Chain = [*PRETRAIN,
                      (f"{S.SITE}/megatron/training/training.py", 712,
                       "setup_model_and_optimizer"),
                      (f"{S.MEG}/optimizer/__init__.py", 590, "get_megatron_optimizer")]
MAIN_PARAMS: S.Chain = [*OPT_BUILD, (f"{S.MEG}/optimizer/optimizer.py", 640, "__init__")]
ADAM_STATE: S.Chain = [*PRETRAIN, (f"{S.SITE}/megatron/training/training.py", 1220,
                                   "train_step"),
                       (f"{S.MEG}/optimizer/optimizer.py", 470, "step"),
                       (f"{S.MEG}/optimizer/__init__.py", 402, "init_state_fn"),
                       (f"{S.TE}/optimizers/fused_adam.py", 360, "_initialize_state")]
DISTRIB: S.Chain = [*OPT_BUILD, (f"{S.MEG}/optimizer/distrib_optimizer.py", 382,
                                 "_build_model_and_main_param_groups")]


def _ddp() -> S.Chain:
    return [*PRETRAIN, (f"{S.SITE}/megatron/training/training.py", 605, "get_model"),
            (f"{S.MEG}/distributed/distributed_data_parallel.py", 298, "__init__"),
            (f"{S.MEG}/distributed/distributed_data_parallel.py", 157,
             "_allocate_buffers_for_parameters")]


def zero_job(stage: int, dp: int, psi: int = 7_500_000_000, tensors: int = 60
             ) -> tuple[dict[str, object], dict[str, object]]:
    """(snapshot, truth) of one rank's model state at ZeRO `stage` over `dp` ranks: Ψ = `psi`
    parameters in `tensors` equal tensors (each divisible by dp), recorded from the start."""
    each = psi // tensors

    def script(sim: CachingAllocatorSim, facts: Facts) -> None:
        p = dp if stage >= 3 else 1
        g = dp if stage >= 2 else 1
        o = dp if stage >= 1 else 1
        sim.malloc(psi * FP16 // p, S.stack(_ddp(), [S.PARAM_DATA]), family="param_buffer")
        sim.malloc(psi * FP16 // g, S.stack(_ddp(), [S.GRAD_DATA]), family="grad_buffer")
        main = DISTRIB if stage >= 1 else MAIN_PARAMS
        for _ in range(tensors):
            sim.malloc(each * FP32 // o, S.stack(main), family="main_params_fp32")
        for _ in range(tensors):
            for _state in ("exp_avg", "exp_avg_sq"):
                sim.malloc(each * FP32 // o, S.stack(ADAM_STATE), family="optimizer_state")
        facts.update(stage=stage, dp=dp, psi=psi)

    out: Outcome = run(script, CAPACITY, 0)
    return out.sim.snapshot(), truth(f"zero-stage{stage}-dp{dp}", out)


def _layer_ops(s: int, b: int, h: int, a: int, tp: int, sp: bool
               ) -> list[tuple[int, S.Chain]]:
    """One layer's saved tensors on one rank, in the order the forward makes them: (bytes,
    the chain of the op that makes it, outermost first)."""
    sbh = s * b * h
    rep = tp if sp else 1  # the residual stream: split only with sequence parallelism
    scores = a * s * s * b // tp
    layer = f"{S.MEG}/transformer/transformer_layer.py"
    attn = [*S.call_module(f"{S.MEG}/transformer/attention.py", 602)]
    core = [*attn, *S.call_module(f"{S.MEG}/transformer/dot_product_attention.py", 150)]
    bda = [(f"{S.MEG}/fusions/fused_bias_dropout.py", 40, "_bias_dropout_add_func")]
    ln = S.TE_LN_LINEAR
    qkv = [*attn, (f"{S.MEG}/transformer/attention.py", 720, "get_query_key_value_tensors")]
    mlp = [(layer, 520, "_forward_mlp"), *S.call_module(f"{S.MEG}/transformer/mlp.py", 141)]
    att = [(layer, 465, "_forward_attention")]
    return [
        (2 * sbh // rep, [*att, *bda]),  # input layer norm's input (the residual stream)
        (2 * sbh // rep, [*att, *attn, *ln]),  # QKV input: the layer norm's output
        (2 * sbh // tp, [*att, *qkv]),  # Q
        (2 * sbh // tp, [*att, *qkv]),  # K
        (2 * sbh // tp, [*att, *qkv]),  # V
        (FP16 * scores, [*att, *core,
                         *S.apply_function(f"{S.MEG}/fusions/fused_softmax.py", 60)]),
        (MASK * scores, [*att, *core]),  # softmax dropout mask
        (FP16 * scores, [*att, *core]),  # dropout output
        (2 * sbh // tp, [*att, *core]),  # context: the projection's input
        (MASK * sbh // rep, [*att, *bda]),  # attention dropout mask
        (2 * sbh // rep, [*mlp[:1], *bda]),  # pre-MLP layer norm's input
        (2 * sbh // rep, [*mlp, *ln]),  # MLP input: the layer norm's output
        (8 * sbh // tp, [*mlp, *ln]),  # GeLU input: the first linear's output
        (8 * sbh // tp, [*mlp, (f"{S.MEG}/fusions/fused_bias_gelu.py", 35,
                                "bias_gelu_impl")]),  # second linear's input
        (MASK * sbh // rep, [*mlp[:1], *bda]),  # MLP dropout mask
    ]


def megatron_layers_job(tp: int, sp: bool = False, layers: int = 2, s: int = 2048,
                        b: int = 1, h: int = 12288, a: int = 96
                        ) -> tuple[dict[str, object], dict[str, object]]:
    """(snapshot, truth) of `layers` layers' forward on one of `tp` ranks, their saved
    activations kept (GPT-3 175B's s, h, a by default: Korthikanti et al.'s Table 3)."""
    top = [*PRETRAIN, (f"{S.SITE}/megatron/training/training.py", 1220, "train_step"),
           (f"{S.MEG}/pipeline_parallel/schedules.py", 286, "forward_step"), *S.GPT_FORWARD]

    def script(sim: CachingAllocatorSim, facts: Facts) -> None:
        for i in range(layers):
            for size, chain in _layer_ops(s, b, h, a, tp, sp):
                sim.malloc(size, S.stack(top, S.layer_chain(i), chain),
                           family="saved_activations")
            sim.advance(1000)
        facts.update(tp=tp, sp=sp, layers=layers, s=s, b=b, h=h, a=a)

    out: Outcome = run(script, CAPACITY, 0)
    return out.sim.snapshot(), truth(f"megatron-layers-tp{tp}{'-sp' if sp else ''}", out)


def megatron_step_job(tp: int, dp: int = 2, tokens: int = 8148, chunk: int = 1024,
                      extra_tp2: int = 685 * 2**20, pad_to: int = 1
                      ) -> tuple[dict[str, object], dict[str, object]]:
    """(snapshot, truth) of the slime / Megatron step of `slime-tp2-chunked-logprob-oom`
    (the seed's dense model, its distributed optimizer over `dp` ranks, one micro-batch's
    forward, vocab-parallel logits and the chunked log-prob's saved softmax) at any `tp`,
    on a card large enough not to run out, recorded from the start. The fp32 SwiGLU
    intermediates (`extra_tp2` per layer at tp=2) are [T, ffn / tp] too. `pad_to`: the
    packed tokens padded up to a multiple of it before the model runs, as slime's get_batch
    pads to tp × pad_multiplier (pad = (m − T % m) % m): the layers and the logits are
    sized for the padded count, the log-prob runs on the `tokens` real ones."""
    from .megatron import DenseModel, forward_layers, init_training_state

    model = DenseModel()
    vocab = model.vocab // tp

    def script(sim: CachingAllocatorSim, facts: Facts) -> None:
        init_training_state(sim, model, tp=tp, dp=dp)
        sim.advance(1_000_000)
        padded = tokens + (pad_to - tokens % pad_to) % pad_to
        forward_layers(sim, model, tp, padded, extra_tp2 * 2 // tp)
        top = S.SLIME_TRAIN + S.FORWARD_STEP
        sim.malloc(padded * vocab * FP16, S.stack(top, S.OUTPUT_LAYER), family="logits")
        sim.malloc(padded * vocab * FP32, S.stack(top, S.FLOAT16_TO_FP32), family="logits")
        loss = [*S.SLIME_TRAIN, *S.LOSS, S.LOGPROB_CHUNK_CALL, *S.LOGPROB_FUNCTION]
        for start in range(0, tokens, chunk):
            n = min(chunk, tokens - start)
            mx = sim.malloc(n * FP32, S.stack(loss, [S.SOFTMAX_MAX]),
                            family="activation_temporaries")
            tmp = sim.malloc(n * vocab * FP32, S.stack(loss, [S.SOFTMAX_SUB]),
                             family="activation_temporaries")
            sim.malloc(n * vocab * FP32, S.stack(loss, [S.SOFTMAX]),
                       family="saved_logprob_softmax")
            sim.free(tmp)
            sim.free(mx)
            sim.malloc(n * FP32, S.stack(loss, [S.LOG_PROB]), family="saved_activations")
            sim.advance(4000)
        facts.update(tp=tp, dp=dp, tokens=tokens, padded_tokens=padded)

    out: Outcome = run(script, CAPACITY, 0)
    return out.sim.snapshot(), truth(f"megatron-step-tp{tp}", out)
