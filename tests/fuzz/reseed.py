"""Real captures, unmutated (issue #27): each seed (samples, corpus snapshots, profiler
traces, memory timelines) as it is, a snapshot re-encoded in every pickle protocol (0-5),
optionally gzip'd, through the commands. A real capture refused is the worst failure there
is: the runner counts it as `real-refused`, a class that must stay at 0."""

from __future__ import annotations

import gzip
import pickle
import random
from pathlib import Path

from . import seeds
from .cases import INPUT, SUMMARY, Case
from .pickle_codec import safe_loads

COMMANDS = (SUMMARY, SUMMARY, ["summary", "{input}"], ["summary", "{input}", "--at", "end",
                                                       "-f", "json"],
            ["report", "{input}", "-o", "out.html"])


def reseed_case(r: random.Random, corpus: bool = True) -> Case:
    roll = r.random()
    if roll < 0.75:
        seed_bytes = seeds.pickle_seed_bytes(corpus)
        pick = r.randrange(len(seed_bytes))
        protocol = r.choice((None, 0, 1, 2, 3, 4, 5))
        data = seed_bytes[pick] if protocol is None else pickle.dumps(
            safe_loads(seed_bytes[pick]), protocol=protocol)
        name = f"pickle seed{pick} {'as is' if protocol is None else f'protocol {protocol}'}"
        ext = ".pickle"
    else:
        files = _json_files() if corpus else ()
        if not files:
            return reseed_case(random.Random(r.random()), corpus) if corpus else Case(
                "reseed", "kineto synthetic seed", {INPUT: seeds.kineto_seed_trees()[0]
                                                    .encode()}, ext=".json", real=True)
        path = files[r.randrange(len(files))]
        data = path.read_bytes()
        name = f"{path.parent.name}/{path.name[:50]} as is"
        ext = ".json"
    if r.random() < 0.3 and data[:2] != b"\x1f\x8b":
        data = gzip.compress(data, 6, mtime=0)
        name += " gz"
        ext += ".gz"
    return Case("reseed", name, {INPUT: data}, argv=list(r.choice(COMMANDS)), ext=ext,
                real=True)


def _json_files() -> tuple[Path, ...]:
    """The corpus's profiler traces and memory timelines (read in place, whole)."""
    return tuple(sorted(p for folder in ("kineto_traces", "memory_timeline")
                        for p in (seeds.CORPUS / folder).glob("*.json*") if p.is_file()))
