"""The fuzzer in CI (issue #14): a fixed-seed slice of generated cases, the hand-made hostile
inputs and every saved regression case in tests/fuzz/corpus/ end refused cleanly (exit 2,
one line) or succeed with consistent figures; never a traceback, a crash, a hang, a memory
blow-up or a modified input. `python -m tests.fuzz --minutes N` runs the long campaign."""

from __future__ import annotations

import pytest

from .fuzz.campaign import corpus_cases, run_cases
from .fuzz.hostile import hostile_cases

SEED = 14
CASES = 150
#: What no input may ever cause.
HARD = ("traceback", "internal", "multiline", "crash", "hang", "memory", "real-refused")


def _failures(result, classes):
    return [f"{cls}: {f.case.fmt} {f.case.name[:70]!r}: {f.outcome.detail[:140]}"
            for (cls, _), f in sorted(result.findings.items()) if cls in classes]


@pytest.fixture(scope="module")
def slice_result():
    return run_cases(None, count=CASES, seed=SEED, jobs=2, corpus=False)


@pytest.fixture(scope="module")
def saved_result():
    return run_cases(corpus_cases() + hostile_cases(), jobs=2)


def test_deterministic_slice_never_fails_hard(slice_result):
    assert slice_result.cases == CASES
    assert not _failures(slice_result, HARD), "\n".join(_failures(slice_result, HARD))


def test_corpus_and_hostile_cases_never_fail_hard(saved_result):
    assert saved_result.cases > 50
    assert not _failures(saved_result, HARD), "\n".join(_failures(saved_result, HARD))


def test_inputs_are_never_modified(slice_result, saved_result):
    bad = _failures(slice_result, ("overwrite",)) + _failures(saved_result, ("overwrite",))
    assert not bad, "\n".join(bad)


def test_figures_are_consistent_on_every_success(slice_result, saved_result):
    bad = _failures(slice_result, ("invariant",)) + _failures(saved_result, ("invariant",))
    assert not bad, "\n".join(bad)
