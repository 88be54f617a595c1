"""`snapana whatif`: the recorded window re-run through the allocator model under a changed
setting or card (issue 45, first part): does the OOM go away, and what does the peak become.
A prediction is made only where the model reproduces the recorded window first."""

from __future__ import annotations

from typing import Annotated

import typer

from snapana.commands import _policy as policy
from snapana.commands._options import DEFAULT_FORMAT, DeviceOpt, FileArg, FormatOpt
from snapana.errors import InputError

#: PYTORCH_CUDA_ALLOC_CONF keys the model has rules for, and those it has none for yet.
SIMULATED = ("expandable_segments",)
NOT_SIMULATED = ("max_split_size_mb", "garbage_collection_threshold",
                 "roundup_power2_divisions", "release_lock_on_cudamalloc",
                 "pinned_use_cuda_host_register")


def whatif(
    file: FileArg,
    set_: Annotated[list[str] | None, typer.Option(
        "--set", metavar="KEY=VALUE",
        help="an allocator setting, as PYTORCH_CUDA_ALLOC_CONF writes it "
             "(expandable_segments:True or expandable_segments=True); repeatable")] = None,
    capacity: Annotated[str | None, typer.Option(
        "--capacity", metavar="SIZE",
        help="the card to run on, e.g. 141GiB (default: the one the recorded OOM implies)")
    ] = None,
    device: DeviceOpt = None,
    format: FormatOpt = DEFAULT_FORMAT,
) -> None:
    """Re-run the recorded window under a changed setting or card: does the OOM go away?"""
    from snapana.render.whatif import whatif_view
    from snapana.session import Session, resolve_capacity

    expandable, not_simulated = _settings(set_ or [])
    card = resolve_capacity(capacity) if capacity is not None else None
    if expandable is None and card is None and not not_simulated:
        raise InputError("nothing to change: give --set expandable_segments:True (or False) "
                         "or --capacity SIZE")
    capture = policy.open_shown(file)
    devices = [device] if device is not None else capture.devices
    predictions = [Session(capture, d).whatif(expandable, card) for d in devices
                   if d in capture.devices]
    if not predictions:
        raise InputError(f"{file}: no device {device} (devices: {capture.devices})")
    change = ", ".join([*(f"expandable_segments:{expandable}" for _ in [0]
                          if expandable is not None),
                        *([f"a card of {capacity}"] if capacity else [])]) or "nothing simulated"
    policy.emit(policy.render_view(whatif_view(str(file), change, predictions,
                                               tuple(not_simulated)), format.value))


def _settings(pairs: list[str]) -> tuple[bool | None, list[str]]:
    """expandable_segments's asked value, and each asked setting the model has no rule for."""
    expandable: bool | None = None
    unknown: list[str] = []
    for pair in (p for item in pairs for p in item.split(",") if p.strip()):
        key, sep, value = pair.replace("=", ":", 1).partition(":")
        key, value = key.strip(), value.strip()
        if not sep or not value:
            raise InputError(f"--set {pair!r}: expected KEY:VALUE (e.g. "
                             "expandable_segments:True)")
        if key == "expandable_segments":
            if value.lower() not in ("true", "false", "1", "0"):
                raise InputError(f"--set {pair!r}: expandable_segments is True or False")
            expandable = value.lower() in ("true", "1")
        elif key in NOT_SIMULATED:
            unknown.append(f"{key}:{value} (the allocator model has no rule for it yet: "
                           "nothing is predicted for it)")
        else:
            raise InputError(f"--set {pair!r}: not a PYTORCH_CUDA_ALLOC_CONF setting "
                             f"(known: {', '.join(SIMULATED + NOT_SIMULATED)})")
    return expandable, unknown
