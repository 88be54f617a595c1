"""Amplification (issue #27): inputs whose decoded size or later work is far beyond their
bytes. By the memo: one block dict, trace entry or frame list referenced thousands to
millions of times (a 10 KB pickle with 5,000 blocks, a few MB with millions of entries). By
repeated keys: many distinct blocks, entries, segments or profiler events at one address,
the key every later join and group uses. Each must be analysed or refused within the
case's time and memory budget."""

from __future__ import annotations

import json
import pickle
import random
from typing import Any

from .cases import INPUT, SUMMARY, Case

MIB = 1 << 20
BASE = 1 << 30
FRAMES = [{"filename": "/app/train.py", "line": 10, "name": "step"},
          {"filename": "/app/model.py", "line": 42, "name": "forward"}]
#: Commands the amplified inputs run through (each stage after decoding costs per row).
COMMANDS = (SUMMARY, SUMMARY, ["summary", "{input}"], ["report", "{input}", "-o", "out.html"],
            ["export", "{input}", "-o", "out-export"],
            ["explain", "{input}", "--family", "unknown"])


def _segment(size: int, blocks: list[Any], address: int = BASE) -> dict[str, Any]:
    return {"device": 0, "address": address, "total_size": size, "stream": 0,
            "segment_type": "large", "segment_pool_id": (0, 0), "is_expandable": False,
            "blocks": blocks}


def _snapshot(segments: list[Any], trace: list[Any]) -> dict[str, Any]:
    return {"segments": segments, "device_traces": [trace],
            "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": ""}}


def _entry(action: str, addr: int, size: int, t: int) -> dict[str, Any]:
    return {"action": action, "addr": addr, "size": size, "stream": 0, "time_us": t,
            "frames": FRAMES}


def memo_blocks(r: random.Random) -> tuple[str, Any]:
    n = r.choice((5_000, 50_000, 200_000))
    size = r.choice((0, 0, 512, 2 * MIB))
    block = {"address": BASE, "size": size, "requested_size": size,
             "state": r.choice(("active_allocated", "inactive", "active_pending_free")),
             "frames": FRAMES}
    return f"one block dict x{n} (size {size})", _snapshot(
        [_segment(max(2 * MIB, size), [block] * n)], [])


def memo_trace(r: random.Random) -> tuple[str, Any]:
    n = r.choice((100_000, 500_000, 2_000_000, 4_000_000))
    k = r.choice((1, 2, 4))
    size = r.choice((512, 4096, 2 * MIB))
    shape = [_entry("alloc", BASE, size, 5), _entry("free_completed", BASE, size, 6),
             _entry("free_requested", BASE, size, 6), _entry("oom", 0, 1 << 40, 7)][:k]
    block = {"address": BASE, "size": 2 * MIB, "state": "inactive", "frames": []}
    return f"{k} trace entry dicts x{n}", _snapshot([_segment(2 * MIB, [block])],
                                                    shape * (n // k))


def memo_frames(r: random.Random) -> tuple[str, Any]:
    n = r.choice((10_000, 100_000, 1_000_000))
    frames = [FRAMES[0]] * n  # one stack of n identical frames
    entries = [dict(_entry("alloc", BASE + i * 512, 512, i), frames=frames)
               for i in range(r.choice((1, 100, 2000)))]
    block = {"address": BASE, "size": 2 * MIB, "state": "inactive", "frames": frames}
    return f"one frame dict x{n} in one stack", _snapshot([_segment(2 * MIB, [block])],
                                                          entries)


def memo_long_name(r: random.Random) -> tuple[str, Any]:
    """One long function name stored once (the memo) and shared by many distinct stacks:
    every site and stack shown would repeat it (issue 43)."""
    name = "f" * r.choice((2_000, 4_000, 8_000))
    n = r.choice((2_000, 8_000, 20_000))
    blocks = [{"address": BASE + 512 * i, "size": 512, "requested_size": 500,
               "state": "active_allocated",
               "frames": [{"filename": "/app/a.py", "name": name, "line": i}]}
              for i in range(n)]
    trace = [dict(_entry("alloc", b["address"], 500, i), frames=b["frames"])
             for i, b in enumerate(blocks)]
    return f"a {len(name)}-char name in {n} stacks", _snapshot(
        [_segment(max(2 * MIB, 512 * n), blocks)], trace)


def repeated_blocks(r: random.Random) -> tuple[str, Any]:
    n = r.choice((1_500, 5_000, 20_000))
    size = r.choice((0, 512))
    blocks = [{"address": BASE, "size": size, "requested_size": size,
               "state": "active_allocated", "frames": FRAMES} for _ in range(n)]
    return f"{n} distinct blocks at one address (size {size})", _snapshot(
        [_segment(2 * MIB, blocks)], [])


def repeated_trace(r: random.Random) -> tuple[str, Any]:
    n = r.choice((2_000, 20_000, 100_000))
    action = r.choice(("alloc", "alloc", "free_requested", "segment_alloc"))
    entries = [_entry(action, BASE, 512, i) for i in range(n)]
    block = {"address": BASE, "size": 2 * MIB, "state": "inactive", "frames": []}
    return f"{n} distinct {action} entries at one address", _snapshot(
        [_segment(2 * MIB, [block])], entries)


def repeated_segments(r: random.Random) -> tuple[str, Any]:
    n = r.choice((1_000, 10_000))
    segs = [_segment(2 * MIB, [{"address": BASE, "size": 2 * MIB, "state": "inactive",
                                "frames": []}]) for _ in range(n)]
    return f"{n} segments at one address", _snapshot(segs, [])


def repeated_annotations(r: random.Random) -> tuple[str, Any]:
    n = r.choice((10_000, 100_000))
    snap = _snapshot([_segment(2 * MIB, [{"address": BASE, "size": 2 * MIB,
                                          "state": "inactive", "frames": []}])],
                     [_entry("alloc", BASE, 512, 5)])
    ann = {"device": 0, "time_us": 5, "stage": "START", "name": "ProfilerStep#1"}
    snap["external_annotations"] = [ann] * n if r.random() < 0.5 else [dict(ann)
                                                                       for _ in range(n)]
    return f"{n} annotations at one time", snap


def kineto_repeated(r: random.Random) -> tuple[str, bytes]:
    """A profiler trace whose memory events all name one address."""
    n = r.choice((5_000, 50_000))
    events = [{"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]",
               "pid": 1, "tid": 1, "ts": i,
               "args": {"Device Type": 1, "Device Id": 0, "Addr": BASE,
                        "Bytes": 512 if r.random() < 0.8 else -512,
                        "Total Allocated": 512, "Total Reserved": 2 * MIB}}
              for i in range(n)]
    doc = {"schemaVersion": 1, "deviceProperties": [], "traceEvents": events}
    return f"kineto: {n} memory events at one address", json.dumps(doc).encode()


SHAPES = (memo_blocks, memo_trace, memo_trace, memo_frames, memo_long_name, repeated_blocks,
          repeated_trace, repeated_segments, repeated_annotations)


def amplify_case(r: random.Random) -> Case:
    if r.random() < 0.12:
        name, data = kineto_repeated(r)
        case = Case("amplify", name, {INPUT: data}, ext=".json")
    else:
        name, tree = r.choice(SHAPES)(r)
        protocol = r.choice((2, 4, 5))
        case = Case("amplify", f"{name} p{protocol}",
                    {INPUT: pickle.dumps(tree, protocol=protocol)}, ext=".pickle")
    case.argv = list(r.choice(COMMANDS))
    return case
