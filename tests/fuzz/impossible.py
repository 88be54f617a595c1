"""Allocator states that cannot exist (issue #27), made from a real seed by one edit:
segments that overlap, blocks outside their segment or overlapping inside it, several
active blocks at one address, active blocks of 0 bytes, frees of another size than their
alloc or with no alloc, a trace shuffled or reversed, one address allocated twice (in a
snapshot's trace and in a profiler trace). Each must be refused, or analysed with its
figures flagged: never a negative or impossible figure (see invariants.py)."""

from __future__ import annotations

import copy
import json
import random
from typing import Any

from . import seeds
from .cases import INPUT, SUMMARY, Case
from .pickle_codec import safe_loads

COMMANDS = (SUMMARY, SUMMARY, SUMMARY, ["summary", "{input}", "--at", "end", "-f", "json"],
            ["summary", "{input}", "--at", "peak", "-f", "json"], ["summary", "{input}"],
            ["report", "{input}", "-o", "out.html"])


def _segments(tree: dict[str, Any]) -> list[dict[str, Any]]:
    return [s for s in tree.get("segments") or [] if isinstance(s, dict)]


def _trace(tree: dict[str, Any]) -> list[dict[str, Any]]:
    traces = [t for t in tree.get("device_traces") or [] if t]
    return traces[0] if traces else []


def overlap_segments(r: random.Random, tree: dict[str, Any]) -> str:
    segs = _segments(tree)
    if not segs:
        return ""
    seg = copy.deepcopy(r.choice(segs))
    shift = r.choice((0, seg["total_size"] // 2, 512)) if seg["total_size"] else 0
    seg["address"] += shift
    for b in seg.get("blocks") or []:
        if "address" in b:
            b["address"] += shift
    tree["segments"].append(seg)
    return f"segment copied at +{shift}"


def block_outside(r: random.Random, tree: dict[str, Any]) -> str:
    segs = [s for s in _segments(tree) if s.get("blocks")]
    if not segs:
        return ""
    seg = r.choice(segs)
    b = r.choice(seg["blocks"])
    b["address"] = seg["address"] + seg["total_size"] - r.choice((0, 256))
    return "block past its segment's end"


def block_overlap(r: random.Random, tree: dict[str, Any]) -> str:
    segs = [s for s in _segments(tree) if len(s.get("blocks") or []) > 1]
    if not segs:
        return ""
    seg = r.choice(segs)
    k = r.randrange(1, len(seg["blocks"]))
    prev = seg["blocks"][k - 1]
    seg["blocks"][k]["address"] = prev.get("address", seg["address"]) + r.choice(
        (0, max(prev["size"] // 2, 1)))
    return "block overlapping the one before"


def active_twice(r: random.Random, tree: dict[str, Any]) -> str:
    segs = [s for s in _segments(tree) if s.get("blocks")]
    if not segs:
        return ""
    seg = r.choice(segs)
    k = r.randrange(len(seg["blocks"]))
    twin = dict(seg["blocks"][k], state="active_allocated")
    seg["blocks"].insert(k, twin)
    return "an active block twice at its address"


def zero_active(r: random.Random, tree: dict[str, Any]) -> str:
    blocks = [b for s in _segments(tree) for b in s.get("blocks") or []]
    if not blocks:
        return ""
    b = r.choice(blocks)
    b["size"] = 0
    b["state"] = "active_allocated"
    return "an active block of 0 bytes"


def free_other_size(r: random.Random, tree: dict[str, Any]) -> str:
    frees = [e for e in _trace(tree) if e.get("action") in ("free_requested", "free_completed")]
    if not frees:
        return ""
    e = r.choice(frees)
    e["size"] = r.choice((e.get("size", 0) * 2 + 512, 512, 1 << 40))
    return "a free of another size than its alloc"


def free_without_alloc(r: random.Random, tree: dict[str, Any]) -> str:
    trace = _trace(tree)
    segs = _segments(tree)
    if not segs:
        return ""
    seg = r.choice(segs)
    trace.insert(r.randrange(len(trace) + 1), {
        "action": "free_completed", "addr": seg["address"], "size": seg["total_size"],
        "stream": 0, "time_us": 1, "frames": []})
    return "a free with no alloc"


def shuffle_trace(r: random.Random, tree: dict[str, Any]) -> str:
    trace = _trace(tree)
    if r.random() < 0.5:
        trace.reverse()
        return "trace reversed"
    r.shuffle(trace)
    return "trace shuffled"


def alloc_twice(r: random.Random, tree: dict[str, Any]) -> str:
    allocs = [i for i, e in enumerate(_trace(tree)) if e.get("action") == "alloc"]
    if not allocs:
        return ""
    trace = _trace(tree)
    i = r.choice(allocs)
    trace.insert(i + 1, dict(trace[i]))
    return "one address allocated twice"


EDITS = (overlap_segments, block_outside, block_overlap, active_twice, zero_active,
         free_other_size, free_without_alloc, shuffle_trace, alloc_twice)


def kineto_alloc_twice(r: random.Random) -> Case:
    """A profiler trace that allocates one address twice (and frees it once or never)."""
    events = []
    addr, t = 1 << 30, 0
    for k in range(r.choice((2, 3, 5))):
        t += 10
        events.append({"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]",
                       "pid": 1, "tid": 1, "ts": t,
                       "args": {"Device Type": 1, "Device Id": 0, "Addr": addr,
                                "Bytes": 1024, "Total Allocated": 1024 * (k + 1),
                                "Total Reserved": 2 << 20}})
    if r.random() < 0.5:
        events.append({"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]",
                       "pid": 1, "tid": 1, "ts": t + 10,
                       "args": {"Device Type": 1, "Device Id": 0, "Addr": addr,
                                "Bytes": -1024, "Total Allocated": 1024,
                                "Total Reserved": 2 << 20}})
    doc = {"schemaVersion": 1, "deviceProperties": [], "traceEvents": events}
    return Case("impossible", f"kineto: one address allocated {len(events)} times",
                {INPUT: json.dumps(doc).encode()}, ext=".json")


def impossible_case(r: random.Random, corpus: bool = True) -> Case:
    if r.random() < 0.1:
        case = kineto_alloc_twice(r)
    else:
        seed_bytes = seeds.pickle_seed_bytes(corpus)
        pick = r.randrange(len(seed_bytes))
        tree = safe_loads(seed_bytes[pick])
        if isinstance(tree, list):
            tree = {"segments": tree}
        tree = seeds.reduce_snapshot(tree, r.choice((16, 64, 256)), r)
        names = [n for n in (r.choice(EDITS)(r, tree) for _ in range(r.choice((1, 1, 2))))
                 if n]
        import pickle

        case = Case("impossible", f"seed{pick}: " + (", ".join(names) or "unchanged"),
                    {INPUT: pickle.dumps(tree, protocol=4)}, ext=".pickle")
    case.argv = list(r.choice(COMMANDS))
    return case
