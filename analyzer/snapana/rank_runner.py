"""Many inputs at once: expand files, folders and globs, then reduce each input to a small
RankSummary in worker processes (local processes, dask or ray), so the parent holds a few
kilobytes per rank and memory stays bounded by the files in flight, not their sum.
"""

from __future__ import annotations

import glob
import multiprocessing
import os
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

from snapana.errors import InputError, SnapanaError
from snapana.ranks import RankSummary, rank_of
from snapana.sources.parquet_dir import MARKER as EXPORT_MARKER

SNAPSHOT_SUFFIXES = (".pickle", ".pkl", ".pickle.gz", ".pkl.gz", ".pt", ".snapshot")


def expand_inputs(args: Iterable[str | Path]) -> list[Path]:
    """Files, directories (their snapshot files) and globs, in a stable order."""
    out: list[Path] = []
    for arg in args:
        p = Path(arg)
        if p.is_dir() and not (p / EXPORT_MARKER).exists():
            found = sorted(f for f in p.iterdir()
                           if f.is_file() and f.name.lower().endswith(SNAPSHOT_SUFFIXES))
            if not found:
                raise InputError(f"{p}: no snapshot files (*.pickle) in this directory")
            out.extend(found)
        elif any(ch in str(arg) for ch in "*?[") and not p.exists():
            matches = sorted(Path(m) for m in glob.glob(str(arg)))
            if not matches:
                raise InputError(f"{arg}: no file matches")
            out.extend(matches)
        else:
            out.append(p)
    return list(dict.fromkeys(out))  # each input once, first mention wins


def summarize_file(path: str, rule_files: list[str] | None = None,
                   capacity: int | None = None) -> dict[str, Any]:
    """Worker: analyse one file and reduce it to a RankSummary dict (picklable, small)."""
    from snapana.attribution import RuleError
    from snapana.render.wording import verdict
    from snapana.session import analyse, open_capture

    p = Path(path)
    summary = RankSummary(file=str(p), rank=rank_of(p))
    try:
        capture = open_capture(p)
        reports = analyse(capture, rules=rule_files or (), capacity=capacity)
    except (SnapanaError, RuleError) as exc:
        summary.error = str(exc)
        return vars(summary)
    except Exception as exc:  # a worker must report, not die: one bad rank is not the job
        summary.error = f"{p}: could not analyse: {type(exc).__name__}: {exc}"
        return vars(summary)
    r = next((r for r in reports if r.oom is not None), reports[0])
    summary.device = r.device
    summary.devices = list(capture.devices)
    summary.reserved_bytes = r.reserved_bytes
    summary.allocated_bytes = r.allocated_bytes
    summary.peak_allocated_bytes = r.peak_allocated_bytes
    summary.families = {g.name: g.bytes for g in r.groups}
    summary.top_family = r.groups[0].name if r.groups else None
    summary.verdict = verdict(r)
    summary.moment = r.moment.kind
    if r.oom is not None:
        summary.oom = {"requested_bytes": r.oom.requested_bytes,
                       "device_free_bytes": r.oom.device_free_bytes,
                       "event_index": r.oom.event_index, "time_us": r.moment.time_us}
    settings = capture.allocator_settings or {}
    summary.settings = str(settings.get("PYTORCH_CUDA_ALLOC_CONF", "")) + (
        " expandable" if settings.get("expandable_segments") else "")
    return vars(summary)


#: Told of each input as its summary arrives (input path, summary dict).
RankDone = Callable[[str, dict[str, Any]], None]


def summarize_many(paths: list[Path], workers: int | None = None,
                   rule_files: list[str] | None = None, capacity: int | None = None,
                   engine: str = "local", on_done: RankDone | None = None
                   ) -> list[RankSummary]:
    """Map summarize_file over the inputs with the chosen engine; order follows `paths`."""
    args = [str(p) for p in paths]
    if engine == "dask":
        results = _map_dask(args, rule_files, capacity, workers)
    elif engine == "ray":
        results = _map_ray(args, rule_files, capacity)
    elif workers == 1 or len(args) == 1:
        results = {}
        for a in args:
            results[a] = summarize_file(a, rule_files, capacity)
            if on_done:
                on_done(a, results[a])
    else:
        results = _map_local(args, rule_files, capacity, workers, on_done)
    return [RankSummary(**results[a]) for a in args]


def _map_local(args: list[str], rule_files: list[str] | None, capacity: int | None,
               workers: int | None, on_done: RankDone | None) -> dict[str, dict[str, Any]]:
    workers = workers or os.cpu_count() or 1
    results: dict[str, dict[str, Any]] = {}
    # Spawned, not forked: polars' thread pool does not survive a fork. (No
    # max_tasks_per_child: Python 3.11's executor can hang replacing retired workers.)
    with ProcessPoolExecutor(max_workers=min(workers, len(args)),
                             mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = {pool.submit(summarize_file, a, rule_files, capacity): a for a in args}
        for fut in as_completed(futures):
            a = futures[fut]
            results[a] = fut.result()
            if on_done:
                on_done(a, results[a])
    return results


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


