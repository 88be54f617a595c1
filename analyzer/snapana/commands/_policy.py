"""The one input/output policy every command follows: resolve the command line once into
typed inputs (`inputs.resolve`: kind, role, sidecar, rank), check the rules and the
capacity once, refuse an output that is an input before any work, read the inputs (a
progress bar on a terminal), make a session per device, choose the rank shown in full by one
rule (`ranks.shown_in_full`), render through the registry, write atomically."""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from rich.console import Console

from snapana import render as renderers
from snapana.errors import InputError, SnapanaError
from snapana.units import inert

if TYPE_CHECKING:  # the pipeline is imported when a command runs: -h and -V stay fast
    from snapana.analysis.attribution.engine import RuleSet
    from snapana.analysis.diagnosis.findings import DeviceReport
    from snapana.analysis.ranks.aggregate import MultiReport
    from snapana.analysis.ranks.runner import RankRun
    from snapana.inputs import Input, Inputs
    from snapana.model import Capture
    from snapana.session import Session

err = Console(stderr=True)
_T = TypeVar("_T")


def inputs(files: list[str], at: str | None = None, *, logs: list[Path] | None = None,
           trace: list[Path] | None = None, memray: list[Path] | None = None,
           texts: bool = True, every_rank: bool = False) -> Inputs:
    """The command line as one typed list of inputs, resolved once before any work
    (`inputs.resolve`): one capture (a file, an export folder) with what is read beside it,
    or many ranks; text logs alone or beside; `--at` applies to one capture only."""
    from snapana.inputs import resolve

    return resolve(files, at=at, logs=logs or (), trace=trace or (), memray=memray or (),
                   texts=texts, every_rank=every_rank)


def each(*files: Path, beside: list[Path] | None = None) -> Inputs:
    """Files named one each (no folder expanded), each a capture shown, and the captures
    read beside them, resolved once (`inputs.resolve_each`)."""
    from snapana.inputs import resolve_each

    return resolve_each(files, beside or ())


def check_rules(rules: list[Path] | None, capacity: str | None) -> tuple[RuleSet, int | None]:
    """The rule set and the capacity, checked once, before a large capture is read."""
    from snapana.session import resolve_capacity, resolve_rules

    return resolve_rules(rules), resolve_capacity(capacity)


def reading(path: Path, read: Callable[[Callable[[int, int], None] | None], _T]) -> _T:
    """Run `read(progress)` with a progress bar on stderr when it is a terminal (quiet
    otherwise): bytes of `path` read so far."""
    from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn

    if not err.is_terminal:
        return read(None)
    with Progress("[progress.description]{task.description}", BarColumn(), DownloadColumn(),
                  TimeRemainingColumn(), console=err, transient=True) as bar:
        task = bar.add_task(f"reading {path.name}", total=None)
        return read(lambda done, total: bar.update(task, completed=done, total=total))


def open_shown(inp: Input) -> Capture:
    """Read an input as resolved (its kind and sidecar told once), with a progress bar on
    stderr when it is a terminal (quiet otherwise)."""
    from snapana.session import open_input

    return reading(inp.path or Path("-"), lambda progress: open_input(inp, progress))


def sessions_of(inp: Input, device: int | None, ruleset: RuleSet, capacity: int | None,
                at: str | None = None) -> list[Session]:
    """A session per device of the input (or the one asked for), in report order."""
    from snapana.session import sessions

    return sessions(open_shown(inp), device, rules=ruleset, capacity=capacity, at=at)


def compare(before: Input, after: Input, device: int | None, ruleset: RuleSet,
            capacity: int | None) -> Any:
    """Two inputs compared (`diff`), each read as resolved, one device of each."""
    from snapana.api import Analysis
    from snapana.session import open_input

    a, b = (Analysis(open_input(i), device=device, rules=ruleset, capacity=capacity)
            for i in (before, after))
    return a.diff(b).diff


def output_file(output: Path | None, default: Path, read: list[Path]) -> Path:
    """Where a single-file output goes: `-o FILE`, or `default`'s name inside `-o DIR`.
    An output that is an input (`read`: the resolved inputs' files, `Inputs.files`: inputs
    and sidecars) or inside an input folder is refused before any work: inputs are never
    modified."""
    out = output if output is not None else default
    if out.is_dir():
        out = out / default.name
        err.print(f"{inert(str(output), lines=False)} is a folder: writing "
                  f"{inert(str(out), lines=False)}", markup=False, highlight=False,
                  soft_wrap=True)
    return output_named(out, read)


def output_named(out: Path, read: list[Path]) -> Path:
    """A file output at exactly this path (`--junit`, or `output_file`'s choice), checked
    before any work: not an input nor inside an input folder (compared by identity, so a
    link loop is a refusal, not `Path.resolve`'s RuntimeError), and a regular file or
    nothing (a link to one is replaced by the new file; its target is left alone)."""
    from snapana.io.output import check_file_target, refuse_inputs

    refuse_inputs(out, read)
    check_file_target(out)
    return out


def output_folder(output: Path, read: list[Path]) -> None:
    """A folder output replaces what is there: refused, before any work, when it is an
    input, lies inside an input folder, or holds an input."""
    from snapana.io.output import refuse_inputs

    refuse_inputs(output, read, folder=True)


def prepare(fmt: str, kind: str = "capture") -> None:
    """Refuse binary output bound for a terminal, then import the renderer of `fmt` now,
    and run its module's `warm()` when it has one, before the inputs are read: a
    snapshot's decode child (started early, `commands._early`) is still running, so this
    costs no time of the command's own. An unknown format is left for `render_view` to
    refuse."""
    binary_to_terminal(fmt)
    try:
        render = renderers.renderer(kind, fmt)
    except renderers.UnknownFormat:
        return
    warm = getattr(sys.modules.get(getattr(render, "__module__", "")), "warm", None)
    if callable(warm):
        warm()


def binary_to_terminal(fmt: str) -> None:
    """A binary format (`render.OUTPUTS`: a PNG) is never printed to a terminal: refused,
    one line, exit 2, before any work."""
    if renderers.is_binary(fmt) and sys.stdout.isatty():
        ext = renderers.OUTPUTS[fmt].extension
        raise InputError(f"-f {fmt} writes binary output, not for a terminal: redirect it "
                         f"to a file (> out{ext})")


def render_view(view: Any, fmt: str, to_terminal: bool = True, full: bool = True
                ) -> str | bytes:
    """`view` through the renderer registry: for stdout, laid out for the terminal there
    (`full=False`: a capture's text on one screen); bytes for a binary format."""
    options = renderers.Options(full=full)
    if to_terminal:
        console = Console()
        options = renderers.Options(width=console.width, color=console.is_terminal, full=full)
    try:
        return renderers.render_output(view, fmt, options)
    except renderers.UnknownFormat as exc:
        raise InputError(str(exc)) from None


def emit(text: str | bytes) -> None:
    """Print a command's output whole, or fail saying so. Python's text stdout drops the rest
    of a write that the file took only in part (a disk that fills up, a file-size limit)
    without a word, and the command would exit 0 with half a report: so the bytes go
    through the binary stream, the count of every write checked (the failure then is an
    OSError: exit 4, `cli.environment_problem`). Bytes (a binary format) never go to a
    terminal (`binary_to_terminal`)."""
    stream = sys.stdout
    if isinstance(text, bytes) and stream.isatty():
        raise InputError("binary output, not for a terminal: redirect it to a file")
    buffer = getattr(stream, "buffer", None)
    if buffer is None:  # a closed stdout (`__main__._Closed`), an in-memory stream
        if isinstance(text, bytes):
            raise InputError("binary output and no binary stdout to write it to")
        stream.write(text)
        return
    data = memoryview(text if isinstance(text, bytes) else
                      text.encode(stream.encoding or "utf-8", stream.errors or "strict"))
    stream.flush()
    while data:
        n = buffer.write(data)
        if not n:
            raise OSError(5, "the output took no more bytes")
        data = data[n:]
    buffer.flush()


def write(out: Path, text: str | bytes, multi: MultiReport | None = None) -> None:
    """Write atomically and say where (or, when none of several inputs `multi` names could
    be analysed, fail saying the output lists why: `none_analysed`)."""
    from snapana.io.output import write_atomic

    write_atomic(out, text)
    none_analysed(multi, written=out)
    wrote(out)


def step_summary(*views: Any) -> None:
    """Append the views' markdown to $GITHUB_STEP_SUMMARY when a GitHub Actions step sets
    it (the job's summary page), as `check` and `diff` do."""
    import os

    from snapana.io.output import append_text

    summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if summary:  # a regular file or a new one: a FIFO or device is refused, never waited on
        append_text(summary, "".join(renderers.render(view, "markdown") + "\n"
                                     for view in views))


def wrote(*paths: Path, detail: str = "") -> None:
    """Say which files a command wrote, one line: paths shown inert (a name can carry
    escape sequences or newlines)."""
    names = " and ".join(inert(str(p), lines=False) for p in paths)
    err.print(f"wrote {names}{detail}", markup=False, highlight=False, soft_wrap=True)


def headline(view: Any) -> None:
    """After "wrote ...": the verdict's headline of the device shown first, so the answer
    is on the terminal before the page is opened."""
    import textwrap

    if view.devices and view.devices[0].lead:
        text = textwrap.fill(inert(f"Verdict. {view.devices[0].lead}"), Console().width,
                             break_long_words=False, break_on_hyphens=False)
        err.print(text, markup=False, highlight=False, soft_wrap=True)


def none_analysed(multi: MultiReport | None, written: Path | None = None) -> None:
    """Several inputs and not one analysed: the command failed (exit 2), whatever it wrote
    to list why each was refused (`written`, named in the one line said instead of the
    "wrote" line; else the reasons are in the output above)."""
    if multi is not None and multi.ranks and not multi.ok:
        where = (f"in {inert(str(written), lines=False)}, written" if written is not None
                 else "listed above")
        raise InputError(f"none of the {len(multi.ranks)} inputs could be analysed (each "
                         f"one's reason is {where})")


def some_failed(multi: MultiReport | None, where: Path | None = None) -> None:
    """Several inputs, some analysed and some not: after the output (which lists each
    failure with its reason), one line, and the run ends with exit code 5
    (`errors.SOME_INPUTS_FAILED`), so a script cannot take a partial run for a whole one."""
    import typer

    from snapana.errors import SOME_INPUTS_FAILED

    if multi is None or not multi.ok or \
            len(multi.ok) == len(multi.ranks) and not multi.beside_failed:
        return
    failed = len(multi.ranks) - len(multi.ok) + multi.beside_failed
    total = len(multi.ranks) + len(multi.beside)
    listed = f"in {inert(str(where), lines=False)}" if where is not None else "above"
    err.print(f"{failed} of {total} inputs could not be read (each one's reason is "
              f"{listed}); the others were analysed: exit code {SOME_INPUTS_FAILED}",
              markup=False, highlight=False, soft_wrap=True)
    raise typer.Exit(SOME_INPUTS_FAILED)


def text_logs(ins: Inputs, at: str | None = None) -> tuple[Any | None, Inputs]:
    """The view of what text inputs say about memory (a paste on standard input, files
    whose content is a log, a folder of per-rank logs), or None and the inputs to read as
    captures (logs named one by one that all say nothing: a rank table, each one's reason
    in its row)."""
    if not ins.text_only:
        return None, ins
    from snapana.log_session import read_logs
    from snapana.render.text_log import text_log_view

    paths = [i.path for i in ins.logs if i.path is not None] or None  # None: standard input
    evidence = read_logs(paths, {i.path: i.rank for i in ins.logs
                                 if i.path is not None and i.rank is not None})
    notes = [n for log in evidence.logs for n in log.notes] + list(ins.skipped)
    empty = [log for log in evidence.logs if log.empty]
    if empty and len(empty) == len(evidence.logs):
        if len(empty) > 1 and not ins.folders:
            return None, ins.as_ranks(at)  # each one's reason in the rank table
        if len(empty) == 1:
            from snapana.sources.log_text import found

            found(empty[0], empty[0].name)  # its one-line refusal
        raise InputError(f"none of the {len(empty)} text inputs says anything about GPU memory "
                         "(no 'CUDA/HIP/NPU out of memory' message, memory_summary(), nvidia-smi "
                         "table or vLLM KV-cache refusal)")
    notes += [f"{inert(log.name, lines=False)}: nothing about GPU memory in it (no OOM "
              "message, memory_summary(), nvidia-smi table or vLLM refusal)" for log in empty]
    title = evidence.logs[0].name if len(evidence.logs) == 1 else f"{len(evidence.logs)} logs"
    return text_log_view(title, evidence, notes), ins


def log_checks(logs: list[Input], reports: Any) -> tuple[Any, ...]:
    """The OOM messages of the logs beside a capture checked against its reports."""
    if not logs:
        return ()
    from snapana.log_session import check_beside

    return check_beside([i.path for i in logs if i.path is not None], list(reports))


def analyse_many(ranks: list[Input], workers: int | None, rules: list[Path] | None,
                 ruleset: RuleSet, capacity: int | None, engine: str = "local",
                 findings: bool = False) -> tuple[MultiReport, RankRun]:
    """Summaries of several inputs (rules already checked) by the session's worker, one
    progress bar on a terminal (a bar per file would redraw thousands of rows on every
    refresh), and their aggregate; `findings`: each keeps its findings (to word its
    verdict)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress

    from snapana.analysis.ranks.aggregate import aggregate
    from snapana.analysis.ranks.runner import run_many
    from snapana.session import summarize

    rule_files = [str(r) for r in rules or ()]
    if not err.is_terminal or engine != "local":
        run = run_many(ranks, summarize, workers, rule_files, capacity, engine,
                       ruleset=ruleset, findings=findings)
        return aggregate(run.summaries), run
    with Progress("[progress.description]{task.description}", BarColumn(),
                  MofNCompleteColumn(), console=err, transient=True) as bar:
        task = bar.add_task("inputs", total=len(ranks))
        run = run_many(ranks, summarize, workers, rule_files, capacity, engine,
                       on_done=lambda a, _: bar.advance(task), ruleset=ruleset,
                       findings=findings)
    return aggregate(run.summaries), run


@dataclass
class Shown:
    """What a report or a summary shows: the device reports in full, and over many inputs
    the rank table they sit under."""

    reports: list[DeviceReport]
    ranks: MultiReport | None = None


def shown(ins: Inputs, device: int | None, rules: list[Path] | None, capacity: str | None,
          at: str | None = None, workers: int | None = None, rank: int | None = None,
          ahead: Callable[[Session], None] | None = None) -> Shown:
    """One capture (every device, or the one asked for, at `at`; plus the captures of the
    same job read beside it), or many inputs: the rank table and the rank
    `ranks.shown_in_full` chooses, its report kept from the run when it was made in this
    process, else analysed once, and a folder's other captures beside it. `ahead` is given
    each session of the one capture before its report is made (what the output needs
    beside the report can be started then)."""
    from snapana.analysis.ranks.aggregate import shown_in_full

    ruleset, cap = check_rules(rules, capacity)
    if ins.single is not None:
        sessions = sessions_of(ins.single, device, ruleset, cap, at)
        if ahead is not None:
            for s in sessions:
                ahead(s)
        reports = [s.report for s in sessions]
        for extra in ins.beside:
            reports += [s.report for s in sessions_of(extra, None, ruleset, cap)]
        return Shown(reports)
    multi, run = analyse_many(ins.ranks, workers, rules, ruleset, cap)
    multi.skipped = list(ins.skipped)
    chosen = shown_in_full(multi, rank)
    if chosen is None:
        return Shown([], multi)
    kept = run.kept.get(chosen.file)
    inp = next(i for i in ins.ranks if str(i.path) == chosen.file)
    reports = [kept] if kept is not None else [
        s.report for s in sessions_of(inp, chosen.device, ruleset, cap)]
    return Shown(reports + _beside(ins.beside, inp, multi, ruleset, cap), multi)


def _beside(companions: list[Input], snapshot: Input, multi: MultiReport,
            ruleset: RuleSet, capacity: int | None) -> list[DeviceReport]:
    """The reports of a folder's other captures, read beside its snapshot as `--trace` and
    `--memray` would read them; a line each in `multi.beside` says what it gave (or why it
    could not be read: then it counts as a failed input)."""
    out: list[DeviceReport] = []
    for inp in companions:
        name, what = inert(inp.name, lines=False), inp.known_kind().row.what
        try:
            reports = [s.report for s in sessions_of(inp, None, ruleset, capacity)]
        except SnapanaError as exc:
            why = inert(str(exc).removeprefix(f"{inp.path}: "), lines=False)
            multi.beside.append(f"{name}: {what}, not read ({why})")
            multi.beside_failed += 1
            continue
        shown = ", ".join(f"{r.device_name or f'device {r.device}'} "
                          f"{'at its OOM' if r.oom is not None else 'at its peak'}"
                          for r in reports)
        multi.beside.append(f"{name}: {what} of the same folder, read beside "
                            f"{inert(snapshot.name, lines=False)}: its report below ({shown}), "
                            "shown with the snapshot's, not joined to its blocks")
        out += reports
    return out


def verdicts(run: RankRun) -> dict[str, str]:
    """Each analysed input's verdict, worded here from the findings its worker returned."""
    from snapana.render.wording import verdict

    return {r.file: verdict(r.findings) for r in run.summaries if r.findings is not None}
