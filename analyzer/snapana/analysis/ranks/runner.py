"""Many inputs at once: each input (`inputs.resolve` made the list: kind, sidecar and rank
told once) reduced to a small RankSummary in worker processes (local processes, dask or
ray), so the parent holds a few kilobytes per rank and memory stays bounded by the files in
flight, not their sum. What reduces an input is the caller's (`session.summarize`, a
function of the layer above, given by reference so spawned workers import it themselves):
the runner only maps it.

Workers return findings (a RankSummary with the device's findings, minus the per-event
series), never wording: the face words and renders them. Run in this process, the runner also
keeps the full report of the rank `ranks.selection_key` puts first, so the rank shown in full
is not analysed twice; from worker processes only summaries travel, and the face analyses
that one rank again (the price of bounded memory).
"""

from __future__ import annotations

import multiprocessing
import os
import queue
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from snapana.analysis.ranks.aggregate import RankSummary, selection_key
from snapana.children import die_with_parent
from snapana.errors import InputError
from snapana.sources import decode_pool

if TYPE_CHECKING:
    from snapana.analysis.attribution.engine import RuleSet
    from snapana.analysis.diagnosis.findings import DeviceReport
    from snapana.inputs import Input

#: Reduces one input (rules: rule files or a loaded RuleSet; the capacity) to its summary
#: and the full report of the device it summarises (None: not analysed). A module-level
#: function: worker processes receive it by reference.
Summarize = Callable[["Input", Any, "int | None"],
                     "tuple[RankSummary, DeviceReport | None]"]


def summary_dict(inp: Input, summarize: Summarize, rule_files: list[str] | None,
                 capacity: int | None, findings: bool = False) -> dict[str, Any]:
    """Worker: one input's RankSummary as a dict (picklable, small); its findings only
    where asked for (they are most of its bytes)."""
    summary = summarize(inp, _rules(tuple(rule_files or ())), capacity)[0]
    if not findings:
        summary.findings = None
    return vars(summary)


@lru_cache(maxsize=1)
def _rules(files: tuple[str, ...]) -> Any:
    """The rules a worker's inputs are matched against, loaded once for all of them (as a
    run in this process shares its RuleSet, and with it what its matches memoise), not once
    per input; the files themselves where they cannot be loaded (`summarize` then says why
    in each input's row)."""
    from snapana.analysis.attribution.engine import RuleError, load_rules

    try:
        return load_rules(list(files))
    except RuleError:
        return list(files)


#: Told of each input as its summary arrives (input path, summary dict).
RankDone = Callable[[str, dict[str, Any]], None]


@dataclass
class RankRun:
    """The summaries of a run over many inputs, in input order, and the full report of the
    rank `selection_key` puts first when the run kept it (in this process only)."""

    summaries: list[RankSummary]
    kept: dict[str, DeviceReport] = field(default_factory=dict)  # file -> full report


def run_many(inputs: Sequence[Input], summarize: Summarize, workers: int | None = None,
             rule_files: list[str] | None = None, capacity: int | None = None,
             engine: str = "local", on_done: RankDone | None = None,
             ruleset: RuleSet | None = None, findings: bool = False) -> RankRun:
    """Summaries of the inputs by `summarize`, with the chosen engine; order follows
    `inputs`. Worker processes load `rule_files` themselves; a run in this process uses
    `ruleset` when given (the same files, already loaded) and keeps the best rank's full
    report. `findings`: each summary keeps its device's findings (to word its verdict);
    else they are dropped as it is made, so memory is the table's."""
    if engine == "local" and (workers == 1 or len(inputs) == 1):
        return _run_here(inputs, summarize, ruleset if ruleset is not None else rule_files,
                         capacity, on_done, findings)
    task = (summarize, rule_files, capacity, findings)  # summary_dict's, after the input
    if engine == "dask":
        results = _map_dask(inputs, task, workers)
    elif engine == "ray":
        results = _map_ray(inputs, task)
    else:
        results = _map_local(inputs, task, workers, on_done)
    return RankRun([RankSummary(**results[str(i.path)]) for i in inputs])


def _run_here(inputs: Sequence[Input], summarize: Summarize, rules: Any,
              capacity: int | None, on_done: RankDone | None, findings: bool) -> RankRun:
    """One input after another in this process, keeping only the full report of the best
    rank so far (`selection_key`): memory stays one report, not one per rank."""
    run = RankRun([])
    best: tuple[Any, str, DeviceReport] | None = None
    with decode_pool.kept():  # one decode process for the small files, not one each
        for inp in inputs:
            a = str(inp.path)
            summary, full = summarize(inp, rules, capacity)
            run.summaries.append(summary)
            if full is not None and (best is None or selection_key(summary) < best[0]):
                best = (selection_key(summary), a, full)
            if not findings:
                summary.findings = None
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


#: `summary_dict`'s arguments after the input: summarize, rule files, capacity, findings.
Task = tuple[Summarize, "list[str] | None", "int | None", bool]


def _map_local(inputs: Sequence[Input], task: Task, workers: int | None,
               on_done: RankDone | None) -> dict[str, dict[str, Any]]:
    workers = workers or os.cpu_count() or 1
    results: dict[str, dict[str, Any]] = {}
    # Spawned, not forked: polars' thread pool does not survive a fork. (No
    # max_tasks_per_child: Python 3.11's executor can hang replacing retired workers.)
    with _no_working_directory(), ProcessPoolExecutor(
            max_workers=min(workers, len(inputs)),
            mp_context=multiprocessing.get_context("spawn"),
            initializer=_worker_start, initargs=(os.getpid(),)) as pool:
        try:
            # each future says it is done on a queue: `wait` on the pending set would walk
            # all of them on every call, quadratic in thousands of ranks
            finished: queue.SimpleQueue[Future[dict[str, Any]]] = queue.SimpleQueue()
            futures: dict[Future[dict[str, Any]], str] = {}
            with _interrupts_held():  # submitting starts the workers
                for i in inputs:
                    fut = pool.submit(summary_dict, i, *task)
                    futures[fut] = str(i.path)
                    fut.add_done_callback(finished.put)
            for _ in futures:
                while True:
                    # woken twice a second: a signal the kernel gave another thread is only
                    # handled (KeyboardInterrupt) when the main thread runs Python code
                    try:
                        fut = finished.get(timeout=0.5)
                        break
                    except queue.Empty:
                        continue
                a = futures[fut]
                results[a] = fut.result()
                if on_done:
                    on_done(a, results[a])
        except BaseException:  # Ctrl-C, an error: the workers stop now, not when done
            _stop(pool)
            raise
    return results


def _worker_start(parent: int) -> None:
    """A rank worker dies with its parent, and decodes its many small files in one kept
    decode process (`decode_pool`), not a child each."""
    die_with_parent(parent)
    decode_pool.keep()


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


def _map_dask(inputs: Sequence[Input], task: Task, workers: int | None
              ) -> dict[str, dict[str, Any]]:
    try:
        import dask.bag as db
    except ImportError:
        raise InputError("--engine dask needs dask: pip install 'snapana[dask]'") from None
    n = len(inputs)
    bag = db.from_sequence(list(inputs), npartitions=max(1, min(n, workers or n)))
    out = bag.map(summary_dict, *task).compute(
        scheduler="processes", num_workers=workers)
    return dict(zip((str(i.path) for i in inputs), out, strict=True))


def _map_ray(inputs: Sequence[Input], task: Task) -> dict[str, dict[str, Any]]:
    try:
        import ray
    except ImportError:
        raise InputError("--engine ray needs ray: pip install 'snapana[ray]'") from None
    started = not ray.is_initialized()
    if started:
        ray.init(ignore_reinit_error=True)  # joins RAY_ADDRESS when set, else starts locally
    try:
        remote = ray.remote(summary_dict)
        out = ray.get([remote.remote(i, *task) for i in inputs])
    finally:
        if started:  # leave a caller's Ray as it was; disconnect from (or stop) our own
            ray.shutdown()
    return dict(zip((str(i.path) for i in inputs), out, strict=True))


