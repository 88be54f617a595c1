"""The lifetime decisions over a whole trace are made with array operations (issue 55); they
must be the decisions a block-by-block reading makes. The reference here walks the trace one
event and one lifetime at a time, as the scalar code before it did: the phase marks of the
trace (each allocation with frames, each phase-naming annotation window), the backward hint
of a frameless allocation, each lifetime's rule decision, and the working sets (a state
family's blocks allocated and freed in one run of their phase, freed by a stack of it). Every
lifetime's family and phase, on the samples and on every corpus snapshot, must match."""

from __future__ import annotations

import bisect
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import snapana
from snapana.analysis.attribution import inference
from snapana.analysis.attribution.lifetimes import attribute_lifetimes
from snapana.analysis.attribution.stack import BlockContext
from snapana.model import EMPTY_STACK

from .conftest import corpus_params

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = sorted((ROOT / "sample_snapshots").glob("*.pickle"))


def _marks(attributor) -> list[tuple[float, str]]:
    """The trace's phase marks, one event at a time, sorted as (position, phase) pairs."""
    capture, rules, windows = attributor.capture, attributor.rules, attributor.windows
    ev = capture.device_events(attributor.device)
    times = ev["time_us"].to_list() if capture.has_time else [None] * ev.height
    marks = []
    for i, (act, sid, t) in enumerate(zip(ev["action"].to_list(), ev["stack_id"].to_list(),
                                          times, strict=True)):
        if act != "alloc" or sid is None or sid == EMPTY_STACK:
            continue
        stack = capture.stacks.stack(sid)
        phase = rules.infer_phase(stack, BlockContext(
            has_alloc_event=True, annotations=windows.at(t))) if stack else "unknown"
        if phase != "unknown":
            marks.append((float(i), phase))
    if capture.has_time:
        timed = [(t, k) for k, t in enumerate(times) if t is not None]
        tpos = [t for t, _ in timed]
        for start, end, name in windows.windows:
            phase = rules.infer_phase((), BlockContext(annotations=(name,)))
            if phase == "unknown":
                continue
            j = bisect.bisect_left(tpos, start)
            marks.append(((timed[j][1] if j < len(timed) else len(times)) - 0.5, phase))
            if end < 2**62:
                j = bisect.bisect_right(tpos, end)
                marks.append(((timed[j - 1][1] if j > 0 else -1) + 0.5, phase))
    return sorted(marks)


def _in_backward(marks: list[tuple[float, str]], i: int) -> bool:
    pos = [p for p, _ in marks]
    j = bisect.bisect_left(pos, i)
    left = marks[j - 1][1] if j > 0 else None
    k = bisect.bisect_right(pos, i)
    right = marks[k][1] if k < len(marks) else None
    return "backward" in (left, right) or left == "forward" and right in (None, "optimizer")


def _same_run(marks: list[tuple[float, str]], phase: str, born: int, freed: int) -> bool:
    return not any(born < p < freed for p, ph in marks if ph != phase)


def _reference(a) -> tuple[list[str], list[str]]:
    """Each lifetime's family and phase, one lifetime at a time."""
    attributor, dr = a.attributor, a.replay
    capture = attributor.capture
    lt = dr.lifetimes
    marks = _marks(attributor) if capture.has_trace else []
    segs = dr.segment_intervals.filter(pl.col("pool") != "0,0").to_dicts()
    ev = capture.device_events(attributor.device)
    n = ev.height
    transient = {t.family: t for t in inference.transient_rules()}
    families, phases = [], []
    for row in lt.select("address", "stack_id", "stream", "size", "alloc_idx",
                         "free_req_idx").iter_rows(named=True):
        born, sid = row["alloc_idx"], row["stack_id"]
        pool = next((s["pool"] for s in segs if s["address"] <= row["address"] <
                     s["address"] + s["total_size"] and s["open_idx"] <= born < s["close_idx"]),
                    "0,0")
        has_event = born >= 0 if capture.has_trace else None
        hint = None
        if has_event and not attributor.stacks.stack(sid) and capture.has_trace:
            hint = "backward" if _in_backward(marks, born) else None
        t = ev["time_us"][born] if capture.has_time and born >= 0 else None
        d = attributor.rules.classify(attributor.stacks.stack(sid), BlockContext(
            pool_id=tuple(int(x) for x in pool.split(",")), stream=0 if row["stream"] == 0 else 1,
            size=row["size"], has_alloc_event=has_event,
            annotations=attributor.windows.at(t), phase_hint=hint))
        family, freed = d.family, row["free_req_idx"]
        rule = transient.get(family)
        if rule and capture.has_trace and 0 <= born < freed < n and \
                _same_run(marks, rule.phase, born, freed):
            fsid = ev["stack_id"][freed]
            if fsid is not None and attributor.stacks.stack(fsid):
                ft = ev["time_us"][freed] if capture.has_time else None
                freer = attributor.rules.classify(attributor.stacks.stack(fsid), BlockContext(
                    size=int(ev["size"][freed] or 0), has_alloc_event=True,
                    annotations=attributor.windows.at(ft)))
                if freer.phase == rule.phase:
                    family = rule.becomes
        if family == "unknown" and born < 0 and not attributor.stacks.stack(sid) and \
                capture.has_trace and 0 <= freed < n:
            family = _freed_as(attributor, ev, freed, row["size"]) or family
        families.append(family)
        phases.append(d.phase)
    return families, phases


def _freed_as(attributor, ev: pl.DataFrame, freed: int, size: int) -> str | None:
    """What the stack that freed a frameless block held since before recording says it was
    (the inference stage's lifetime methods: zero_grad frees last step's gradients), read
    from that one free event."""
    fsid = ev["stack_id"][freed]
    stack = attributor.stacks.stack(fsid) if fsid is not None else ()
    if not stack:
        return None
    ft = ev["time_us"][freed] if attributor.capture.has_time else None
    phase = attributor.rules.classify(stack, BlockContext(
        size=int(size), has_alloc_event=True, annotations=attributor.windows.at(ft))).phase
    method = inference.freed_as(inference.Freed(
        phase, frozenset(f[1] for f in stack), attributor.site(fsid)), window=False)
    return None if method is None else method.family


def _with_set_decisions(a: snapana.Analysis, families: list[str]) -> list[str]:
    """`families` with the window's set decisions (`Attributor.set_decisions`) applied one
    lifetime at a time: an allocation a decision moment saw takes the set family it named
    there (if any); one none saw, allocated in the window, takes its call path and size's."""
    window = a.attributor.set_decisions()
    if window is None:
        return families
    by_key = {(k, ad): f for k, ad, f in window.by_key.select(
        "alloc_idx", "address", "_c_family").iter_rows()}
    by_path = {(sid, req): f for sid, req, f in window.by_path.select(
        "stack_id", "_req", "_p_family").iter_rows()}
    out = list(families)
    for i, (born, address, sid, size, req) in enumerate(a.replay.lifetimes.select(
            "alloc_idx", "address", "stack_id", "size", "requested_size").iter_rows()):
        if (born, address) in by_key:
            out[i] = by_key[(born, address)] or out[i]
        elif born >= 0:
            out[i] = by_path.get((sid, req if req is not None else size)) or out[i]
    return out


def _check(path: Path) -> None:
    for device in snapana.load(path).capture.devices:
        a = snapana.load(path, device=device)
        dr = a.replay
        if not dr.n_events:
            continue
        fast = attribute_lifetimes(a.attributor, dr)
        families, phases = _reference(a)
        families = _with_set_decisions(a, families)
        wrong = np.flatnonzero(np.asarray(fast["family"].to_list(), dtype=object)
                               != np.asarray(families, dtype=object))
        assert not wrong.size, (device, [(fast["family"][int(i)], families[i])
                                         for i in wrong[:5]])
        assert fast["phase"].to_list() == phases, device


@pytest.mark.parametrize("path", SAMPLES, ids=lambda p: p.name)
def test_every_lifetime_decision_matches_one_by_one_on_samples(path: Path) -> None:
    _check(path)


@pytest.mark.parametrize("path", corpus_params("torch_snapshots", "*.p*"))
def test_every_lifetime_decision_matches_one_by_one_on_corpus(path: Path) -> None:
    _check(path)


def test_working_sets_of_a_long_training_trace_match_one_by_one(tmp_path: Path) -> None:
    """A simulated training run long enough for many optimizer steps: its step temporaries
    and activation gradients are working sets (the reference must find some, or this test
    checks nothing), decided as one by one."""
    from .conftest import invoke

    path = tmp_path / "train.pickle"
    invoke("synth", "--entries", "30000", "-o", str(path))
    a = snapana.load(path)
    families, _ = _reference(a)
    becomes = {t.becomes for t in inference.transient_rules()}
    assert becomes & set(families)
    _check(path)
