"""`snapana explain`: why a block, a family or a site got its family."""

from __future__ import annotations

from typing import Annotated

import typer

from snapana.commands import _policy as policy
from snapana.commands._options import AtOpt, DeviceOpt, FileArg, RulesOpt
from snapana.errors import InputError


def explain(
    file: FileArg,
    block: Annotated[str | None, typer.Option("--block", metavar="ADDR",
                                              help="block address (0x...)")] = None,
    family: Annotated[str | None, typer.Option("--family", metavar="FAMILY",
                                               help="family id")] = None,
    site: Annotated[str | None, typer.Option("--site", metavar="TEXT",
                                             help="text in the site")] = None,
    device: DeviceOpt = None,
    rules: RulesOpt = None,
    at: AtOpt = None,
) -> None:
    """Why a block (or a family, or a site; none: the largest sites) got its family: rule,
    frames, near misses."""
    from snapana.render.views import explain_view
    from snapana.session import Session

    address = None
    if block is not None:
        from snapana.units import parse_address

        try:
            address = parse_address(block, "--block")
        except ValueError as exc:
            raise InputError(str(exc)) from None
    ins = policy.each(file)
    ruleset, _ = policy.check_rules(rules, None)
    session = Session(policy.open_shown(ins.items[0]), device, rules=ruleset, at=at)
    items = session.explain(block=address, family=family, site=site)
    policy.emit(policy.render_view(explain_view(items), "text"))
