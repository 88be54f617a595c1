"""Rank statistics over many inputs of one job: which rank ran out of memory first, which
rank a report shows in full (`shown_in_full`, the one rule every command uses), which
families are outliers against the median of the ranks. Pure functions over small summaries
(RankSummary), which the rank runner makes in worker processes."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from snapana.errors import InputError

if TYPE_CHECKING:
    from snapana.analysis.diagnosis.findings import DeviceReport

#: A family is an outlier on a rank when it differs from the median of the ranks by more
#: than this share of the median and at least OUTLIER_MIN_BYTES.
OUTLIER_SHARE = 0.20
OUTLIER_MIN_BYTES = 256 << 20


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
    settings: str = ""
    moment: str = ""
    #: Whether the capture recorded history, and the OOM its dump names where it records no
    #: allocation: what the rank table says of a rank with no OOM entry.
    history: bool = True
    oom_named: str = ""
    #: The findings of the device summarised, without the per-event series, segments and
    #: blocks (kilobytes): what the face words (each rank's verdict). Kept only where the
    #: run was asked for them (`runner.run_many(findings=True)`: thousands of ranks would
    #: hold thousands of them, and the table needs only the fields above); None when the
    #: input failed.
    findings: DeviceReport | None = None


def _order(r: RankSummary) -> tuple[bool, int, str]:
    """Ranks in rank order (inputs without a rank last), then by file."""
    return (r.rank is None, r.rank if r.rank is not None else 0, r.file)


def selection_key(r: RankSummary) -> tuple[Any, ...]:
    """The one rule for which rank a report shows in full, as a sort key (smallest first):
    the first rank to run out of memory (by the OOM's time when the traces share a clock,
    else by rank), else the rank with the largest peak, ties in rank order. Total, so a
    runner can keep the best so far without holding every rank."""
    time = r.oom.get("time_us") if r.oom is not None else None
    if r.oom is not None:
        return (0, time is None, time or 0, _order(r))
    return (1, False, -r.peak_allocated_bytes, _order(r))


@dataclass
class MultiReport:
    """The aggregate over ranks: who failed first, who is unlike the others."""

    ranks: list[RankSummary]
    first_oom: RankSummary | None
    outliers: list[dict[str, Any]]
    families: list[str]
    one_job: bool
    why_not_one_job: list[str]
    #: a line for each file of a named folder that is not an input, with why
    skipped: list[str] = field(default_factory=list)
    #: a line for each other capture of the folder read beside the snapshot shown in full
    #: (a profiler trace, a memray capture): what it gave, or why it could not be read
    beside: list[str] = field(default_factory=list)
    beside_failed: int = 0  # of those, how many could not be read

    @property
    def ok(self) -> list[RankSummary]:
        return [r for r in self.ranks if r.error is None]


def shown_in_full(m: MultiReport, rank: int | None = None) -> RankSummary | None:
    """The rank a report shows in full: `rank` when given (InputError when no analysed input
    has it), else the smallest `selection_key` (None: no input could be analysed)."""
    if rank is not None:
        chosen = next((r for r in m.ok if r.rank == rank), None)
        if chosen is None:
            raise InputError(f"--rank {rank}: no analysed input has that rank")
        return chosen
    return min(m.ok, key=selection_key, default=None)


def aggregate(ranks: list[RankSummary]) -> MultiReport:
    ok = [r for r in ranks if r.error is None]
    ranks = sorted(ranks, key=_order)
    first = min((r for r in ok if r.oom is not None), key=selection_key, default=None)
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
