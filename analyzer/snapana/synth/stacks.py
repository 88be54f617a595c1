"""Python call stacks shaped like the real frameworks' allocation sites (see FAMILIES.md).

Chains are written outermost first, as one reads a traceback, and ``stack()`` turns them into
the snapshot's innermost-first order. File names and function names are the frameworks' own;
line numbers are plausible and only tell two sites in one function apart.
"""

from __future__ import annotations

from snapana.allocator_model.frames import Frame

SITE = "/usr/local/lib/python3.10/dist-packages"
TORCH = f"{SITE}/torch"
MEG = f"{SITE}/megatron/core"
TE = f"{SITE}/transformer_engine/pytorch"
VLLM = f"{SITE}/vllm"
SWIFT = f"{SITE}/swift"
SLIME = "/root/slime/slime"

Chain = list[Frame]


def stack(*chains: Chain) -> tuple[Frame, ...]:
    """Concatenate outermost-first chains and return the innermost-first stack."""
    out: list[Frame] = []
    for c in chains:
        out.extend(c)
    return tuple(reversed(out))


def call_module(path: str, line: int, name: str = "forward") -> Chain:
    """``module(x)``: torch's module call wrappers, then the module's own forward."""
    return [
        (f"{TORCH}/nn/modules/module.py", 1773, "_wrapped_call_impl"),
        (f"{TORCH}/nn/modules/module.py", 1784, "_call_impl"),
        (path, line, name),
    ]


def apply_function(path: str, line: int, name: str = "forward") -> Chain:
    """``SomeFunction.apply(...)``: a custom autograd Function's forward (torch <= 2.9)."""
    return [(f"{TORCH}/autograd/function.py", 575, "apply"), (path, line, name)]


# ------------------------------------------------------------------ slime / Megatron training
SLIME_TRAIN: Chain = [
    ("/root/slime/train.py", 104, "<module>"),
    ("/root/slime/train.py", 71, "train"),
    (f"{SLIME}/backends/megatron_utils/actor.py", 398, "train"),
    (f"{SLIME}/backends/megatron_utils/actor.py", 455, "train_actor"),
    (f"{SLIME}/backends/megatron_utils/model.py", 498, "train"),
    (f"{SLIME}/backends/megatron_utils/model.py", 382, "train_one_step"),
    (f"{MEG}/pipeline_parallel/schedules.py", 594, "forward_backward_no_pipelining"),
]
SLIME_INIT: Chain = [
    ("/root/slime/train.py", 104, "<module>"),
    ("/root/slime/train.py", 22, "train"),
    (f"{SLIME}/backends/megatron_utils/actor.py", 92, "init"),
    (f"{SLIME}/backends/megatron_utils/model.py", 121, "initialize_model_and_optimizer"),
    (f"{SLIME}/backends/megatron_utils/model.py", 96, "setup_model_and_optimizer"),
]
FORWARD_STEP: Chain = [
    (f"{MEG}/pipeline_parallel/schedules.py", 286, "forward_step"),
    (f"{SLIME}/backends/megatron_utils/model.py", 339, "forward_step"),
    *call_module(f"{MEG}/distributed/data_parallel_base.py", 22),
    *call_module(f"{MEG}/transformer/module.py", 313),  # Float16Module.forward
]
GPT_FORWARD: Chain = [
    *call_module(f"{MEG}/models/gpt/gpt_model.py", 278),
]
BACKWARD_STEP: Chain = [
    (f"{MEG}/pipeline_parallel/schedules.py", 411, "backward_step"),
    (f"{MEG}/pipeline_parallel/schedules.py", 150, "custom_backward"),
]


def layer_chain(layer: int) -> Chain:
    """GPTModel -> TransformerBlock -> TransformerLayer (the same frames for every layer,
    as in a real dump: the layer index is not on the stack)."""
    del layer
    return [
        *GPT_FORWARD,
        *call_module(f"{MEG}/transformer/transformer_block.py", 549),
        *call_module(f"{MEG}/transformer/transformer_layer.py", 412),
    ]


ATTN: Chain = [
    (f"{MEG}/transformer/transformer_layer.py", 465, "_forward_attention"),
    *call_module(f"{MEG}/transformer/attention.py", 602),
]
MLP: Chain = [
    (f"{MEG}/transformer/transformer_layer.py", 520, "_forward_mlp"),
    *call_module(f"{MEG}/transformer/mlp.py", 141),
]
TE_LN_LINEAR = [*call_module(f"{TE}/module/layernorm_linear.py", 1500),
                *apply_function(f"{TE}/module/layernorm_linear.py", 180)]
TE_LINEAR = [*call_module(f"{TE}/module/linear.py", 1250),
             *apply_function(f"{TE}/module/linear.py", 150)]
TE_ATTN = [*call_module(f"{MEG}/extensions/transformer_engine.py", 1015),
           *call_module(f"{TE}/attention/dot_product_attention/dot_product_attention.py", 1330),
           *call_module(f"{TE}/attention/dot_product_attention/backends.py", 1120),
           *apply_function(f"{TE}/attention/dot_product_attention/backends.py", 760)]
SWIGLU = [(f"{MEG}/fusions/fused_bias_swiglu.py", 186, "bias_swiglu_impl"),
          *apply_function(f"{MEG}/fusions/fused_bias_swiglu.py", 105)]

OUTPUT_LAYER: Chain = [
    *GPT_FORWARD,
    (f"{MEG}/models/gpt/gpt_model.py", 347, "_postprocess"),
    *call_module(f"{MEG}/tensor_parallel/layers.py", 1054),  # ColumnParallelLinear
    (f"{MEG}/tensor_parallel/layers.py", 640, "linear_with_grad_accumulation_and_async_allreduce"),
    *apply_function(f"{MEG}/tensor_parallel/layers.py", 470),
]
FLOAT16_TO_FP32: Chain = [
    (f"{MEG}/transformer/module.py", 316, "float16_to_fp32"),
    (f"{MEG}/transformer/module.py", 41, "conversion_helper"),
    (f"{MEG}/transformer/module.py", 52, "float_conversion"),
]

LOSS: Chain = [
    (f"{MEG}/pipeline_parallel/schedules.py", 286, "forward_step"),
    (f"{MEG}/pipeline_parallel/schedules.py", 215, "forward_step_calc_loss"),
    (f"{SLIME}/backends/megatron_utils/loss.py", 640, "loss_function"),
    (f"{SLIME}/backends/megatron_utils/loss.py", 402, "policy_loss_function"),
    (f"{SLIME}/backends/megatron_utils/loss.py", 111, "get_log_probs_and_entropy"),
    (f"{SLIME}/utils/ppo_utils.py", 520, "calculate_log_probs_and_entropy"),
]
CHECKPOINT: Chain = [
    (f"{TORCH}/_compile.py", 53, "inner"),
    (f"{TORCH}/utils/checkpoint.py", 495, "checkpoint"),
    (f"{TORCH}/utils/checkpoint.py", 1536, "_checkpoint_without_reentrant_generator"),
]
RECOMPUTE: Chain = [
    (f"{TORCH}/utils/checkpoint.py", 1129, "unpack_hook"),
    (f"{TORCH}/utils/checkpoint.py", 1500, "recompute_fn"),
]
LOGPROB_FUNCTION: Chain = apply_function(f"{SLIME}/utils/ppo_utils.py", 412)
LOGPROB_CHUNK_CALL = (f"{SLIME}/utils/ppo_utils.py", 478, "_calculate_log_probs_and_entropy_chunk")
SOFTMAX_MAX = (f"{SLIME}/utils/ppo_utils.py", 362, "vocab_parallel_softmax")
SOFTMAX_SUB = (f"{SLIME}/utils/ppo_utils.py", 366, "vocab_parallel_softmax")
SOFTMAX = (f"{SLIME}/utils/ppo_utils.py", 371, "vocab_parallel_softmax")
LOG_PROB = (f"{SLIME}/utils/ppo_utils.py", 425, "forward")


# ------------------------------------------------------------------ Megatron init
def ddp_buffer_chain() -> Chain:
    return [
        *SLIME_INIT,
        (f"{SITE}/megatron/training/training.py", 605, "get_model"),
        (f"{MEG}/distributed/distributed_data_parallel.py", 298, "__init__"),
        (f"{MEG}/distributed/distributed_data_parallel.py", 157,
         "_allocate_buffers_for_parameters"),
    ]


PARAM_DATA = (f"{MEG}/distributed/param_and_grad_buffer.py", 701, "__init__")
GRAD_DATA = (f"{MEG}/distributed/param_and_grad_buffer.py", 716, "__init__")
MODEL_BUILD: Chain = [
    *SLIME_INIT,
    (f"{SITE}/megatron/training/training.py", 540, "get_model"),
    (f"{SITE}/megatron/training/training.py", 470, "build_model"),
    (f"{SLIME}/backends/megatron_utils/model_provider.py", 88, "model_provider"),
    (f"{MEG}/models/gpt/gpt_model.py", 190, "__init__"),
    (f"{MEG}/transformer/transformer_block.py", 300, "__init__"),
    (f"{MEG}/transformer/transformer_block.py", 260, "_build_layers"),
]
TE_PARAM_INIT = [(f"{TE}/module/linear.py", 1180, "__init__"),
                 (f"{TE}/module/base.py", 1040, "reset_parameters")]
OPTIMIZER_BUILD: Chain = [
    *SLIME_INIT,
    (f"{SITE}/megatron/training/training.py", 712, "setup_model_and_optimizer"),
    (f"{MEG}/optimizer/__init__.py", 590, "get_megatron_optimizer"),
    (f"{MEG}/optimizer/__init__.py", 420, "_get_megatron_optimizer_based_on_param_groups"),
    (f"{MEG}/optimizer/distrib_optimizer.py", 520, "__init__"),
    (f"{MEG}/optimizer/distrib_optimizer.py", 382, "_build_model_and_main_param_groups"),
]
OPTIMIZER_STATE: Chain = [
    *SLIME_INIT,
    (f"{SLIME}/backends/megatron_utils/checkpoint.py", 60, "load_checkpoint"),
    (f"{MEG}/optimizer/distrib_optimizer.py", 1210, "load_state_dict"),
    (f"{MEG}/optimizer/__init__.py", 402, "init_state_fn"),
    (f"{TE}/optimizers/fused_adam.py", 402, "initialize_state"),
    (f"{TE}/optimizers/fused_adam.py", 360, "_initialize_state"),
]
