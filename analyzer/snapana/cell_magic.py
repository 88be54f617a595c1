"""`%%snapana`, a notebook cell magic for GPU memory (issue 47), the habit memray's
`%%memray_flamegraph` set for host memory:

    %load_ext snapana
    %%snapana --budget budget.toml
    loss = model(batch).sum(); loss.backward()

The cell runs with PyTorch's memory history recorded (through the backend `snapana record`
and the pytest plugin use); afterwards its snapshot is written to `--dir` and the report's
explorer is shown inline. Over budget or on an OOM the verdict and the breached limits come
first, in red. Its plain-text form is a few lines: a notebook saves it beside the page.
Without PyTorch or CUDA the cell still runs, and one line says nothing was recorded.
"""

from __future__ import annotations

import argparse
import html
import itertools
import pickle
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from snapana.analysis.budget import Budget, Check, check, read_budget_file
from snapana.api import Analysis, Explorer, load
from snapana.errors import InputError
from snapana.io.output import write_atomic
from snapana.record.cuda import AROUND_ONE_STEP, backend, unavailable
from snapana.render.check import breach_line

MAGIC = "snapana"
DEFAULT_DIR = "snapana-memory"

_cells = itertools.count(1)


def load_ipython_extension(ipython: Any) -> None:
    """`%load_ext snapana`: register the cell magic."""
    ipython.register_magic_function(
        lambda line, cell: run_cell_magic(ipython, line, cell),
        magic_kind="cell", magic_name=MAGIC)


class _Parser(argparse.ArgumentParser):
    """argparse that raises on a usage error: its own way (usage on stderr, SystemExit(2))
    would stop at the magic as a traceback, where the cell's answer is one line."""

    def error(self, message: str) -> NoReturn:
        raise argparse.ArgumentError(None, message)


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="%%snapana", add_help=False, exit_on_error=False)
    p.add_argument("--budget", type=Path, default=None,
                   help="a budget file (as `snapana check --budget`)")
    p.add_argument("--dir", type=Path, default=Path(DEFAULT_DIR),
                   help="where the cell's snapshot is written")
    p.add_argument("--max-entries", type=int, default=AROUND_ONE_STEP)
    p.add_argument("--height", type=int, default=900, help="the explorer's height in px")
    return p


@dataclass(frozen=True)
class CellMemory:
    """What `%%snapana` shows for one cell: the verdict's headline, the budget lines, the
    explorer (whose page has the verdict in full)."""

    path: Path
    verdict: str
    oom: bool
    checks: tuple[Check, ...]
    explorer: Explorer | None = field(repr=False)

    @property
    def breaches(self) -> tuple[Check, ...]:
        return tuple(c for c in self.checks if not c.ok)

    @property
    def failed(self) -> bool:
        return self.oom or bool(self.breaches)

    def lines(self) -> list[str]:
        head = ("OVER BUDGET: " if self.breaches else "OUT OF MEMORY: " if self.oom
                else "within budget: " if self.checks else "")
        return ([head + self.verdict] + [breach_line(c) for c in self.breaches]
                + [f"snapshot: {self.path}"])

    def __repr__(self) -> str:
        return "\n".join(self.lines())

    def _repr_html_(self) -> str:
        colour = "#d62728" if self.failed else "#3182bd"
        lines = self.lines()
        head = "".join(f"<div>{html.escape(t)}</div>" for t in lines[:-1])
        rows = "".join(
            f"<tr><td>{html.escape(c.name)}</td><td>{html.escape(c.limit)}</td>"
            f"<td>{html.escape(c.actual)}</td><td>{'yes' if c.ok else '<b>NO</b>'}</td></tr>"
            for c in self.checks)
        table = ("<table><tr><th>budget</th><th>limit</th><th>measured</th><th>holds</th>"
                 f"</tr>{rows}</table>") if rows else ""
        page = self.explorer._repr_html_() if self.explorer is not None else ""
        return (f"<div class='snapana-cell'><div class='snapana-verdict' style='border-left:"
                f"4px solid {colour};padding-left:8px'>{head}</div>{table}"
                f"<div style='color:#666'>{html.escape(lines[-1])}</div>{page}</div>")


@dataclass(frozen=True)
class NotRecorded:
    """The cell ran, but there was no GPU memory to record."""

    reason: str

    def __repr__(self) -> str:
        return f"%%snapana: {self.reason}: the cell ran without recording"

    def _repr_html_(self) -> str:
        return f"<div class='snapana-cell'>{html.escape(repr(self))}</div>"


def run_cell_magic(ipython: Any, line: str, cell: str) -> None:
    """Run `cell` with memory history recorded, then display what it held."""
    from IPython.display import display

    try:
        args = _parser().parse_args(shlex.split(line))
        budget = read_budget_file(args.budget) if args.budget is not None else None
    except (argparse.ArgumentError, ValueError, InputError) as exc:
        print(f"%%snapana: {exc}")
        return
    cuda = backend()
    reason = unavailable(cuda, " in this kernel")
    if reason:
        ipython.run_cell(cell)
        display(NotRecorded(reason))
        return
    cuda.start_history(args.max_entries, "python")
    try:
        result = ipython.run_cell(cell)
        snapshot = cuda.snapshot()
    finally:
        cuda.stop_history()
    raised = result.error_in_exec
    oom = raised is not None and type(raised).__name__ == "OutOfMemoryError"
    path = args.dir / f"cell-{next(_cells)}.pickle"
    try:
        args.dir.mkdir(parents=True, exist_ok=True)
        write_atomic(path, pickle.dumps(snapshot, protocol=4))
        shown = _shown(load(path), path, budget, oom, args.height)
    except (InputError, OSError) as exc:
        print(f"%%snapana: {exc}")
        return
    display(shown)


def _shown(a: Analysis, path: Path, budget: Budget | None, oom: bool,
           height: int) -> CellMemory:
    reports = [s.report for s in a.session.devices()]
    checks = tuple(check(budget, a.device_report, reports)) if budget is not None else ()
    return CellMemory(path, a.headline, oom or a.device_report.oom is not None, checks,
                      a.explore(height))
