"""Autocast's weight copies in a torch.profiler trace (issue 70): a trace made after the model
was built holds no parameter block to size the copies against, but with record_shapes it
records each cast: `at::autocast::cached_cast` calls `arg.to(bf16)` inside the op's own
autocast kernel, so the `aten::to` event sits in the `aten::linear` event, its `Input Dims`
the weight's. Made here on the CPU build of torch (CPU autocast caches its casts as CUDA's
does); the truth is the model's own weights (numel x 2 bytes each), never snapana's output."""

from __future__ import annotations

from pathlib import Path

import pytest
import snapana

from .conftest import require

FAMILY = "autocast_weight_copies"
WIDTHS = (64, 96, 160, 48, 2048)  # distinct weight sizes, none an activation's (batch 3 x 5);
# the last output the largest block, so the peak comes after every weight was cast


def _trace(tmp: Path, autocast: bool) -> tuple[Path, list[int]]:
    """A no-grad forward of a Linear stack under CPU bf16 autocast (or not), profiled with
    shapes and memory; and the bytes of each weight's bf16 copy, from the model itself."""
    torch = require("torch")
    from torch.profiler import ProfilerActivity, profile

    torch.manual_seed(0)
    layers = []
    for a, b in zip(WIDTHS[:-1], WIDTHS[1:], strict=True):
        layers += [torch.nn.Linear(a, b), torch.nn.GELU()]
    model = torch.nn.Sequential(*layers).eval()
    x = torch.randn(3, 5, WIDTHS[0])
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True,
                 with_stack=True) as prof:
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            kept = model(x)
    del kept
    path = tmp / f"linear-{'bf16' if autocast else 'fp32'}.json"
    prof.export_chrome_trace(str(path))
    weights = [m.weight.numel() * torch.bfloat16.itemsize for m in model
               if isinstance(m, torch.nn.Linear)]
    return path, weights


@pytest.mark.torch
def test_trace_copies_are_the_weights_bf16_copies(tmp_path: Path) -> None:
    """At the peak, the blocks named autocast_weight_copies are one per Linear weight, of its
    bf16 bytes, said to be inferred from the op's own record of the cast."""
    path, weights = _trace(tmp_path, autocast=True)
    a = snapana.load(path)
    got = a.blocks.filter(a.blocks["family"] == FAMILY)
    assert sorted(got["requested_size"].to_list()) == sorted(weights)
    assert set(got["evidence"].to_list()) == {"inferred"}
    assert all("`aten::linear`" in r and "the weight" in r for r in got["reason"].to_list())


@pytest.mark.torch
def test_trace_without_autocast_names_none(tmp_path: Path) -> None:
    """The same forward in fp32 casts nothing: no block is named a copy."""
    path, _ = _trace(tmp_path, autocast=False)
    a = snapana.load(path)
    assert FAMILY not in a.blocks["family"].to_list()


def test_checkpointing_frees_cached_copies_at_the_backward_start() -> None:
    """Checkpointed, autograd no longer holds autocast's copies into the backward (the pack
    hook keeps a handle): the replay frees them where the backward starts, as the cache's
    exit does; without the `cached` family they stay held to their recorded free."""
    import polars as pl
    from snapana.analysis.replay import NEVER
    from snapana.analysis.scaling import load_rules
    from snapana.analysis.trace_edits import checkpoint_edit

    # a forward of two layers (sites a, b each save one per layer) that casts one weight
    # (event 0), then the backward: its first gradient at event 10, the copy freed at 20
    rows = [("autocast_weight_copies", 0, 20, "w"), ("saved_activations", 1, 15, "a"),
            ("saved_activations", 2, 16, "b"), ("saved_activations", 3, 17, "a"),
            ("saved_activations", 4, 18, "b"), ("gradients", 10, NEVER, "g")]
    blocks = pl.DataFrame({"family": [r[0] for r in rows], "alloc_idx": [r[1] for r in rows],
                           "free_idx": [r[2] for r in rows], "site": [r[3] for r in rows],
                           "code_site": [r[3] for r in rows],
                           "address": list(range(len(rows))), "requested": [64] * len(rows)})
    rules = load_rules()
    assert "autocast_weight_copies" in rules.checkpoint_cached
    edit = checkpoint_edit(blocks, rules.checkpoint_saved, rules.checkpoint_backward, None,
                           rules.checkpoint_cached)
    assert edit.moves.get(20) == 9  # freed right before the backward's first allocation
    plain = checkpoint_edit(blocks, rules.checkpoint_saved, rules.checkpoint_backward, None)
    assert 20 not in plain.moves


@pytest.mark.torch
def test_a_trace_that_starts_above_zero_still_names_the_copies(tmp_path: Path) -> None:
    """A trace whose allocated total starts above zero (memory held before it: a job's own,
    or a tensor an earlier capture in the same process kept) shows a held block that is no
    weight; the copies are still sized against the op's own record of each cast."""
    torch = require("torch")
    from torch.profiler import ProfilerActivity, profile

    kept = []
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True):
        kept.append(torch.randn(1000, 1000))
    path, weights = _trace(tmp_path, autocast=True)
    got = snapana.load(path).blocks
    got = got.filter(got["family"] == FAMILY)
    assert sorted(got["requested_size"].to_list()) == sorted(weights)
    del kept
