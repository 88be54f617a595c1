"""The options and arguments the commands share, spelled once."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated, Any

import typer

from snapana import render as renderers
from snapana.errors import InputError

#: The output formats a user may choose in each command: those the renderer registry has for
#: the views the command shows (`snapana.render.formats`), as the Enum typer needs for a
#: choice.
SummaryFormat = Enum(  # type: ignore[misc]
    "SummaryFormat", {f: f for f in renderers.formats("capture", "ranks", "text_log")},
    type=str)
DiffFormat = Enum(  # type: ignore[misc]
    "DiffFormat", {f: f for f in renderers.formats("diff")}, type=str)
CheckFormat = Enum(  # type: ignore[misc]
    "CheckFormat", {f: f for f in renderers.formats("check")}, type=str)
WhatifFormat = Enum(  # type: ignore[misc]
    "WhatifFormat", {f: f for f in renderers.formats("whatif", "scale")}, type=str)
#: Each command's default: the registry's (`render.DEFAULT_FORMAT`).
SUMMARY_DEFAULT = SummaryFormat(renderers.DEFAULT_FORMAT)
DIFF_DEFAULT = DiffFormat(renderers.DEFAULT_FORMAT)
CHECK_DEFAULT = CheckFormat(renderers.DEFAULT_FORMAT)
WHATIF_DEFAULT = WhatifFormat(renderers.DEFAULT_FORMAT)


class Annotate(str, Enum):
    """Where CI annotations go (`--annotate github`: GitHub workflow ::error lines)."""

    github = "github"


AnnotateOpt = Annotated[
    Annotate | None,
    typer.Option("--annotate", help="also print each breach as a CI annotation "
                 "(github: ::error)"),
]


class Engine(str, Enum):
    local = "local"
    dask = "dask"
    ray = "ray"


RulesOpt = Annotated[
    list[Path] | None,
    typer.Option("--rules", metavar="RULES.toml",
                 help="extra rule pack (TOML); repeatable; wins over built-ins"),
]
CapacityOpt = Annotated[
    str | None,
    typer.Option("--capacity", metavar="SIZE",
                 help="device memory with its unit, e.g. 80GiB (2^30) or 80GB (10^9): "
                 "measures memory outside PyTorch"),
]
AtOpt = Annotated[
    str | None,
    typer.Option("--at", metavar="MOMENT",
                 help="moment to show: oom, peak, end, event:N or time:US "
                 "(default: the OOM, else the peak)"),
]
FileArg = Annotated[Path, typer.Argument(
    metavar="FILE",
    help="snapshot pickle, profiler trace, memory timeline or memray capture (optionally gzip)")]
def integer(option: str, lo: int, hi: int) -> Any:
    """The parser of an integer option: `units.parse_int` (ASCII digits, one sign, range),
    its refusal one line and exit 2 (click's own int takes other scripts' digits)."""
    from snapana.units import parse_int

    def parse(text: Any) -> int:
        if isinstance(text, int):  # a default
            return text
        try:
            return parse_int(text, option, lo, hi)
        except ValueError as exc:
            raise InputError(str(exc)) from None
    return parse


DeviceOpt = Annotated[int | None, typer.Option("--device", metavar="N",
                                               parser=integer("--device", 0, 4095),
                                               help="only this device")]
OutputOpt = Annotated[Path | None, typer.Option("-o", "--output", metavar="PATH")]
FilesArg = Annotated[list[str], typer.Argument(
    metavar="FILE",
    help="snapshot file(s), directories of snapshots, or globs (one report for all ranks); "
    "a job's log with its OOM messages, or - for a paste on standard input")]
WorkersOpt = Annotated[int | None, typer.Option("--workers", "-j", metavar="N",
                                                parser=integer("--workers", 1, 4096),
                                                help="worker processes (default: all cores)")]
EngineOpt = Annotated[Engine, typer.Option("--engine", help="where the per-file work runs")]
SummaryFormatOpt = Annotated[SummaryFormat, typer.Option("--format", "-f")]
DiffFormatOpt = Annotated[DiffFormat, typer.Option("--format", "-f")]
CheckFormatOpt = Annotated[CheckFormat, typer.Option("--format", "-f")]
WhatifFormatOpt = Annotated[WhatifFormat, typer.Option("--format", "-f")]

LogOpt = Annotated[
    list[Path] | None,
    typer.Option("--log", metavar="FILE",
                 help="a log of the same failure: its OOM message is checked against the "
                      "snapshot's figures (a log named among the inputs is taken the same "
                      "way); repeatable"),
]
