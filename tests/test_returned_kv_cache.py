"""A forward's returned KV cache (issue 67): the key / value states a causal LM keeps per
layer with use_cache=True and returns as past_key_values (transformers <= 4.55
cache_utils.py DynamicCache.update appends them without allocating; older models return
`present = (key, value)`) are the kv_cache family, said to be inferred, not saved
activations; use_cache=False (free) acts on them where the forward does not generate.

Checked against the simulator's ground truth and against a real Hugging Face trace, whose
K / V blocks this test finds itself from the raw file's events and frames."""

from __future__ import annotations

import gzip
import json
from collections import Counter
from pathlib import Path

import pytest
import snapana
from snapana.analysis.attribution.kv_pairs import (
    Held,
    Row,
    find,
    find_fused,
    returned_by_update,
)
from snapana.synth.scenarios import write_snapshot
from snapana.synth.scenarios.hf_forward import HEAD_DIM, KV_HEADS, LAYERS, hf_forward

from .conftest import CORPUS

FAMILY = "kv_cache"
METHOD = "signature:kv-pairs"
KNOB = "transformers.use_cache_false"


def _synth(tmp: Path, **kw: object) -> tuple[snapana.api.Analysis, dict]:
    path, truth = write_snapshot(*hf_forward(**kw), tmp / "hf.pickle")  # type: ignore[arg-type]
    return snapana.load(path), json.loads(truth.read_text())


def test_simulated_cache_is_named_exactly(tmp_path: Path) -> None:
    """At the forward's peak the blocks named kv_cache are the simulator's cache: one K and
    one V per layer of batch x kv_heads x seq x head_dim x 2 bytes, inferred, and why."""
    a, truth = _synth(tmp_path)
    got = a.blocks.filter(a.blocks["family"] == FAMILY)
    assert sorted(got["address"].to_list()) == sorted(truth["facts"]["kv"])
    assert len(truth["facts"]["kv"]) == 2 * LAYERS
    assert int(got["requested_size"].sum()) == truth["facts"]["kv_bytes"] \
        == 2 * LAYERS * 8 * 8192 * KV_HEADS * HEAD_DIM * 2
    assert set(got["evidence"].to_list()) == {"inferred"}
    assert set(got["method"].to_list()) == {METHOD}
    assert all(r.startswith(f"inferred: {LAYERS} pairs") and "freed together" in r
               for r in got["reason"].to_list())


def test_use_cache_false_is_offered_first_and_generate_knobs_are_not(tmp_path: Path) -> None:
    """A forward that does not generate: use_cache=False (free) is the first knob for the
    cache; max_new_tokens (needs generate()) is not offered."""
    a, _ = _synth(tmp_path)
    ids = [k.id for k in a.diagnosis.knobs]
    assert KNOB in ids and "transformers.max_new_tokens" not in ids
    kv = [k for k in a.diagnosis.knobs if FAMILY in k.families]
    assert kv[0].id == KNOB and kv[0].cost == "free"
    what = {w.family: w for w in a.diagnosis.what_ifs}
    assert what[FAMILY].removable == "yes"


#: knobs whose setting is an argument of generate() or a decoding loop's length
DECODING = ("transformers.quantized_cache", "transformers.offloaded_cache",
            "torch.kv_cache_size", "transformers.max_new_tokens")


def test_no_decoding_knob_for_a_forward_that_does_not_generate(tmp_path: Path) -> None:
    """The returned cache of a plain forward: nothing generates, so no knob whose setting is
    generate()'s (cache_implementation, max_new_tokens) or a decoding loop's length is
    offered, and no offered knob for the cache speaks of generate()."""
    a, _ = _synth(tmp_path)
    offered = {k.id: k for k in a.diagnosis.knobs}
    assert not set(DECODING) & set(offered)
    assert not [k.id for k in offered.values() if "kv_cache" in k.families
                and ("generate(" in k.knob or "max_new_tokens" in k.knob)]


def test_generate_prefill_gets_the_decoding_knobs(tmp_path: Path) -> None:
    """The same forward as generate()'s prefill (transformers/generation/utils.py generate ->
    _sample on its stacks): the cache is a decoding loop's, so the generate() knobs are
    offered and use_cache=False (which would break the loop) and the returned-cache fact
    are not."""
    a, truth = _synth(tmp_path, generate=True)
    got = a.blocks.filter(a.blocks["family"] == FAMILY)
    assert sorted(got["address"].to_list()) == sorted(truth["facts"]["kv"])
    offered = {k.id for k in a.diagnosis.knobs}
    assert set(DECODING) <= offered
    assert KNOB not in offered
    assert "returned_kv_cache" not in a.diagnosis.evidence.facts


@pytest.mark.parametrize("kw", [{"use_cache": False}, {"grad": True, "batch": 1, "seq": 2048}],
                         ids=["no-cache", "grad-enabled"])
def test_twins_name_no_cache(tmp_path: Path, kw: dict) -> None:
    """Without use_cache nothing is kept per layer; with autograd on, every layer keeps a
    dozen sites and which two are the cache is not known: neither names a cache."""
    a, _ = _synth(tmp_path, **kw)
    assert FAMILY not in a.blocks["family"].to_list()
    assert KNOB not in [k.id for k in a.diagnosis.knobs]


def _r(size: int, site: str, at: int, free: int = -1) -> Row:
    return Row(size, "saved_activations", "forward", site, at, free)


def test_pattern_edges() -> None:
    """Pairs must alternate, be of one size, be held together and freed in one burst."""
    never = lambda lo, hi: 0  # noqa: E731
    pairs = [r for i in range(4) for r in (_r(64, "k", 10 * i), _r(64, "v", 10 * i + 1))]
    assert sorted(find(pairs, never)) == list(range(8))
    # all K first, then all V: not one pair per layer
    assert find([*(_r(64, "k", i) for i in range(4)), *(_r(64, "v", 10 + i) for i in range(4))],
                never) == {}
    # K and V of different sizes
    assert find([r if r.site == "k" else _r(32, "v", r.alloc_idx) for r in pairs], never) == {}
    # freed with allocations in between, or some kept and some freed
    freed = [_r(r.size, r.site, r.alloc_idx, 100 + n) for n, r in enumerate(pairs)]
    assert len(find(freed, never)) == 8
    assert find(freed, lambda lo, hi: 1) == {}
    assert find([*freed[:7], pairs[7]], never) == {}
    # a third equal-size site alternating with both: which two are K and V is not known
    three = [r for i in range(4) for r in (_r(64, "k", 10 * i), _r(64, "v", 10 * i + 1),
                                           _r(64, "h", 10 * i + 2))]
    assert find(three, never) == {}


# --- a real Hugging Face trace -------------------------------------------------------------

QWEN = CORPUS / "kineto_traces" / (
    "AMD-AGI+TraceLens__tests_traces_h100_Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz")


def _kv_from_raw(path: Path) -> tuple[set[int], int]:
    """Independently of snapana: the CUDA blocks alive at the trace's peak allocated total
    that were allocated inside a call of transformers' Qwen2 attention forward (the
    python_function events of modeling_qwen2.py nested under a Qwen2Attention module) and
    that share one size with one block per decoder layer from each of two code paths:
    the v projection (nn.Linear) and the rotary embedding (apply_rotary_pos_emb)."""
    ev = json.load(gzip.open(path))["traceEvents"]
    mem = sorted((e for e in ev if e.get("name") == "[memory]"
                  and e["args"].get("Device Type") == 1), key=lambda e: e["ts"])
    attn = [(e["ts"], e["ts"] + e["dur"]) for e in ev if e.get("cat") == "python_function"
            and str(e.get("name", "")).startswith("nn.Module: Qwen2Attention_")]
    rope = [(e["ts"], e["ts"] + e["dur"]) for e in ev if e.get("cat") == "python_function"
            and "apply_rotary_pos_emb" in str(e.get("name", ""))]
    lin = [(e["ts"], e["ts"] + e["dur"]) for e in ev if e.get("cat") == "python_function"
           and str(e.get("name", "")).startswith("nn.Module: Linear_")]
    layers = len(attn)

    def inside(t: float, spans: list[tuple[float, float]]) -> bool:
        return any(a <= t <= b for a, b in spans)

    live: dict[int, dict] = {}
    peak, at_peak = -1, {}
    for e in mem:
        b = e["args"]["Bytes"]
        if b > 0:
            live[e["args"]["Addr"]] = e
        else:
            live.pop(e["args"]["Addr"], None)
        if e["args"]["Total Allocated"] > peak:
            peak, at_peak = e["args"]["Total Allocated"], dict(live)
    made = [e for e in at_peak.values() if inside(e["ts"], attn)]
    k = [e for e in made if inside(e["ts"], rope)]
    v = [e for e in made if not inside(e["ts"], rope) and inside(e["ts"], lin)]
    sizes = Counter(e["args"]["Bytes"] for e in k + v)
    size, n = sizes.most_common(1)[0]
    assert n == 2 * layers and len(k) == len(v) == layers
    return {e["args"]["Addr"] for e in k + v}, size


def test_qwen_trace_cache_matches_raw() -> None:
    """The HF Qwen1.5-0.5B forward of the TraceLens trace: the 48 blocks snapana names
    kv_cache at the peak are the ones its raw events place in the 24 attention calls (K from
    the rotary embedding, V from the v projection), and nothing is left as saved
    activations from those calls."""
    if not QWEN.exists():
        pytest.skip("corpus trace absent")
    expected, size = _kv_from_raw(QWEN)
    a = snapana.load(QWEN, device=0)
    got = a.blocks.filter(a.blocks["family"] == FAMILY)
    assert set(got["address"].to_list()) == expected
    assert set(got["size"].to_list()) == {size}
    assert set(got["method"].to_list()) == {METHOD}
    assert "layered_activations" not in a.diagnosis.evidence.facts


def test_a_training_step_names_no_cache() -> None:
    """Kept pairs beside what only a backward or a step makes (a gradient, optimizer state)
    are what autograd or activation checkpointing saved (the slime recompute sample keeps
    each layer's attention and MLP inputs alternately): no cache is named."""
    never = lambda lo, hi: 0  # noqa: E731
    pairs = [r for i in range(4) for r in (_r(64, "k", 10 * i), _r(64, "v", 10 * i + 1))]
    assert len(find(pairs, never)) == 8
    assert find([*pairs, Row(4096, "optimizer_state", "unknown", "", -1, -1)], never) == {}
    assert find([*pairs, Row(4096, "recompute", "backward", "r", 99, -1)], never) == {}


def test_a_module_called_twice_per_layer_is_no_cache() -> None:
    """K and V are made once per layer, by the layer loop's one line: each site's blocks
    share one call path. Two sites reached alternately from two lines of each layer (a norm
    applied before the attention and again before the MLP) make two blocks per layer: the
    same sizes and alternation, but not one K and one V per layer, so nothing is named."""
    never = lambda lo, hi: 0  # noqa: E731
    one = [Row(64, "saved_activations", "forward", s, 10 * i + k, -1, 0)
           for i in range(4) for k, s in enumerate(("a", "b"))]
    assert len(find(one, never)) == 8
    # layers 0-1, each calling the module from line 200 (path 0) and line 201 (path 1)
    two = [Row(64, "saved_activations", "forward", s, 10 * i + k, -1, i % 2)
           for i in range(4) for k, s in enumerate(("a", "b"))]
    assert find(two, never) == {}


CS336_FORWARD = ["kkaitlyn111+cs336-a2-systems__memory_files_memory_ctx512_forward_.pickle",
                 "kkaitlyn111+cs336-a2-systems__memory_files_memory_ctx512_forward_mixed.pickle"]


@pytest.mark.corpus
@pytest.mark.parametrize("name", CS336_FORWARD)
def test_cs336_forward_keeps_no_cache(name: str) -> None:
    """CS336's own Transformer (cs336_basics, a model the rule was not written from) returns
    logits only. Its forward keeps, from two lines of one module, blocks of one size that
    alternate, layer after layer, like K and V; the raw trace shows each of those lines
    reached from two lines of the calling block (the module called twice per layer), so
    they are no returned cache, and no moment of the window names one."""
    from snapana.session import Session

    from .conftest import raw_load

    path = CORPUS / "torch_snapshots" / name
    if not path.exists():
        pytest.skip("corpus capture absent")
    trace = next(t for t in raw_load(path)["device_traces"] if t)
    callers: dict[tuple[str, int], set[tuple[str, int]]] = {}
    sizes: dict[tuple[str, int], set[int]] = {}
    for e in trace:
        code = [(f["filename"], f["line"]) for f in e.get("frames", ())
                if f["filename"].endswith(".py") and "/torch/" not in f["filename"]]
        if e["action"] == "alloc" and len(code) >= 2 and "cs336_basics" in code[0][0]:
            callers.setdefault(code[0], set()).add(code[1])
            sizes.setdefault(code[0], set()).add(e["size"])
    twice = {site for site, c in callers.items() if len(c) >= 2 and len(sizes[site]) == 1}
    assert len(twice) >= 2  # the module's two lines, each from two lines of the block
    session = Session.open(path)
    decided = session.attributor.set_decisions()
    named = [] if decided is None else decided.by_key.filter(
        decided.by_key["_c_family"] == FAMILY)["alloc_idx"].to_list()
    assert named == []
    assert FAMILY not in session.report.timeline.families.lifetimes["family"].to_list()


UPDATE = ("/site-packages/transformers/cache_utils.py", "update")


def test_pairs_a_cache_layer_made() -> None:
    """transformers >= 4.56 makes the pairs in cache_utils.py DynamicLayer.update (its frame
    names them kv_cache): a forward returned them where they are an even number of one size,
    a K and a V for each of at least 4 layers, made by that function, none replaced by a
    later update (a decoding step frees a layer's previous block) before the last was made."""
    pairs = [Held(64, i, UPDATE) for i in range(8)]
    assert returned_by_update(pairs, -1) == list(range(8))
    assert returned_by_update(pairs, 20) == list(range(8))  # the output dropped after
    assert returned_by_update(pairs, 5) == []  # a cache block freed before the last made
    assert returned_by_update(pairs[:7], -1) == []  # odd: not one K and one V per layer
    assert returned_by_update(pairs[:6], -1) == []  # fewer than min_layers pairs
    assert returned_by_update([*pairs[:6], Held(32, 6, UPDATE), Held(32, 7, UPDATE)],
                              -1) == []  # two sizes
    other = ("/site-packages/transformers/cache_utils.py", "lazy_initialization")
    assert returned_by_update([Held(64, i, other) for i in range(8)], -1) == []
    fork = ("/work/kivi/my_cache_utils.py", "update")  # not transformers' own file
    assert returned_by_update([Held(64, i, fork) for i in range(8)], -1) == []
    assert returned_by_update([Held(64, -1, UPDATE) for _ in range(8)], -1) == []


# --- views of one fused query/key/value projection output per layer ----------------------

#: a layer's hidden state (batch x seq x hidden x 4 bytes) and its fused projection's output
#: (three parts of that size: query, key, value), as transformers 4.44 GPT-2's c_attn makes
HIDDEN_BYTES = 2 * 16 * 64 * 4
FUSED_BYTES = 3 * HIDDEN_BYTES


def _layers(n: int = 4, *, extra: str = "", extra_size: int = HIDDEN_BYTES,
            free: int = -1) -> tuple[list[Row], dict[int, int]]:
    """One fused block per layer (site `qkv`, made at event 10 i + 1) with the layer's
    hidden state allocated just before (event 10 i), optionally a second kept site; and the
    sizes each event allocated, as a trace would record them."""
    rows, sizes = [], {}
    for i in range(n):
        sizes[10 * i] = HIDDEN_BYTES
        sizes[10 * i + 1] = FUSED_BYTES
        rows.append(Row(FUSED_BYTES, "saved_activations", "forward", "qkv", 10 * i + 1,
                        -1 if free < 0 else free + i))
        if extra:
            sizes[10 * i + 5] = extra_size
            rows.append(Row(extra_size, "saved_activations", "forward", extra, 10 * i + 5,
                            -1 if free < 0 else free + n + i))
    return rows, sizes


def _between(sizes: dict[int, int]):  # noqa: ANN202
    return lambda lo, hi: {s for i, s in sizes.items() if lo < i < hi}


def test_fused_projection_views_are_the_cache() -> None:
    """Transformers <= 4.55 GPT-2 returns key and value views of its fused c_attn output:
    one block per layer, three times the hidden state the layer allocated before it, is
    the cache, with words that say its query part is held too."""
    never = lambda lo, hi: 0  # noqa: E731
    rows, sizes = _layers()
    assert find(rows, never) == {}  # no K / V pair of blocks
    got = find_fused(rows, never, _between(sizes))
    assert sorted(got) == [0, 1, 2, 3]
    why = got[0]
    assert f"4 blocks of {FUSED_BYTES} bytes" in why and "query part" in why
    # freed in one burst: said; freed with allocations among the frees: not one output
    rows, sizes = _layers(free=100)
    assert "freed together" in find_fused(rows, never, _between(sizes))[0]
    assert find_fused(rows, lambda lo, hi: 1, _between(sizes)) == {}


def test_fused_signature_edges() -> None:
    """Not the cache: no block of a third's size made between the layers' blocks (a block
    three times nothing the layer reads), a size that is no three equal parts, a second
    kept site of a part's size (a separate key block beside a value view, or returned
    hidden states: which is the cache is not known), fewer than min_layers, or a step's
    blocks held beside them (autograd saved them)."""
    never = lambda lo, hi: 0  # noqa: E731
    rows, sizes = _layers()
    assert find_fused(rows, never, _between({i: s for i, s in sizes.items()
                                             if s != HIDDEN_BYTES})) == {}
    odd = [Row(FUSED_BYTES + 4, r.family, r.phase, r.site, r.alloc_idx, r.free_idx)
           for r in rows]
    assert find_fused(odd, never, _between(sizes)) == {}
    rows2, sizes2 = _layers(extra="hidden")
    assert find_fused(rows2, never, _between(sizes2)) == {}
    rows3, sizes3 = _layers(3)
    assert find_fused(rows3, never, _between(sizes3)) == {}
    step = Row(4096, "optimizer_state", "unknown", "", -1, -1)
    assert find_fused([*rows, step], never, _between(sizes)) == {}
    # a kept site of another size (returned attention weights) leaves the cache named
    rows4, sizes4 = _layers(extra="attn", extra_size=2 * 2 * 16 * 16 * 4)  # 2 heads
    assert sorted(find_fused(rows4, never, _between(sizes4))) == [0, 2, 4, 6]
