"""`snapana diff`: two captures compared, family by family and site by site."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from snapana import render as renderers
from snapana.commands import _policy as policy
from snapana.commands._options import (
    DEFAULT_FORMAT,
    CapacityOpt,
    DeviceOpt,
    FormatOpt,
    RulesOpt,
)


def diff(
    before: Annotated[Path, typer.Argument(
        metavar="BEFORE", help="the capture before the change (the OOM)")],
    after: Annotated[Path, typer.Argument(
        metavar="AFTER", help="the capture after the change (the fix)")],
    output: Annotated[Path | None, typer.Option(
        "-o", "--output", metavar="PATH",
        help="write to a file (HTML when it ends in .html) or into a folder (as .html)")
    ] = None,
    format: FormatOpt = DEFAULT_FORMAT,
    device: DeviceOpt = None,
    rules: RulesOpt = None,
    capacity: CapacityOpt = None,
) -> None:
    """Compare two captures, e.g. before and after a fix: the change per family and site,
    the peak, and whether the OOM is gone."""
    import snapana
    from snapana.render.views import diff_view

    out = None
    if output is not None:
        stem = f"{before.name.split('.')[0]}-vs-{after.name.split('.')[0]}"
        out = policy.output_file(output, Path(f"{stem}.html"),
                                 policy.with_sidecars([before, after]).files)
    ruleset, cap = policy.check_rules(rules, capacity)
    view = diff_view(snapana.diff(before, after, device=device, rules=ruleset,
                                  capacity=cap).diff)
    if out is None:
        policy.emit(policy.render_view(view, format.value))
        return
    policy.write(out, policy.render_view(view, renderers.format_for_path(out, format.value),
                                         to_terminal=False))
