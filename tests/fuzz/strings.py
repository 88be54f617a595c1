"""Unicode and control characters in every string field (issue #27): frame file names and
function names, actions, states, segment types, annotations, allocator settings, user
metadata, sidecar tensor names, profiler event names. Terminal escape sequences (screen
clear, colours, OSC 52 clipboard writes, hyperlinks), C1 controls, unpaired surrogates
(legal in a pickle), bidi overrides, NUL, CR, rich markup and HTML. Every command must stay
clean (no internal error on a surrogate) and its text output inert: the runner fails any
case whose text output holds a raw control character."""

from __future__ import annotations

import json
import pickle
import random
from typing import Any

from . import seeds
from .cases import INPUT, SUMMARY, Case
from .pickle_codec import safe_loads

HOSTILE_TEXT = (
    "\x1b[2J\x1b[H", "\x1b]52;c;SGVsbG8gY2xpcGJvYXJk\x07", "\x1b[31;1mred\x1b[0m", "\x9b2J",
    "\x1b]8;;http://example.invalid\x1b\\link\x1b]8;;\x1b\\", "\ud800", "\udfff",
    "train\ud800.py", "\u202etxt.exe", "\x00", "a\rb", "line\nbreak", "\x7f", "\x85", "\u2028",
    "[bold red]markup[/]", "<script>alert(1)</script>", "`|*_#", "é漢字🔥", "e\u0301\u0301",
    "\x1bP+q\x1b\\", "\x07\x08\x0c",
)
COMMANDS = (SUMMARY, ["summary", "{input}"], ["summary", "{input}", "-f", "markdown"],
            ["summary", "{input}", "-f", "html"],
            ["explain", "{input}", "--family", "unknown"],
            ["explain", "{input}", "--site", "train"], ["report", "{input}", "-o", "out.html"],
            ["export", "{input}", "-o", "out-export"],
            ["diff", "{input}", "{input}"])


def hostile_text(r: random.Random, old: str = "") -> str:
    bad = r.choice(HOSTILE_TEXT)
    how = r.random()
    if how < 0.4 or not old:
        return bad
    if how < 0.7:
        return old + bad
    cut = r.randrange(len(old) + 1)
    return old[:cut] + bad + old[cut:]


def _strings(tree: Any, r: random.Random, share: float, seen: set[int]) -> int:
    """Replace a share of the strings (values and string keys of dicts) in the tree, walking
    each container once; returns how many changed."""
    changed = 0
    stack = [tree]
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, dict):
            for k in list(node):
                v = node[k]
                # actions and states mostly kept: a changed one makes most of a capture
                # unreadable, and the strings that reach the output are elsewhere
                keep = k in ("action", "state") and r.random() < 0.85
                if isinstance(v, str) and not keep and r.random() < share:
                    node[k] = hostile_text(r, v)
                    changed += 1
                elif isinstance(v, (dict, list)):
                    stack.append(v)
                if isinstance(k, str) and k not in ("action", "addr", "size", "frames",
                                                    "segments", "blocks", "device_traces",
                                                    "address", "total_size", "state",
                                                    "filename", "name", "line") \
                        and r.random() < share / 4:
                    node[hostile_text(r, k)] = node.pop(k)
                    changed += 1
        elif isinstance(node, list):
            for i, v in enumerate(node):
                if isinstance(v, str) and r.random() < share:
                    node[i] = hostile_text(r, v)
                    changed += 1
                elif isinstance(v, (dict, list)):
                    stack.append(v)
    return changed


def _pickle_case(r: random.Random, corpus: bool) -> Case:
    seed_bytes = seeds.pickle_seed_bytes(corpus)
    pick = r.randrange(len(seed_bytes))
    tree = safe_loads(seed_bytes[pick])
    tree = seeds.reduce_snapshot(tree, r.choice((8, 32, 128)), r)
    if isinstance(tree, dict):
        tree.setdefault("user_metadata", {"job": "train", "note": "x"})
        tree.setdefault("external_annotations", [])
        if isinstance(tree["external_annotations"], list):
            tree["external_annotations"].append({"device": 0, "time_us": 0, "stage": "START",
                                                 "name": hostile_text(r, "ProfilerStep#1")})
    share = r.choice((0.02, 0.2, 1.0))
    n = _strings(tree, r, share, set())
    files = {INPUT: pickle.dumps(tree, protocol=r.choice((2, 4, 5)))}
    name = f"seed{pick}: {n} strings hostile (share {share})"
    if r.random() < 0.2 and pick < len(seeds.pickle_seed_bytes(False)):  # a sample: sidecar
        sidecar = seeds.sidecar_seed(seed_bytes[pick])  # before its keys were changed
        for k in ("device_name", "hostname", "pytorch_cuda_alloc_conf"):
            sidecar[k] = hostile_text(r, sidecar[k])
        _strings(sidecar["inventory"]["tensors"], r, 0.5, set())
        files[INPUT + ".meta.json"] = json.dumps(sidecar).encode()
        name += " +sidecar"
    return Case("strings", name, files, ext=".pickle")


def _kineto_case(r: random.Random) -> Case:
    texts = seeds.kineto_seed_trees()
    pick = r.randrange(len(texts))
    tree = json.loads(texts[pick])
    n = _strings(tree, r, r.choice((0.05, 0.5)), set())
    return Case("strings", f"kineto seed{pick}: {n} strings hostile",
                {INPUT: json.dumps(tree).encode()}, ext=".json")


def strings_case(r: random.Random, corpus: bool = True) -> Case:
    case = _kineto_case(r) if r.random() < 0.2 else _pickle_case(r, corpus)
    case.argv = list(r.choice(COMMANDS))
    return case
