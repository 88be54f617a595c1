"""Static tools see the package: mypy is clean on it (strictly on the public API), and a
user's three-line script gets real types, not Any."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import ROOT, require

pytestmark = pytest.mark.slow


def _mypy(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    require("mypy")
    return subprocess.run([sys.executable, "-m", "mypy", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=900)


def test_the_package_type_checks() -> None:
    run = _mypy(cwd=ROOT)  # files and flags from pyproject.toml
    assert run.returncode == 0, run.stdout[-4000:]
    assert run.stdout.startswith("Success")


def test_a_user_script_sees_real_types(tmp_path: Path) -> None:
    script = tmp_path / "incident.py"
    script.write_text(
        "import snapana\n"
        "a = snapana.load('oom.pickle')\n"
        "reveal_type(a.families)\n"
        "reveal_type(snapana.diff(a, a).families)\n"
        "reveal_type(a.at(moment='peak').allocated)\n"
    )
    # the package check's cache (polars, plotly already analysed) keeps this one quick
    run = _mypy("--strict", "--cache-dir", str(ROOT / ".mypy_cache"), str(script), cwd=tmp_path)
    revealed = [line for line in run.stdout.splitlines() if "Revealed type" in line]
    assert len(revealed) == 3, run.stdout
    assert "polars.dataframe.frame.DataFrame" in revealed[0]
    assert "polars.dataframe.frame.DataFrame" in revealed[1]
    assert revealed[2].endswith('"int"') or '"builtins.int"' in revealed[2]
    assert "error" not in run.stdout.replace("Revealed type", ""), run.stdout
