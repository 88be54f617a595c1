"""`snapana record`: run a job with memory recording injected into its Python processes."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated

import typer

from snapana.commands._options import integer
from snapana.errors import InputError

#: typer's settings for this command: everything after `--` is the job's own command line.
CONTEXT_SETTINGS = {"allow_extra_args": True, "ignore_unknown_options": True}


class Stacks(str, Enum):
    python = "python"
    all = "all"


def record(
    command: Annotated[list[str], typer.Argument(
        metavar="-- COMMAND", help="the job to run, after --: python train.py ..., torchrun ...")],
    output: Annotated[Path, typer.Option(
        "-o", "--output", metavar="DIR", help="folder for snapshots and sidecars")
    ] = Path("snapana-record"),
    max_entries: Annotated[int, typer.Option(
        "--max-entries", metavar="N", parser=integer("--max-entries", 1, 2**31 - 1),
        help="trace ring buffer size per process")] = 100_000,
    stacks: Annotated[Stacks, typer.Option(
        "--stacks", help="python frames, or all (with C++ frames: slower)")] = Stacks.python,
    dump_at_step: Annotated[int | None, typer.Option(
        "--dump-at-step", metavar="N", parser=integer("--dump-at-step", 1, 2**63 - 1),
        help="also dump after the N-th optimizer step")] = None,
    job: Annotated[str | None, typer.Option(
        "--job", metavar="NAME", help="file name prefix (default: the script's name)")] = None,
) -> None:
    """Run a job with memory recording injected into each of its Python processes: on OOM,
    at --dump-at-step and at exit each rank writes a snapshot and a sidecar (capacity, rank,
    versions, tensor inventory) into DIR. The job's output and exit code pass through."""
    from snapana.io.output import check_folder_target
    from snapana.process_settings import as_given
    from snapana.record.launch import job_environment, run

    if not command:
        raise InputError("record: give the job's command after --, e.g. "
                         "snapana record -o out -- python train.py")
    check_folder_target(output, replaced=False)
    # the job runs in the user's environment, not with this process's own settings
    env = job_environment(output, max_entries, stacks.value, dump_at_step, job,
                          base=as_given())
    try:
        code = run(command, env)
    except FileNotFoundError:
        raise InputError(f"record: no such command: {command[0]}") from None
    raise typer.Exit(code)
