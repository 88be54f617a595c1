"""`snapana whatif`: the recorded window re-run through the allocator model under a changed
setting or card (issue 45, first part): does the OOM go away, and what does the peak become.
A prediction is made only where the model reproduces the recorded window first."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from snapana.commands import _policy as policy
from snapana.commands._options import WHATIF_DEFAULT, DeviceOpt, FileArg, WhatifFormatOpt
from snapana.errors import InputError
from snapana.units import inert

if TYPE_CHECKING:
    from snapana.allocator_model.config import AllocConf
    from snapana.inputs import Inputs


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
    scale: Annotated[list[str] | None, typer.Option(
        "--scale", metavar="KNOB=RECORDED[:TARGET]",
        help="resize the job: batch=4:16 or seq=128:2048 (the capture's size, then the one "
             "to predict); both may be given; with --fit only the recorded size is needed. "
             "The parallel layout: tp=2:4, dp=8:64, pp=2:4, sp=0:1 (sequence parallelism "
             "off/on); KEY=N alone keeps N")
    ] = None,
    zero: Annotated[str | None, typer.Option(
        "--zero", metavar="RECORDED:TARGET",
        help="with --scale dp=N: the ZeRO stage (0-3, or FSDP's no_shard / shard_grad_op / "
             "full_shard); TARGET alone reads the recorded one from the capture's frames")
    ] = None,
    fit: Annotated[bool, typer.Option(
        "--fit", help="with --scale and a card: the largest batch (or seq) that fits, by "
                      "bisection on the replay, and the knob that would buy the next step")
    ] = False,
    calibrate: Annotated[Path | None, typer.Option(
        "--calibrate", metavar="OTHER.pickle",
        help="a capture of the same job at another size: each allocation's growth is "
             "measured against it (give its size with --calibrate-size)")] = None,
    calibrate_size: Annotated[str | None, typer.Option(
        "--calibrate-size", metavar="KNOB=SIZE",
        help="the --calibrate capture's size in the one knob it differs in, e.g. seq=512")
    ] = None,
    device: DeviceOpt = None,
    format: WhatifFormatOpt = WHATIF_DEFAULT,
) -> None:
    """Re-run the recorded window under a changed setting or card: does the OOM go away?
    With --scale: at another batch or sequence length, and the largest that fits (--fit)."""
    ins = policy.each(file, beside=[calibrate] if calibrate is not None else [])
    if scale or fit or zero is not None or calibrate is not None or calibrate_size is not None:
        if set_ or drop or free_before_forward or empty_cache_before_forward or smallest:
            raise InputError("--scale is replayed alone: leave out --set, --drop, "
                             "--free-before-forward, --empty-cache-before-forward and "
                             "--smallest")
        _scaled(ins, scale or [], capacity, fit, calibrate_size, device, format.value, zero)
        return
    from snapana.allocator_model import config as alloc_conf
    from snapana.render.whatif import whatif_view
    from snapana.session import Session, resolve_capacity

    asked, not_simulated, simulated = _settings(set_ or [])
    card = resolve_capacity(capacity) if capacity is not None else None
    families = tuple(dict.fromkeys(drop or ()))
    early = tuple(dict.fromkeys(free_before_forward or ()))
    if not simulated and card is None and not not_simulated and not families and not early \
            and not empty_cache_before_forward:
        raise InputError("nothing to change: give --set KEY:VALUE (e.g. "
                         "expandable_segments:True, max_split_size_mb:512), --capacity SIZE "
                         "--drop FAMILY or --free-before-forward FAMILY")
    capture = policy.open_shown(ins.items[0])
    same = alloc_conf.in_force(asked, capture.allocator_settings)
    if same and len(same) == len(simulated) and card is None and not not_simulated and \
            not families and not early and not empty_cache_before_forward:
        _say_already_in_force(same, file, format.value)
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
    change = _change(simulated, capacity, families, early, empty_cache_before_forward)
    policy.emit(policy.render_view(whatif_view(str(file), change, predictions,
                                               tuple(not_simulated)), format.value))


def _settings(set_: list[str]) -> tuple[AllocConf, list[str], list[str]]:
    """--set parsed: the settings asked for, what is not simulated (with why), and the
    pairs the model simulates, as typed."""
    from snapana.allocator_model import config as alloc_conf

    try:
        asked, not_simulated = alloc_conf.parse(set_)
    except alloc_conf.ConfError as exc:
        raise InputError(f"--set {exc}") from None
    simulated = [p for item in set_ for p in alloc_conf.split_pairs(item)
                 if p.replace("=", ":", 1).partition(":")[0].strip() in alloc_conf.SIMULATED]
    return asked, not_simulated, simulated


def _say_already_in_force(same: list[str], file: Path, fmt: str) -> None:
    """Every setting asked for is the one the capture was recorded with: nothing to
    predict, and the answer says so."""
    said = (f"{', '.join(same)}: already in force in {inert(str(file), lines=False)} "
            "(its allocator_settings record it): the window was recorded with it, so "
            "there is nothing to change or predict. Ask for another setting, --capacity, "
            "--drop or --free-before-forward.")
    policy.emit(json.dumps({"already_in_force": same, "message": said}, indent=2) + "\n"
                if fmt == "json" else said + "\n")


def _change(simulated: list[str], capacity: str | None, families: tuple[str, ...],
            early: tuple[str, ...], empty_cache_before_forward: bool) -> str:
    """What the what-if changes, in words (each part bounded)."""
    return ", ".join([*(p if len(p) <= 60 else p[:59] + "…" for p in simulated),
                      *([f"a card of {capacity}"] if capacity else []),
                      *(f"without {f[:60]}" for f in families),
                      *(f"{f[:60]} freed before each forward" for f in early),
                      *(["torch.cuda.empty_cache() before each forward"]
                        if empty_cache_before_forward else [])]) or "nothing simulated"


def _scaled(ins: Inputs, scale: list[str], capacity: str | None, fit: bool,
            calibrate_size: str | None, device: int | None, fmt: str,
            zero: str | None = None) -> None:
    """`--scale`: the window resized and replayed; `--fit`: the largest size that fits
    (calibrated on the capture read beside, `--calibrate`, when one is given); the parallel
    layout keys and `--zero`: each rank's share under another layout (`analysis.parallel`)."""
    from snapana.analysis.parallel import check_layout
    from snapana.analysis.scaling import ScaleError, parse_sizes
    from snapana.render.scale import scale_view
    from snapana.session import Session

    shown, calibrate = ins.items[0], next(iter(ins.beside), None)
    file = shown.path

    scale, layout_items = check_layout(scale, zero)
    try:
        sizes = parse_sizes(scale)
    except ScaleError as exc:
        raise InputError(f"--scale {exc}") from None
    try:
        other = parse_sizes([calibrate_size]) if calibrate_size is not None else {}
    except ScaleError as exc:
        raise InputError(f"--calibrate-size {exc}") from None
    if not sizes and not layout_items and zero is None:
        raise InputError("give the capture's size: --scale batch=RECORDED[:TARGET] or "
                         "--scale seq=RECORDED[:TARGET]")
    if fit and (len(sizes) > 1 or not sizes and not layout_items):
        raise InputError("--fit finds one knob: give one --scale (batch=N or seq=N)")
    if not fit and not layout_items and zero is None and \
            not any(s.target is not None for s in sizes.values()):
        raise InputError("nothing to predict: give a target (--scale seq=128:2048) or --fit")
    if (calibrate is None) != (not other):
        raise InputError("--calibrate OTHER.pickle and --calibrate-size KNOB=SIZE go together")
    if other and (len(other) != 1 or next(iter(other)) not in sizes):
        raise InputError("--calibrate-size names the one knob the other capture differs in, "
                         "and --scale must give that knob")
    capture = policy.open_shown(shown)
    devices = [device] if device is not None else capture.devices
    if not [d for d in devices if d in capture.devices]:
        raise InputError(f"{file}: no device {device} (devices: {capture.devices})")
    with_other = None
    if calibrate is not None:
        differs, size = next(iter(other.items()))
        with_other = (Session(policy.open_shown(calibrate), device), differs, size.recorded)
    knob = next(iter(sizes), None) if fit else None
    sessions = [Session(capture, d) for d in devices if d in capture.devices]
    layouts = [s.parallel_layout(layout_items, zero) for s in sessions]
    predictions = [s.resize(sizes, capacity, knob, with_other, lay)
                   for s, lay in zip(sessions, layouts, strict=True)]
    if fit and knob is None and any(p.capacity is None for p in predictions):
        raise InputError("--fit needs a card: give --capacity SIZE (no OOM is recorded to "
                         "imply one)")
    change = ", ".join([*(f"{k} {s.recorded:,}" + (f" → {s.target:,}" if s.target else "")
                          for k, s in sizes.items()),
                        *(layouts[0].said() if layouts and layouts[0] else []),
                        *([f"the largest {knob} that fits"] if knob else []),
                        *([f"a card of {capacity}"] if capacity else []),
                        *([f"calibrated on {calibrate.name}"] if calibrate else [])])
    policy.emit(policy.render_view(scale_view(str(file), change, predictions), fmt))
