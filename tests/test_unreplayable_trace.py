"""Issue 66: a snapshot whose trace was reordered (reversed, shuffled) reported allocated
4,636,169,216 B above reserved 4,236,247,040 B, a figure of a state no allocator can be in,
flagged but printed. Replayed back from the final segments, such a trace holds more bytes
live than the segments reserve; it cannot be their history, so it is not used: the report
is the snapshot's final state (every figure checkable against the file) and says why, and a
moment only the trace could give (--at peak, oom, event:N) is refused in one line.

Expected figures are recomputed here from the raw snapshot dict, never from snapana.
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import pytest

from .conftest import ROOT, invoke

M = 1 << 20
BASE = 1 << 40
CORPUS_SNAPSHOT = (ROOT.parent / "shared" / "corpus" / "torch_snapshots"
                   / "bcrafton+assignment2-systems__memory_snapshot.pickle")


def _ev(action: str, addr: int, size: int, t: int) -> dict[str, Any]:
    return {"action": action, "addr": addr, "size": size, "stream": 0, "time_us": t,
            "frames": []}


def _small(order: str) -> dict[str, Any]:
    """One 2 MiB segment that one 2 MiB block fills at the end; before it, a 1 MiB block
    was allocated and freed. Written in time order, or reversed."""
    trace = [_ev("alloc", BASE + M, M, 10), _ev("free_requested", BASE + M, M, 11),
             _ev("free_completed", BASE + M, M, 12), _ev("alloc", BASE, 2 * M, 13)]
    block = {"address": BASE, "size": 2 * M, "requested_size": 2 * M,
             "state": "active_allocated", "frames": []}
    seg = {"device": 0, "address": BASE, "total_size": 2 * M, "stream": 0,
           "segment_type": "large", "blocks": [block]}
    return {"segments": [seg],
            "device_traces": [trace if order == "time" else trace[::-1]]}


def _final_figures(snap: dict[str, Any]) -> tuple[int, int]:
    """(allocated, reserved) of the snapshot's final state, from the raw dict."""
    segs = [s for s in snap["segments"] if s.get("device", 0) == 0]
    reserved = sum(s["total_size"] for s in segs)
    allocated = sum(b["size"] for s in segs for b in s["blocks"]
                    if b["state"] == "active_allocated")
    return allocated, reserved


def _summary(path: Path, *args: str) -> dict[str, Any]:
    result = invoke("summary", str(path), "-f", "json", *args)
    assert result.returncode == 0, result.stderr
    (dev,) = json.loads(result.stdout)["devices"]
    return dev


def _check_final_state(path: Path, snap: dict[str, Any]) -> None:
    allocated, reserved = _final_figures(snap)
    for args in ((), ("--at", "end")):
        dev = _summary(path, *args)
        assert (dev["allocated_bytes"], dev["reserved_bytes"]) == (allocated, reserved)
        assert dev["allocated_bytes"] <= dev["reserved_bytes"]
        assert dev["moment"]["kind"] == "snapshot"
        n = len(snap["device_traces"][0])
        (why,) = [w for w in dev["warnings"]
                  if w.startswith("the trace cannot be replayed in the order it is written")]
        assert f"its {n:,} events" in why and "final segments and blocks" in why
        assert not any("figures are inconsistent" in w for w in dev["warnings"])
    for at in ("peak", "event:0"):
        result = invoke("summary", str(path), "--at", at)
        lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
        assert result.returncode == 2 and len(lines) == 1, result.stderr
        assert "cannot be replayed" in lines[0] and "('end')" in lines[0]
    text = invoke("summary", str(path))
    assert text.returncode == 0, text.stderr
    assert "its trace cannot be replayed" in text.stdout
    assert "no allocation history recorded" not in text.stdout


def test_a_reversed_trace_reports_the_final_state(tmp_path: Path) -> None:
    snap = _small("reversed")
    path = tmp_path / "reversed.pickle"
    path.write_bytes(pickle.dumps(snap, protocol=4))
    _check_final_state(path, snap)


def test_the_same_trace_in_time_order_is_replayed(tmp_path: Path) -> None:
    """Only a trace that cannot be the segments' history is set aside: in time order the
    same events replay, and the peak is the 2 MiB block (1 MiB freed before it)."""
    snap = _small("time")
    path = tmp_path / "ordered.pickle"
    path.write_bytes(pickle.dumps(snap, protocol=4))
    dev = _summary(path)
    assert dev["moment"]["kind"] == "peak" and dev["history"]
    assert (dev["allocated_bytes"], dev["reserved_bytes"]) == (2 * M, 2 * M)
    assert not any("cannot be replayed" in w for w in dev["warnings"])


@pytest.mark.skipif(not CORPUS_SNAPSHOT.is_file(), reason="shared corpus not present")
def test_a_reordered_corpus_trace_reports_the_final_state(tmp_path: Path) -> None:
    """The finding's capture: a real snapshot (4.24 GB reserved), its last 64 trace entries
    (a ring buffer's window, as the fuzzer keeps) reversed."""
    snap = pickle.loads(CORPUS_SNAPSHOT.read_bytes())
    snap["device_traces"] = [t[-64:][::-1] for t in snap["device_traces"]]
    path = tmp_path / "reordered.pickle"
    path.write_bytes(pickle.dumps(snap, protocol=4))
    _check_final_state(path, snap)
