"""Many inputs at once: expand files, folders and globs, then reduce each input to a small
RankSummary in worker processes (local processes, dask or ray), so the parent holds a few
kilobytes per rank and memory stays bounded by the files in flight, not their sum.

Workers return findings (a RankSummary with the device's findings, minus the per-event
series), never wording: the face words and renders them. Run in this process, the runner also
keeps the full report of the rank `ranks.selection_key` puts first, so the rank shown in full
is not analysed twice; from worker processes only summaries travel, and the face analyses
that one rank again (the price of bounded memory).
"""

from __future__ import annotations

import glob
import multiprocessing
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from snapana.analysis.ranks.aggregate import RankSummary, rank_of, selection_key
from snapana.children import die_with_parent
from snapana.errors import InputError, SnapanaError
from snapana.sources.parquet_dir import MARKER as EXPORT_MARKER

if TYPE_CHECKING:
    from snapana.analysis.attribution.engine import RuleSet
    from snapana.analysis.diagnosis.findings import DeviceReport
    from snapana.capture_kinds import CaptureKind

SNAPSHOT_SUFFIXES = (".pickle", ".pkl", ".pickle.gz", ".pkl.gz", ".pt", ".snapshot")


def expand_inputs(args: Iterable[str | Path]) -> list[Path]:
    """Files, directories (their snapshot files) and globs, in a stable order."""
    return expand(args)[0]


def expand(args: Iterable[str | Path]
           ) -> tuple[list[Path], list[str], list[tuple[Path, CaptureKind]]]:
    """`expand_inputs`, a line for each file of a named folder that is not taken, with why
    (a folder's files are told apart by content, never dropped without a word), and the
    folders' other captures of the same job (path, kind: the kinds read beside a snapshot)
    where the inputs come to one snapshot: they are read beside it. Beside several
    snapshots a trace is tied to none of them, and listed with why."""
    out: list[Path] = []
    skipped: list[str] = []
    companions: list[tuple[Path, CaptureKind]] = []
    for arg in args:
        p = Path(arg)
        if p.is_dir() and not (p / EXPORT_MARKER).exists():
            found, passed, others = _folder(p)
            if not found:
                raise InputError(f"{p}: no snapshot files (*.pickle) in this directory"
                                 + (f" ({len(passed) + len(others)} other files)"
                                    if passed or others else ""))
            out.extend(found)
            skipped.extend(passed)
            companions.extend(others)
        elif any(ch in str(arg) for ch in "*?[") and not p.exists():
            matches = sorted(Path(m) for m in glob.glob(str(arg)))
            if not matches:
                raise InputError(f"{arg}: no file matches")
            out.extend(matches)
        else:
            out.append(p)
    out = list(dict.fromkeys(out))  # each input once, first mention wins
    if len(out) != 1:
        from snapana.units import inert

        skipped += [f"{inert(f.name, lines=False)}: {kind.row.not_a_rank} (with several snapshots "
                    "it is tied to none)" for f, kind in companions]
        companions = []
    return out, skipped, companions


def _folder(folder: Path) -> tuple[list[Path], list[str], list[tuple[Path, CaptureKind]]]:
    """A folder's snapshots (by name, or by content whatever their name: `x.pickle__sha`),
    a line for each other file that is not read with them (what its first bytes say it is,
    `sources.sniff`, and how it is given: its row of `capture_kinds.SOURCES`), and the
    captures read beside a lone snapshot (path, kind)."""
    from snapana.sources import sniff
    from snapana.units import inert

    found: list[Path] = []
    skipped: list[str] = []
    others: list[tuple[Path, CaptureKind]] = []
    for f in sorted(folder.iterdir()):
        if f.name.startswith(".") or not f.is_file():
            continue
        if f.name.lower().endswith(SNAPSHOT_SUFFIXES):
            found.append(f)
            continue
        if f.name.endswith(".meta.json"):
            skipped.append(f"{inert(f.name, lines=False)}: a sidecar, read with its capture")
            continue
        try:
            kind = sniff(f)
        except InputError as exc:
            why = str(exc).removeprefix(f"{f}: ")
            skipped.append(f"{inert(f.name, lines=False)}: not read ({inert(why, lines=False)})")
            continue
        if kind.row.rank_input:
            found.append(f)
        elif kind.row.read_beside:
            others.append((f, kind))
        else:
            skipped.append(f"{inert(f.name, lines=False)}: {kind.row.not_a_rank}")
    return found, skipped, others


def summarize_file(path: str, rule_files: list[str] | None = None,
                   capacity: int | None = None) -> dict[str, Any]:
    """Worker: analyse one file and reduce it to a RankSummary dict (picklable, small)."""
    return vars(_analyse_file(path, rule_files, capacity)[0])


def _analyse_file(path: str, rules: Any = None, capacity: int | None = None
                  ) -> tuple[RankSummary, DeviceReport | None]:
    """One file's RankSummary and the full report of the device it summarises (None when the
    file could not be analysed). `rules`: rule files or a loaded RuleSet."""
    from snapana.analysis.attribution import RuleError
    from snapana.session import analyse, open_capture

    p = Path(path)
    summary = RankSummary(file=str(p), rank=rank_of(p))
    try:
        capture = open_capture(p)
        reports = analyse(capture, rules=rules or (), capacity=capacity)
    except (SnapanaError, RuleError) as exc:
        summary.error = str(exc)
        return summary, None
    except Exception as exc:  # a worker must report, not die: one bad rank is not the job
        summary.error = f"{p}: could not analyse: {type(exc).__name__}: {exc}"
        return summary, None
    r = next((r for r in reports if r.oom is not None), reports[0])
    summary.device = r.device
    summary.devices = list(capture.devices)
    summary.reserved_bytes = r.reserved_bytes
    summary.allocated_bytes = r.allocated_bytes
    summary.peak_allocated_bytes = r.peak_allocated_bytes
    summary.families = {g.name: g.bytes for g in r.groups}
    summary.top_family = r.groups[0].name if r.groups else None
    summary.findings = _without_series(r)
    summary.moment = r.moment.kind
    if r.oom is not None:
        summary.oom = {"requested_bytes": r.oom.requested_bytes,
                       "device_free_bytes": r.oom.device_free_bytes,
                       "event_index": r.oom.event_index, "time_us": r.moment.time_us}
    settings = capture.allocator_settings or {}
    summary.settings = str(settings.get("PYTORCH_CUDA_ALLOC_CONF", "")) + (
        " expandable" if settings.get("expandable_segments") else "")
    return summary, r


def _without_series(r: DeviceReport) -> DeviceReport:
    """A report's findings without what grows with the trace or the blocks (the per-event
    series, the segments and the live blocks): kilobytes, enough to word it."""
    import numpy as np

    empty = np.zeros(0, dtype=np.int64)
    timeline = replace(r.timeline, allocated=empty, reserved=empty, times_us=None, bands=(),
                       families=None, stacks=None)
    return replace(r, timeline=timeline, segments=r.segments.clear(),
                   live_blocks=r.live_blocks.clear())


#: Told of each input as its summary arrives (input path, summary dict).
RankDone = Callable[[str, dict[str, Any]], None]


@dataclass
class RankRun:
    """The summaries of a run over many inputs, in input order, and the full report of the
    rank `selection_key` puts first when the run kept it (in this process only)."""

    summaries: list[RankSummary]
    kept: dict[str, DeviceReport] = field(default_factory=dict)  # file -> full report


def summarize_many(paths: list[Path], workers: int | None = None,
                   rule_files: list[str] | None = None, capacity: int | None = None,
                   engine: str = "local", on_done: RankDone | None = None
                   ) -> list[RankSummary]:
    """Map summarize_file over the inputs with the chosen engine; order follows `paths`."""
    return run_many(paths, workers, rule_files, capacity, engine, on_done).summaries


def run_many(paths: list[Path], workers: int | None = None,
             rule_files: list[str] | None = None, capacity: int | None = None,
             engine: str = "local", on_done: RankDone | None = None,
             ruleset: RuleSet | None = None) -> RankRun:
    """Summaries of the inputs with the chosen engine; order follows `paths`. Worker
    processes load `rule_files` themselves; a run in this process uses `ruleset` when given
    (the same files, already loaded) and keeps the best rank's full report."""
    args = [str(p) for p in paths]
    if engine == "local" and (workers == 1 or len(args) == 1):
        return _run_here(args, ruleset if ruleset is not None else rule_files, capacity,
                         on_done)
    if engine == "dask":
        results = _map_dask(args, rule_files, capacity, workers)
    elif engine == "ray":
        results = _map_ray(args, rule_files, capacity)
    else:
        results = _map_local(args, rule_files, capacity, workers, on_done)
    return RankRun([RankSummary(**results[a]) for a in args])


def _run_here(args: list[str], rules: Any, capacity: int | None,
              on_done: RankDone | None) -> RankRun:
    """One input after another in this process, keeping only the full report of the best
    rank so far (`selection_key`): memory stays one report, not one per rank."""
    run = RankRun([])
    best: tuple[Any, str, DeviceReport] | None = None
    for a in args:
        summary, full = _analyse_file(a, rules, capacity)
        run.summaries.append(summary)
        if full is not None and (best is None or selection_key(summary) < best[0]):
            best = (selection_key(summary), a, full)
        if on_done:
            on_done(a, vars(summary))
    if best is not None:
        run.kept[best[1]] = best[2]
    return run


@contextmanager
def _no_working_directory() -> Iterator[None]:
    """Spawned workers import nothing from the working directory: a spawned interpreter
    starts as `python -c`, which puts the working directory first on its path (a `json.py`
    in an incident folder would run), and then takes the parent's path, which holds it too
    under `python -m snapana`. While the workers start: PYTHONSAFEPATH (Python 3.11's -P) for
    the first, the parent's path without it for the second."""
    cwd = os.getcwd()
    saved_env, saved_path = os.environ.get("PYTHONSAFEPATH"), list(sys.path)
    os.environ["PYTHONSAFEPATH"] = "1"
    sys.path[:] = [p for p in sys.path if p not in ("", ".", cwd)]
    try:
        yield
    finally:
        sys.path[:] = saved_path
        if saved_env is None:
            os.environ.pop("PYTHONSAFEPATH", None)
        else:
            os.environ["PYTHONSAFEPATH"] = saved_env


def _map_local(args: list[str], rule_files: list[str] | None, capacity: int | None,
               workers: int | None, on_done: RankDone | None) -> dict[str, dict[str, Any]]:
    workers = workers or os.cpu_count() or 1
    results: dict[str, dict[str, Any]] = {}
    # Spawned, not forked: polars' thread pool does not survive a fork. (No
    # max_tasks_per_child: Python 3.11's executor can hang replacing retired workers.)
    with _no_working_directory(), ProcessPoolExecutor(
            max_workers=min(workers, len(args)),
            mp_context=multiprocessing.get_context("spawn"),
            initializer=die_with_parent, initargs=(os.getpid(),)) as pool:
        try:
            with _interrupts_held():  # submitting starts the workers
                futures = {pool.submit(summarize_file, a, rule_files, capacity): a
                           for a in args}
            pending = set(futures)
            while pending:
                # woken twice a second: a signal the kernel gave another thread is only
                # handled (KeyboardInterrupt) when the main thread runs Python code
                done, pending = wait(pending, timeout=0.5, return_when=FIRST_COMPLETED)
                for fut in done:
                    a = futures[fut]
                    results[a] = fut.result()
                    if on_done:
                        on_done(a, results[a])
        except BaseException:  # Ctrl-C, an error: the workers stop now, not when done
            _stop(pool)
            raise
    return results


@contextmanager
def _interrupts_held() -> Iterator[None]:
    """Ctrl-C is held while the workers start, and comes right after: one interrupted in
    the middle of its start is not the pool's yet (`_stop` cannot kill it), and prints a
    traceback of its own when the pipe it reads its task from closes. (Python's handler is
    swapped for one that takes note: blocking the signal in this thread would not do, the
    kernel gives it to another and Python still raises it here.)"""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    came: list[int] = []
    before = signal.signal(signal.SIGINT, lambda signum, frame: came.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)
    if came and callable(before):
        before(signal.SIGINT, None)  # Python's own raises KeyboardInterrupt


def _stop(pool: ProcessPoolExecutor) -> None:
    """Kill the pool's workers and drop what is queued: leaving the pool would otherwise
    wait for every worker to finish its file."""
    for proc in list((getattr(pool, "_processes", None) or {}).values()):
        proc.kill()
    pool.shutdown(wait=False, cancel_futures=True)


def _map_dask(args: list[str], rule_files: list[str] | None, capacity: int | None,
              workers: int | None) -> dict[str, dict[str, Any]]:
    try:
        import dask.bag as db
    except ImportError:
        raise InputError("--engine dask needs dask: pip install 'snapana[dask]'") from None
    bag = db.from_sequence(args, npartitions=max(1, min(len(args), workers or len(args))))
    out = bag.map(summarize_file, rule_files, capacity).compute(
        scheduler="processes", num_workers=workers)
    return dict(zip(args, out, strict=True))


def _map_ray(args: list[str], rule_files: list[str] | None, capacity: int | None
             ) -> dict[str, dict[str, Any]]:
    try:
        import ray
    except ImportError:
        raise InputError("--engine ray needs ray: pip install 'snapana[ray]'") from None
    started = not ray.is_initialized()
    if started:
        ray.init(ignore_reinit_error=True)  # joins RAY_ADDRESS when set, else starts locally
    try:
        task = ray.remote(summarize_file)
        out = ray.get([task.remote(a, rule_files, capacity) for a in args])
    finally:
        if started:  # leave a caller's Ray as it was; disconnect from (or stop) our own
            ray.shutdown()
    return dict(zip(args, out, strict=True))


