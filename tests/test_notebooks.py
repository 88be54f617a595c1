"""The notebooks run top to bottom on a fresh kernel, and are stored without outputs (so diffs
stay reviewable and no sample data leaks into git through a cell's output)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from .conftest import ROOT, invoke, require

NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
PARAMS = [pytest.param(p, id=p.name) for p in NOTEBOOKS]


def test_the_notebooks_are_there() -> None:
    assert {p.name for p in NOTEBOOKS} >= {"explore_oom.ipynb", "compare_fix.ipynb"}


@pytest.mark.parametrize("path", PARAMS)
def test_stored_without_outputs(path: Path) -> None:
    nbformat = require("nbformat")
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [], f"{path.name}: a cell has stored outputs"
            assert cell.execution_count is None, f"{path.name}: a cell has an execution count"


@pytest.mark.parametrize("path", PARAMS)
def test_runs_top_to_bottom(path: Path) -> None:
    nbformat = require("nbformat")
    nbclient = require("nbclient")
    require("ipykernel")
    nb = nbformat.read(path, as_version=4)
    # run where Jupyter would (the notebook's folder): the notebook finds the root itself
    client = nbclient.NotebookClient(nb, kernel_name="python3", timeout=600,
                                     resources={"metadata": {"path": str(path.parent)}})
    client.execute()  # raises CellExecutionError on the first failing cell
    for cell in nb.cells:
        if cell.cell_type == "code":
            errors = [o for o in cell.outputs if o.output_type == "error"]
            assert not errors, f"{path.name}: {errors[0].ename}: {errors[0].evalue}"


def _finding_cell(path: Path) -> str:
    """The notebook's first code cell: where it looks for the samples it reads."""
    nbformat = require("nbformat")
    nb = nbformat.read(path, as_version=4)
    return next(c.source for c in nb.cells if c.cell_type == "code")


@pytest.mark.parametrize("path", PARAMS)
def test_a_copy_outside_the_checkout_says_what_it_needs(path: Path, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A notebook copied elsewhere (a folder with no sample_snapshots/ above it) says which
    files it needs and how to give them (it raised a bare StopIteration); SNAPANA_SAMPLES
    pointing at a folder that holds them, written by the simulator, is enough."""
    cell = _finding_cell(path)
    away = tmp_path / "elsewhere"
    away.mkdir()
    (away / "pyproject.toml").write_text("[project]\nname = 'another'\n")  # not a checkout
    monkeypatch.chdir(away)
    monkeypatch.delenv("SNAPANA_SAMPLES", raising=False)
    with pytest.raises(FileNotFoundError) as told:
        exec(compile(cell, path.name, "exec"), {})
    said = str(told.value)
    needed = set(re.findall(r'SAMPLES / "([^"]+)"', path.read_text().replace('\\"', '"')))
    assert needed and all(name in said for name in needed), said
    assert "SNAPANA_SAMPLES" in said and "run it from the checkout" in said
    samples = tmp_path / "samples"
    for name in needed:  # the command the message gives writes each one
        command = re.search(rf"snapana synth \S+ -o DIR/{re.escape(name)}", said)
        assert command, said
        scenario = command.group(0).split()[2]
        assert invoke("synth", scenario, "-o", str(samples / name)).returncode == 0
    monkeypatch.setenv("SNAPANA_SAMPLES", str(samples))
    found: dict[str, object] = {}
    exec(compile(cell, path.name, "exec"), found)
    assert found["SAMPLES"] == samples
