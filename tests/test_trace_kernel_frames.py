"""A profiler trace names a kernel and a layer differently from a snapshot (issue 70): its op
frames are pseudo-frames (`<op>` `aten::_scaled_dot_product_attention_math`, where a
snapshot's C++ stack says `at::native::_scaled_dot_product_attention_math`), and the
innermost frame of a block is the aten op, which every layer's call of it shares. One rule
reads both forms; the checkpointing replay's layers are lines of code, not op frames."""

from __future__ import annotations

import polars as pl
from snapana.analysis.replay import NEVER
from snapana.analysis.scaling import _rule_function, load_rules
from snapana.analysis.sites import code_site_of
from snapana.analysis.trace_edits import checkpoint_edit

KERNEL = "_scaled_dot_product_attention_math"
CALLER = ("/srv/transformers/integrations/sdpa_attention.py", "sdpa_attention_forward", 96)


def _math_rule():  # noqa: ANN202 - a ScoreRule
    return next(r for r in load_rules().scores if r.native)


def test_math_fallback_rule_reads_a_traces_op_frame_and_a_snapshots_cpp_frame() -> None:
    """The same kernel, named as a trace records it and as a snapshot's C++ stack does: the
    rule names it in both; a Python function of that name is not the kernel."""
    rule = _math_rule()
    trace = [("<op>", "aten::bmm", 0), ("<op>", f"aten::{KERNEL}", 0),
             ("<op>", "aten::scaled_dot_product_attention", 0), CALLER]
    snapshot = [("??", "at::native::bmm_out_cpu(...)", 0),
                ("??", f"at::native::{KERNEL}(at::Tensor const&, ...)", 0), CALLER]
    assert _rule_function(rule, trace) == KERNEL
    assert _rule_function(rule, snapshot) == KERNEL
    assert _rule_function(rule, [("/srv/mine.py", f"aten::{KERNEL}", 3)]) is None
    assert _rule_function(rule, [("<op>", "aten::bmm", 0), CALLER]) is None


def test_code_site_leaves_the_profilers_pseudo_frames_out() -> None:
    line = ("/srv/transformers/models/gpt2/modeling_gpt2.py", "forward", 210)
    stack = (("<op>", "aten::mul", 0), ("<python>", "nn.Module: GPT2MLP_1", 0), line)
    assert code_site_of(stack) == code_site_of((line,))
    assert "modeling_gpt2.py:210" in code_site_of(stack)
    ops_only = (("<op>", "aten::mul", 0),)
    assert code_site_of(ops_only) != ""  # no code frame: the op, as before


def test_checkpoint_layers_are_lines_not_op_frames() -> None:
    """Two layers, each saving a tensor at three lines: two `aten::mul`s (big) and one
    `aten::mm`. By op frame the `aten::mul` site saved 4 (one per layer, twice a layer: taken
    for 4 layers, the mm's bytes being under a tenth); by line each saved 2: two layers."""
    layers, per = 2, [("a", "aten::mul", 1000), ("b", "aten::mul", 1000), ("c", "aten::mm", 10)]
    rows = []
    for _ in range(layers):
        for line, op, size in per:
            rows.append({"alloc_idx": len(rows), "address": 100 + len(rows), "requested": size,
                         "family": "saved_activations", "site": f"<op>:0 {op}",
                         "code_site": f"model.py:{line}"})
    grad = {"alloc_idx": len(rows), "address": 999, "requested": 8, "family": "gradients",
            "site": "<op>:0 aten::mm", "code_site": "train.py:9"}
    n = len(rows) + 1
    # the backward frees the last layer's first: each saved block freed after the gradient
    frees = [n + (layers * len(per) - i) for i in range(len(rows))]
    blocks = pl.DataFrame([*rows, grad]).with_columns(
        pl.Series("free_idx", [*frees, NEVER], dtype=pl.Int64))
    edit = checkpoint_edit(blocks, ["saved_activations"], ["gradients"])
    assert edit.words.startswith(f"{layers} repeated blocks (layers) found: 3 sites"), edit.words


def test_a_norm_shared_by_every_layer_and_the_final_one_is_layered() -> None:
    """A norm line every layer calls and the final norm calls once more (LlamaRMSNorm): 2
    layers save 5 blocks there. Up to the last layer's end it saved 4, two a layer: its
    blocks are the layers' and are freed at each layer's end, not held to the backward."""
    rows: list[dict] = []

    def save(line: str, size: int) -> None:
        rows.append({"alloc_idx": len(rows), "address": 100 + len(rows), "requested": size,
                     "family": "saved_activations", "site": "<op>:0 aten::mul",
                     "code_site": f"model.py:{line}"})

    for _ in range(2):
        save("norm", 100)
        save("proj", 300)
        save("norm", 100)
        save("mlp", 300)
    save("norm", 100)  # the final norm, after the last layer
    n = len(rows)
    grad = {"alloc_idx": n, "address": 999, "requested": 8, "family": "gradients",
            "site": "<op>:0 aten::mm", "code_site": "train.py:9"}
    blocks = pl.DataFrame([*rows, grad]).with_columns(
        pl.Series("free_idx", [2 * n + 1 - i for i in range(n)] + [NEVER], dtype=pl.Int64))
    edit = checkpoint_edit(blocks, ["saved_activations"], ["gradients"])
    # per layer: 4 saved, 1 kept (its first), 3 freed at the layer's end
    assert len(edit.moves) == 2 * 3, edit.words
    assert n - 1 not in edit.moves  # the final norm's block: saved as recorded
    # each freed block is made again for its layer's backward, freed where it was
    assert sorted(c.after for c in edit.copies) == sorted(edit.moves)


def test_weight_gradients_read_by_the_optimizer_step_do_not_grow() -> None:
    """A trace's window holds no weights (made before profiling: no mirror to count), so
    every `gradients` block used to be taken for an activation's gradient and grown. The
    ones alive where the optimizer step's first temporary is made are the weights' .grad
    (the step reads them): held; the one freed in the backward grows."""
    from snapana.analysis.scaling import _unmirrored

    rules = load_rules()
    mirrored, _, read_by = rules.mirrors["gradients"]
    blocks = pl.DataFrame({
        "alloc_idx": [0, 1, 2, 5], "requested": [64, 64, 64, 8],
        "family": ["gradients", "gradients", "gradients", read_by[0]],
        "free_idx": [9, 9, 3, 6]}, schema_overrides={"free_idx": pl.Int64})
    assert _unmirrored(blocks, "gradients", mirrored, read_by) == [2]
    assert sorted(_unmirrored(blocks, "gradients", mirrored)) == [0, 1, 2]
