"""Issue 67 on captures made here: a forward's returned KV cache and a hand-written optimizer's
state, each profiled with torch.profiler (profile_memory, record_shapes, with_stack) on the
CPU build of torch and read back by snapana from the exported chrome trace.

The ground truth is the program's own: the storages its tensors own (`data_ptr` of the
cache's keys and values, of the weights and moments it made), and sizes computed from the
model's config or the shapes it asked for, never from snapana's output.

- A Hugging Face causal LM built from a small random config (no download), called with
  use_cache=True: its past_key_values are one key and one value block per decoder layer, of
  batch x kv_heads x seq x head_dim x 4 bytes. transformers >= 4.56 makes them in
  cache_utils.py `DynamicLayer.update` (`torch.cat([self.keys, key_states], dim=-2)`), which
  the pack's frame rule names; before, `DynamicCache.update` kept the attention's own
  tensors, which the `kv_pairs` signature names. Either way: kv_cache, 2 x layers blocks --
  except GPT-2 before 4.56, whose keys and values are views of its fused c_attn output
  (one [batch, seq, 3 x n_embd] block per layer, query part included), which the
  `kv_pairs.fused` signature names: kv_cache, layers blocks. Run with transformers 4.44.2
  (pip install --target DIR transformers==4.44.2, DIR first on PYTHONPATH) for that path.
- A program that makes its weights with torch.randn(..., requires_grad=True) and steps its
  own Adam (moments by torch.zeros_like in its own code): the weights are parameters and the
  moments optimizer state, by structure; the program's inputs and targets (one of them the
  size of a bias) are neither.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import polars as pl
import pytest
import snapana

from .conftest import invoke, require

PROFILE = {"profile_memory": True, "record_shapes": True, "with_stack": True}


def _storage(t: Any) -> int:
    """The address of the allocation a tensor's storage lives in (what the trace records)."""
    return int(t.untyped_storage().data_ptr())


def _profiled(tmp: Path, name: str, work: Any) -> tuple[Path, Any]:
    """Run `work()` under torch.profiler on the CPU; the chrome trace and what work returned."""
    profiler = require("torch.profiler")
    with profiler.profile(activities=[profiler.ProfilerActivity.CPU], **PROFILE) as prof:
        got = work()
    path = tmp / f"{name}.json"
    prof.export_chrome_trace(str(path))
    return path, got


def _live_at_peak(path: Path) -> set[int]:
    """Independently of snapana: the CPU allocations live when the trace's own Total
    Allocated is highest."""
    events = [e for e in json.loads(path.read_text())["traceEvents"]
              if e.get("name") == "[memory]" and e["args"].get("Device Type") == 0]
    live: set[int] = set()
    peak, at_peak = -1, set()
    for e in sorted(events, key=lambda e: e["ts"]):
        (live.add if e["args"]["Bytes"] > 0 else live.discard)(e["args"]["Addr"])
        if e["args"]["Total Allocated"] > peak:
            peak, at_peak = e["args"]["Total Allocated"], set(live)
    return at_peak


def _summary_groups(path: Path) -> dict[str, dict]:
    run = invoke("summary", str(path), "--format", "json")
    assert run.returncode == 0, run.stderr
    (device,) = json.loads(run.stdout)["devices"]
    assert device["device_name"] == "cpu"
    return {g["family"]: g for g in device["groups"]}


# --- a Hugging Face causal LM's returned cache ---------------------------------------------

LAYERS, BATCH, SEQ = 4, 2, 16


def _config(kind: str) -> Any:
    transformers = require("transformers")
    if kind == "gpt2":
        return transformers.GPT2Config(n_layer=LAYERS, n_head=4, n_embd=64, vocab_size=512,
                                       n_positions=64, bos_token_id=0, eos_token_id=0)
    return transformers.LlamaConfig(num_hidden_layers=LAYERS, num_attention_heads=4,
                                    num_key_value_heads=2, hidden_size=64,
                                    intermediate_size=128, vocab_size=512,
                                    max_position_embeddings=64, bos_token_id=0,
                                    eos_token_id=0, pad_token_id=0)


def _kv_bytes(config: Any, seq: int) -> int:
    """One K (or V) block: batch x kv_heads x seq x head_dim x 4 bytes (fp32)."""
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    return BATCH * kv_heads * seq * (config.hidden_size // heads) * 4


def _kv_tensors(cache: Any) -> list[Any]:
    """The cache's key and value tensors: transformers >= 4.56 keeps them in `layers`
    (DynamicLayer.keys / .values), before in `key_cache` / `value_cache` lists, or a model
    returns the legacy tuple of (key, value) per layer."""
    if isinstance(cache, tuple):
        return [t for layer in cache for t in layer[:2]]
    layers = getattr(cache, "layers", None)
    if layers is not None:
        return [t for layer in layers for t in (layer.keys, layer.values)]
    return [*cache.key_cache, *cache.value_cache]


def _mechanism_column(fused: bool = False) -> tuple[str, str]:
    """Where the installed transformers makes the cache, as snapana should say it: its own
    frame (cache_utils.py DynamicLayer.update's torch.cat, from 4.56) or the signature of
    the attention's kept tensors (before): a K / V pair per layer, or, where the keys and
    values the model returned are views of one fused projection output per layer
    (`fused`), that block."""
    transformers = require("transformers")
    major, minor = (int(x) for x in transformers.__version__.split(".")[:2])
    if (major, minor) >= (4, 56):
        return "rule_id", "transformers.kv_cache"
    return "method", "signature:fused-qkv" if fused else "signature:kv-pairs"


def _expected_cache(kind: str, config: Any, tensors: list[Any]) -> tuple[bool, int, int]:
    """(fused, blocks, bytes of one block) of the cache the model returned, from its own
    tensors and config. GPT-2 before transformers 4.56 splits its fused c_attn output
    (pytorch_utils.py Conv1D: one addmm of [batch, seq, 3 x n_embd]) into views, so a
    layer's key and value share that one storage, of 3 x the K size; otherwise each is a
    block of its own, of the K size."""
    storages = {_storage(t) for t in tensors}
    if kind == "gpt2" and _mechanism_column()[0] == "method":
        assert len(storages) == LAYERS  # one storage per layer holds its key and value
        fused = BATCH * SEQ * 3 * config.hidden_size * 4
        assert {t.untyped_storage().nbytes() for t in tensors} == {fused}
        return True, LAYERS, fused
    return False, 2 * LAYERS, _kv_bytes(config, SEQ)


@pytest.mark.torch
@pytest.mark.transformers
@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_forward_returned_cache_is_kv_cache(tmp_path: Path, kind: str) -> None:
    """A plain forward with use_cache=True whose output is dropped inside the window: at the
    peak, the blocks named kv_cache are exactly the storages of past_key_values, of the
    size the config gives (2 x layers K and V blocks; for transformers <= 4.55 GPT-2, one
    fused c_attn output per layer whose views the cache holds), and the evidence says a
    forward returned them (what use_cache=False acts on); the summary's JSON says the
    same."""
    torch = require("torch")
    transformers = require("transformers")
    torch.manual_seed(0)
    config = _config(kind)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    ids = torch.randint(0, config.vocab_size, (BATCH, SEQ))

    def forward() -> tuple[set[int], tuple[bool, int, int]]:
        with torch.no_grad():
            out = model(ids, use_cache=True)
        tensors = _kv_tensors(out.past_key_values)
        kept = ({_storage(t) for t in tensors}, _expected_cache(kind, config, tensors))
        del out, tensors  # the returned cache dropped: its blocks freed together
        return kept

    path, (truth, (fused, blocks, size)) = _profiled(tmp_path, kind, forward)
    assert len(truth) == blocks
    assert truth <= _live_at_peak(path)  # the moment holds the whole cache

    a = snapana.load(path)
    got = a.blocks.filter(pl.col("family") == "kv_cache")
    assert set(got["address"].to_list()) == truth
    assert set(got["requested_size"].to_list()) == {size}
    column, value = _mechanism_column(fused)
    assert set(got[column].to_list()) == {value}
    assert "returned_kv_cache" in a.diagnosis.evidence.facts
    if fused:  # the words say the query part is held too
        assert all("query part" in r for r in got["reason"].to_list())

    kv = _summary_groups(path)["kv_cache"]
    assert (kv["blocks"], kv["bytes"]) == (blocks, blocks * size)


@pytest.mark.torch
@pytest.mark.transformers
def test_returned_hidden_states_are_no_cache(tmp_path: Path) -> None:
    """GPT-2 with use_cache=False and output_hidden_states=True (n_embd 96, so a hidden
    state's bytes split in three): each layer keeps one block of one size until the output
    is dropped, as a fused projection's output would, but nothing is cached: no kv_cache,
    and the hidden states the program asked for are not named one."""
    torch = require("torch")
    transformers = require("transformers")
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=LAYERS, n_head=4, n_embd=96, vocab_size=512,
                                     n_positions=64, bos_token_id=0, eos_token_id=0)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    ids = torch.randint(0, config.vocab_size, (BATCH, SEQ))

    def forward() -> set[int]:
        with torch.no_grad():
            out = model(ids, use_cache=False, output_hidden_states=True)
        kept = {_storage(t) for t in out.hidden_states}
        del out
        return kept

    path, hidden = _profiled(tmp_path, "gpt2-hidden", forward)
    assert (BATCH * SEQ * config.hidden_size * 4) % 3 == 0
    a = snapana.load(path)
    assert "kv_cache" not in a.blocks["family"].to_list()
    assert "returned_kv_cache" not in a.diagnosis.evidence.facts
    named = a.blocks.filter(pl.col("address").is_in(list(hidden)))
    assert named.height and "kv_cache" not in named["family"].to_list()


def _cache_argument() -> str:
    """generate()'s argument for a cache the caller made: `cache` from transformers 5 (where
    `past_key_values` is deprecated), `past_key_values` before."""
    transformers = require("transformers")
    return "cache" if int(transformers.__version__.split(".")[0]) >= 5 else "past_key_values"


@pytest.mark.torch
@pytest.mark.transformers
def test_generate_cache_is_kv_cache(tmp_path: Path) -> None:
    """generate() of a few tokens into a cache the program passed in and keeps: at the end
    of the window its blocks are kv_cache, one K and one V per layer, of the length the
    last decoding step left (prompt + new tokens - 1), and the capture shows generate()."""
    torch = require("torch")
    transformers = require("transformers")
    torch.manual_seed(0)
    config = _config("llama")
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    ids = torch.randint(1, config.vocab_size, (BATCH, SEQ))
    cache = transformers.DynamicCache()

    def generate() -> int:
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=4,
                             min_new_tokens=4, do_sample=False, **{_cache_argument(): cache})
        return int(out.shape[1])

    path, length = _profiled(tmp_path, "generate", generate)
    truth = {_storage(t) for t in _kv_tensors(cache)}
    assert len(truth) == 2 * LAYERS

    a = snapana.load(path)
    got = a.at(moment="end").blocks.filter(pl.col("family") == "kv_cache")
    assert set(got["address"].to_list()) == truth
    assert set(got["requested_size"].to_list()) == {_kv_bytes(config, length - 1)}
    assert "hf_generate" in a.diagnosis.evidence.facts
    assert "returned_kv_cache" not in a.diagnosis.evidence.facts


# --- a hand-written Adam over hand-made weights --------------------------------------------

#: three layers' weights and biases; the batch's targets (16 x 8 fp32) are 512 bytes, the
#: size of no weight, and the backward's activation gradients of that shape are freed
#: inside it
SHAPES = [(256, 96), (96,), (96, 48), (48,), (48, 8), (8,)]


@pytest.mark.torch
def test_hand_written_adam_state(tmp_path: Path) -> None:
    """Weights made by torch.randn(requires_grad=True) inside the window and an Adam whose
    moments the program makes with torch.zeros_like in its own step: at the peak (the first
    step's update), the blocks named parameters are the weights' storages and those named
    optimizer_state the moments', two per weight; the inputs and targets are neither."""
    torch = require("torch")
    torch.manual_seed(0)

    def train() -> dict[str, list[Any]]:
        ws = [torch.randn(*s, requires_grad=True) for s in SHAPES]
        x, y = torch.randn(16, 256), torch.randn(16, 8)
        moments: list[Any] = []
        for t in range(1, 4):
            h = x
            for i in range(0, len(ws), 2):
                h = h @ ws[i] + ws[i + 1]
                h = torch.tanh(h) if i < len(ws) - 2 else h
            ((h - y) ** 2).mean().backward()
            if not moments:
                moments = [(torch.zeros_like(w), torch.zeros_like(w)) for w in ws]
            with torch.no_grad():
                for w, (m, v) in zip(ws, moments, strict=True):
                    m.mul_(0.9).add_(w.grad, alpha=0.1)
                    v.mul_(0.999).addcmul_(w.grad, w.grad, value=0.001)
                    step = (m / (1 - 0.9 ** t)) / ((v / (1 - 0.999 ** t)).sqrt() + 1e-8)
                    w.sub_(1e-3 * step)
            for w in ws:
                w.grad = None
        # the job holds its model, optimizer and data past the profiled window
        return {"parameters": ws, "optimizer_state": [s for pair in moments for s in pair],
                "inputs": [x, y]}

    path, held = _profiled(tmp_path, "adam", train)
    truth = {k: {_storage(t) for t in ts} for k, ts in held.items()}
    assert truth["parameters"] | truth["optimizer_state"] <= _live_at_peak(path)

    a = snapana.load(path)
    b = a.blocks
    for family, method in (("parameters", "size-mirror:hand-parameters"),
                           ("optimizer_state", "size-mirror:hand-optimizer")):
        got = b.filter(pl.col("family") == family)
        assert set(got["address"].to_list()) == truth[family], family
        assert set(got["method"].to_list()) == {method}
    inputs = b.filter(pl.col("address").is_in(list(truth["inputs"])))
    assert not set(inputs["family"].to_list()) & {"parameters", "optimizer_state"}

    weight_bytes = sum(4 * (s[0] * s[1] if len(s) == 2 else s[0]) for s in SHAPES)
    groups = _summary_groups(path)
    assert (groups["parameters"]["blocks"], groups["parameters"]["bytes"]) == (
        len(SHAPES), weight_bytes)
    assert (groups["optimizer_state"]["blocks"], groups["optimizer_state"]["bytes"]) == (
        2 * len(SHAPES), 2 * weight_bytes)
