"""Many snapshots at once: one compact summary per input, made in worker processes, then
aggregated into a rank table (which rank failed first, which are outliers).

Each worker loads, analyses and reduces one file to a small dict, so the parent holds a few
kilobytes per rank and memory stays bounded by the files in flight, not their sum.
"""

from __future__ import annotations

import glob
import multiprocessing
import os
import re
import statistics
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from snapana.errors import InputError, SnapanaError

#: How ranks are spelled in snapshot file names (Megatron-Bridge `snapshot_oom_rank-3`,
#: `oom_rank3`, `rank_3`, `r3`), tried in order.
RANK_PATTERNS = (r"rank[-_]?(\d+)", r"(?:^|[-_.])r(\d+)(?:[-_.]|$)", r"(?:^|[-_.])(\d+)\.pickle")
#: A family is an outlier on a rank when it differs from the median of the ranks by more
#: than this share of the median and at least OUTLIER_MIN_BYTES.
OUTLIER_SHARE = 0.20
OUTLIER_MIN_BYTES = 256 << 20
SNAPSHOT_SUFFIXES = (".pickle", ".pkl", ".pickle.gz", ".pkl.gz", ".pt", ".snapshot")


def rank_of(path: Path) -> int | None:
    name = path.name.lower()
    for pattern in RANK_PATTERNS:
        m = re.search(pattern, name)
        if m:
            return int(m.group(1))
    return None


def expand_inputs(args: Iterable[str | Path]) -> list[Path]:
    """Files, directories (their snapshot files) and globs, in a stable order."""
    out: list[Path] = []
    for arg in args:
        p = Path(arg)
        if p.is_dir() and not (p / "snapana-export.json").exists():
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
    seen: set[Path] = set()
    return [p for p in out if not (p in seen or seen.add(p))]


@dataclass
class RankSummary:
    """What the aggregate needs from one input; everything else stays in the worker."""

    file: str
    rank: int | None
    error: str | None = None
    device: int | None = None
    devices: list[int] = field(default_factory=list)
    oom: dict[str, Any] | None = None
    reserved_bytes: int = 0
    allocated_bytes: int = 0
    peak_allocated_bytes: int = 0
    top_family: str | None = None
    families: dict[str, int] = field(default_factory=dict)
    verdict: str = ""
    settings: str = ""
    moment: str = ""


def summarize_file(path: str, rule_files: list[str] | None = None,
                   capacity: int | None = None) -> dict[str, Any]:
    """Worker: analyse one file and reduce it to a RankSummary dict (picklable, small)."""
    from snapana import sources
    from snapana.attribution import RuleError, load_rules
    from snapana.diagnosis import analyse
    from snapana.render.text import verdict

    p = Path(path)
    summary = RankSummary(file=str(p), rank=rank_of(p))
    try:
        capture = sources.load(p)
        reports = analyse(capture, rules=load_rules(rule_files or ()), capacity=capacity)
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
        summary.oom = {"requested_bytes": r.oom["requested_bytes"],
                       "device_free_bytes": r.oom["device_free_bytes"],
                       "event_index": r.oom["event_index"], "time_us": r.moment.time_us}
    settings = capture.allocator_settings or {}
    summary.settings = str(settings.get("PYTORCH_CUDA_ALLOC_CONF", "")) + (
        " expandable" if settings.get("expandable_segments") else "")
    return vars(summary)


Progress = Callable[[str, dict[str, Any]], None]


def summarize_many(paths: list[Path], workers: int | None = None,
                   rule_files: list[str] | None = None, capacity: int | None = None,
                   engine: str = "local", on_done: Progress | None = None
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
               workers: int | None, on_done: Progress | None) -> dict[str, dict[str, Any]]:
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


@dataclass
class MultiReport:
    """The aggregate over ranks: who failed first, who is unlike the others."""

    ranks: list[RankSummary]
    first_oom: RankSummary | None
    outliers: list[dict[str, Any]]
    families: list[str]
    one_job: bool
    why_not_one_job: list[str]

    @property
    def ok(self) -> list[RankSummary]:
        return [r for r in self.ranks if r.error is None]


def aggregate(ranks: list[RankSummary]) -> MultiReport:
    ok = [r for r in ranks if r.error is None]
    ranks = sorted(ranks, key=lambda r: (r.rank is None, r.rank if r.rank is not None else 0,
                                         r.file))
    failed = [r for r in ok if r.oom is not None]
    timed = [r for r in failed if r.oom and r.oom.get("time_us") is not None]
    if timed:
        first = min(timed, key=lambda r: r.oom["time_us"])
    else:
        first = min(failed, key=lambda r: (r.rank is None, r.rank or 0), default=None)
    totals: dict[str, int] = {}
    for r in ok:
        for fam, b in r.families.items():
            totals[fam] = totals.get(fam, 0) + b
    families = sorted(totals, key=lambda f: -totals[f])
    reasons = []
    if len({tuple(r.devices) for r in ok}) > 1:
        reasons.append("the files record different devices")
    if len({r.settings for r in ok}) > 1:
        reasons.append("the allocator settings differ")
    if sum(r.rank is None for r in ok) and len(ok) > 1:
        reasons.append("some file names carry no rank")
    ranks_seen = [r.rank for r in ok if r.rank is not None]
    if len(ranks_seen) != len(set(ranks_seen)):
        reasons.append("several files claim the same rank")
    outliers = []
    if len(ok) >= 3 and not reasons:  # ranks of unrelated jobs have no common median
        for fam in families:
            values = [r.families.get(fam, 0) for r in ok]
            median = statistics.median(values)
            for r, v in zip(ok, values, strict=True):
                if abs(v - median) > max(OUTLIER_SHARE * median, OUTLIER_MIN_BYTES):
                    outliers.append({"file": r.file, "rank": r.rank, "family": fam,
                                     "bytes": v, "median_bytes": int(median)})
    return MultiReport(ranks, first, outliers, families, not reasons, reasons)
