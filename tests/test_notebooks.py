"""The notebooks run top to bottom on a fresh kernel, and are stored without outputs (so diffs
stay reviewable and no sample data leaks into git through a cell's output)."""

from __future__ import annotations

from pathlib import Path

import pytest

from .conftest import ROOT, require

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
