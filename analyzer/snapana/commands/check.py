"""`snapana check CAPTURE --budget budget.toml`: a capture against a memory budget, for CI
(issue 47). Exit 0 within budget, 1 over it (each breach one line: the figure, the budget,
where it comes from), 2 for bad input as everywhere. Besides the chosen format: a JUnit XML
file (`--junit`), GitHub workflow annotations (`--annotate github`), and the markdown
summary appended to $GITHUB_STEP_SUMMARY when a GitHub Actions step sets it."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from snapana.commands import _policy as policy
from snapana.commands._options import (
    CHECK_DEFAULT,
    Annotate,
    AnnotateOpt,
    AtOpt,
    CapacityOpt,
    CheckFormatOpt,
    DeviceOpt,
    FileArg,
)

#: Exit code of a capture over its budget (bad input stays 2, as everywhere).
OVER_BUDGET = 1
#: The moment measured, in words.
MOMENT_WORDS = {"oom": "the OOM", "peak": "the peak", "snapshot": "the snapshot",
                "event": "the event asked for"}


def check(
    file: FileArg,
    budget: Annotated[Path, typer.Option(
        "--budget", metavar="BUDGET.toml",
        help="the limits: no_oom, peak_allocated, peak_reserved, cached_share, "
             "[families], [chunks] (see the README's CI section)")],
    junit: Annotated[Path | None, typer.Option(
        "--junit", metavar="FILE.xml", help="also write a JUnit XML report there")] = None,
    annotate: AnnotateOpt = None,
    device: DeviceOpt = None,
    capacity: CapacityOpt = None,
    at: AtOpt = None,
    format: CheckFormatOpt = CHECK_DEFAULT,
) -> None:
    """Check a capture against a memory budget: exit 0 within it, 1 over it."""
    from snapana.analysis.budget import check as check_budget
    from snapana.analysis.budget import read_budget_file
    from snapana.io.output import write_atomic
    from snapana.render.check import CheckView, github_annotations, junit_xml

    ins = policy.each(file)
    rules, cap = policy.check_rules(None, capacity)
    limits = read_budget_file(budget)
    if junit is not None:
        policy.output_named(junit, [*ins.files, budget])
    sessions = policy.sessions_of(ins.items[0], device, rules, cap, at)
    reports = [s.report for s in sessions]
    shown = reports[0]
    when = MOMENT_WORDS.get(shown.moment.kind, shown.moment.kind)
    where = (f"{shown.device_name or f'cuda:{shown.device}'} at {when}" if shown.device >= 0
             else f"host memory at {when}")
    view = CheckView(file.name, budget.name, where,
                     tuple(check_budget(limits, shown, reports)))
    policy.emit(policy.render_view(view, format.value))
    if annotate is Annotate.github:
        for line in github_annotations(view):
            policy.emit(line + "\n")
    if junit is not None:
        write_atomic(junit, junit_xml(view))
        policy.wrote(junit)
    policy.step_summary(view)
    if view.breaches:
        raise typer.Exit(OVER_BUDGET)
