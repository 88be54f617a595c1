"""The `snapana` command: thin commands that wire sources → replay → diagnosis → render."""

from __future__ import annotations

import sys
from enum import Enum
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn
from snapana.errors import SnapanaError

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Explain GPU out-of-memory incidents from PyTorch memory snapshots.",
    pretty_exceptions_enable=False,
)
err = Console(stderr=True)


class Format(str, Enum):
    text = "text"
    markdown = "markdown"
    json = "json"


def _load(path: Path):
    """Load with a progress bar on stderr when it is a terminal (quiet otherwise)."""
    from snapana import sources

    if not err.is_terminal:
        return sources.load(path)
    with Progress("[progress.description]{task.description}", BarColumn(), DownloadColumn(),
                  TimeRemainingColumn(), console=err, transient=True) as bar:
        task = bar.add_task(f"reading {path.name}", total=None)
        return sources.load(path, lambda done, total: bar.update(task, completed=done,
                                                                  total=total))


def _reports(path: Path, device: int | None):
    from snapana.diagnosis import analyse

    return analyse(_load(path), device)


@app.command()
def report(
    file: Annotated[Path, typer.Argument(help="snapshot pickle (.pickle, optionally gzip)")],
    output: Annotated[
        Path | None, typer.Option("-o", "--output", help="HTML file to write")
    ] = None,
    device: Annotated[int | None, typer.Option("--device", help="only this device")] = None,
) -> None:
    """Write a self-contained HTML report (opens offline, attach it to the ticket)."""
    from snapana.output import write_atomic
    from snapana.render import html

    reports = _reports(file, device)
    out = output or Path(file.name.split(".")[0] + ".html")
    write_atomic(out, html.render(reports, title=file.name))
    err.print(f"wrote {out}")


@app.command()
def summary(
    file: Annotated[Path, typer.Argument(help="snapshot pickle")],
    format: Annotated[Format, typer.Option("--format", "-f")] = Format.text,
    device: Annotated[int | None, typer.Option("--device")] = None,
) -> None:
    """Print the headline and what holds memory: a table, markdown for a ticket, or JSON."""
    reports = _reports(file, device)
    if format is Format.json:
        from snapana.render import json as json_render

        sys.stdout.write(json_render.render(reports))
    elif format is Format.markdown:
        from snapana.render import markdown

        sys.stdout.write(markdown.render(reports))
    else:
        from snapana.render import terminal

        terminal.render(reports, Console())


def main() -> None:
    """Entry point: domain errors become one line on stderr and exit code 2."""
    try:
        app(standalone_mode=False)
    except SnapanaError as exc:
        err.print(f"snapana: error: {exc}", markup=False, highlight=False, soft_wrap=True)
        raise SystemExit(exc.exit_code) from None
    except KeyboardInterrupt:
        raise SystemExit(130) from None
    except (typer.Exit, SystemExit):
        raise
    except Exception as exc:  # click usage errors arrive here in standalone_mode=False
        import click

        if isinstance(exc, click.exceptions.ClickException):
            exc.show()
            raise SystemExit(2) from None
        if isinstance(exc, click.exceptions.Abort):
            raise SystemExit(1) from None
        raise
