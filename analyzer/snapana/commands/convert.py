"""`snapana convert`: a memray capture as Parquet that any memray-less install reads."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from snapana.commands import _policy as policy


def convert(
    file: Annotated[Path, typer.Argument(metavar="FILE", help="memray capture (.bin)")],
    output: Annotated[Path | None, typer.Option(
        "-o", "--output", metavar="PATH", help="Parquet file to write")] = None,
) -> None:
    """Turn a memray capture into a Parquet file that snapana reads with any memray installed.

    Run it where the memray release that wrote the capture is installed (snapana's error
    message names it).
    """
    from snapana.convert import convert_memray

    out = convert_memray(file, policy.output_file(
        output, Path(file.with_suffix(".parquet").name) if output is not None
        else file.with_suffix(".parquet"), [file]))
    policy.err.print(f"wrote {out}")
