"""`snapana whatif`: the recorded window re-run through the allocator model under a changed
setting or card (issue 45, first part): does the OOM go away, and what does the peak become.
A prediction is made only where the model reproduces the recorded window first."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from snapana.commands import _policy as policy
from snapana.commands._options import DEFAULT_FORMAT, DeviceOpt, FileArg, FormatOpt
from snapana.errors import InputError
from snapana.units import inert


def whatif(
    file: FileArg,
    set_: Annotated[list[str] | None, typer.Option(
        "--set", metavar="KEY=VALUE",
        help="an allocator setting, as PYTORCH_CUDA_ALLOC_CONF writes it: "
             "expandable_segments:True, max_split_size_mb:512, "
             "roundup_power2_divisions:4 or [256:1,>:4]; repeatable")] = None,
    capacity: Annotated[str | None, typer.Option(
        "--capacity", metavar="SIZE",
        help="the card to run on, e.g. 141GiB (default: the one the recorded OOM implies)")
    ] = None,
    drop: Annotated[list[str] | None, typer.Option(
        "--drop", metavar="FAMILY",
        help="leave a family's allocations in the window out, with their frees (e.g. "
             "saved_activations); repeatable")] = None,
    free_before_forward: Annotated[list[str] | None, typer.Option(
        "--free-before-forward", metavar="FAMILY",
        help="free a family's live blocks where each forward phase starts (e.g. gradients: "
             "optimizer.zero_grad(set_to_none=True) before the forward); repeatable")] = None,
    empty_cache_before_forward: Annotated[bool, typer.Option(
        "--empty-cache-before-forward",
        help="torch.cuda.empty_cache() where each forward phase starts")] = False,
    smallest: Annotated[bool | None, typer.Option(
        "--smallest/--no-smallest",
        help="seek the least memory the window fits in under the change (a dozen replays; "
             "by default only for traces of up to 50,000 events)")] = None,
    device: DeviceOpt = None,
    format: FormatOpt = DEFAULT_FORMAT,
) -> None:
    """Re-run the recorded window under a changed setting or card: does the OOM go away?"""
    from snapana.allocator_model import config as alloc_conf
    from snapana.render.whatif import whatif_view
    from snapana.session import Session, resolve_capacity

    try:
        asked, not_simulated = alloc_conf.parse(set_ or [])
    except alloc_conf.ConfError as exc:
        raise InputError(f"--set {exc}") from None
    simulated = [p for item in set_ or [] for p in alloc_conf.split_pairs(item)
                 if p.replace("=", ":", 1).partition(":")[0].strip() in alloc_conf.SIMULATED]
    card = resolve_capacity(capacity) if capacity is not None else None
    families = tuple(dict.fromkeys(drop or ()))
    early = tuple(dict.fromkeys(free_before_forward or ()))
    if not simulated and card is None and not not_simulated and not families and not early \
            and not empty_cache_before_forward:
        raise InputError("nothing to change: give --set KEY:VALUE (e.g. "
                         "expandable_segments:True, max_split_size_mb:512), --capacity SIZE "
                         "--drop FAMILY or --free-before-forward FAMILY")
    capture = policy.open_shown(file)
    same = alloc_conf.in_force(asked, capture.allocator_settings)
    if same and len(same) == len(simulated) and card is None and not not_simulated and \
            not families and not early and not empty_cache_before_forward:
        said = (f"{', '.join(same)}: already in force in {inert(str(file), lines=False)} "
                "(its allocator_settings record it): the window was recorded with it, so "
                "there is nothing to change or predict. Ask for another setting, --capacity, "
                "--drop or --free-before-forward.")
        policy.emit(json.dumps({"already_in_force": same, "message": said}, indent=2) + "\n"
                    if format.value == "json" else said + "\n")
        return
    not_simulated += [f"{s}: already in force (the capture records it), not changed"
                      for s in same]
    devices = [device] if device is not None else capture.devices
    predictions = [Session(capture, d).whatif(
        *simulated, capacity=card, smallest=smallest, drop=families, free_before_forward=early,
        empty_cache_before_forward=empty_cache_before_forward)
                   for d in devices if d in capture.devices]
    if not predictions:
        raise InputError(f"{file}: no device {device} (devices: {capture.devices})")
    change = ", ".join([*(p if len(p) <= 60 else p[:59] + "…" for p in simulated),
                        *([f"a card of {capacity}"] if capacity else []),
                        *(f"without {f[:60]}" for f in families),
                        *(f"{f[:60]} freed before each forward" for f in early),
                        *(["torch.cuda.empty_cache() before each forward"]
                          if empty_cache_before_forward else [])]) or "nothing simulated"
    policy.emit(policy.render_view(whatif_view(str(file), change, predictions,
                                               tuple(not_simulated)), format.value))
