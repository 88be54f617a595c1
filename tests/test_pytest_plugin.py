"""Issue 47, the pytest plugin (`snapana.pytest_plugin`, a pytest11 entry point): collection,
options and outcome wiring, run by pytester with the recorder's CUDA backend replaced by a
CPU stand-in whose snapshot is a simulated training step; the budgets are set around that
step's ground truth (the scenario's own sidecar), not snapana's output."""

from __future__ import annotations

import pytest

from .conftest import require
from .cuda_stand_in import STAND_IN as BACKEND

STAND_IN = """
import pytest
""" + BACKEND + """


@pytest.fixture(autouse=True, scope="session")
def stand_in(request):
    cuda._backend = StandIn(request.config.getoption("--no-gpu") is False)


def pytest_addoption(parser):
    parser.addoption("--no-gpu", action="store_true")
"""


@pytest.fixture()
def truth() -> dict:
    from snapana.synth.scenarios import run_scenario

    return dict(run_scenario("fsdp-train-step")[1])


def _tests(peak: int, top: str, top_bytes: int) -> str:
    return f'''
import pytest
from conftest import OutOfMemoryError

@pytest.mark.cuda_memory(limit="{peak + 2**30}B")
def test_within():
    pass

@pytest.mark.cuda_memory(limit="{peak - 1}B")
def test_over_the_limit():
    pass

@pytest.mark.cuda_memory(families={{"{top}": "{top_bytes - 1}B"}})
def test_a_family_over():
    pass

@pytest.mark.cuda_memory(limit="1000 GiB")
def test_oom():
    raise OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

def test_unmarked():
    pass
'''


def _top(truth: dict) -> tuple[str, int]:
    held: dict[str, int] = {}
    for b in truth["blocks"]:
        if b["state"] == "active_allocated":
            held[b["family"]] = held.get(b["family"], 0) + b["size"]
    return max(held.items(), key=lambda kv: kv[1])


def test_marked_tests_pass_within_budget_and_fail_past_it(pytester, truth) -> None:
    pytester.makeconftest(STAND_IN)
    top, top_bytes = _top(truth)
    pytester.makepyfile(test_budget=_tests(truth["peak_allocated_bytes"], top, top_bytes))
    # -rN: no short summary, which under CI=true repeats each failure message in full
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-n", "0", "-rN",
                                           "--snapana-dir", "mem")
    result.assert_outcomes(passed=2, failed=3)
    text = result.stdout.str()
    assert "peak allocated" in text and f"family {top}" in text
    assert "the test ran out of GPU memory" in text
    assert text.count("snapshot and report: mem") == 3
    written = sorted(p.name for p in (pytester.path / "mem").iterdir())
    assert len([n for n in written if n.endswith(".pickle")]) == 4  # the marked tests
    assert len([n for n in written if n.endswith(".html")]) == 4


def test_without_cuda_marked_tests_are_skipped_or_required(pytester, truth) -> None:
    pytester.makeconftest(STAND_IN)
    top, top_bytes = _top(truth)
    pytester.makepyfile(test_budget=_tests(truth["peak_allocated_bytes"], top, top_bytes))
    skipped = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-n", "0", "--no-gpu", "-rs")
    skipped.assert_outcomes(passed=1, skipped=4)
    assert "CUDA is not available" in skipped.stdout.str()
    required = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-n", "0", "--no-gpu",
                                  "--snapana-require-cuda")
    required.assert_outcomes(passed=1, failed=4)


def test_the_marker_and_options_are_registered(pytester) -> None:
    result = pytester.runpytest_subprocess("--markers")
    assert "cuda_memory(limit=None, families=None)" in result.stdout.str()
    bad = pytester.makepyfile(test_bad='''
import pytest

@pytest.mark.cuda_memory(limit="2")
def test_unit_missing():
    pass
''')
    pytester.makeconftest(STAND_IN)
    result = pytester.runpytest_subprocess(str(bad), "-p", "no:cacheprovider", "-n", "0")
    assert "has no unit" in result.stdout.str() + result.stderr.str()


@pytest.mark.torch
def test_a_real_allocation_past_a_budget_on_a_gpu(pytester) -> None:
    """With the real recorder: a 64 MiB tensor against a 32 MiB limit fails the test on a
    machine with a GPU; without one (the CPU build here) the plugin skips it, saying why."""
    import subprocess
    import sys

    require("torch")
    probe = subprocess.run([sys.executable, "-c", "import torch; "
                            "print(torch.cuda.is_available())"], capture_output=True,
                           text=True, check=True)
    pytester.makepyfile(test_gpu='''
import pytest
import torch

@pytest.mark.cuda_memory(limit="32 MiB")
def test_big():
    x = torch.empty(64 * 2**20, dtype=torch.uint8, device="cuda")
    del x
''')
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-n", "0", "-rs")
    if probe.stdout.strip() == "True":
        result.assert_outcomes(failed=1)
        assert "peak allocated" in result.stdout.str()
    else:
        result.assert_outcomes(skipped=1)
        assert "CUDA is not available" in result.stdout.str()


def test_history_is_recorded_around_a_marked_test_only(pytester) -> None:
    """Each marked test starts history, takes its snapshot and stops it again, so an unmarked
    test after it runs without recording (the cell magic does the same per cell)."""
    pytester.makeconftest(STAND_IN)
    pytester.makepyfile(test_calls='''
import pytest
from snapana.record import cuda

@pytest.mark.cuda_memory(limit="1000 GiB")
def test_a():
    pass

@pytest.mark.cuda_memory(limit="1000 GiB")
def test_b():
    pass

def test_c_unmarked_runs_unrecorded():
    assert cuda._backend.calls == ["start", "snapshot", "stop"] * 2
''')
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-n", "0", "-rN",
                                           "--snapana-dir", "mem")
    result.assert_outcomes(passed=3)
