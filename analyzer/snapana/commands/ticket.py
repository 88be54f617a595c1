"""`snapana ticket`: what to attach to an incident ticket, in one folder: a PNG card every
tracker shows inline, the markdown body (its first line is where the card is dropped), the
HTML report, zipped too (a tracker attaches a .zip, not an .html), and the JSON summary
(`io.ticket`); `--stdout` prints the body too, for `gh issue create --body-file -`."""

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
        help="folder to write card.png, ticket.md, report.html, report.html.zip and "
             "summary.json in (made when absent)")],
    stdout: Annotated[bool, typer.Option(
        "--stdout", help="also print ticket.md to standard output, for `gh issue create "
        "--body-file -` (what was written is said on stderr)")] = False,
    device: DeviceOpt = None,
    rules: RulesOpt = None,
    capacity: CapacityOpt = None,
    at: AtOpt = None,
) -> None:
    """Write a ticket's attachments: card.png, ticket.md, report.html (and .zip), summary.json."""
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
    if stdout:
        policy.emit(written[1].read_text(encoding="utf-8"))
