"""Megatron-LM training state on the simulator: model build, DDP buffers, distributed
optimizer, and one micro-batch's forward activations (shared by the slime scenarios)."""

from __future__ import annotations

from dataclasses import dataclass

from snapana.allocator_model.simulator import CachingAllocatorSim

from .. import stacks as S

BF16, FP32 = 2, 4


@dataclass(frozen=True)
class DenseModel:
    """Dimensions of a Qwen3-style dense decoder (the seed's Qwen3.5-4B, vocab 248320)."""

    hidden: int = 2560
    layers: int = 36
    q_heads: int = 32
    kv_heads: int = 8
    head_dim: int = 128
    ffn: int = 9728
    vocab: int = 248320

    def layer_params(self, tp: int) -> list[tuple[str, int]]:
        """(name, elements on one TP rank) for one transformer layer."""
        h, d = self.hidden, self.head_dim
        return [
            ("linear_qkv", h * (self.q_heads + 2 * self.kv_heads) * d // tp),
            ("linear_proj", self.q_heads * d // tp * h),
            ("linear_fc1", h * 2 * self.ffn // tp),
            ("linear_fc2", self.ffn // tp * h),
            ("input_layernorm", h), ("pre_mlp_layernorm", h), ("q_layernorm", d),
            ("k_layernorm", d),
        ]

    def all_params(self, tp: int) -> list[tuple[str, int]]:
        emb = self.vocab // tp * self.hidden
        out = [("embedding", emb)]
        for i in range(self.layers):
            out += [(f"layers.{i}.{n}", k) for n, k in self.layer_params(tp)]
        return out + [("final_layernorm", self.hidden), ("output_layer", emb)]


def init_training_state(
    sim: CachingAllocatorSim, model: DenseModel, tp: int, dp: int
) -> dict[str, int]:
    """Build the model, move its parameters into DDP's param/grad buffers, build the
    distributed optimizer's fp32 main-param shards and Adam state. Returns buffer addresses."""
    params = model.all_params(tp)
    created = []
    for i, (name, numel) in enumerate(params):
        chain = S.MODEL_BUILD + S.TE_PARAM_INIT
        if name in ("embedding", "output_layer", "final_layernorm"):
            chain = S.MODEL_BUILD[:-2] + [(f"{S.MEG}/tensor_parallel/layers.py", 250 + i % 2,
                                          "__init__")]
        created.append(sim.malloc(numel * BF16, S.stack(chain), family="parameters"))
    total = sum(n for _, n in params)
    ddp = S.ddp_buffer_chain()
    param_data = sim.malloc(total * BF16, S.stack(ddp, [S.PARAM_DATA]), family="param_buffer")
    grad_data = sim.malloc(total * FP32, S.stack(ddp, [S.GRAD_DATA]), family="grad_buffer")
    for addr in created:  # param.data = param_data[...]: the original storages die
        sim.free(addr)
    for _, numel in params:
        sim.malloc(numel // dp * FP32, S.stack(S.OPTIMIZER_BUILD), family="main_params_fp32")
    for _, numel in params:
        for _state in ("exp_avg", "exp_avg_sq"):
            sim.malloc(numel // dp * FP32, S.stack(S.OPTIMIZER_STATE), family="optimizer_state")
    return {"param_data": param_data, "grad_data": grad_data}


LAYER_OUTPUT = (f"{S.MEG}/transformer/transformer_layer.py", 540, "_forward_mlp")
"""Where a layer's output is made: the MLP's bias-dropout-add residual sum."""


def forward_layers(
    sim: CachingAllocatorSim, model: DenseModel, tp: int, tokens: int,
    extra_per_layer: int = 0, extra_slack: int = 0,
) -> list[int]:
    """One micro-batch through every layer without recompute: what autograd keeps is
    ``saved_activations``; what dies inside the layer is ``activation_temporaries``.
    ``extra_per_layer`` adds the fp32 intermediates the fused SwiGLU keeps (scenario sizing);
    they are computed in a workspace ``extra_slack`` bytes larger that is freed first, so each
    layer leaves a small cached hole (the fragmentation a real step shows)."""
    h, T = model.hidden, tokens
    q = model.q_heads * model.head_dim // tp
    kv = model.kv_heads * model.head_dim // tp
    ffn = model.ffn // tp
    top = S.SLIME_TRAIN + S.FORWARD_STEP
    saved: list[int] = []

    def keep(size: int, *chains: S.Chain) -> None:
        saved.append(sim.malloc(size, S.stack(top, *chains), family="saved_activations"))

    def temp(size: int, *chains: S.Chain) -> int:
        return sim.malloc(size, S.stack(top, *chains), family="activation_temporaries")

    for layer in range(model.layers):
        lay = S.layer_chain(layer)
        keep(T * h * BF16, lay, S.ATTN, S.TE_LN_LINEAR)  # ln_out
        qkv = temp(T * (q + 2 * kv) * BF16, lay, S.ATTN, S.TE_LN_LINEAR)
        rope = [(f"{S.MEG}/models/common/embeddings/rope_utils.py", 233, "apply_rotary_pos_emb")]
        keep(T * q * BF16, lay, S.ATTN, rope)
        keep(T * kv * BF16, lay, S.ATTN, rope)
        sim.free(qkv)
        keep(T * q * BF16, lay, S.ATTN, S.TE_ATTN)  # core attention output
        keep(model.q_heads // tp * T * FP32, lay, S.ATTN, S.TE_ATTN)  # softmax_lse
        proj = temp(T * h * BF16, lay, S.ATTN, S.TE_LINEAR)
        keep(T * h * BF16, lay, [(f"{S.MEG}/transformer/transformer_layer.py", 480,
                                  "_forward_attention")])  # residual sum
        sim.free(proj)
        keep(T * h * BF16, lay, S.MLP, S.TE_LN_LINEAR)  # pre-MLP layernorm output
        keep(T * 2 * ffn * BF16, lay, S.MLP, S.TE_LN_LINEAR)  # fc1 output
        if extra_per_layer:
            swiglu_fp32 = [*S.SWIGLU[:-1], (f"{S.MEG}/fusions/fused_bias_swiglu.py", 99,
                                             "forward")]
            work = temp(extra_per_layer + extra_slack, lay, S.MLP, swiglu_fp32)
            sim.free(work)
            keep(extra_per_layer, lay, S.MLP, swiglu_fp32)
        keep(T * ffn * BF16, lay, S.MLP, S.SWIGLU)  # swiglu output
        fc2 = temp(T * h * BF16, lay, S.MLP, S.TE_LINEAR)
        keep(T * h * BF16, lay, [LAYER_OUTPUT])  # layer output
        sim.free(fc2)
        sim.advance(900)
    return saved


RECOMPUTE_BLOCK: S.Chain = [
    (f"{S.MEG}/transformer/transformer_block.py", 430, "_checkpointed_forward"),
    (f"{S.MEG}/transformer/transformer_block.py", 400, "checkpoint_handler"),
    (f"{S.MEG}/tensor_parallel/random.py", 480, "checkpoint"),
    *S.apply_function(f"{S.MEG}/tensor_parallel/random.py", 410),  # CheckpointFunction
    (f"{S.MEG}/transformer/transformer_block.py", 380, "custom_forward"),
]


def forward_layers_recomputed(
    sim: CachingAllocatorSim, model: DenseModel, tp: int, tokens: int
) -> list[int]:
    """Full uniform recompute: each checkpointed layer keeps only its input; everything it
    computes inside runs without grad and dies with the layer."""
    h, T = model.hidden, tokens
    q = model.q_heads * model.head_dim // tp
    kv = model.kv_heads * model.head_dim // tp
    ffn = model.ffn // tp
    top = S.SLIME_TRAIN + S.FORWARD_STEP + S.GPT_FORWARD + S.call_module(
        f"{S.MEG}/transformer/transformer_block.py", 549) + RECOMPUTE_BLOCK
    lay = S.call_module(f"{S.MEG}/transformer/transformer_layer.py", 412)
    saved: list[int] = []
    for _ in range(model.layers):
        def temp(size: int, *chains: S.Chain) -> int:
            return sim.malloc(size, S.stack(top, lay, *chains), family="activation_temporaries")
        ln = temp(T * h * BF16, S.ATTN, S.TE_LN_LINEAR)
        qkv = temp(T * (q + 2 * kv) * BF16, S.ATTN, S.TE_LN_LINEAR)
        sim.free(ln)
        att = temp(T * q * BF16, S.ATTN, S.TE_ATTN)
        sim.free(qkv)
        res = temp(T * h * BF16, S.ATTN, S.TE_LINEAR)
        sim.free(att)
        fc1 = temp(T * 2 * ffn * BF16, S.MLP, S.TE_LN_LINEAR)
        act = temp(T * ffn * BF16, S.MLP, S.SWIGLU)
        sim.free(fc1)
        fc2 = temp(T * h * BF16, S.MLP, S.TE_LINEAR)
        sim.free(act)
        # the layer's output is the MLP bias-dropout-add's residual sum (made in
        # _forward_mlp, as in forward_layers), not fc2's output: it is the next
        # checkpoint's input, which that checkpoint saves
        saved.append(sim.malloc(T * h * BF16, S.stack(top, lay, [LAYER_OUTPUT]),
                                family="saved_activations"))
        sim.free(fc2)
        sim.free(res)
        sim.advance(1500)
    return saved
