"""`snapana report`: the self-contained HTML report of one capture, or of many ranks."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from snapana import render as renderers
from snapana.commands import _policy as policy
from snapana.commands._options import (
    AtOpt,
    CapacityOpt,
    DeviceOpt,
    FilesArg,
    LogOpt,
    RulesOpt,
    WorkersOpt,
    integer,
)

if TYPE_CHECKING:
    from snapana.session import Session


def report(
    files: FilesArg,
    output: Annotated[Path | None, typer.Option(
        "-o", "--output", metavar="PATH", help="HTML file to write (or a folder to write it in)")
    ] = None,
    device: DeviceOpt = None,
    rules: RulesOpt = None,
    capacity: CapacityOpt = None,
    at: AtOpt = None,
    workers: WorkersOpt = None,
    rank: Annotated[int | None, typer.Option(
        "--rank", metavar="N", parser=integer("--rank", 0, 2**31 - 1),
        help="with several inputs: the rank shown in full (default: first OOM)")
    ] = None,
    trace: Annotated[list[Path] | None, typer.Option(
        "--trace", metavar="FILE",
        help="a torch.profiler trace or memory timeline of the same job")] = None,
    memray: Annotated[list[Path] | None, typer.Option(
        "--memray", metavar="FILE", help="a memray capture (host memory) of the same job")
    ] = None,
    log: LogOpt = None,
) -> None:
    """Write a self-contained HTML report (opens offline, attach it to the ticket)."""
    ins = policy.inputs(files, at, logs=log, trace=trace, memray=memray)
    logs, ins = policy.text_logs(ins, at)
    if logs is not None:  # a log or a paste: its OOM messages
        named = [Path(f) for f in files if f != "-"]
        default = Path((named[0].name.split(".")[0] if len(named) == 1 else "snapana-report")
                       + renderers.OUTPUTS[renderers.REPORT_FORMAT].extension)
        out = policy.output_file(output, default, ins.files)
        policy.write(out, policy.render_view(logs, renderers.REPORT_FORMAT, to_terminal=False))
        return
    from snapana.render.views import capture_view

    default = Path((ins.single.path.name.split(".")[0] if ins.single is not None and
                    ins.single.path is not None else "snapana-report")
                   + renderers.OUTPUTS[renderers.REPORT_FORMAT].extension)
    out = policy.output_file(output, default, ins.files)
    policy.prepare(renderers.REPORT_FORMAT)
    shown = policy.shown(ins, device, rules, capacity, at, workers, rank,
                         ahead=_explorer_ahead)
    view = capture_view(shown.reports, title=ins.title, ranks=shown.ranks,
                        log_checks=policy.log_checks(ins.logs, shown.reports))
    policy.write(out, policy.render_view(view, renderers.REPORT_FORMAT, to_terminal=False),
                 shown.ranks)
    policy.headline(view)
    policy.some_failed(shown.ranks, out)


def _explorer_ahead(session: Session) -> None:
    """The page's explorer columns that need no attribution, started while the session's
    report is made (`explorer.ahead`)."""
    from snapana.render.explorer import ahead

    replay = session.replay
    ahead(replay.lifetimes, replay.n_events, replay.reserved, session.capture.stacks)
