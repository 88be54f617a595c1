"""A no-grad forward of a small GPT under ``torch.autocast(dtype=torch.bfloat16)`` with fp32
weights (issue 67): autocast's cast cache keeps a bf16 copy of each matmul weight from its
first use until the context exits (aten autocast_mode.cpp ``cached_cast``; torch/amp
autocast_mode.py ``__exit__``), so the peak holds the weights plus half of them again.

The weights exist before recording starts (no frames). Each copy is made where the module's
forward calls ``F.linear``; with ``cpp=True`` the stacks also carry C++ frames, the copy's
passing through ``at::autocast::cached_cast``. ``autocast=False`` is the fp32 twin: the same
forward, no copies. Ground truth (`facts["copies"]`: the copies' addresses) is the
simulator's own bookkeeping, never an analysis.
"""

from __future__ import annotations

from snapana.allocator_model.frames import Frame
from snapana.allocator_model.simulator import CachingAllocatorSim

from .. import stacks as S
from .common import Facts, drop_together, run_recorded_late

NAME = "gpt-autocast-forward"
LAYERS, HIDDEN, FFN, VOCAB = 8, 2048, 8192, 32768
FP32, BF16 = 4, 2
MODEL = "/workspace/gpt/model.py"
DRIVER: S.Chain = [("/workspace/gpt/infer.py", 40, "<module>"),
                   (f"{S.TORCH}/utils/_contextlib.py", 116, "decorate_context"),
                   ("/workspace/gpt/infer.py", 22, "evaluate")]
#: the matmul weights of one layer (numel): qkv, out, up, down; the norms stay fp32
MATMULS = (HIDDEN * 3 * HIDDEN, HIDDEN * HIDDEN, HIDDEN * FFN, FFN * HIDDEN)
NORMS = (HIDDEN, HIDDEN)
CAST: tuple[Frame, ...] = (
    ("??", 0, "at::native::_to_copy(at::Tensor const&, std::optional<c10::ScalarType>)"),
    ("??", 0, "at::autocast::cached_cast(c10::ScalarType, at::Tensor const&, "
              "c10::DeviceType)"),
    ("??", 0, "at::_ops::linear::call(at::Tensor const&, at::Tensor const&)"),
)
OP: tuple[Frame, ...] = (
    ("??", 0, "at::native::empty_cuda(c10::ArrayRef<long>)"),
    ("??", 0, "at::_ops::linear::call(at::Tensor const&, at::Tensor const&)"),
)


def _linear(layer: int, cpp: tuple[Frame, ...], use_cpp: bool) -> tuple[Frame, ...]:
    """A module's forward calling F.linear (a builtin: no Python frame of its own)."""
    chain = [*DRIVER, *S.call_module(MODEL, 200), *S.call_module(MODEL, 120 + layer % 2),
             *S.call_module(f"{S.TORCH}/nn/modules/linear.py", 125)]
    return (cpp if use_cpp else ()) + S.stack(chain)


def autocast_forward(batch: int = 3, seq: int = 500, *, autocast: bool = True,
                     cpp: bool = False) -> tuple[dict[str, object], dict[str, object]]:
    """(snapshot, truth): the forward's peak holds the weights, the copies (with `autocast`)
    and one layer's activations; the copies are freed together after it (autocast's exit)."""
    start: list[int] = []
    t = batch * seq
    act = BF16 if autocast else FP32

    def script(sim: CachingAllocatorSim, facts: Facts) -> None:
        weights = [sim.malloc(VOCAB * HIDDEN * FP32, None, family="parameters")]
        for _ in range(LAYERS):
            weights += [sim.malloc(n * FP32, None, family="parameters")
                        for n in (*MATMULS, *NORMS)]
        start.append(len(sim.trace))
        sim.advance(1_000_000)
        copies: list[tuple[int, int]] = []
        x = sim.malloc(t * HIDDEN * FP32, S.stack([*DRIVER, *S.call_module(MODEL, 190)]),
                       family="activation_temporaries")
        for i in range(LAYERS):
            for k, n in enumerate(MATMULS):
                stack = _linear(i, CAST, cpp)
                if autocast:  # the weight's first use: autocast caches its bf16 cast
                    copies.append((sim.malloc(n * BF16, stack,
                                              family="autocast_weight_copies"), n * BF16))
                width = n // HIDDEN if k != 3 else HIDDEN
                y = sim.malloc(t * width * act, _linear(i, OP, cpp),
                               family="activation_temporaries")
                sim.free(x)  # no_grad: the input goes once the next op has used it
                x = y
            sim.advance(2000)
        logits = sim.malloc(t * VOCAB * act, _linear(LAYERS, OP, cpp),
                            family="activation_temporaries")
        facts["copies"] = [a for a, _ in copies]
        facts["copy_bytes"] = sum(n for _, n in copies)
        # torch.autocast.__exit__: torch.clear_autocast_cache(); then the output goes
        drop_together(sim, [a for a, _ in copies], (x, logits))

    return run_recorded_late(NAME, script, start)
