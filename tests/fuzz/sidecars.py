"""Cases for the sidecar `snapana record` writes beside a snapshot (`<name>.meta.json`): a
valid snapshot with a corrupt or hostile sidecar next to it, so every command that opens
the snapshot also reads (and must survive) the sidecar."""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from typing import Any

from . import seeds
from .cases import Case
from .mutators import (
    NUMBERS,
    byte_mutation,
    dump_json,
    json_value,
    mutate_json_tree,
    text_mutation,
)

SNAP = "run/snap-rank0.pickle"
SIDE = "run/snap-rank0.meta.json"
SIDECAR_FIELDS = {
    "top": ("format", "version", "reason", "device", "device_name", "device_total_bytes",
            "device_free_bytes", "rank", "local_rank", "world_size", "hostname", "pid", "step",
            "wall_time", "pytorch_cuda_alloc_conf", "versions", "argv", "frameworks",
            "inventory"),
    "inventory": ("complete", "stopped", "seconds", "tensors"),
    "tensor": ("ptr", "nbytes", "role", "name", "shape", "dtype"),
}
#: What the sidecar path can be instead of a file (setup steps of a Case).
NOT_A_FILE = (("fifo", SIDE), ("dir", SIDE), ("symlink", SIDE, "/dev/zero"),
              ("symlink", SIDE, "snap-rank0.meta.json"), ("symlink", SIDE, "missing.json"),
              ("symlink", SIDE, "snap-rank0.pickle"))


def _encoder(snapshot: bytes) -> Callable[[Any], dict[str, bytes]]:
    def enc(tree: Any) -> dict[str, bytes]:
        return {SNAP: snapshot, SIDE: dump_json(tree).encode("utf-8", "surrogatepass")}
    return enc


def _tensor_mutation(r: random.Random, meta: dict[str, Any]) -> str:
    """Aim at the inventory's tensor records: odd values, many tensors, overlaps."""
    inv = meta.get("inventory")
    tensors = inv.get("tensors") if isinstance(inv, dict) else None
    if not isinstance(tensors, list) or not tensors:
        return "noop"
    t = r.choice(tensors)
    how = r.random()
    if how < 0.15 and isinstance(t, dict):  # text that is not text: shown in every format
        t["name"] = r.choice(("w\udc80", "\x1b]0;x\x07", "a\u202eb", "\ud800" * 50,
                              "x\n\x9b2J"))
        return "tensor.name-not-text"
    if how < 0.6 and isinstance(t, dict):
        key = r.choice(SIDECAR_FIELDS["tensor"])
        t[key] = r.choice((*NUMBERS, 5, [], [-1], [2**70], {"a": 1}, "x", None, [1.5],
                           json_value(r)))
        return f"tensor.{key}"
    if how < 0.8:
        n = r.choice((1000, 100_000))
        tensors.extend([dict(t) if isinstance(t, dict) else t] * n)
        return f"tensors*{n}"
    if isinstance(t, dict) and isinstance(t.get("ptr"), int):
        t["ptr"] += r.choice((1, -1, 511, 1 << 20))
        t["nbytes"] = r.choice((0, 1, 1 << 40, 2**63 - 1))
        return "tensor.overlap"
    return "noop"


def sidecar_case(r: random.Random) -> Case | None:
    snapshot = seeds.small_snapshot()
    if snapshot is None:
        return None
    meta = seeds.sidecar_seed(snapshot)
    enc = _encoder(snapshot)
    names: list[str] = []
    setup: list[tuple[str, ...]] = []
    tree: Any = meta
    roll = r.random()
    if roll < 0.35:
        names += [mutate_json_tree(r, meta, SIDECAR_FIELDS) for _ in range(r.choice((1, 2)))]
    elif roll < 0.55:
        names.append(_tensor_mutation(r, meta))
    elif roll < 0.65:
        names.append(r.choice(("format", "version", "device")) + "-odd")
        meta[names[-1].split("-")[0]] = r.choice((None, "2", 2, 99, -1, 1.0, True, [1]))
    files = enc(meta)
    if roll >= 0.65 and roll < 0.82:
        text, how = text_mutation(r, files[SIDE].decode("utf-8", "surrogatepass"))
        files[SIDE] = text.encode("utf-8", "surrogatepass")
        names.append(how)
        tree = None
    elif roll >= 0.82 and roll < 0.92:
        files[SIDE], how = byte_mutation(r, files[SIDE])
        names.append(how)
        tree = None
    elif roll >= 0.92:
        step = r.choice(NOT_A_FILE)
        del files[SIDE]
        setup.append(step)
        names.append(f"sidecar is {step[0]} {step[-1]}")
        tree = None
    case = Case("sidecar", ",".join(names), files, argv=_command(r), input=SNAP,
                setup=setup, tree=tree, encode=enc if tree is not None else None)
    return case


def _command(r: random.Random) -> list[str]:
    roll = r.random()
    if roll < 0.6:
        return ["summary", "{input}", "-f", "json"]
    if roll < 0.7:
        return ["summary", "run", "-f", "json"]  # the folder: one snapshot in it
    if roll < 0.8:
        return ["report", "{input}", "-o", "out.html"]
    if roll < 0.87:
        return ["export", "{input}", "-o", "out-export"]
    if roll < 0.92:
        return ["explain", "{input}", "--family", "parameters"]
    if roll < 0.96:
        return ["report", "{input}", "-o", SIDE]  # the sidecar is an input: refused
    return ["diff", "{input}", "{input}", "-f", "json"]


def valid_sidecar(snapshot: bytes, rank: int) -> bytes:
    """The seed sidecar of `snapshot` as bytes (for multi-input cases)."""
    return json.dumps(seeds.sidecar_seed(snapshot, rank)).encode()
