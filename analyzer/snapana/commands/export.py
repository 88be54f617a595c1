"""`snapana export`: the capture as Parquet tables for DuckDB, polars or pandas."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from snapana.commands import _policy as policy
from snapana.commands._options import CapacityOpt, DeviceOpt, FileArg, RulesOpt


def export(
    file: FileArg,
    output: Annotated[Path | None, typer.Option(
        "-o", "--output", metavar="DIR",
        help="folder to write (an earlier export there is replaced)")] = None,
    device: DeviceOpt = None,
    rules: RulesOpt = None,
    capacity: CapacityOpt = None,
) -> None:
    """Write the capture as Parquet tables (blocks with families, events, segments, stacks)
    for DuckDB, polars or pandas; `snapana report DIR` reads the folder back."""
    from snapana.io.export import export as export_tables
    from snapana.io.output import check_dir_target
    from snapana.sources.parquet_dir import MARKER

    out = output or Path(file.name.split(".")[0] + "-export")
    ins = policy.each(file)
    policy.output_folder(out, ins.files)
    check_dir_target(out, MARKER, "export")  # refuse before the work, not after
    ruleset, cap = policy.check_rules(rules, capacity)
    export_tables(policy.sessions_of(ins.items[0], device, ruleset, cap), out)
    policy.wrote(out)
