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
    memray_python: Annotated[Path | None, typer.Option(
        "--memray-python", metavar="PYTHON",
        help="the python of an environment where the memray release that reads the capture "
        "is installed (memray alone is enough there)")] = None,
) -> None:
    """Turn a memray capture into a Parquet file that snapana reads with any memray installed.

    Run it where the memray release that wrote the capture is installed (snapana's error
    message names it), or point --memray-python at such an environment's python.
    """
    from snapana.io.convert import convert_memray

    target = policy.output_file(
        output, Path(file.with_suffix(".parquet").name) if output is not None
        else file.with_suffix(".parquet"), policy.each(file).files)
    python = str(memray_python) if memray_python is not None else None
    out = policy.reading(file, lambda progress: convert_memray(file, target, python=python,
                                                               progress=progress))
    policy.wrote(out)
