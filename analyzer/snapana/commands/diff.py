"""`snapana diff`: two captures compared, family by family and site by site."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from snapana import render as renderers
from snapana.commands import _policy as policy
from snapana.commands._options import (
    DIFF_DEFAULT,
    Annotate,
    AnnotateOpt,
    CapacityOpt,
    DeviceOpt,
    DiffFormatOpt,
    RulesOpt,
)
from snapana.commands._policy import err
from snapana.errors import InputError


def diff(
    before: Annotated[Path, typer.Argument(
        metavar="BEFORE", help="the capture before the change (the OOM)")],
    after: Annotated[Path, typer.Argument(
        metavar="AFTER", help="the capture after the change (the fix)")],
    output: Annotated[Path | None, typer.Option(
        "-o", "--output", metavar="PATH",
        help="write to a file (HTML when it ends in .html) or into a folder (as .html)")
    ] = None,
    format: DiffFormatOpt = DIFF_DEFAULT,
    device: DeviceOpt = None,
    rules: RulesOpt = None,
    capacity: CapacityOpt = None,
    fail_on: Annotated[list[str] | None, typer.Option(
        "--fail-on", metavar="EXPR",
        help="exit 1 when the after capture grew past a limit: peak_allocated>+5%, "
             "reserved>+2GiB, family:kv_cache>+512MiB, new_family, oom; repeatable")] = None,
    junit: Annotated[Path | None, typer.Option(
        "--junit", metavar="FILE.xml",
        help="with --fail-on: also write each limit as a JUnit test case there")] = None,
    annotate: AnnotateOpt = None,
    annotate_github: Annotated[bool, typer.Option(
        "--annotate-github", hidden=True, help="the old spelling of --annotate github")
    ] = False,
) -> None:
    """Compare two captures, e.g. before and after a fix: the change per family and site,
    the peak, and whether the OOM is gone."""
    from snapana.render.views import diff_view

    ins = policy.each(before, after)
    out = None
    if output is not None:
        stem = f"{before.name.split('.')[0]}-vs-{after.name.split('.')[0]}"
        out = policy.output_file(output, Path(f"{stem}.html"), ins.files)
    from snapana.analysis.regression import evaluate, parse_gate
    from snapana.io.output import write_atomic
    from snapana.render.check import CheckView, github_annotations, junit_xml

    github = annotate is Annotate.github or annotate_github
    gates = [parse_gate(g) for g in fail_on or ()]
    if (junit is not None or github) and not gates:
        raise InputError("--junit and --annotate github report the --fail-on limits: give "
                         "at least one --fail-on EXPR")
    if junit is not None:
        policy.output_named(junit, ins.files)
    ruleset, cap = policy.check_rules(rules, capacity)
    compared = policy.compare(ins.items[0], ins.items[1], device, ruleset, cap)
    view = diff_view(compared)
    if out is None:
        policy.emit(policy.render_view(view, format.value))
    else:
        policy.write(out, policy.render_view(
            view, renderers.format_for_path(out, format.value), to_terminal=False))
    gated = CheckView(f"{before.name} → {after.name}", "--fail-on", "before → after",
                      tuple(evaluate(gates, compared))) if gates else None
    policy.step_summary(view, *([gated] if gated is not None else []))
    if gated is not None:
        for line in gated.breach_lines():
            err.print(line, markup=False, highlight=False, soft_wrap=True)
        if github:
            for line in github_annotations(gated):
                policy.emit(line + "\n")
        if junit is not None:
            write_atomic(junit, junit_xml(gated))
            policy.wrote(junit)
        if gated.breaches:
            raise typer.Exit(1)
