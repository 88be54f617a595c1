"""Attribution against the simulator's ground truth: on every sample, every live block at the
OOM point (the snapshot point when nothing failed) gets the family the simulator gave it,
and the chunked log-prob group reports what the truth's ``chunks`` entry implies.

Expected values come from ``NAME.truth.json`` (the simulator's own bookkeeping) and the
allocator's size rules, never from an analysis.
"""

from __future__ import annotations

import json
import pickle
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from snapana.allocator_model.rules import SMALL_SIZE, round_size
from snapana.analysis.attribution import BlockContext, RuleError, load_rules
from snapana.analysis.attribution.assign import Attributor
from snapana.analysis.attribution.pack_parser import parse_pack
from snapana.analysis.replay import replay
from snapana.session import analyse
from snapana.sources import load
from snapana.synth import CachingAllocatorSim
from snapana.synth import stacks as S

from .conftest import SAMPLES

NAMES = sorted(p.name[: -len(".pickle")] for p in SAMPLES.glob("*.pickle"))
SOFTMAX = "saved_logprob_softmax"
MiB, GiB = 1 << 20, 1 << 30


def truth_of(name: str) -> dict[str, Any]:
    return json.loads((SAMPLES / f"{name}.truth.json").read_text())


def attributed(path: Path, oom: bool) -> Any:
    """Live blocks at the OOM (or, without one, at the snapshot), with their families."""
    capture = load(path)
    dr = replay(capture, 0)
    moment = dr.interest if oom else dr.final
    if oom:
        assert moment.kind == "oom"
    return Attributor(capture, 0, load_rules()).attribute(dr.blocks_at(moment))


def test_there_are_samples() -> None:
    assert len(NAMES) >= 7


@pytest.mark.parametrize("name", NAMES)
def test_every_live_block_has_its_true_family(name: str) -> None:
    truth = truth_of(name)
    att = attributed(SAMPLES / f"{name}.pickle", truth["oom"] is not None)
    rows = {r["address"]: r for r in att.iter_rows(named=True)}
    assert set(rows) == {b["address"] for b in truth["blocks"]}, "live blocks differ"
    wrong: Counter[tuple[str, str, str]] = Counter()
    for b in truth["blocks"]:
        r = rows[b["address"]]
        assert r["size"] == b["size"]
        if r["family"] != b["family"]:
            wrong[(b["family"], r["family"], r["rule_id"] or r["reason"])] += b["size"]
    table = "\n".join(
        f"  truth {t} -> {g} via {why}: {n / GiB:.2f} GiB"
        for (t, g, why), n in wrong.most_common()
    )
    assert not wrong, f"{name}: blocks attributed to the wrong family:\n{table}"


@pytest.mark.parametrize("name", NAMES)
def test_chunked_logprob_group_matches_truth(name: str) -> None:
    """The chunks kept for backward are one group: as many chunks as the truth says were
    saved, each the block that holds one ``chunk_bytes`` tensor, summing to what they hold."""
    truth = truth_of(name)
    path = SAMPLES / f"{name}.pickle"
    saved = [b for b in truth["blocks"]
             if b["family"] == SOFTMAX and b["state"] == "active_allocated"]
    report = analyse(load(path))[0]
    groups = {g.name: g for g in report.groups}
    if len(saved) < 2:  # no chunk loop was kept (recompute, or the one chunk failed)
        assert not (groups.get(SOFTMAX) and groups[SOFTMAX].chunks)
        assert truth["chunks"].get("saved_chunks", 0) == len(saved)
        return
    chunks = truth["chunks"]
    assert chunks["saved_chunks"] == len(saved)
    group = groups[SOFTMAX]
    (loop,) = group.chunks
    assert loop["count"] == chunks["saved_chunks"]
    # chunks are counted in block bytes, like the family they belong to, so that
    # "N × size = total" adds up to what the family holds
    assert loop["uniform"] and loop["chunk_size"] == saved[0]["size"]
    assert loop["total"] == loop["chunk_size"] * chunks["saved_chunks"] == group.bytes
    # the family holds the blocks: each the request rounded up, plus at most kSmallSize
    # the allocator does not split off a large block
    assert group.bytes == sum(b["size"] for b in saved)
    assert all(round_size(chunks["chunk_bytes"]) <= b["size"]
               <= round_size(chunks["chunk_bytes"]) + SMALL_SIZE for b in saved)
    # each saved block really holds one full chunk's tensor
    att = attributed(path, truth["oom"] is not None)
    mine = att.filter(att["family"] == SOFTMAX)
    assert sorted(mine["requested_size"].to_list()) == [chunks["chunk_bytes"]] * len(saved)
    if truth["oom"] is not None:  # the last chunk is the one that did not fit
        assert chunks["count"] == chunks["saved_chunks"] + 1
        assert truth["oom"]["requested_bytes"] == chunks["last_chunk_bytes"]


# ------------------------------------------------------------------ phase from the trace

FWD = S.stack([("/w/train.py", 9, "train"), *S.call_module("/w/model.py", 40)])
OPT = S.stack([("/w/train.py", 12, "train"), (f"{S.TORCH}/optim/optimizer.py", 485, "wrapper"),
               (f"{S.TORCH}/optim/adam.py", 165, "_init_group")])
BWD_HOOK = S.stack([(f"{S.TORCH}/autograd/function.py", 307, "apply"),
                    ("/w/ops.py", 30, "backward")])


def _frameless_sample(tmp_path: Path) -> tuple[Path, dict[str, int]]:
    """Frameless allocations in known places around forward, backward and the optimizer."""
    sim = CachingAllocatorSim(8 * GiB)
    at: dict[str, int] = {}
    sim.malloc(4 * MiB, FWD)
    at["between_forwards"] = sim.malloc(3 * MiB, None)
    sim.malloc(4 * MiB, FWD)
    at["after_forward"] = sim.malloc(5 * MiB, None)
    sim.malloc(MiB, BWD_HOOK)
    at["after_python_backward"] = sim.malloc(6 * MiB, None)
    sim.malloc(4 * MiB, OPT)
    at["after_optimizer"] = sim.malloc(7 * MiB, None)
    path = tmp_path / "frameless.pickle"
    path.write_bytes(pickle.dumps(sim.snapshot(), protocol=4))
    return path, at


def test_frameless_blocks_are_placed_by_the_trace(tmp_path: Path) -> None:
    path, at = _frameless_sample(tmp_path)
    att = attributed(path, oom=False)
    rows = {r["address"]: r for r in att.iter_rows(named=True)}
    for key in ("after_forward", "after_python_backward"):
        r = rows[at[key]]
        assert (r["family"], r["phase"]) == ("gradients", "backward"), key
        assert r["rule_id"] == "pytorch.no_frames_backward_by_trace"
        assert "allocated on the autograd thread during backward (no Python frames)" in (
            r["label"])
    for key in ("between_forwards", "after_optimizer"):  # the trace cannot tell
        r = rows[at[key]]
        assert r["family"] == "unknown", key
        assert "no frames" in r["reason"]


def test_frameless_blocks_bounded_by_an_optimizer_window(tmp_path: Path) -> None:
    """An Optimizer.step window ends backward even when the step allocates nothing."""
    sim = CachingAllocatorSim(8 * GiB)
    sim.malloc(4 * MiB, FWD)
    grad = sim.malloc(5 * MiB, None)
    with sim.annotate("Optimizer.step#AdamW.step"):
        sim.advance(100)
    late = sim.malloc(6 * MiB, None)
    path = tmp_path / "window.pickle"
    path.write_bytes(pickle.dumps(sim.snapshot(), protocol=4))
    rows = {r["address"]: r for r in attributed(path, oom=False).iter_rows(named=True)}
    assert rows[grad]["family"] == "gradients"
    assert rows[late]["family"] == "unknown"


# ------------------------------------------------------------------ the schema these rely on

HF = f"{S.SITE}/transformers/models/llama/modeling_llama.py"
LINEAR = (f"{S.TORCH}/nn/modules/linear.py", 125, "forward")
CTX = BlockContext(size=MiB, has_alloc_event=True)


def stack(*chains: S.Chain) -> tuple[tuple[str, str, int], ...]:
    """The simulator's (file, line, name) chains as the engine's (file, name, line) stack."""
    return tuple((f, n, line) for f, line, n in S.stack(*chains))


def test_outermost_frame_pattern_tells_the_lm_head_from_layer_linears() -> None:
    rules = load_rules()
    top = [("/w/train.py", 9, "train"), *S.call_module(HF, 470)]
    head = stack(top, S.call_module(*LINEAR[:2]))
    layer = stack(top, S.call_module(HF, 405), S.call_module(HF, 300),
                  S.call_module(*LINEAR[:2]))
    upcast = stack([("/w/train.py", 9, "train"), *S.call_module(HF, 480)])
    in_layer = stack(top, S.call_module(HF, 405), S.call_module(HF, 300))
    assert rules.classify(head, CTX).rule_id == "pytorch.hf_lm_head"
    assert rules.classify(layer, CTX).family == "saved_activations"
    assert rules.classify(upcast, CTX).rule_id == "pytorch.hf_causal_lm_own"
    assert rules.classify(in_layer, CTX).rule_id == "pytorch.module_forward"


def test_line_rank_range_needs_the_sites_and_spares_the_last_line() -> None:
    ppo = "/r/slime/slime/utils/ppo_utils.py"
    base = [(ppo, 520, "calculate_log_probs_and_entropy"),
            (ppo, 478, "_calculate_log_probs_and_entropy_chunk"),
            *S.apply_function(ppo, 412)]
    at = {line: stack(base, [(ppo, line, "vocab_parallel_softmax")]) for line in (362, 366, 371)}
    plain = load_rules()  # no sites: no line is told apart, every one is the saved softmax
    assert {plain.classify(s, CTX).family for s in at.values()} == {SOFTMAX}
    ranked = plain.with_sites(at.values())
    got = {line: ranked.classify(s, CTX).family for line, s in at.items()}
    assert got == {362: "activation_temporaries", 366: "activation_temporaries", 371: SOFTMAX}
    only_one = plain.with_sites([at[366]])  # one line seen: it is the last one
    assert only_one.classify(at[366], CTX).family == SOFTMAX


def test_phase_hint_condition() -> None:
    rules = load_rules()
    hinted = BlockContext(size=MiB, has_alloc_event=True, phase_hint="backward")
    bare = BlockContext(size=MiB, has_alloc_event=True)
    assert rules.classify((), hinted).family == "gradients"
    assert rules.classify((), bare).family == "unknown"
    with pytest.raises(RuleError, match="unknown phase_hint 'later'"):
        parse_pack('[[rule]]\nid = "x"\nfamily = "gradients"\nlabel = "g"\n'
                   'phase_hint = "later"\n', "u.toml", user=True)
    with pytest.raises(RuleError, match="unknown field"):
        parse_pack('[[phase_rule]]\nid = "x"\nphase = "backward"\nphase_hint = "forward"\n',
                   "u.toml", user=True)
    # a function name is exact: a glob in it would never match, so the pack is refused
    with pytest.raises(RuleError, match="is a pattern: use `function_re`"):
        parse_pack('[[rule]]\nid = "x"\nfamily = "logits"\nlabel = "l"\n'
                   'frames = [{ function = ["cross_entropy_*"] }]\n', "u.toml", user=True)
