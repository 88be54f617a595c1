"""Issue 46, notebook manners: the README's "In Jupyter" snippet, run statement by statement
in a real kernel (nbclient) as a user pastes it, cell by cell: the text/plain of every object
snapana returns is under 1 KB (a notebook saves it beside the HTML, a terminal IPython
prints it: the explorer's was a 2 MB copy of its page), the polars tables included (their
plain form is a few rows, their HTML polars' own); and the saved notebook stays under the
size the README states."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from .conftest import ROOT, require

#: The most a notebook of the README's snippet may weigh, saved (the README says so).
SAVED_LIMIT_MB = 4
#: The most bytes an output's text/plain may take.
PLAIN_LIMIT = 1024


def _snippet() -> list[str]:
    """The README's Jupyter block, one cell per top-level statement."""
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## In Jupyter", 1)[1]
    (code,) = re.findall(r"```python\n(.*?)```", section, re.S)[:1]
    lines = code.splitlines()
    return ["\n".join(lines[node.lineno - 1:node.end_lineno])
            for node in ast.parse(code).body]


def test_readme_snippet_outputs_stay_short(tmp_path: Path) -> None:
    nbformat = require("nbformat")
    nbclient = require("nbclient")
    require("ipykernel")
    (tmp_path / "sample_snapshots").symlink_to(ROOT / "sample_snapshots")
    cells = _snippet()
    assert any("explore()" in c for c in cells) and len(cells) >= 10
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(c) for c in cells]
    nbclient.NotebookClient(nb, kernel_name="python3", timeout=600,
                            resources={"metadata": {"path": str(tmp_path)}}).execute()
    shown = 0
    for cell in nb.cells:
        for out in cell.outputs:
            assert out.output_type != "error", (cell.source, out.get("evalue"))
            plain = out.get("data", {}).get("text/plain", "")
            if out.output_type == "stream":
                plain = out.text
            assert len(plain.encode()) < PLAIN_LIMIT, (cell.source, len(plain), plain[:300])
            shown += out.output_type in ("execute_result", "display_data")
    assert shown >= 8  # the expressions did display something
    saved = tmp_path / "readme.ipynb"
    nbformat.write(nb, saved)
    size = saved.stat().st_size
    assert size < SAVED_LIMIT_MB * 2**20, f"saved notebook {size / 2**20:.1f} MiB"
    readme = (ROOT / "README.md").read_text()
    assert f"under {SAVED_LIMIT_MB} MB" in readme
