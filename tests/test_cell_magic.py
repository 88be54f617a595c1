"""Issue 47, the notebook cell magic: `%load_ext snapana` then `%%snapana [--budget ...]`, run
in a real kernel (nbclient, as the notebooks are) with the recorder's CUDA backend replaced by
a CPU stand-in whose snapshot is a simulated training step. Budgets are set around that step's
ground truth (the scenario's own sidecar), not snapana's output."""

from __future__ import annotations

from pathlib import Path

import pytest

from .conftest import require
from .cuda_stand_in import STAND_IN as BACKEND

STAND_IN = BACKEND + "\nstand_in = cuda._backend = StandIn(True)\n"


@pytest.fixture()
def truth() -> dict:
    from snapana.synth.scenarios import run_scenario

    return dict(run_scenario("fsdp-train-step")[1])


def _run(tmp_path: Path, cells: list[str]) -> list:
    nbformat = require("nbformat")
    nbclient = require("nbclient")
    require("ipykernel")
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(c) for c in cells]
    client = nbclient.NotebookClient(nb, kernel_name="python3", timeout=300,
                                     allow_errors=True,
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    nbformat.write(nb, tmp_path / "magic.ipynb")
    return nb.cells


def _shown(cell) -> tuple[str, str]:
    """The (text/plain, text/html) the cell displayed through the magic."""
    data = [o["data"] for o in cell.outputs if o.output_type == "display_data"]
    assert len(data) == 1, cell.outputs
    return data[0]["text/plain"], data[0].get("text/html", "")


def test_cell_magic_records_and_judges_the_cell(tmp_path: Path, truth: dict) -> None:
    peak = truth["peak_allocated_bytes"]
    (tmp_path / "within.toml").write_text(f'peak_allocated = "{peak + 2**20}B"\nno_oom = true\n')
    (tmp_path / "over.toml").write_text(f'peak_allocated = "{peak - 2**20}B"\n')
    cells = _run(tmp_path, [
        STAND_IN + "\n%load_ext snapana",
        "%%snapana --budget within.toml\nx = 1 + 1",
        "%%snapana --budget over.toml\ny = 2",
        "%%snapana\nraise OutOfMemoryError('CUDA out of memory. Tried to allocate 2.00 GiB')",
        "%%snapana --budget missing.toml\nz = 3",
        "print(stand_in.calls, x, y)",
    ])
    setup, within, over, oom, bad, after = cells
    assert not [o for o in setup.outputs if o.output_type == "error"], setup.outputs

    text, page = _shown(within)
    assert text.startswith("within budget: ") and "snapshot: snapana-memory/cell-1" in text
    assert "snapana-explorer" in page and "<b>NO</b>" not in page
    text, page = _shown(over)
    assert text.startswith("OVER BUDGET: ")
    assert "over budget: peak_allocated" in text
    # the verdict comes before the explorer, in red
    assert page.index("OVER BUDGET") < page.index("snapana-explorer")
    assert "#d62728" in page.split("snapana-explorer")[0]
    text, page = _shown(oom)
    assert text.startswith("OUT OF MEMORY: ")
    assert [o.ename for o in oom.outputs if o.output_type == "error"] == ["OutOfMemoryError"]
    # a budget that cannot be read is one line, and nothing is recorded
    said = [o["text"] for o in bad.outputs if o.output_type == "stream"]
    assert len(said) == 1 and said[0].startswith("%%snapana: missing.toml") \
        and said[0].count("\n") == 1, said
    assert not [o for o in bad.outputs if o.output_type == "display_data"]
    # each recorded cell started and stopped history and took one snapshot; the cell ran
    out = "".join(o["text"] for o in after.outputs if o.output_type == "stream")
    assert out.strip() == str(["start", "snapshot", "stop"] * 3) + " 2 2"
    written = sorted(p.name for p in (tmp_path / "snapana-memory").iterdir())
    assert written == ["cell-1.pickle", "cell-2.pickle", "cell-3.pickle"]
    for cell in (within, over, oom):
        plain, _ = _shown(cell)
        assert len(plain.encode()) < 1024, plain


def test_without_cuda_the_cell_runs_and_says_so(tmp_path: Path) -> None:
    cells = _run(tmp_path, [STAND_IN.replace("StandIn(True)", "StandIn(False)")
                            + "\n%load_ext snapana", "%%snapana\nw = 41 + 1", "print(w)"])
    text, _ = _shown(cells[1])
    assert text == "%%snapana: CUDA is not available: the cell ran without recording"
    assert "".join(o["text"] for o in cells[2].outputs).strip() == "42"
    assert not (tmp_path / "snapana-memory").exists()


def test_without_torch_the_cell_runs_unrecorded_and_says_so(tmp_path: Path) -> None:
    """A kernel where PyTorch cannot be imported (None in sys.modules: `import torch` raises
    ModuleNotFoundError, as in a kernel without it): the cell's code runs, one line says why
    nothing was recorded, and no snapshot is written."""
    cells = _run(tmp_path, ["import sys\nsys.modules['torch'] = None\n%load_ext snapana",
                            "%%snapana\nw = 41 + 1", "print(w)"])
    assert not [o for o in cells[1].outputs if o.output_type == "error"], cells[1].outputs
    text, _ = _shown(cells[1])
    assert text == "%%snapana: PyTorch is not installed in this kernel: the cell ran without " \
        "recording"
    assert "".join(o["text"] for o in cells[2].outputs).strip() == "42"
    assert not (tmp_path / "snapana-memory").exists()


def test_the_cell_leads_with_the_verdicts_headline(tmp_path: Path) -> None:
    """The answer first in a notebook too: the cell's plain text is the headline the CLI's
    JSON gives for the same snapshot (the verdict in full is in the explorer's page)."""
    import json

    from .conftest import invoke

    cells = _run(tmp_path, [STAND_IN + "\n%load_ext snapana", "%%snapana\nx = 1"])
    text, _ = _shown(cells[1])
    (path,) = (tmp_path / "snapana-memory").iterdir()
    js = json.loads(invoke("summary", str(path), "-f", "json").stdout)
    assert text.splitlines()[0] == js["devices"][0]["diagnosis"]["headline"]
