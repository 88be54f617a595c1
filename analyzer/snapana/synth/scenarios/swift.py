"""S2: ms-swift Megatron GRPO colocated with vLLM, Qwen3.5-35B-A3B on 8 x A800 (seed 003).

vLLM's engine init fails for want of KV-cache memory; while unwinding, ms-swift's
``load_megatron_model_to_gpu`` asks 7.50 GiB and hits "total capacity of 79.25 GiB of which
975.94 MiB is free ... 77.28 GiB is allocated by PyTorch, and 66.45 MiB is reserved by PyTorch
but unallocated". The sample reproduces those four numbers exactly.
"""

from __future__ import annotations

from snapana.allocator_model.rules import GiB, MiB, round_size
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

BF16, FP32 = 2, 4
LAYERS, HIDDEN, EXPERTS, MOE_FFN = 40, 2048, 256, 512
Q_HEADS, KV_HEADS, HEAD_DIM, VOCAB = 32, 2, 256, 248320
EXPERT_BUFFER = 4_026_531_840  # EP=8 shard of the experts: 7.50 GiB of bf16 params
DENSE_BUFFER = 1_789_919_232  # attention, router, norms, embeddings (not offloaded)
KV_BLOCKS = 20310  # 20310 x 32 KiB per layer: each tensor leaves a 1.31 MiB cached tail
WEIGHTS_POOL, KV_POOL = (0, 1), (0, 2)  # vLLM sleep-mode CuMemAllocator pools
NCCL_STREAM = 0x55D6_8A3C_1E50

ALLOCATED = round_size(int(77.28 * GiB))  # "77.28 GiB is allocated by PyTorch"
UNALLOCATED = 136090 * 512  # "66.45 MiB is reserved by PyTorch but unallocated"
FREE = round(975.94 * MiB)  # "975.94 MiB is free"
REQUEST = 8_053_063_680  # "Tried to allocate 7.50 GiB"

SWIFT_MAIN: S.Chain = [
    (f"{S.SWIFT}/cli/_megatron/rlhf.py", 5, "<module>"),
    (f"{S.SWIFT}/megatron/train/rlhf.py", 70, "megatron_rlhf_main"),
    (f"{S.SWIFT}/megatron/train/sft.py", 280, "main"),
    (f"{S.SWIFT}/llm/base.py", 49, "main"),
    (f"{S.SWIFT}/megatron/train/sft.py", 250, "run"),
]
TRAINER_INIT: S.Chain = [
    *SWIFT_MAIN,
    (f"{S.SWIFT}/megatron/trainers/grpo_trainer.py", 80, "__init__"),
]
VLLM_INIT: S.Chain = [
    *TRAINER_INIT,
    (f"{S.SWIFT}/megatron/trainers/grpo_trainer.py", 231, "prepare_vllm"),
    (f"{S.SWIFT}/llm/infer/infer_engine/grpo_vllm_engine.py", 70, "__init__"),
    (f"{S.SWIFT}/llm/infer/infer_engine/vllm_engine.py", 130, "_prepare_engine"),
    (f"{S.VLLM}/entrypoints/llm.py", 340, "__init__"),
    (f"{S.VLLM}/v1/engine/llm_engine.py", 180, "from_engine_args"),
    (f"{S.VLLM}/v1/engine/core.py", 85, "__init__"),
]
LOAD_WEIGHTS: S.Chain = [
    *VLLM_INIT,
    (f"{S.VLLM}/v1/executor/abstract.py", 60, "__init__"),
    (f"{S.VLLM}/v1/worker/gpu_worker.py", 220, "load_model"),
    (f"{S.VLLM}/v1/worker/gpu_model_runner.py", 2400, "load_model"),
    (f"{S.VLLM}/model_executor/model_loader/base_loader.py", 45, "load_model"),
    (f"{S.VLLM}/model_executor/model_loader/utils.py", 60, "initialize_model"),
    (f"{S.VLLM}/model_executor/models/qwen3_next.py", 1100, "__init__"),
    (f"{S.VLLM}/model_executor/models/qwen3_next.py", 930, "__init__"),
]
PROFILE: S.Chain = [
    *VLLM_INIT,
    (f"{S.VLLM}/v1/engine/core.py", 160, "_initialize_kv_caches"),
    (f"{S.VLLM}/v1/worker/gpu_worker.py", 260, "determine_available_memory"),
    (f"{S.VLLM}/v1/worker/gpu_model_runner.py", 3200, "profile_run"),
    (f"{S.VLLM}/v1/worker/gpu_model_runner.py", 2900, "_dummy_run"),
    *S.call_module(f"{S.VLLM}/model_executor/models/qwen3_next.py", 1150),
]
KV_ALLOC: S.Chain = [
    *VLLM_INIT,
    (f"{S.VLLM}/v1/engine/core.py", 190, "_initialize_kv_caches"),
    (f"{S.VLLM}/v1/worker/gpu_worker.py", 300, "initialize_from_config"),
    (f"{S.VLLM}/v1/worker/gpu_model_runner.py", 3700, "initialize_kv_cache"),
    (f"{S.VLLM}/v1/worker/gpu_model_runner.py", 3650, "initialize_kv_cache_tensors"),
    (f"{S.VLLM}/v1/worker/gpu_model_runner.py", 3520, "_allocate_kv_cache_tensors"),
]
MEGATRON_INIT: S.Chain = [
    *SWIFT_MAIN,
    (f"{S.SWIFT}/megatron/trainers/base.py", 120, "__init__"),
    (f"{S.SITE}/megatron/training/training.py", 700, "setup_model_and_optimizer"),
]
RELOAD: S.Chain = [
    *TRAINER_INIT,
    (f"{S.SWIFT}/megatron/trainers/grpo_trainer.py", 236, "prepare_vllm"),
    ("/usr/lib/python3.10/contextlib.py", 153, "__exit__"),
    (f"{S.SWIFT}/megatron/trainers/grpo_trainer.py", 1210, "offload_context"),
    (f"{S.SWIFT}/megatron/trainers/utils.py", 402, "load_megatron_model_to_gpu"),
]
OFFLOAD: S.Chain = [
    *TRAINER_INIT,
    (f"{S.SWIFT}/megatron/trainers/grpo_trainer.py", 1195, "offload_context"),
    (f"{S.SWIFT}/megatron/trainers/utils.py", 371, "offload_megatron_model_to_cpu"),
]


def _megatron(sim: CachingAllocatorSim, misc: int) -> None:
    """Megatron model and distributed optimizer; then the offload context frees the expert
    buffer's param_data and the optimizer, but not the dense buffer or the grad buffers."""
    if misc:
        sim.malloc(misc, S.stack(MEGATRON_INIT, [
            (f"{S.MEG}/utils.py", 560, "get_tensor")]), family="comm_buffer")
    ddp = [*MEGATRON_INIT, (f"{S.SITE}/megatron/training/training.py", 605, "get_model"),
           (f"{S.MEG}/distributed/distributed_data_parallel.py", 157,
            "_allocate_buffers_for_parameters")]
    dense_p = sim.malloc(DENSE_BUFFER * BF16 // 2, S.stack(ddp, [S.PARAM_DATA]),
                         family="param_buffer")
    sim.malloc(DENSE_BUFFER * FP32 // 2, S.stack(ddp, [S.GRAD_DATA]), family="grad_buffer")
    expert_p = sim.malloc(EXPERT_BUFFER * 2, S.stack(ddp, [S.PARAM_DATA]),
                          family="param_buffer")
    sim.malloc(EXPERT_BUFFER * 4, S.stack(ddp, [S.GRAD_DATA]), family="grad_buffer")
    opt = [*MEGATRON_INIT, (f"{S.MEG}/optimizer/__init__.py", 590, "get_megatron_optimizer"),
           (f"{S.MEG}/optimizer/distrib_optimizer.py", 382,
            "_build_model_and_main_param_groups")]
    state = [*MEGATRON_INIT, (f"{S.MEG}/optimizer/__init__.py", 402, "init_state_fn"),
             (f"{S.TE}/optimizers/fused_adam.py", 360, "_initialize_state")]
    shards = []
    per_layer = (DENSE_BUFFER + EXPERT_BUFFER) // 2 // LAYERS  # bf16 bytes -> elements
    for _ in range(LAYERS):
        shards.append(sim.malloc(per_layer * FP32 // 8, S.stack(opt), family="main_params_fp32"))
        shards.append(sim.malloc(per_layer * FP32 // 8, S.stack(state), family="optimizer_state"))
        shards.append(sim.malloc(per_layer * FP32 // 8, S.stack(state), family="optimizer_state"))
    sim.advance(60_000_000)
    off = S.stack(OFFLOAD)
    for addr in shards:  # offload_optimizer: states go to CPU
        sim.free(addr, off)
    sim.free(expert_p, off)  # param_data.storage().resize_(0)
    _ = dense_p  # the dense buffer is left on the GPU: the context missed it


def _vllm(sim: CachingAllocatorSim, kv_blocks: int) -> None:
    """vLLM (TP=2) weights, the profiling dummy run, then the KV-cache tensors."""
    linear = (f"{S.VLLM}/model_executor/layers/linear.py", 300, "create_weights")
    fused = (f"{S.VLLM}/model_executor/layers/fused_moe/layer.py", 420, "create_weights")
    norm = (f"{S.VLLM}/model_executor/layers/layernorm.py", 90, "__init__")
    emb = (f"{S.VLLM}/model_executor/layers/vocab_parallel_embedding.py", 60, "create_weights")
    wp = WEIGHTS_POOL
    sim.malloc(VOCAB // 2 * HIDDEN * BF16, S.stack(LOAD_WEIGHTS, [emb]), pool=wp,
               family="parameters")
    qkv = HIDDEN * (Q_HEADS + 2 * KV_HEADS) * HEAD_DIM // 2
    for _ in range(LAYERS):
        sim.malloc(qkv * BF16, S.stack(LOAD_WEIGHTS, [linear]), pool=wp, family="parameters")
        sim.malloc(Q_HEADS * HEAD_DIM // 2 * HIDDEN * BF16, S.stack(LOAD_WEIGHTS, [linear]),
                   pool=wp, family="parameters")
        sim.malloc(EXPERTS * HIDDEN * 2 * MOE_FFN // 2 * BF16, S.stack(LOAD_WEIGHTS, [fused]),
                   pool=wp, family="parameters")  # w13
        sim.malloc(EXPERTS * MOE_FFN // 2 * HIDDEN * BF16, S.stack(LOAD_WEIGHTS, [fused]),
                   pool=wp, family="parameters")  # w2
        sim.malloc(EXPERTS * HIDDEN * BF16, S.stack(LOAD_WEIGHTS, [linear]), pool=wp,
                   family="parameters")  # router
        for _n in range(2):
            sim.malloc(HIDDEN * BF16, S.stack(LOAD_WEIGHTS, [norm]), pool=wp,
                       family="parameters")
    sim.malloc(VOCAB // 2 * HIDDEN * BF16, S.stack(LOAD_WEIGHTS, [emb]), pool=wp,
               family="parameters")
    sim.advance(30_000_000)
    tokens = 8192  # max_num_batched_tokens of the dummy run
    for _ in range(LAYERS):
        h = sim.malloc(tokens * HIDDEN * BF16, S.stack(PROFILE), family="activation_temporaries")
        a = sim.malloc(tokens * 8 * 2 * MOE_FFN // 2 * BF16, S.stack(PROFILE),
                       family="activation_temporaries")
        sim.free(a)
        sim.free(h)
    logits = sim.malloc(1024 * VOCAB // 2 * FP32, S.stack(PROFILE), family="logits")
    sim.free(logits)
    sim.empty_cache(PROFILE[:-3])  # determine_available_memory empties the cache
    sim.advance(5_000_000)
    per_layer = kv_blocks * 2 * 16 * (KV_HEADS * 2 // 2) * HEAD_DIM * BF16
    for _ in range(LAYERS):
        sim.malloc(per_layer, S.stack(KV_ALLOC), pool=KV_POOL, family="kv_cache")


def _script(misc: int, keeper: int) -> Script:
    def script(sim: CachingAllocatorSim, facts: Facts) -> None:
        _megatron(sim, misc)
        sim.advance(10_000_000)
        _vllm(sim, KV_BLOCKS)
        if keeper:
            sim.malloc(keeper, S.stack(VLLM_INIT, [
                (f"{S.TORCH}/distributed/distributed_c10d.py", 2800, "all_gather_into_tensor")]),
                stream=NCCL_STREAM, family="comm_buffer")
        sim.advance(2_000_000)
        failing_request(sim, REQUEST, S.stack(RELOAD), "param_buffer")

    return script


def vllm_colocate_oom() -> Outcome:
    """Solve the three knobs (a persistent buffer, one NCCL buffer that leaves a cached hole,
    memory outside PyTorch) so the OOM message's numbers come out exactly."""
    probe = run(_script(0, 0), A800_CAPACITY * 4, 0).probe
    assert probe is not None
    holes = probe["reserved"] - probe["allocated"]
    add = UNALLOCATED - holes  # a fresh 20 MiB segment holding `keeper` leaves 20 MiB - keeper
    keeper = 20 * MiB - add
    if not MiB < keeper < 10 * MiB:
        raise RuntimeError(f"swift scenario: cached holes {holes} out of range")
    misc = ALLOCATED - probe["allocated"] - round_size(keeper)
    misc = 2 * MiB * round(misc / (2 * MiB))  # a whole 2 MiB segment: no split, no waste
    if misc < 10 * MiB:
        raise RuntimeError(f"swift scenario: persistent buffer {misc} out of range")
    out = calibrate_outside(_script(misc, keeper), A800_CAPACITY, FREE, REQUEST)
    out.facts.update({"vllm_tp": 2, "expert_parallel": 8, "kv_blocks_per_layer": KV_BLOCKS})
    return out
