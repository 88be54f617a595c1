"""Cases for the multi-input path: a folder of ranks (valid snapshots, mutated ones, other
formats, corrupt sidecars, things that are not files) given as a folder, a list of files or
a glob to `summary`, `report` and `batch`, in-process and through the worker pool."""

from __future__ import annotations

import random

from . import seeds
from .cases import Case
from .mutators import byte_mutation, pickle_case
from .sidecars import valid_sidecar

RANKS = "ranks"
#: What a rank's path can be instead of a file (setup steps of a Case).
NOT_A_FILE = (("fifo",), ("dir",), ("symlink", "/dev/zero"), ("symlink", "rank0.pickle"),
              ("symlink", "missing.pickle"), ("loop",))


def _rank_file(r: random.Random, k: int) -> tuple[bytes, str]:
    """The bytes of rank k's snapshot and what they are."""
    roll = r.random()
    if roll < 0.5:
        return seeds.rank_snapshot(k % 4, r.random() < 0.5), "ok"
    if roll < 0.8:
        mutated = pickle_case(r, corpus=False)
        if mutated.size <= 64 << 10 and not mutated.setup:
            return next(iter(mutated.files.values())), "mutated"
        return seeds.rank_snapshot(k % 4, False)[: r.randrange(1, 1800)], "truncated"
    if roll < 0.9:
        data, how = byte_mutation(r, seeds.rank_snapshot(k % 4, True))
        return data, how
    return r.choice((b"", b"{}", b"[]", b'{"traceEvents": []}', b"\x80\x04N.")), "odd"


def ranks_case(r: random.Random) -> Case:
    n = r.choice((2, 2, 3, 4))
    files: dict[str, bytes] = {}
    setup: list[tuple[str, ...]] = []
    names = []
    for k in range(n):
        path = f"{RANKS}/rank{k}.pickle"
        data, what = _rank_file(r, k) if k else (seeds.rank_snapshot(0, True), "ok")
        files[path] = data
        names.append(f"{k}:{what}")
        if r.random() < 0.2:
            side = valid_sidecar(seeds.rank_snapshot(k % 4, False), r.choice((k, k, 0, 7)))
            if r.random() < 0.5:
                side, how = byte_mutation(r, side)
                names[-1] += f"+sidecar {how}"
            files[f"{RANKS}/rank{k}.meta.json"] = side
    if r.random() < 0.15:
        step = r.choice(NOT_A_FILE)
        path = f"{RANKS}/rank{n}.pickle"
        if step[0] == "loop":
            setup.append(("symlink", path, f"rank{n}.pickle"))
        elif step[0] == "symlink":
            setup.append(("symlink", path, step[1]))
        else:
            setup.append((step[0], path))
        names.append(f"{n}:{step[0]}")
    argv = _command(r, n)
    return Case("ranks", " ".join(names), files, argv=argv, input=RANKS, setup=setup)


def _command(r: random.Random, n: int) -> list[str]:
    jobs = ["-j", "2"] if r.random() < 0.08 else ["-j", "1"]  # the pool now and then
    roll = r.random()
    if roll < 0.4:
        return ["summary", "{input}", "-f", "json", *jobs]
    if roll < 0.5:
        return ["summary", *(f"{RANKS}/rank{k}.pickle" for k in range(n)), "-f", "json",
                *jobs]
    if roll < 0.58:
        return ["summary", f"{RANKS}/rank*.pickle", "-f", "json", *jobs]
    if roll < 0.75:
        rank = ["--rank", str(r.randrange(-1, n + 1))] if r.random() < 0.3 else []
        return ["report", "{input}", "-o", "out.html", *rank, *jobs]
    if roll < 0.85:
        return ["batch", "{input}", "-o", "dataset", *jobs]
    if roll < 0.9:
        return ["summary", "{input}", *jobs]
    if roll < 0.95:
        return ["report", "{input}", "-o", f"{RANKS}/rank0.pickle", *jobs]  # refused
    return ["batch", "{input}", "-o", RANKS, *jobs]  # refused: it holds the inputs
