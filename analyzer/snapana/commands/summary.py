"""`snapana summary`: the verdict and what holds memory, in any format of the registry."""

from __future__ import annotations

from typing import Annotated

import typer

from snapana.commands import _policy as policy
from snapana.commands._options import (
    SUMMARY_DEFAULT,
    AtOpt,
    CapacityOpt,
    DeviceOpt,
    FilesArg,
    LogOpt,
    RulesOpt,
    SummaryFormatOpt,
    WorkersOpt,
)


def summary(
    files: FilesArg,
    format: SummaryFormatOpt = SUMMARY_DEFAULT,
    device: DeviceOpt = None,
    rules: RulesOpt = None,
    capacity: CapacityOpt = None,
    at: AtOpt = None,
    workers: WorkersOpt = None,
    log: LogOpt = None,
    full: Annotated[bool, typer.Option(
        "--full", help="every section (the text of one capture otherwise fits one screen: "
        "the verdict, its evidence, the first knobs)")] = False,
) -> None:
    """Print the verdict and what holds memory: a table, markdown for a ticket, JSON, or the
    HTML page. With several inputs: the rank table, then the failing (else the largest)
    rank in full."""
    ins = policy.inputs(files, at, logs=log)
    logs, ins = policy.text_logs(ins, at)
    if logs is not None:  # a log or a paste: its OOM messages
        policy.emit(policy.render_view(logs, format.value, full=full))
        return
    from snapana.render.views import capture_view

    policy.prepare(format.value)
    shown = policy.shown(ins, device, rules, capacity, at, workers)
    view = capture_view(shown.reports, title=ins.title, ranks=shown.ranks,
                        log_checks=policy.log_checks(ins.logs, shown.reports))
    policy.emit(policy.render_view(view, format.value, full=full))
    policy.none_analysed(shown.ranks)
    policy.some_failed(shown.ranks)
