"""The `snapana` command: thin commands that wire sources → replay → diagnosis → render."""

from __future__ import annotations

import sys
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn
from typer.core import TyperGroup

if TYPE_CHECKING:  # the pipeline is imported by the commands that run it: -h and -V stay fast
    from snapana.diagnosis import DeviceReport
    from snapana.model import Capture
    from snapana.session import Session

from snapana import render as renderers
from snapana.errors import InputError, SnapanaError

err = Console(stderr=True)


#: Exit code of an error that is snapana's fault, not the input's (which exits 2).
INTERNAL_ERROR = 3
_DEBUG = False


class _Guarded(TyperGroup):
    """Every command runs inside this, in a process or in a test's CliRunner: an error that
    is the input's fault (SnapanaError) becomes one line on stderr and its exit code; any
    other exception one line naming the inputs and exit 3 (the traceback with --debug)."""

    def resolve_command(self, ctx: Any, args: list[str]) -> tuple[str | None, Any, list[str]]:
        """Help shows an argument by its metavar alone (FILE...), not by its Python type."""
        name, command, rest = super().resolve_command(ctx, args)
        self._inputs = [a for a in rest if not a.startswith("-")]  # for the error line
        for param in command.params if command is not None else ():
            if param.param_type_name == "argument" and param.metavar:
                param.display_type_rich = lambda ctx: None  # type: ignore[attr-defined]
        return name, command, rest

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except SnapanaError as exc:
            from snapana.units import inert

            # one line, inert: an error may quote text from the input
            err.print(f"snapana: error: {inert(str(exc), lines=False)}", markup=False,
                      highlight=False, soft_wrap=True)
            raise typer.Exit(exc.exit_code) from None
        except (typer.Exit, typer.Abort, KeyboardInterrupt):
            raise
        except Exception as exc:
            if type(exc).__module__.split(".")[0] in ("click", "typer"):
                raise  # usage errors: the CLI framework prints them itself
            if _DEBUG:
                import traceback

                traceback.print_exc()
            inputs = " ".join(getattr(self, "_inputs", []))
            from snapana.units import inert

            first = inert(str(exc).splitlines()[0][:200], lines=False) if str(exc) else ""
            err.print(f"snapana: internal error on {inputs or 'this command'}: "
                      f"{type(exc).__name__}: {first} — please report this with the file "
                      "(--debug shows the traceback)", markup=False, highlight=False,
                      soft_wrap=True)
            raise typer.Exit(INTERNAL_ERROR) from None


app = typer.Typer(
    cls=_Guarded,
    rich_markup_mode=None,
    add_completion=False,
    no_args_is_help=True,
    help="Explain GPU out-of-memory incidents from PyTorch memory snapshots.",
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


#: The output formats: those of the renderer registry (`snapana.render.formats()`), only.
Format = Enum("Format", {f: f for f in renderers.formats()}, type=str)  # type: ignore[misc]
DEFAULT_FORMAT = Format(renderers.DEFAULT_FORMAT)


class Engine(str, Enum):
    local = "local"
    dask = "dask"
    ray = "ray"


def _version(value: bool) -> None:
    if value:
        from snapana import __version__

        typer.echo(f"snapana {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    version: Annotated[bool, typer.Option(
        "--version", "-V", callback=_version, is_eager=True, help="print the version and exit")
    ] = False,
    debug: Annotated[bool, typer.Option(
        "--debug", help="on an internal error, print the traceback")] = False,
) -> None:
    """Explain GPU out-of-memory incidents from PyTorch memory snapshots."""
    global _DEBUG
    _DEBUG = debug


def _open(path: Path) -> Capture:
    """Read with a progress bar on stderr when it is a terminal (quiet otherwise)."""
    from snapana.session import open_capture

    if not err.is_terminal:
        return open_capture(path)
    with Progress("[progress.description]{task.description}", BarColumn(), DownloadColumn(),
                  TimeRemainingColumn(), console=err, transient=True) as bar:
        task = bar.add_task(f"reading {path.name}", total=None)
        return open_capture(path, lambda done, total: bar.update(task, completed=done,
                                                                  total=total))


def _sessions(path: Path, device: int | None, rules: list[Path] | None = None,
              capacity: str | None = None, at: str | None = None) -> list[Session]:
    """A session per device of the file (or the one asked for); rules checked first, so a
    bad rule file fails before a large capture is read."""
    from snapana.session import resolve_capacity, resolve_rules, sessions

    ruleset = resolve_rules(rules)
    cap = resolve_capacity(capacity)
    return sessions(_open(path), device, rules=ruleset, capacity=cap, at=at)


def _reports(path: Path, device: int | None, rules: list[Path] | None = None,
             capacity: str | None = None, at: str | None = None) -> list[DeviceReport]:
    return [s.report for s in _sessions(path, device, rules, capacity, at)]


def _inputs(paths: list[Path]) -> list[Path]:
    """The files a command reads: the given ones and the sidecar beside each snapshot."""
    from snapana import sidecar

    found = (sidecar.find(p) for p in paths if p.is_file())
    return [*paths, *(s for s in found if s is not None)]


def _output_file(output: Path | None, default: Path, inputs: list[Path]) -> Path:
    """Where a single-file output goes: `-o FILE`, or `default`'s name inside `-o DIR`.
    An output that is an input or inside an input folder is refused before any work:
    inputs are never modified."""
    from snapana.output import check_file_target, refuse_inputs

    out = output if output is not None else default
    if out.is_dir():
        out = out / default.name
        err.print(f"{output} is a folder: writing {out}")
    refuse_inputs(out, _inputs(inputs))
    check_file_target(out)
    return out


def _output_folder(output: Path, inputs: list[Path]) -> None:
    """A folder output replaces what is there: refused, before any work, when it is an
    input, lies inside an input folder, or holds an input."""
    from snapana.output import refuse_inputs

    refuse_inputs(output, _inputs(inputs), folder=True)


def _render(view: Any, fmt: str, to_terminal: bool = True) -> str:
    """`view` through the renderer registry: for stdout, laid out for the terminal there."""
    options = renderers.Options()
    if to_terminal:
        console = Console()
        options = renderers.Options(width=console.width, color=console.is_terminal)
    try:
        return renderers.render(view, fmt, options)
    except renderers.UnknownFormat as exc:
        raise InputError(str(exc)) from None


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


def _integer(option: str, lo: int, hi: int) -> Any:
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


FileArg = Annotated[Path, typer.Argument(
    metavar="FILE",
    help="snapshot pickle, profiler trace, memory timeline or memray capture (optionally gzip)")]
DeviceOpt = Annotated[int | None, typer.Option("--device", metavar="N",
                                               parser=_integer("--device", 0, 4095),
                                               help="only this device")]
OutputOpt = Annotated[Path | None, typer.Option("-o", "--output", metavar="PATH")]


FilesArg = Annotated[list[str], typer.Argument(
    metavar="FILE",
    help="snapshot file(s), directories of snapshots, or globs (one report for all ranks)")]
WorkersOpt = Annotated[int | None, typer.Option("--workers", "-j", metavar="N",
                                                parser=_integer("--workers", 1, 4096),
                                                help="worker processes (default: all cores)")]
EngineOpt = Annotated[Engine, typer.Option("--engine", help="where the per-file work runs")]


def _many(paths: list[Path], workers: int | None, rules: list[Path] | None,
          capacity: str | None, engine: str = "local"):
    """Summaries of several inputs (expanded: `expand_inputs`), a progress bar per file on a
    terminal."""
    from snapana.rank_runner import summarize_many
    from snapana.ranks import aggregate
    from snapana.session import resolve_capacity, resolve_rules

    resolve_rules(rules)  # a bad rule file fails once, here, not in every worker
    rule_files = [str(r) for r in rules or ()]
    cap = resolve_capacity(capacity)
    if not err.is_terminal or engine != "local":
        return aggregate(summarize_many(paths, workers, rule_files, cap, engine))
    with Progress("[progress.description]{task.description}", BarColumn(), console=err,
                  transient=True) as bar:
        tasks = {str(p): bar.add_task(p.name, total=1) for p in paths}
        ranks = summarize_many(paths, workers, rule_files, cap, engine,
                               on_done=lambda a, _: bar.update(tasks[a], completed=1))
    return aggregate(ranks)


def _single(files: list[str]) -> Path | None:
    from snapana.rank_runner import expand_inputs

    only = Path(files[0]) if len(files) == 1 else None
    if only is not None and (not only.is_dir() or (only / "snapana-export.json").is_file()):
        paths = expand_inputs(files)
        return paths[0] if len(paths) == 1 else None
    return None


@app.command()
def report(
    files: FilesArg,
    output: Annotated[Path | None, typer.Option(
        "-o", "--output", metavar="PATH", help="HTML file to write (or a folder to write it in)")
    ] = None,
    device: DeviceOpt = None,
    rules: RulesOpt = None,
    capacity: CapacityOpt = None,
    at: AtOpt = None,
    workers: WorkersOpt = None,
    rank: Annotated[int | None, typer.Option(
        "--rank", metavar="N", parser=_integer("--rank", 0, 2**31 - 1),
        help="with several inputs: the rank shown in full (default: first OOM)")
    ] = None,
    trace: Annotated[list[Path] | None, typer.Option(
        "--trace", metavar="FILE",
        help="a torch.profiler trace or memory timeline of the same job")] = None,
    memray: Annotated[list[Path] | None, typer.Option(
        "--memray", metavar="FILE", help="a memray capture (host memory) of the same job")
    ] = None,
) -> None:
    """Write a self-contained HTML report (opens offline, attach it to the ticket)."""
    from snapana.output import write_atomic
    from snapana.rank_runner import expand_inputs
    from snapana.render.views import capture_view

    single = _single(files)
    if single is not None:
        extras = [*(trace or ()), *(memray or ())]
        out = _output_file(output, Path(single.name.split(".")[0] + ".html"),
                           [single, *extras])
        reports = _reports(single, device, rules, capacity, at)
        for extra in extras:
            reports += _reports(extra, None, rules, capacity)
        write_atomic(out, _render(capture_view(reports, title=single.name),
                                  renderers.REPORT_FORMAT, to_terminal=False))
        err.print(f"wrote {out}")
        return
    if at is not None:
        raise InputError("--at applies to one capture; with several inputs, pick one file")
    paths = expand_inputs(files)
    out = _output_file(output, Path("snapana-report.html"), paths)
    multi = _many(paths, workers, rules, capacity)
    chosen = multi.first_oom
    if rank is not None:
        chosen = next((r for r in multi.ok if r.rank == rank), None)
        if chosen is None:
            raise InputError(f"--rank {rank}: no analysed input has that rank")
    chosen = chosen or (multi.ok[0] if multi.ok else None)
    reports = _reports(Path(chosen.file), chosen.device, rules, capacity) if chosen else []
    write_atomic(out, _render(capture_view(reports, title=f"{len(paths)} inputs", ranks=multi),
                              renderers.REPORT_FORMAT, to_terminal=False))
    err.print(f"wrote {out}")


@app.command()
def summary(
    files: FilesArg,
    format: Annotated[Format, typer.Option("--format", "-f")] = DEFAULT_FORMAT,
    device: DeviceOpt = None,
    rules: RulesOpt = None,
    capacity: CapacityOpt = None,
    at: AtOpt = None,
    workers: WorkersOpt = None,
) -> None:
    """Print the verdict and what holds memory: a table, markdown for a ticket, JSON, or the
    HTML page. With several inputs: the rank table, then the failing (else the largest)
    rank in full."""
    from snapana.rank_runner import expand_inputs
    from snapana.render.views import capture_view

    single = _single(files)
    if single is None:
        if at is not None:
            raise InputError("--at applies to one capture; with several inputs, pick one file")
        paths = expand_inputs(files)
        multi = _many(paths, workers, rules, capacity)
        chosen = multi.first_oom or max(multi.ok, key=lambda r: r.peak_allocated_bytes,
                                        default=None)
        reports = _reports(Path(chosen.file), chosen.device, rules, capacity) if chosen else []
        sys.stdout.write(_render(capture_view(reports, title=f"{len(paths)} inputs",
                                              ranks=multi), format.value))
        return
    reports = _reports(single, device, rules, capacity, at)
    sys.stdout.write(_render(capture_view(reports, title=single.name), format.value))


@app.command()
def batch(
    files: FilesArg,
    output: Annotated[Path, typer.Option("-o", "--output", metavar="DIR",
                                         help="dataset folder to write")],
    job: Annotated[str | None, typer.Option("--job", metavar="NAME",
                                            help="job name (default: folder)")] = None,
    engine: EngineOpt = Engine.local,
    workers: WorkersOpt = None,
    rules: RulesOpt = None,
    capacity: CapacityOpt = None,
) -> None:
    """Summarise a whole incident directory into a partitioned Parquet dataset
    (ranks/ and families/, one partition per job and rank); --engine dask|ray for clusters."""
    from snapana import rank_dataset
    from snapana.rank_runner import expand_inputs

    paths = expand_inputs(files)
    _output_folder(output, paths)
    multi = _many(paths, workers, rules, capacity, engine.value)
    name = job or (paths[0].parent.name if paths else "job")
    rank_dataset.write(multi, output, name)
    err.print(f"wrote {output} ({len(multi.ranks)} inputs, {len(multi.ok)} analysed)")


@app.command()
def explain(
    file: FileArg,
    block: Annotated[str | None, typer.Option("--block", metavar="ADDR",
                                              help="block address (0x...)")] = None,
    family: Annotated[str | None, typer.Option("--family", metavar="FAMILY",
                                               help="family id")] = None,
    site: Annotated[str | None, typer.Option("--site", metavar="TEXT",
                                             help="text in the site")] = None,
    device: DeviceOpt = None,
    rules: RulesOpt = None,
    at: AtOpt = None,
) -> None:
    """Why a block (or a family, or a site) got its family: rule, frames, near misses."""
    from snapana.render.views import explain_view
    from snapana.session import Session, resolve_rules

    address = None
    if block is not None:
        from snapana.units import parse_address

        try:
            address = parse_address(block, "--block")
        except ValueError as exc:
            raise InputError(str(exc)) from None
    ruleset = resolve_rules(rules)
    session = Session(_open(file), device, rules=ruleset, at=at)
    items = session.explain(block=address, family=family, site=site)
    sys.stdout.write(_render(explain_view(items), "text"))


@app.command()
def synth(
    scenario: Annotated[str | None, typer.Argument(
        metavar="[SCENARIO]", help="scenario name (see --list)")] = None,
    output: OutputOpt = None,
    list_: Annotated[bool, typer.Option("--list", help="list the scenarios")] = False,
    entries: Annotated[int | None, typer.Option(
        "--entries", metavar="N", parser=_integer("--entries", 1, 10**9),
        help="instead of a scenario: a training run with N trace entries")] = None,
    seed: Annotated[int, typer.Option("--seed", metavar="N",
                                      parser=_integer("--seed", 0, 2**63 - 1),
                                      help="with --entries")] = 0,
) -> None:
    """Write a simulated snapshot (and its ground-truth sidecar) for a seed incident, or a
    large one (--entries N) for benchmarks."""
    from snapana.synth.scenarios import MULTI_DEVICE, SCENARIOS, write_sample

    if entries is not None:
        from snapana.synth.scale import write_scale_snapshot

        if not 1 <= entries <= 50_000_000:
            raise InputError(f"--entries {entries}: give 1 to 50000000")
        out = write_scale_snapshot(entries, _output_file(output, Path(f"scale-{entries}.pickle"),
                                                         []), seed=seed)
        err.print(f"wrote {out}")
        return

    known = [*SCENARIOS, *MULTI_DEVICE]  # the bundled samples, then multi-GPU captures
    if list_ or scenario is None:
        for name in known:
            typer.echo(name + ("  (several devices)" if name in MULTI_DEVICE else ""))
        return
    if scenario not in known:
        raise InputError(f"unknown scenario {scenario!r}; known: {', '.join(known)}")
    pickle_path, truth = write_sample(scenario,
                                      _output_file(output, Path(f"{scenario}.pickle"), []))
    err.print(f"wrote {pickle_path} and {truth}")


@app.command()
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

    out = convert_memray(file, _output_file(output, Path(file.with_suffix(".parquet").name)
                                            if output is not None else
                                            file.with_suffix(".parquet"), [file]))
    err.print(f"wrote {out}")


@app.command()
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
    from snapana.export_tables import export as export_tables
    from snapana.output import check_dir_target
    from snapana.sources.parquet_dir import MARKER

    out = output or Path(file.name.split(".")[0] + "-export")
    _output_folder(out, [file])
    check_dir_target(out, MARKER, "export")  # refuse before the work, not after
    export_tables(_sessions(file, device, rules, capacity), out)
    err.print(f"wrote {out}")


@app.command()
def diff(
    before: Annotated[Path, typer.Argument(
        metavar="BEFORE", help="the capture before the change (the OOM)")],
    after: Annotated[Path, typer.Argument(
        metavar="AFTER", help="the capture after the change (the fix)")],
    output: Annotated[Path | None, typer.Option(
        "-o", "--output", metavar="PATH",
        help="write to a file (HTML when it ends in .html) or into a folder (as .html)")
    ] = None,
    format: Annotated[Format, typer.Option("--format", "-f")] = DEFAULT_FORMAT,
    device: DeviceOpt = None,
    rules: RulesOpt = None,
    capacity: CapacityOpt = None,
) -> None:
    """Compare two captures, e.g. before and after a fix: the change per family and site,
    the peak, and whether the OOM is gone."""
    from snapana import diff as compare
    from snapana.output import write_atomic
    from snapana.render.views import diff_view
    from snapana.session import resolve_capacity, resolve_rules

    out = None
    if output is not None:
        stem = f"{before.name.split('.')[0]}-vs-{after.name.split('.')[0]}"
        out = _output_file(output, Path(f"{stem}.html"), [before, after])
    ruleset, cap = resolve_rules(rules), resolve_capacity(capacity)
    view = diff_view(compare(before, after, device=device, rules=ruleset, capacity=cap).diff)
    if out is None:
        sys.stdout.write(_render(view, format.value))
        return
    write_atomic(out, _render(view, renderers.format_for_path(out, format.value),
                              to_terminal=False))
    err.print(f"wrote {out}")


class Stacks(str, Enum):
    python = "python"
    all = "all"


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def record(
    command: Annotated[list[str], typer.Argument(
        metavar="-- COMMAND", help="the job to run, after --: python train.py ..., torchrun ...")],
    output: Annotated[Path, typer.Option(
        "-o", "--output", metavar="DIR", help="folder for snapshots and sidecars")
    ] = Path("snapana-record"),
    max_entries: Annotated[int, typer.Option(
        "--max-entries", metavar="N", help="trace ring buffer size per process")] = 100_000,
    stacks: Annotated[Stacks, typer.Option(
        "--stacks", help="python frames, or all (with C++ frames: slower)")] = Stacks.python,
    dump_at_step: Annotated[int | None, typer.Option(
        "--dump-at-step", metavar="N", help="also dump after the N-th optimizer step")] = None,
    job: Annotated[str | None, typer.Option(
        "--job", metavar="NAME", help="file name prefix (default: the script's name)")] = None,
) -> None:
    """Run a job with memory recording injected into each of its Python processes: on OOM,
    at --dump-at-step and at exit each rank writes a snapshot and a sidecar (capacity, rank,
    versions, tensor inventory) into DIR. The job's output and exit code pass through."""
    from snapana.record.launch import job_environment, run

    if not command:
        raise InputError("record: give the job's command after --, e.g. "
                         "snapana record -o out -- python train.py")
    if max_entries < 1:
        raise InputError(f"--max-entries {max_entries}: must be at least 1")
    if dump_at_step is not None and dump_at_step < 1:
        raise InputError(f"--dump-at-step {dump_at_step}: must be at least 1")
    if output.exists() and not output.is_dir():
        raise InputError(f"-o {output}: exists and is not a folder")
    env = job_environment(output, max_entries, stacks.value, dump_at_step, job)
    try:
        code = run(command, env)
    except FileNotFoundError:
        raise InputError(f"record: no such command: {command[0]}") from None
    raise typer.Exit(code)


def main() -> None:
    """Entry point of the console script and `python -m snapana`."""
    try:
        app()
    except KeyboardInterrupt:
        raise SystemExit(130) from None
