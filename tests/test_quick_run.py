"""The README's test command (`python -m pytest -q`) says why each skipped test was skipped:
a new user saw 61 skips and no reason (issue 71)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from .conftest import ROOT


def test_the_quick_run_names_each_skip_and_its_reason(tmp_path: Path) -> None:
    """The project's own pytest configuration (pyproject's addopts, as the README's command
    reads it) lists a skipped test with its reason in the run's summary, and still lists a
    failed one (a bare `-rs` would have hidden failures from the summary)."""
    (tmp_path / "test_one_skip.py").write_text(
        "import pytest\n\n\ndef test_needs_a_judge():\n"
        "    pytest.skip('judge chromium not installed')\n\n\n"
        "def test_fails():\n    assert 1 == 2\n")
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-c", str(ROOT / "pyproject.toml"),
         "--rootdir", str(tmp_path), "-n", "0", "-p", "no:cacheprovider",
         str(tmp_path / "test_one_skip.py")],
        capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert run.returncode == 1, run.stdout + run.stderr  # the one failure
    summary = run.stdout.split("short test summary info", 1)[-1]
    assert "SKIPPED [1]" in summary and "judge chromium not installed" in summary, run.stdout
    assert "FAILED" in summary and "test_fails" in summary, run.stdout
