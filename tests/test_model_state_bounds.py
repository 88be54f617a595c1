"""Issue 42's checks on every real capture and sample: the loss chain is never the program's
own tensors or unknown, and optimizer state never exceeds what the optimizer allows.

What a block is comes from the raw pickle here (its frames, read with a loader that runs
nothing), not from snapana's parsing; the bound on optimizer state comes from the optimizer
the raw frames show (Adam-like: two moments per parameter; SGD with momentum: one).
"""

from __future__ import annotations

import re
from pathlib import Path

import polars as pl
import pytest
import snapana
from snapana.analysis.attribution import BlockContext, load_rules

from .conftest import ROOT, SNAPSHOTS, raw_load
from .raw_replay import live_after, raw_replay, rounded

CAPTURES = sorted([*SNAPSHOTS.glob("*.p*")] if SNAPSHOTS.is_dir() else []) + sorted(
    (ROOT / "sample_snapshots").glob("*.pickle"))
#: a loss over the vocabulary: the innermost Python frame's function (cross_entropy_loss,
#: masked_log_softmax, F.nll_loss, ...)
LOSS = re.compile(r"(?:\w+_)?(?:log_softmax|cross_entropy|nll_loss)(?:_\w+)?")
MiB = 1 << 20


def _innermost_python(frames: list[dict]) -> str:
    return next((f["name"] for f in frames if str(f["filename"]).endswith(".py")), "")


def _raw_stacks(raw: dict) -> list[tuple[tuple[tuple[str, str, int], ...], int, bool]]:
    """(stack, size, allocated while recording) of every final active block and every
    traced allocation of the raw snapshot."""
    out = []
    for seg in raw.get("segments", []):
        for b in seg.get("blocks", []):
            if str(b.get("state", "")).startswith("active") and b.get("frames"):
                out.append((b["frames"], int(b["size"]), True))
    for trace in raw.get("device_traces") or []:
        for e in trace:
            if e.get("action") == "alloc" and e.get("frames"):
                out.append((e["frames"], int(e["size"]), True))
    return [(tuple((str(f["filename"]), str(f["name"]), int(f["line"])) for f in frames),
             size, ev) for frames, size, ev in out]


@pytest.mark.parametrize("path", CAPTURES, ids=lambda p: p.name)
def test_the_loss_chain_is_never_the_programs_own_or_unknown(path: Path) -> None:
    raw = raw_load(path)
    if not isinstance(raw, dict):
        pytest.skip("an old list-of-segments layout: no frames to read")
    rules = load_rules()
    checked = 0
    for stack, size, has_event in _raw_stacks(raw):
        name = _innermost_python([{"filename": p, "name": n} for p, n, _ in stack])
        if not LOSS.fullmatch(name):
            continue
        family = rules.classify(stack, BlockContext(size=size, has_alloc_event=has_event)).family
        assert family not in ("user_tensors", "unknown"), (name, size, family)
        checked += 1
    if not checked:
        pytest.skip("no loss-chain allocation in this capture")


def _optimizer_moments(raw: dict) -> int | None:
    """Moments per parameter the raw frames' optimizer keeps: 2 for Adam-like (torch.optim
    adam/adamw, TransformerEngine / apex FusedAdam, Megatron's optimizer, a program's own
    optimizer called through torch.optim's step wrapper), 1 for SGD; None: no optimizer."""
    names: set[str] = set()
    for stack, _, _ in _raw_stacks(raw):
        for p, n, _ in stack:
            p = p.replace("\\", "/")
            if "/optim" in p or "optimizer" in p:
                names.add(f"{p.rsplit('/', 1)[-1]}:{n}")
    if not names:
        return None
    if any(re.search(r"adam|megatron|distrib_optimizer|optimizer\.py:wrapper", n, re.I)
           for n in names):
        return 2
    if any(re.search(r"sgd", n, re.I) for n in names):
        return 1
    return 2


@pytest.mark.parametrize("path", CAPTURES, ids=lambda p: p.name)
def test_optimizer_state_within_what_the_optimizer_allows(path: Path) -> None:
    """Optimizer state at the report's moment is at most `moments` × the bytes of what it
    can shadow: the parameters (their fp32 master copies and Megatron's flat buffers), or
    tensors of the program's own that it optimises (an input image in a counterfactual
    search). An update temporary booked as state breaks it. A step that updates out of
    place (it frees state held since before recording and makes its own anew, one
    parameter at a time) holds, for the parameter it is at, the old moments beside the new
    ones: at most one more set, of the largest such block (its request rounded, plus a
    remainder too small to split off). A state block's bytes beyond its tensor are the
    allocator's, not the optimizer's: a large-pool request takes a whole free block when
    what would remain is too small to split (at most kSmallSize), so where the state is
    over, the bound is on the state less those remainders, as an independent replay of the
    raw trace cuts them (`raw_replay`: the NPU MemSnapDump capture's Adam moments of
    2,359,296 and 2,097,152 B from `_init_group` each took a 3,144,192 B block)."""
    raw = raw_load(path)
    moments = _optimizer_moments(raw) if isinstance(raw, dict) else None
    if moments is None:
        pytest.skip("no optimizer in the raw frames")
    a = snapana.load(path)
    blocks = a.blocks
    held = dict(blocks.group_by("family").agg(pl.col("size").sum()).iter_rows())
    state = held.get("optimizer_state", 0)
    shadowed = sum(held.get(f, 0) for f in ("parameters", "main_params_fp32", "param_buffer",
                                            "user_tensors"))
    replaced = [rounded(e["size"]) + MiB for e in _frees_before_any_alloc(raw)
                if _in_step(e.get("frames") or [])]
    in_flight = moments * max(replaced, default=0)
    bound = moments * shadowed + in_flight + MiB
    if state > bound:
        state -= _remainders(raw, a, blocks.filter(pl.col("family") == "optimizer_state"))
    assert state <= bound, (state, moments, shadowed)


def _remainders(raw: dict, a: snapana.Analysis, state: pl.DataFrame) -> int:
    """Bytes of the `state` blocks allocated in the window beyond their rounded requests,
    the request read from the raw trace entry that allocated each and the block's size from
    an independent replay of the raw trace to the report's moment."""
    trace = raw["device_traces"][a.device]
    r = raw_replay(raw, a.device)
    live = live_after(raw, a.device, a.moment.idx)
    out = 0
    for address, idx in state.filter(pl.col("alloc_idx") >= 0).select(
            "address", "alloc_idx").iter_rows():
        e = trace[idx]
        assert e["action"] == "alloc" and e["addr"] == address
        cut = live[address] - rounded(e["size"], r.pad)
        assert 0 <= cut <= MiB  # a remainder too small to split off (kSmallSize)
        out += cut
    return out


def _frees_before_any_alloc(raw: dict) -> list[dict]:
    """Trace entries that free a block allocated before recording (no alloc of its address
    comes first)."""
    out = []
    for trace in raw.get("device_traces") or []:
        seen: set[int] = set()
        for e in trace:
            if e["action"] == "alloc":
                seen.add(e["addr"])
            elif e["action"] == "free_requested" and e["addr"] not in seen:
                seen.add(e["addr"])
                out.append(e)
    return out


def _in_step(frames: list[dict]) -> bool:
    return any(f["name"] in ("step", "wrapper") and re.search(
        r"optim", str(f["filename"]).replace("\\", "/").rsplit("/", 1)[-1]) for f in frames)


def _raw_step_temporaries(raw: dict, device: int) -> set[tuple[int, int]]:
    """(address, event index of the allocation) of what the raw trace allocates inside an
    optimizer step and frees inside it, with no forward or backward allocation between
    (autograd's frames or a module's forward)."""
    trace = (raw.get("device_traces") or [])[device]
    born: dict[int, int] = {}
    other_phase = [i for i, e in enumerate(trace) if e.get("action") == "alloc" and any(
        f["name"] == "forward" or "autograd" in str(f["filename"]) or "autograd" in f["name"]
        for f in e.get("frames") or ())]
    out = set()
    for i, e in enumerate(trace):
        if e.get("action") == "alloc":
            born[e["addr"]] = i if _in_step(e.get("frames") or []) else -1
        elif e.get("action") == "free_requested" and born.get(e["addr"], -1) >= 0:
            j, start = i, born.pop(e["addr"])
            if _in_step(e.get("frames") or []) and not any(start < k < j for k in other_phase):
                out.add((e["addr"], start))
    return out


@pytest.mark.parametrize("path", CAPTURES, ids=lambda p: p.name)
def test_update_temporaries_are_not_optimizer_state(path: Path) -> None:
    raw = raw_load(path)
    if not isinstance(raw, dict) or not raw.get("device_traces"):
        pytest.skip("no trace")
    a = snapana.load(path)
    if a.blocks.is_empty():
        pytest.skip("nothing live")
    temporaries = _raw_step_temporaries(raw, int(a.blocks["device"][0]))
    live = a.blocks.filter([(addr, i) in temporaries for addr, i in
                            a.blocks.select("address", "alloc_idx").iter_rows()])
    if live.is_empty():
        pytest.skip("no update temporary live at the report's moment")
    assert set(live["family"].to_list()) == {"optimizer_temporaries"}
