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
