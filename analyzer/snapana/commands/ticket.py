"""`snapana ticket`: what to attach to an incident ticket, in one folder: a PNG card every
tracker shows inline, the markdown summary with the card embedded, the HTML report and the
JSON summary (`io.ticket`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from snapana.commands import _policy as policy
from snapana.commands._options import AtOpt, CapacityOpt, DeviceOpt, FileArg, RulesOpt
from snapana.errors import InputError


def ticket(
    file: FileArg,
    output: Annotated[Path, typer.Option(
        "-o", "--output", metavar="DIR",
        help="folder to write card.png, ticket.md, report.html and summary.json in (made "
             "when absent)")],
    device: DeviceOpt = None,
    rules: RulesOpt = None,
    capacity: CapacityOpt = None,
    at: AtOpt = None,
) -> None:
    """Write a ticket's attachments: card.png, ticket.md, report.html, summary.json."""
    from snapana.io.ticket import check_targets, write_ticket
    from snapana.render.views import capture_view

    ins = policy.inputs([str(file)], at, texts=False)
    if ins.single is None:
        raise InputError(f"{file}: a ticket is made of one capture; name one file")
    check_targets(output, ins.files)
    shown = policy.shown(ins, device, rules, capacity, at)
    view = capture_view(shown.reports, title=ins.title)
    written = write_ticket(view, output, ins.single.name)
    policy.wrote(*written)
    policy.headline(view)
