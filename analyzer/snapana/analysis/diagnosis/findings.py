"""The findings: the typed, frozen vocabulary every renderer reads (a DeviceReport and its
parts). Only types live here; `diagnosis.py` computes them, and no renderer imports it.

Every figure in a DeviceReport is a sum over replayed blocks, so a test can recompute it from
the model. Shaping for display (downsampling, capping, wording) is the view-model's work
(`render/views.py`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import PurePath
from typing import Literal, TypedDict, TypeVar

import numpy as np
import polars as pl

from snapana.analysis.allocator_replay import KnobReplay, Prediction
from snapana.analysis.diagnosis.causes import Cause
from snapana.analysis.evidence import JobEvidence
from snapana.analysis.family_timeline import FamilyGrowth, FamilyTimeline
from snapana.analysis.knobs import Knob
from snapana.analysis.placement import SpareTerms
from snapana.analysis.replay import Moment, MomentKind
from snapana.analysis.size_groups import SizeGroup
from snapana.capture_kinds import CaptureKind
from snapana.model import Frame, StackTable

#: Whether a family can go: "yes" (kept by the step), "offload" (model state a knob moves),
#: "shrink" (working set of the op in flight), "no", or "unknown" (the unknown family, or one
#: whose lifetime is "undetermined": what it is for, and so whether it can go, is not known).
Removable = Literal["yes", "offload", "shrink", "no", "unknown"]
C = TypeVar("C", bound=Cause)

@dataclass(frozen=True)
class PoolFree:
    pool: str
    stream: int
    reserved_bytes: int  # mapped bytes when expandable: unmapped address space is not reserved
    free_bytes: int
    largest_free_bytes: int
    expandable: bool = False  # expandable segments: grows by mapping pages, see placement


class GroupSite(TypedDict):
    """One site of a family: bytes and blocks it holds, its usual label and rule."""

    site: str
    bytes: int
    blocks: int
    label: str | None
    rule_id: str | None


class ChunkLoop(TypedDict):
    """Live blocks one stack (one site, one loop) allocated repeatedly, in block bytes (what
    the family's bytes count). `uniform`: all the same size, so count × chunk_size == total."""

    site: str
    stack_id: int
    count: int
    chunk_size: int  # the most common size (== min_size == max_size when uniform)
    total: int
    uniform: bool
    min_size: int
    max_size: int


class PoolStreamBytes(TypedDict):
    pool: str
    stream: int
    bytes: int
    blocks: int


@dataclass(frozen=True)
class Group:
    """Bytes held by one tensor family, with its sites and any chunk loops in it."""

    name: str
    bytes: int
    blocks: int
    label: str = ""
    sites: tuple[GroupSite, ...] = ()
    chunks: tuple[ChunkLoop, ...] = ()
    inferred_bytes: int = 0  # of `bytes`, decided without a stack rule (evidence "inferred")
    #: Of `bytes`, how much each kind of evidence decided (inventory / frames / inferred /
    #: unknown), the most first.
    evidence: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True)
class Site:
    site: str
    bytes: int
    blocks: int
    stack: tuple[Frame, ...]
    family: str = ""


@dataclass(frozen=True)
class Band:
    """An annotation window (record_function range) on the trace clock, in µs."""

    name: str
    start: int
    end: int


@dataclass(frozen=True, eq=False)
class Timeline:
    """Live bytes after every event of the device's trace, at full resolution (a view
    downsamples it for display)."""

    allocated: np.ndarray  # allocated bytes after each event
    reserved: np.ndarray  # reserved bytes after each event
    times_us: np.ndarray | None  # each event's trace time; None: no clock (x is the index)
    oom_idx: int | None  # the event of the OOM that ended the job, if any
    peak_idx: int  # the event of the peak (-1: before the first event)
    peak_bytes: int
    bands: tuple[Band, ...]  # closed annotation windows (only on a clock)
    #: each family's live bytes over the trace (None without history)
    families: FamilyTimeline | None = None
    #: the families that held or gained most by the moment (see FamilyTimeline.dominant)
    growth: tuple[FamilyGrowth, ...] = ()
    #: each family's site that allocated the most bytes over the trace
    family_sites: Mapping[str, str] = field(default_factory=dict)
    #: the capture's stacks, to show the frames of a block of `families.lifetimes`
    stacks: StackTable | None = None
    #: each segment's life over the trace (address, total_size, pool, stream, open_idx,
    #: close_idx: the replay's `segment_intervals`); None where no segments are recorded
    segments: pl.DataFrame | None = None

    @property
    def n_events(self) -> int:
        return len(self.allocated)


@dataclass(frozen=True)
class OomFinding:
    """The failed allocation that ended the job (the last `oom` entry of the device)."""

    requested_bytes: int
    device_free_bytes: int | None
    gap_bytes: int | None  # requested minus device free: how far short the device was
    stream: int
    stack: tuple[Frame, ...]
    event_index: int
    count: int  # OOM entries in the device's trace


@dataclass(frozen=True)
class WhatIf:
    """The state at the moment without one family: would the request have fit?"""

    family: str
    bytes: int
    blocks: int
    fits: bool | None  # None at a peak: there is no failed request to place
    spare_bytes: int | None
    how: str
    removable: Removable
    #: Of `bytes`, those in private pools (not the pool the request needed): freeing them
    #: frees memory for that pool only, not for the request.
    private_pool_bytes: int = 0
    private_pools: tuple[str, ...] = ()
    #: Those private pools' reserved bytes: what the device gets back if the pools are released
    #: (an engine's sleep mode), and whether the request's new segment would then fit.
    private_pool_reserved_bytes: int = 0
    fits_if_pool_released: bool | None = None
    #: The terms `spare_bytes` is the sum of (placement.Fit.spare_terms), for the report.
    spare_terms: SpareTerms = ()

    @property
    def by_offload(self) -> bool:
        """It can go only by offloading (model state a knob moves)."""
        return self.removable == "offload"


@dataclass(frozen=True)
class FailedRequest:
    """The allocation that failed, as the allocator would have placed it."""

    bytes: int
    rounded_bytes: int  # rounded as the allocator rounds a block
    segment_bytes: int  # the segment it would have asked the device for
    family: str | None
    label: str | None
    site: str | None


@dataclass(frozen=True)
class Remedy:
    """What to take away first, and the cheapest alternative that also suffices."""

    excess_family: str | None = None  # the family to take away first: see `_excess`
    #: The cheapest family other than the first one whose removal also makes the request fit.
    alternative_family: str | None = None
    #: The failing request's family holds live copies from one loop (see `_accumulation`).
    accumulating: ChunkLoop | None = None
    #: The request placed without exactly those copies (the rest of the family kept).
    without_copies: WhatIf | None = None
    #: The knobs the verdict names for `excess_family` (for an accumulating family: the one
    #: that stops it) and for `alternative_family`; None where no knob of a framework in use
    #: applies. Both lead `knobs`.
    excess_knob: Knob | None = None
    alternative_knob: Knob | None = None


@dataclass(frozen=True)
class Advice:
    """The knobs offered, why each applies, and what a replay predicts of them."""

    knobs: tuple[Knob, ...] = ()
    #: Knob id -> why it applies to this job (the evidence its preconditions found).
    applies: Mapping[str, str] = field(default_factory=dict)
    #: The families the knobs were chosen for: at an OOM those whose removal makes the request
    #: fit, the request's own, or together enough for `shortfall_bytes`; else those holding at
    #: least `KNOB_SHARE` of the allocated bytes.
    knob_families: tuple[str, ...] = ()
    #: Knob id -> its allocator settings replayed over the recorded window (knobs with
    #: `simulate`, in a capture with history): what the model predicts, or why it does not
    replays: Mapping[str, KnobReplay] = field(default_factory=dict)
    #: Knob id -> the generic knobs folded into it (`knobs.fold_twins`): a framework's own
    #: knob for the mechanism they name, listed once under the framework's name
    same_as: Mapping[str, tuple[str, ...]] = field(default_factory=dict)


@dataclass(frozen=True)
class Standing:
    """Where the device stands against its capacity, and so whether anything is prescribed."""

    #: Capacity minus reserved at the moment (None: capacity unknown).
    headroom_bytes: int | None = None
    #: False when nothing needs fixing (no OOM, far from a known capacity; or host memory).
    prescribe: bool = True
    #: Nothing is allocated or reserved on the device: there is nothing to diagnose.
    empty: bool = False
    #: More than `LARGE_CACHE_SHARE` of reserved is cached but unallocated (see `large_cache`).
    large_cache: bool = False
    #: No OOM and under `SMALL_RESERVED` held: no knob is prescribed.
    small: bool = False
    #: Another device of the capture ran out of memory: this one is shown for comparison, and
    #: no knob is prescribed for it.
    failed_elsewhere: int | None = None


@dataclass(frozen=True)
class Diagnosis:
    """Why the allocation failed (or what the peak holds), what would have made it fit, and
    the knobs that change that. Grouped: the failed request, the remedy, the advice and the
    standing (the properties below read through them)."""

    kind: MomentKind
    phase: str
    request: FailedRequest | None
    capacity_bytes: int | None
    outside_pytorch_bytes: int | None
    causes: tuple[Cause, ...]
    what_ifs: tuple[WhatIf, ...]
    frameworks: tuple[str, ...]
    remedy: Remedy = Remedy()
    advice: Advice = Advice()
    standing: Standing = Standing()
    #: The OOM happened while reloading offloaded state: no offload knob is offered.
    reloading: bool = False
    #: The capture records allocation history (alloc/free events), not only the final state.
    history: bool = True
    #: "training", "inference" or "undetermined", decided from the evidence (see
    #: `analysis.evidence`); None: nothing in the capture speaks for any. Knobs only for the
    #: other workload are not offered; where undetermined, inference-only knobs come last.
    workload: str | None = None
    #: The job's evidence (workload, facts, owners of each family, allocator settings).
    evidence: JobEvidence | None = None
    #: At an OOM, how far the replayed state is from placing the request (0: it would fit).
    shortfall_bytes: int | None = None
    #: Without history: the live blocks grouped by size, related sizes together (what the
    #: sizes say when no event does); () where history was recorded.
    size_groups: tuple[SizeGroup, ...] = ()
    #: Without an OOM in the trace: what says the capture was written at one anyway (its
    #: sidecar's reason, its file name), in words; "" when nothing does.
    oom_named: str = ""
    #: Family -> the recorded window replayed without its allocations (at an OOM with
    #: history, for the what-if families; empty where the model does not reproduce it)
    whatif_replays: Mapping[str, Prediction] = field(default_factory=dict)

    @property
    def at_oom(self) -> bool:
        """The moment is the failed allocation (not a peak or the capture's end)."""
        return self.kind == "oom"

    @property
    def at_peak(self) -> bool:
        return self.kind == "peak"

    @property
    def at_time(self) -> bool:
        """The moment is a trace time the user chose (--at)."""
        return self.kind == "time"

    @property
    def phase_known(self) -> bool:
        """The frames place the moment in a phase (forward, backward, ...)."""
        return self.phase != "unknown"

    # ----- the groups' figures, read as before the grouping (#68)

    @property
    def request_bytes(self) -> int | None:
        return self.request.bytes if self.request else None

    @property
    def request_rounded_bytes(self) -> int | None:
        return self.request.rounded_bytes if self.request else None

    @property
    def request_segment_bytes(self) -> int | None:
        return self.request.segment_bytes if self.request else None

    @property
    def request_family(self) -> str | None:
        return self.request.family if self.request else None

    @property
    def request_label(self) -> str | None:
        return self.request.label if self.request else None

    @property
    def request_site(self) -> str | None:
        return self.request.site if self.request else None

    @property
    def excess_family(self) -> str | None:
        return self.remedy.excess_family

    @property
    def alternative_family(self) -> str | None:
        return self.remedy.alternative_family

    @property
    def accumulating(self) -> ChunkLoop | None:
        return self.remedy.accumulating

    @property
    def without_copies(self) -> WhatIf | None:
        return self.remedy.without_copies

    @property
    def excess_knob(self) -> Knob | None:
        return self.remedy.excess_knob

    @property
    def alternative_knob(self) -> Knob | None:
        return self.remedy.alternative_knob

    @property
    def knobs(self) -> tuple[Knob, ...]:
        return self.advice.knobs

    @property
    def applies(self) -> Mapping[str, str]:
        return self.advice.applies

    @property
    def knob_families(self) -> tuple[str, ...]:
        return self.advice.knob_families

    @property
    def replays(self) -> Mapping[str, KnobReplay]:
        return self.advice.replays

    @property
    def same_as(self) -> Mapping[str, tuple[str, ...]]:
        return self.advice.same_as

    @property
    def headroom_bytes(self) -> int | None:
        return self.standing.headroom_bytes

    @property
    def prescribe(self) -> bool:
        return self.standing.prescribe

    @property
    def empty(self) -> bool:
        return self.standing.empty

    @property
    def large_cache(self) -> bool:
        return self.standing.large_cache

    @property
    def small(self) -> bool:
        return self.standing.small

    @property
    def failed_elsewhere(self) -> int | None:
        return self.standing.failed_elsewhere

    def cause(self, kind: type[C]) -> C | None:
        """The cause of that kind the diagnosis checked (None: not checked)."""
        return next((c for c in self.causes if isinstance(c, kind)), None)

    def __repr__(self) -> str:
        """One line (the findings are its attributes; a notebook saves the plain form)."""
        first = f", first {self.knobs[0].id}" if self.knobs else ""
        return (f"<snapana Diagnosis {self.kind} in the {self.phase} phase: excess "
                f"{self.excess_family}, {len(self.knobs)} knob(s){first}>")


@dataclass(frozen=True)
class Figures:
    """The device's bytes at the moment (and its peak), as the report states them."""

    reserved_bytes: int
    allocated_bytes: int
    pending_free_bytes: int
    #: None: not computable (the state at the moment cannot exist; a warning says why)
    cached_unallocated_bytes: int | None
    largest_free_block_bytes: int | None
    peak_allocated_bytes: int
    before_recording_bytes: int


@dataclass(frozen=True)
class Coverage:
    """What the capture records of the device, and so which figures the report can state."""

    has_segments: bool = True  # the source records allocator segments (pools, cached bytes)
    failed: bool = False  # this device's trace records an OOM (reports list it first)
    reserved_known: bool = True  # reserved is measured (segments or a reserved series)
    #: the trace is recorded but could not be replayed: the state is the snapshot's final one
    not_replayed: bool = False


@dataclass(frozen=True, eq=False)
class DeviceReport:
    """Everything a report shows about one device at its moment of interest."""

    path: str
    #: the kind of capture (its traits: `source.row`)
    source: CaptureKind
    device: int
    moment: Moment
    figures: Figures
    pools: tuple[PoolFree, ...]
    peak: Moment
    oom: OomFinding | None
    groups: tuple[Group, ...]
    by_pool_stream: tuple[PoolStreamBytes, ...]
    top_sites: tuple[Site, ...]
    timeline: Timeline
    segments: pl.DataFrame  # the segments at the moment (pool, stream, address, total_size)
    #: blocks live at the moment (allocated, pending free), with their family and evidence
    live_blocks: pl.DataFrame
    n_events: int
    warnings: tuple[str, ...]
    diagnosis: Diagnosis
    device_name: str = ""  # e.g. "host process" (memray), "GPU 0" / "CPU" (profiler)
    at: str | None = None  # the moment the user asked for (--at); None: the default moment
    coverage: Coverage = Coverage()
    #: some block of the capture (any device's) carries the stack that allocated it: stacks
    #: were recorded, whatever this device holds (one that holds nothing shows none)
    stacks_recorded: bool = False

    # ----- the groups' figures, read as before the grouping (#68)

    @property
    def reserved_bytes(self) -> int:
        return self.figures.reserved_bytes

    @property
    def allocated_bytes(self) -> int:
        return self.figures.allocated_bytes

    @property
    def pending_free_bytes(self) -> int:
        return self.figures.pending_free_bytes

    @property
    def cached_unallocated_bytes(self) -> int | None:
        return self.figures.cached_unallocated_bytes

    @property
    def largest_free_block_bytes(self) -> int | None:
        return self.figures.largest_free_block_bytes

    @property
    def peak_allocated_bytes(self) -> int:
        return self.figures.peak_allocated_bytes

    @property
    def before_recording_bytes(self) -> int:
        return self.figures.before_recording_bytes

    @property
    def has_segments(self) -> bool:
        return self.coverage.has_segments

    @property
    def failed(self) -> bool:
        return self.coverage.failed

    @property
    def reserved_known(self) -> bool:
        return self.coverage.reserved_known

    @property
    def not_replayed(self) -> bool:
        return self.coverage.not_replayed

    @property
    def expandable(self) -> bool:
        """The default pool's segments are expandable (`expandable_segments:True`)."""
        return any(p.expandable for p in self.pools if p.pool == "0,0")

    def __repr__(self) -> str:
        """One line: which device, which moment, how much (the findings are attributes)."""
        return (f"<snapana DeviceReport {PurePath(self.path).name!r} device {self.device} at the "
                f"{self.moment.kind} (event {self.moment.idx}): {self.allocated_bytes:,} bytes "
                f"allocated, {self.reserved_bytes:,} reserved>")
