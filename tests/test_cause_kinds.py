"""The cause kinds (issue 68): each registered once, each with its words on every path that
builds it, one class for a cause whether a snapshot or a log shows it."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest
from snapana.analysis.attribution.families import cause_ids
from snapana.analysis.diagnosis.causes import (
    HEADLINE_ORDER,
    KINDS,
    LOG_KINDS,
    VERDICT_ORDER,
    Cause,
    Demand,
    kind,
)
from snapana.analysis.text_diagnosis import diagnose
from snapana.session import analyse
from snapana.sources import load
from snapana.sources.oom_text import read_messages

from .conftest import SAMPLES

#: The words each diagnosis reaches a cause's kind for.
WORDS = {"snapshot": ("reason", "verdict", "short"), "log": ("says",)}


def wordless(kinds: list[type[Cause]]) -> list[str]:
    """Each kind and path whose words are the base's (which raise, never print an id)."""
    return [f"{k.vocab_id}.{name}" for k in kinds for path in k.paths
            for name in WORDS[path] if getattr(k, name) is getattr(Cause, name)]


def test_every_kind_has_words_on_every_path_that_builds_it() -> None:
    assert wordless(list(KINDS.values())) == []


def test_a_kind_without_words_is_found() -> None:
    @dataclass(frozen=True)
    class Mute(Cause):
        pass

    # registered by hand (not through `kind`, which would add it to the registry)
    Mute.vocab_id, Mute.paths = "mute", ("snapshot", "log")
    assert wordless([Mute]) == ["mute.reason", "mute.verdict", "mute.short", "mute.says"]
    with pytest.raises(NotImplementedError):
        Mute().says(None)  # type: ignore[arg-type]


def test_a_kind_is_registered_once() -> None:
    with pytest.raises(ValueError, match="registered twice"):
        kind("fragmentation", "again", "context", ())(type("Again", (Cause,), {}))


def test_the_vocabulary_names_kinds_and_each_kind_is_said() -> None:
    """Every [[cause]] id of the vocabulary (a knob's `causes` name them) is a kind (the
    vocabulary listed large_cache, which the old CauseId did not); every kind a snapshot
    builds is in both orders its words are said in."""
    snapshot = {k.vocab_id for k in KINDS.values() if "snapshot" in k.paths}
    assert set(cause_ids()) <= set(KINDS)
    for order in (VERDICT_ORDER, HEADLINE_ORDER):
        assert {k.vocab_id for k in order} == snapshot


def test_a_logs_demand_and_a_snapshots_demand_are_one_class() -> None:
    text = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has "
            "a total capacity of 79.15 GiB of which 1.00 GiB is free. Including non-PyTorch "
            "memory, this process has 78.14 GiB memory in use. Of the allocated memory 77.00 "
            "GiB is allocated by PyTorch, and 100.00 MiB is reserved by PyTorch but "
            "unallocated.")
    log = diagnose(read_messages(text)[0])
    # request 2 GiB, free 1 GiB: the live tensors (77 GiB) alone cover the 1 GiB shortfall,
    # the 100 MiB cache cannot serve the request, no other process is on the card
    assert type(log.lead) is Demand and log.lead.id == LOG_KINDS["demand"].log_id == "demand"
    name = "slime-tp2-chunked-logprob-oom"
    truth = json.loads((SAMPLES / f"{name}.truth.json").read_text())
    (r,) = analyse(load(SAMPLES / f"{name}.pickle"), capacity=truth["capacity_bytes"])
    snap = r.diagnosis.cause(Demand)
    assert type(snap) is Demand and snap.id == "real_demand" and snap.holds


def test_every_framework_finding_has_words() -> None:
    """Each finding id a framework's judge builds (`Finding("id", ...)` in
    framework_memory.py) has its words in the text-log view: none prints as a raw id."""
    import ast

    from snapana.analysis import framework_memory
    from snapana.render.text_log import FRAMEWORK_WORDS

    tree = ast.parse(Path(framework_memory.__file__).read_text())
    built = {c.args[0].value for c in ast.walk(tree) if isinstance(c, ast.Call)
             and isinstance(c.func, ast.Name) and c.func.id == "Finding"
             and c.args and isinstance(c.args[0], ast.Constant)}
    assert len(built) > 10  # the scan finds them
    assert built - set(FRAMEWORK_WORDS) == set()
