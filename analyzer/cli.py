"""The `snapana` command: thin commands that wire sources → replay → diagnosis → render."""

from __future__ import annotations

import sys
from enum import Enum
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn
from snapana.errors import InputError, SnapanaError

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


def _rules(files: list[Path] | None):
    """Built-in packs plus user rule files; a bad rule file is the input's fault (exit 2)."""
    from snapana.attribution import RuleError, load_rules

    try:
        return load_rules(files or ())
    except RuleError as exc:
        raise InputError(str(exc)) from None


def _capacity(text: str | None) -> int | None:
    from snapana.units import parse_bytes

    if text is None:
        return None
    try:
        return parse_bytes(text)
    except ValueError as exc:
        raise InputError(f"--capacity: {exc}") from None


def _reports(path: Path, device: int | None, rules: list[Path] | None = None,
             capacity: str | None = None):
    from snapana.diagnosis import analyse

    ruleset = _rules(rules)
    return analyse(_load(path), device, rules=ruleset, capacity=_capacity(capacity))


RulesOpt = Annotated[
    list[Path] | None,
    typer.Option("--rules", help="extra rule pack (TOML); repeatable; wins over built-ins"),
]
CapacityOpt = Annotated[
    str | None,
    typer.Option("--capacity", help="device memory, e.g. 80GiB: measures memory outside "
                 "PyTorch"),
]


FileArg = Annotated[Path, typer.Argument(
    help="snapshot pickle, profiler trace, memory timeline or memray capture (optionally gzip)")]
DeviceOpt = Annotated[int | None, typer.Option("--device", help="only this device")]


@app.command()
def report(
    file: FileArg,
    output: Annotated[
        Path | None, typer.Option("-o", "--output", help="HTML file to write")
    ] = None,
    device: DeviceOpt = None,
    rules: RulesOpt = None,
    capacity: CapacityOpt = None,
) -> None:
    """Write a self-contained HTML report (opens offline, attach it to the ticket)."""
    from snapana.output import write_atomic
    from snapana.render import html

    reports = _reports(file, device, rules, capacity)
    out = output or Path(file.name.split(".")[0] + ".html")
    write_atomic(out, html.render(reports, title=file.name))
    err.print(f"wrote {out}")


@app.command()
def summary(
    file: FileArg,
    format: Annotated[Format, typer.Option("--format", "-f")] = Format.text,
    device: DeviceOpt = None,
    rules: RulesOpt = None,
    capacity: CapacityOpt = None,
) -> None:
    """Print the verdict and what holds memory: a table, markdown for a ticket, or JSON."""
    reports = _reports(file, device, rules, capacity)
    if format is Format.json:
        from snapana.render import json as json_render

        sys.stdout.write(json_render.render(reports))
    elif format is Format.markdown:
        from snapana.render import markdown

        sys.stdout.write(markdown.render(reports))
    else:
        from snapana.render import terminal

        terminal.render(reports, Console())


@app.command()
def explain(
    file: FileArg,
    block: Annotated[str | None, typer.Option("--block", help="block address (0x...)")] = None,
    family: Annotated[str | None, typer.Option("--family", help="family id")] = None,
    site: Annotated[str | None, typer.Option("--site", help="text in the site")] = None,
    device: DeviceOpt = None,
    rules: RulesOpt = None,
) -> None:
    """Why a block (or a family, or a site) got its family: rule, frames, near misses."""
    from snapana.explain import explain as run_explain
    from snapana.render import terminal

    address = None
    if block is not None:
        try:
            address = int(block, 0)
        except ValueError:
            raise InputError(f"--block: {block!r} is not an address (e.g. 0x7f3a00000000)"
                             ) from None
    capture = _load(file)
    dev = device if device is not None else capture.devices[0]
    items = run_explain(capture, dev, _rules(rules), block=address, family=family, site=site)
    terminal.render_explain(items, Console())


@app.command()
def synth(
    scenario: Annotated[str | None, typer.Argument(help="scenario name (see --list)")] = None,
    output: Annotated[Path | None, typer.Option("-o", "--output")] = None,
    list_: Annotated[bool, typer.Option("--list", help="list the scenarios")] = False,
) -> None:
    """Write a simulated snapshot (and its ground-truth sidecar) for a seed incident."""
    from snapana.synth.scenarios import SCENARIOS, write_sample

    if list_ or scenario is None:
        for name in SCENARIOS:
            typer.echo(name)
        return
    if scenario not in SCENARIOS:
        raise InputError(f"unknown scenario {scenario!r}; known: {', '.join(SCENARIOS)}")
    pickle_path, truth = write_sample(scenario, output or Path(f"{scenario}.pickle"))
    err.print(f"wrote {pickle_path} and {truth}")


@app.command()
def convert(
    file: Annotated[Path, typer.Argument(help="memray capture (.bin)")],
    output: Annotated[
        Path | None, typer.Option("-o", "--output", help="Parquet file to write")
    ] = None,
) -> None:
    """Turn a memray capture into a Parquet file that snapana reads with any memray installed.

    Run it where the memray release that wrote the capture is installed (snapana's error
    message names it).
    """
    from snapana.convert import convert_memray

    out = convert_memray(file, output or file.with_suffix(".parquet"))
    err.print(f"wrote {out}")


def main() -> None:
    """Entry point: domain errors become one line on stderr and exit code 2."""
    try:
        app()
    except SnapanaError as exc:
        err.print(f"snapana: error: {exc}", markup=False, highlight=False, soft_wrap=True)
        raise SystemExit(exc.exit_code) from None
    except KeyboardInterrupt:
        raise SystemExit(130) from None
