"""`snapana synth`: a simulated snapshot with its ground truth, or a large one."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from snapana.commands import _policy as policy
from snapana.commands._options import OutputOpt, integer
from snapana.errors import InputError


def synth(
    scenario: Annotated[str | None, typer.Argument(
        metavar="[SCENARIO]", help="scenario name (see --list)")] = None,
    output: OutputOpt = None,
    list_: Annotated[bool, typer.Option("--list", help="list the scenarios")] = False,
    entries: Annotated[int | None, typer.Option(
        "--entries", metavar="N", parser=integer("--entries", 1, 10**9),
        help="instead of a scenario: a training run with N trace entries")] = None,
    seed: Annotated[int, typer.Option("--seed", metavar="N",
                                      parser=integer("--seed", 0, 2**63 - 1),
                                      help="with --entries")] = 0,
    batch: Annotated[int | None, typer.Option(
        "--batch", metavar="N", parser=integer("--batch", 1, 4096),
        help="with gpt-train-sized: the batch (default 2)")] = None,
    seq: Annotated[int | None, typer.Option(
        "--seq", metavar="N", parser=integer("--seq", 1, 65536),
        help="with gpt-train-sized: the sequence length (default 128)")] = None,
    list_per_entry: Annotated[bool, typer.Option(
        "--list-per-entry", help="with --entries: a new frame list per trace entry, as "
        "PyTorch writes (a file four times as large: what real captures hold)")] = False,
) -> None:
    """Write a simulated snapshot (and its ground-truth sidecar) for a seed incident, or a
    large one (--entries N) for benchmarks."""
    from snapana.synth.scenarios import MULTI_DEVICE, SCENARIOS, SIZED, write_sample

    if entries is not None:
        from snapana.synth.scale import write_scale_snapshot

        if not 1 <= entries <= 50_000_000:
            raise InputError(f"--entries {entries}: give 1 to 50000000")
        out = write_scale_snapshot(
            entries, policy.output_file(output, Path(f"scale-{entries}.pickle"), []), seed=seed,
            list_per_entry=list_per_entry)
        policy.wrote(out)
        return

    known = [*SCENARIOS, *MULTI_DEVICE, *SIZED]  # samples, multi-GPU captures, any size
    if list_ or scenario is None:
        for name in known:
            typer.echo(name + ("  (several devices)" if name in MULTI_DEVICE else
                               "  (any --batch and --seq)" if name in SIZED else ""))
        return
    if (batch is not None or seq is not None) and scenario not in SIZED:
        raise InputError(f"--batch and --seq go with {', '.join(SIZED)}")
    if scenario in SIZED:
        from snapana.synth.scenarios import write_snapshot

        b, s = batch or 2, seq or 128
        policy.wrote(*write_snapshot(*SIZED[scenario](b, s), policy.output_file(
            output, Path(f"{scenario}-b{b}-s{s}.pickle"), [])))
        return
    if scenario not in known:
        raise InputError(f"unknown scenario {scenario!r}; known: {', '.join(known)}")
    pickle_path, truth = write_sample(
        scenario, policy.output_file(output, Path(f"{scenario}.pickle"), []))
    policy.wrote(pickle_path, truth)
