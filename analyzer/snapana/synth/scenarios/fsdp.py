"""An FSDP2 training step: all-gather buffers on their own stream, reduce-scatter, AdamW.

The model is a transformers ``LlamaForCausalLM`` with every decoder layer its own FSDP unit
(the usual way to ``fully_shard`` a causal LM); its forward runs ``LlamaModel`` and then
``lm_head``, the one ``nn.Linear`` it calls itself, whose output is the logits.

Exercises what the slime/swift incidents do not: non-default streams, ``record_stream``
(blocks left ``active_pending_free``), and an ``Optimizer.step#AdamW.step`` annotation.
"""

from __future__ import annotations

from snapana.allocator_model.rules import MiB
from snapana.allocator_model.simulator import CachingAllocatorSim

from .. import stacks as S
from .common import Facts, Outcome, run

LAYERS, HIDDEN, FFN, VOCAB, WORLD, TOKENS = 16, 2048, 8192, 32000, 8, 4096
AG_STREAM = 0x5620_3A1C_90D0  # FSDP2 all-gather stream
RS_STREAM = 0x5620_3A1C_9B40  # FSDP2 reduce-scatter stream
CAPACITY = 40_339 * MiB  # A100-40GB: "39.39 GiB"
FSDP = f"{S.TORCH}/distributed/fsdp/_fully_shard"
TRAIN: S.Chain = [("/workspace/train_fsdp.py", 210, "<module>"),
                  ("/workspace/train_fsdp.py", 160, "train")]
LLAMA = f"{S.SITE}/transformers/models/llama/modeling_llama.py"
FWD: S.Chain = [*TRAIN, *S.call_module(LLAMA, 470)]  # LlamaForCausalLM.forward
DECODER: S.Chain = [*FWD, *S.call_module(LLAMA, 405)]  # LlamaModel.forward
LAYER_CALL: S.Chain = S.call_module(LLAMA, 0)[:2]  # module call: FSDP2's pre-forward hook
AG: S.Chain = [(f"{FSDP}/_fsdp_state.py", 230, "_pre_forward"),
               (f"{FSDP}/_fsdp_param_group.py", 300, "pre_forward"),
               (f"{FSDP}/_fsdp_param_group.py", 260, "unshard"),
               (f"{FSDP}/_fsdp_collectives.py", 160, "foreach_all_gather")]
# Backward collectives run in FSDP2's Python hooks, called by the autograd engine on its
# device thread: their stacks hold the hook's frames and nothing above them. The tensor hook
# FSDPState._pre_backward all-gathers a layer's parameters; RegisterPostBackwardFunction's
# backward (a custom Function, so torch/autograd/function.py apply) reduce-scatters its grads.
AG_BACKWARD: S.Chain = [(f"{FSDP}/_fsdp_state.py", 385, "_pre_backward"),
                        (f"{FSDP}/_fsdp_param_group.py", 582, "pre_backward"),
                        (f"{FSDP}/_fsdp_param_group.py", 260, "unshard"),
                        (f"{FSDP}/_fsdp_collectives.py", 160, "foreach_all_gather")]
RS_BACKWARD: S.Chain = [(f"{S.TORCH}/autograd/function.py", 307, "apply"),
                        (f"{FSDP}/_fsdp_param_group.py", 1126, "backward"),
                        (f"{FSDP}/_fsdp_param_group.py", 688, "post_backward"),
                        (f"{FSDP}/_fsdp_collectives.py", 560, "foreach_reduce")]
OPT: S.Chain = [*TRAIN, (f"{S.TORCH}/optim/optimizer.py", 485, "wrapper"),
                (f"{S.TORCH}/optim/optimizer.py", 79, "_use_grad"),
                (f"{S.TORCH}/optim/adam.py", 223, "step")]


def _layer_params() -> list[int]:
    h = HIDDEN
    return [3 * h * h, h * h, 2 * h * FFN, FFN * h, h, h]


def _script(sim: CachingAllocatorSim, facts: Facts) -> None:
    init = [*TRAIN[:1], ("/workspace/train_fsdp.py", 120, "build"),
            (f"{S.TORCH}/distributed/fsdp/_fully_shard/_fully_shard.py", 200, "fully_shard"),
            (f"{FSDP}/_fsdp_param.py", 380, "_init_sharded_param")]
    shards: list[tuple[int, int]] = []
    for _ in range(LAYERS):
        for n in _layer_params():
            shards.append((sim.malloc(n * 4 // WORLD, S.stack(init), family="parameters"),
                           n * 4 // WORLD))
    layer_bytes = sum(_layer_params()) * 2  # bf16 unsharded
    saved: list[int] = []
    sim.advance(1_000_000)
    for i in range(LAYERS):  # forward: gather, compute, reshard
        buf = sim.malloc(layer_bytes, S.stack(DECODER, LAYER_CALL, AG), stream=AG_STREAM,
                         family="comm_buffer")
        sim.record_stream(buf, 0)
        for w in (HIDDEN, 3 * HIDDEN, HIDDEN, HIDDEN, 2 * FFN, FFN):
            saved.append(sim.malloc(TOKENS * w * 2, S.stack(  # LlamaDecoderLayer
                DECODER, S.call_module(LLAMA, 300 + i % 3)), family="saved_activations"))
        sim.free(buf)
        sim.complete_pending()
        sim.advance(2000)
    sim.malloc(TOKENS * VOCAB * 4, S.stack(FWD, S.call_module(  # lm_head
        f"{S.TORCH}/nn/modules/linear.py", 125)), family="logits")
    sim.advance(50_000)
    grads: list[int] = []
    for i in reversed(range(LAYERS)):  # backward: gather, grads, reduce-scatter
        buf = sim.malloc(layer_bytes, S.stack(AG_BACKWARD), stream=AG_STREAM,
                         family="comm_buffer")
        sim.record_stream(buf, 0)
        full = sim.malloc(layer_bytes * 2, None, family="gradients")  # built-in ops: no frames
        rs = sim.malloc(layer_bytes * 2 // WORLD, S.stack(RS_BACKWARD), stream=RS_STREAM,
                        family="comm_buffer")
        sim.record_stream(rs, 0)
        sim.free(full)
        grads.append(sim.malloc(layer_bytes * 2 // WORLD, None, family="gradients"))
        sim.free(rs)
        sim.free(buf)
        for addr in saved[6 * i: 6 * i + 6]:
            sim.free(addr)
        if i % 4:  # the last collectives are still in flight when the snapshot is taken
            sim.complete_pending()
        sim.advance(3000)
    sim.advance(20_000)
    with sim.annotate("Optimizer.step#AdamW.step"):
        init_group = [*OPT, (f"{S.TORCH}/optim/adam.py", 165, "_init_group")]
        for _, size in shards:
            sim.malloc(size, S.stack(init_group), family="optimizer_state")  # exp_avg
            sim.malloc(size, S.stack(init_group[:-1], [
                (f"{S.TORCH}/optim/adam.py", 169, "_init_group")]), family="optimizer_state")
    facts["streams"] = {"all_gather": AG_STREAM, "reduce_scatter": RS_STREAM}


def fsdp_train_step() -> Outcome:
    """One step on a 40 GB card, snapshot after the optimizer step."""
    return run(_script, CAPACITY, 900 * MiB)
