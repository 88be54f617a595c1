"""Autocast's weight copies (issue 67): the bf16 copy torch.autocast caches of each fp32
weight (aten autocast_mode.cpp `cached_cast`, freed at torch/amp autocast_mode.py `__exit__`)
is its own family, not saved activations, and a smaller batch is not offered for it.

Checked against the simulator's ground truth (which blocks it made as copies) and against real
captures, recomputed here from the raw pickle with a plain loader."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
import snapana
from snapana.analysis.attribution.weight_copies import Row, find
from snapana.analysis.knobs import load_knobs
from snapana.synth.scenarios import sized, write_snapshot
from snapana.synth.scenarios.autocast import BF16, LAYERS, MATMULS, autocast_forward

from .conftest import SNAPSHOTS, raw_load

FAMILY = "autocast_weight_copies"
KNOB = "torch.autocast_weights_in_low_precision"


def _synth(tmp: Path, **kw: bool) -> tuple[snapana.api.Analysis, dict]:
    path, truth = write_snapshot(*autocast_forward(**kw), tmp / "ac.pickle")
    return snapana.load(path), json.loads(truth.read_text())


@pytest.mark.parametrize("cpp", [False, True], ids=["python-frames", "cpp-frames"])
def test_simulated_copies_are_named_exactly(tmp_path: Path, cpp: bool) -> None:
    """At the forward's peak, the blocks named autocast_weight_copies are the simulator's
    copies, one per matmul weight, half its fp32 bytes; said to be inferred, and why."""
    a, truth = _synth(tmp_path, cpp=cpp)
    got = a.blocks.filter(a.blocks["family"] == FAMILY)
    assert sorted(got["address"].to_list()) == sorted(truth["facts"]["copies"])
    assert int(got["requested_size"].sum()) == truth["facts"]["copy_bytes"]
    assert truth["facts"]["copy_bytes"] == LAYERS * sum(MATMULS) * BF16
    assert set(got["evidence"].to_list()) == {"inferred"}
    assert all("inferred: sizes match 1/2 of" in r and "same Python call site" in r
               for r in got["reason"].to_list())
    assert all(("cached_cast" in r) == cpp for r in got["reason"].to_list())


def test_fp32_twin_has_no_copies(tmp_path: Path) -> None:
    """The same forward without autocast makes no copies, and none is named."""
    a, truth = _synth(tmp_path, autocast=False)
    assert truth["facts"]["copies"] == []
    assert FAMILY not in a.blocks["family"].to_list()


def test_knob_acts_on_copies_and_batch_does_not(tmp_path: Path) -> None:
    """The low-precision-weights knob is offered for the copies; no knob that shrinks the
    batch names them, and they are not called 'can go: yes' (only autocast's exit frees
    them)."""
    a, _ = _synth(tmp_path)
    d = a.diagnosis
    offered = {k.id: k for k in d.knobs}
    assert KNOB in offered and FAMILY in offered[KNOB].families
    batch = [k for k in load_knobs() if "batch" in k.knob.lower()]
    assert batch and not any(FAMILY in k.families for k in batch)
    what = {w.family: w for w in d.what_ifs}
    assert what[FAMILY].removable != "yes"
    assert what[FAMILY].bytes == sum(
        int(b) for b in a.blocks.filter(a.blocks["family"] == FAMILY)["size"])


def _row(size: int, family: str = "saved_activations", cast: bool = False,
         follows: bool = True) -> Row:
    return Row(size, family, "forward", True, cpp=cast, cast=cast, follows=follows)


def test_coincidental_sizes_are_not_copies() -> None:
    """More half-size blocks than weights of a size: which is the copy is not known, so none
    of that size is named; a few copies of a big model's weights are no signature."""
    weights = [_row(4096, "parameters") for _ in range(4)] + [_row(1 << 20, "parameters")]
    # four copies of the small weights, but they cover ~1% of the weights' bytes
    assert find([*weights, *(_row(2048) for _ in range(4))]) == {}
    big = [_row(1 << 22, "parameters") for _ in range(8)]
    rows = [*big, *(_row(1 << 21) for _ in range(9))]  # nine blocks for eight weights
    assert find(rows) == {}
    rows = [*big, *(_row(1 << 21) for _ in range(8))]
    assert sorted(find(rows)) == list(range(8, 16))
    # with C++ frames recorded, a block not made through the cast is not a copy
    rows = [*big, *(Row(1 << 21, "saved_activations", "forward", True, cpp=True, cast=i < 6,
                        follows=True) for i in range(8))]
    assert len(find(rows)) == 6
    rows[8:] = [Row(1 << 21, "saved_activations", "forward", True, cpp=True, cast=False,
                    follows=True)] * 8
    assert find(rows) == {}


def test_a_copy_is_followed_by_its_op() -> None:
    """Blocks of exactly the copies' sizes whose next allocation was not made at their call
    site are not copies: autocast casts an op's arguments and runs it in one call, so its
    output follows each copy there; an fp32 op makes only its output."""
    big = [_row(1 << 22, "parameters") for _ in range(8)]
    assert find([*big, *(_row(1 << 21, follows=False) for _ in range(8))]) == {}
    rows = [*big, *(_row(1 << 21, follows=i < 6) for i in range(8))]
    assert sorted(find(rows)) == list(range(8, 14))


def test_sized_fp32_job_with_copy_sized_activations_names_none(tmp_path: Path) -> None:
    """The fp32 training step at batch × seq = hidden / 2: each fp32 activation [b, s, n] has
    the bytes of a bf16 copy of an [h, n] weight (checked here from the simulator's shapes),
    yet no allocation anywhere in the window is named a copy: none is followed by an
    allocation at its own call site."""
    batch, seq = 2, 256
    assert batch * seq * sized.FP32 == sized.HIDDEN * BF16
    path, _ = write_snapshot(*sized.sized_job(batch, seq), tmp_path / "sized.pickle")
    a = snapana.load(path)
    assert FAMILY not in a.timeline["family"].unique().to_list()
    assert FAMILY not in a.blocks["family"].to_list()


# --- real captures -----------------------------------------------------------------------

MIXED = [
    "kkaitlyn111+cs336-a2-systems__memory_files_memory_ctx128_forward_mixed.pickle",
    "kkaitlyn111+cs336-a2-systems__memory_files_memory_ctx256_forward_mixed.pickle",
    "kkaitlyn111+cs336-a2-systems__memory_files_memory_ctx512_forward_mixed.pickle",
    "silmont2000+assignment2-systems__memory_forward_bf16_128.pickle",
    "bolongcheng+assignment2-systems__benchmarks_memory_snapshot_xl_fwd_cl512_dtypetorch"
    ".bfloat16.pickle",
]
#: the mixed-precision training step whose peak comes after the forward (copies gone) and
#: its fp32 twin
NONE = ["notHanmin+assignment2-systems__memory_snapshot.pickle",
        "notHanmin+assignment2-systems__memory_snapshot_forward_without_mixed.pickle"]


def _corpus(name: str) -> Path:
    path = SNAPSHOTS / name
    if not path.exists():
        pytest.skip(f"corpus capture {name} absent")
    return path


def _copies_from_raw(path: Path, idx: int) -> set[int]:
    """Independently of snapana: the blocks live at trace event `idx` that a forward made
    through at::autocast::cached_cast, sized half a parameter (a block with no alloc event:
    held since before recording), at most as many of a size as parameters of twice it."""
    snap = raw_load(path)
    trace = snap["device_traces"][0]
    made = {e["addr"] for e in trace if e["action"] == "alloc"}
    params = Counter(b["requested_size"] for s in snap["segments"] for b in s["blocks"]
                     if b["state"] == "active_allocated" and b["address"] not in made)
    live: dict[int, dict] = {}
    for e in trace[:idx + 1]:
        if e["action"] == "alloc":
            live[e["addr"]] = e
        elif e["action"] in ("free_requested", "free_completed"):
            live.pop(e["addr"], None)
    cast = [e for e in live.values() if params.get(2 * e["size"])
            and any("autocast::cached_cast" in f["name"] for f in e.get("frames") or ())]
    per = Counter(e["size"] for e in cast)
    return {e["addr"] for e in cast if per[e["size"]] <= params[2 * e["size"]]}


@pytest.mark.parametrize("name", MIXED)
def test_corpus_copies_match_raw(name: str) -> None:
    """The copies named at the moment shown are those the raw trace shows (cast through the
    cache's C++ frame, half a parameter's size), none of them left as saved activations."""
    path = _corpus(name)
    a = snapana.load(path)
    expected = _copies_from_raw(path, a.moment.idx)
    got = set(a.blocks.filter(a.blocks["family"] == FAMILY)["address"].to_list())
    assert len(expected) > 50
    assert got == expected


def _python_frames(event: dict) -> tuple:
    return tuple((f["filename"], f["line"], f["name"]) for f in event.get("frames") or ()
                 if f["filename"].endswith(".py"))


@pytest.mark.parametrize("name", MIXED)
def test_corpus_casts_are_followed_by_their_op(name: str) -> None:
    """What the rule keys on, read from the raw trace: every allocation made through
    at::autocast::cached_cast is followed, as the device's very next allocation, by one made
    at the same Python frames (its op's output, or another argument's cast)."""
    trace = raw_load(_corpus(name))["device_traces"][0]
    allocs = [e for e in trace if e["action"] == "alloc"]
    casts = [i for i, e in enumerate(allocs[:-1])
             if any("autocast::cached_cast" in f["name"] for f in e.get("frames") or ())]
    assert len(casts) > 50
    assert all(_python_frames(allocs[i]) and _python_frames(allocs[i]) ==
               _python_frames(allocs[i + 1]) for i in casts)


def test_corpus_copies_do_not_grow_with_sequence() -> None:
    """The same model at 128, 256 and 512 tokens: the same copy bytes at each peak."""
    sizes = []
    for name in MIXED[:3]:
        a = snapana.load(_corpus(name))
        sizes.append(int(a.blocks.filter(a.blocks["family"] == FAMILY)["size"].sum()))
    assert sizes[0] > 0 and len(set(sizes)) == 1


@pytest.mark.parametrize("name", NONE)
def test_corpus_without_live_copies_names_none(name: str) -> None:
    path = _corpus(name)
    a = snapana.load(path)
    assert _copies_from_raw(path, a.moment.idx) == set()
    assert FAMILY not in a.blocks["family"].to_list()
