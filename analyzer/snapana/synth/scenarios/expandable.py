"""A Hugging Face causal-LM fine-tune with ``expandable_segments:True`` that runs out of memory
in the fp32 logits: segments grow by mapped pages and free pages are unmapped before the OOM."""

from __future__ import annotations

from snapana.allocator_model.rules import MiB
from snapana.allocator_model.simulator import CachingAllocatorSim

from .. import stacks as S
from .common import Facts, Outcome, calibrate_outside, failing_request

CAPACITY = 22_593 * MiB  # a 24 GB card: "22.06 GiB"
LAYERS, HIDDEN, FFN, VOCAB, TOKENS = 24, 2048, 5632, 151936, 8192
HF = f"{S.SITE}/transformers/models/qwen2/modeling_qwen2.py"
TRAIN: S.Chain = [("/workspace/sft.py", 88, "<module>"), ("/workspace/sft.py", 61, "main"),
                  (f"{S.SITE}/transformers/trainer.py", 2240, "train"),
                  (f"{S.SITE}/transformers/trainer.py", 3700, "training_step"),
                  (f"{S.SITE}/transformers/trainer.py", 3800, "compute_loss")]
MODEL: S.Chain = [*TRAIN, *S.call_module(HF, 820)]


def _script(sim: CachingAllocatorSim, facts: Facts) -> None:
    load = [("/workspace/sft.py", 40, "main"), *S.call_module(f"{S.TORCH}/nn/modules/module.py",
                                                             1355, "to"),
            (f"{S.TORCH}/nn/modules/module.py", 930, "_apply"),
            (f"{S.TORCH}/nn/modules/module.py", 1341, "convert")]
    h = HIDDEN
    sim.malloc(VOCAB * h * 2, S.stack(load), family="parameters")
    for _ in range(LAYERS):
        for n in (h * h, h * 256, h * 256, h * h, 2 * h * FFN, FFN * h, h, h):
            sim.malloc(n * 2, S.stack(load), family="parameters")
    sim.malloc(VOCAB * h * 2, S.stack(load), family="parameters")
    sim.advance(5_000_000)
    for i in range(LAYERS):
        layer = [*MODEL, *S.call_module(HF, 560), *S.call_module(HF, 300 + i % 2)]
        for w in (h, h + 512, h, h, 2 * FFN):
            sim.malloc(TOKENS * w * 2, S.stack(layer), family="saved_activations")
        tmp = sim.malloc(TOKENS * FFN * 4, S.stack(layer), family="activation_temporaries")
        sim.malloc(TOKENS * FFN * 2, S.stack(layer), family="saved_activations")
        sim.free(tmp)
        sim.advance(1500)
    head = [*MODEL, *S.call_module(f"{S.TORCH}/nn/modules/linear.py", 125)]
    logits = sim.malloc(TOKENS * VOCAB * 2, S.stack(head), family="logits")
    facts["request"] = TOKENS * VOCAB * 4
    # logits.float() in Qwen2ForCausalLM.forward itself (the line after the lm_head call)
    failing_request(sim, TOKENS * VOCAB * 4, S.stack(TRAIN, S.call_module(HF, 845)), "logits")
    sim.free(logits)


FREE = 3_150 * MiB  # another process on the card leaves ~3 GiB free: not enough for 4.6 GiB


def expandable_segments_oom() -> Outcome:
    """Fragmentation is not the problem here, and expandable segments cannot help."""
    return calibrate_outside(_script, CAPACITY, FREE, TOKENS * VOCAB * 4, expandable=True)
