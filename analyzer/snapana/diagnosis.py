"""Findings for one device of a capture: the numbers every renderer shows, computed once.

Findings are typed and frozen, and a DeviceReport is built whole (its diagnosis included).
Every figure in it is a sum over replayed blocks, so a test can recompute it from the model.
Shaping for display (downsampling the timeline, capping the segment map, wording) is the
view-model's work (`render/views.py`), not this module's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal, TypedDict, get_args

import numpy as np
import polars as pl

from snapana.attribution import chunk_groups, family_label
from snapana.attribution.assign import AnnotationWindows, Attributor
from snapana.attribution.chunks import LOOP_FAMILIES
from snapana.attribution.engine import RuleSet
from snapana.attribution.lifetimes import attribute_lifetimes
from snapana.family_timeline import FamilyGrowth, FamilyTimeline, family_timeline
from snapana.knobs import (
    Knob,
    best_knob,
    can_release,
    frameworks_in,
    knobs_for,
    preference,
    stop_knob,
    transient_families,
    working_set_families,
)
from snapana.model import Capture, Frame, StackTable
from snapana.placement import round_request, segment_size_for, would_fit
from snapana.replay import OVER_RESERVED, DeviceReplay, Moment
from snapana.units import fmt_bytes

CHUNK_MIN_BYTES = 16 << 20  # repeated blocks smaller than this are not worth calling chunks
LOOP_SIZE_SPREAD = 16  # a loop's copies differ in size by at most this factor
#: Fragmentation is the cause only when the cached-but-unallocated bytes are a real share of
#: what PyTorch reserved; below this the memory is genuinely in use (seed 000, S1 #3).
FRAGMENTATION_SHARE = 0.10
#: Memory outside PyTorch is a cause when it is at least this share of the device.
OUTSIDE_SHARE = 0.05
WHATIF_FAMILIES = 8
#: Knobs a diagnosis names (every format shows the same list, in this order).
MAX_KNOBS = 6
#: Without an OOM, a capture whose reserved memory is below this share of a known capacity is
#: far from it: the report states the headroom instead of prescribing a knob.
FAR_FROM_CAPACITY = 0.75

#: Why an allocation failed (the ``[[cause]]`` ids of ``attribution/packs/vocabulary.toml``).
CauseId = Literal["real_demand", "fragmentation", "private_pool", "outside_pytorch",
                  "capacity_unknown"]
#: Which moment a report shows: the OOM, the peak, the snapshot, or one asked for (--at).
MomentKind = Literal["oom", "peak", "snapshot", "event", "time"]
#: Whether a family can go: "yes" (kept by the step), "offload" (model state a knob moves),
#: "shrink" (working set of the op in flight) or "no".
Removable = Literal["yes", "offload", "shrink", "no"]

MOMENT_KINDS: tuple[MomentKind, ...] = get_args(MomentKind)


def moment_kind(m: Moment) -> MomentKind:
    """A replay Moment's kind as the Literal findings use (replay spells it as a str)."""
    if m.kind not in MOMENT_KINDS:
        raise ValueError(f"unknown moment kind {m.kind!r}")
    return m.kind


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
class Cause:
    """One reason the allocation failed, with the numbers that show it (bytes as ints)."""

    id: CauseId
    holds: bool
    numbers: Mapping[str, int | float | bool]


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


@dataclass(frozen=True)
class Diagnosis:
    kind: MomentKind
    phase: str
    request_bytes: int | None
    request_rounded_bytes: int | None
    request_segment_bytes: int | None
    request_family: str | None
    request_label: str | None
    request_site: str | None
    capacity_bytes: int | None
    outside_pytorch_bytes: int | None
    causes: tuple[Cause, ...]
    what_ifs: tuple[WhatIf, ...]
    excess_family: str | None  # the family to take away first: see _excess
    knobs: tuple[Knob, ...]
    frameworks: tuple[str, ...]
    #: The failing request's family holds live copies from one loop (see `_accumulation`).
    accumulating: ChunkLoop | None = None
    #: The cheapest family other than the first one whose removal also makes the request fit.
    alternative_family: str | None = None
    #: The knobs the verdict names for `excess_family` (for an accumulating family: the one
    #: that stops it) and for `alternative_family`; None where no knob of a framework in use
    #: applies. Both lead `knobs`.
    excess_knob: Knob | None = None
    alternative_knob: Knob | None = None
    #: The OOM happened while reloading offloaded state: no offload knob is offered.
    reloading: bool = False
    #: Capacity minus reserved at the moment (None: capacity unknown).
    headroom_bytes: int | None = None
    #: False when nothing needs fixing (no OOM, far from a known capacity; or host memory).
    prescribe: bool = True
    #: The capture records allocation history (alloc/free events), not only the final state.
    history: bool = True

    def cause(self, cause_id: CauseId) -> Cause | None:
        return next((c for c in self.causes if c.id == cause_id), None)


@dataclass(frozen=True, eq=False)
class DeviceReport:
    """Everything a report shows about one device at its moment of interest."""

    path: str
    source: str
    device: int
    moment: Moment
    reserved_bytes: int
    allocated_bytes: int
    pending_free_bytes: int
    #: None: not computable (the state at the moment cannot exist; a warning says why)
    cached_unallocated_bytes: int | None
    largest_free_block_bytes: int | None
    pools: tuple[PoolFree, ...]
    peak_allocated_bytes: int
    peak: Moment
    oom: OomFinding | None
    groups: tuple[Group, ...]
    by_pool_stream: tuple[PoolStreamBytes, ...]
    top_sites: tuple[Site, ...]
    timeline: Timeline
    segments: pl.DataFrame  # the segments at the moment (pool, stream, address, total_size)
    live_blocks: pl.DataFrame  # blocks live at the moment (allocated, pending free), by family
    n_events: int
    warnings: tuple[str, ...]
    before_recording_bytes: int
    diagnosis: Diagnosis
    device_name: str = ""  # e.g. "host process" (memray), "GPU 0" / "CPU" (profiler)
    at: str | None = None  # the moment the user asked for (--at); None: the default moment
    has_segments: bool = True  # the source records allocator segments (pools, cached bytes)
    failed: bool = False  # this device's trace records an OOM (reports list it first)
    reserved_known: bool = True  # reserved is measured (segments or a reserved series)

    @property
    def total_blocks(self) -> int:
        return sum(g.blocks for g in self.groups)


@dataclass(frozen=True, eq=False)
class _State:
    """The allocator state at the moment, as diagnosis reads it."""

    moment: Moment
    live: pl.DataFrame  # allocated and pending-free blocks: both occupy their segment
    held: pl.DataFrame  # allocated blocks, attributed
    segments: pl.DataFrame
    pools: tuple[PoolFree, ...]
    groups: tuple[Group, ...]
    reserved: int
    allocated: int
    pending_free: int  # freed, waiting on another stream: still in its segment, not reusable
    #: why the state at the moment cannot exist (see `_impossible`); None: it can
    impossible: str | None = None

    @property
    def cached_unallocated(self) -> int:
        """The one definition: reserved = allocated + pending free + cached unallocated, so
        the report's figures add up (and equal the pools' free bytes)."""
        return self.reserved - self.allocated - self.pending_free


def device_report(capture: Capture, dr: DeviceReplay, attributor: Attributor,
                  capacity: int | None = None, at: str | None = None) -> DeviceReport:
    history = _has_history(capture, dr)
    peak, peak_bytes = _peak(dr, history)
    moment = dr.resolve(at)
    if at is None and not history and dr.oom is None:
        moment = dr.final  # nothing was recorded before it: the snapshot is the state
    elif at is None and moment.kind == "peak":
        moment = peak
    live = dr.blocks_at(moment)
    held = attributor.attribute(live.filter(pl.col("state") == "active_allocated"))
    reserved = dr.reserved_at(moment)
    if capacity is not None:
        _check_capacity(capture, dr, moment, capacity, reserved)
    allocated = int(held["size"].sum())
    pending = int(live.filter(pl.col("state") == "active_pending_free")["size"].sum())
    segments = dr.segments_at(moment)
    pools = _pools(segments, dr.free_blocks_at(moment))
    oom = None
    if moment.kind == "oom" and dr.oom is not None:
        o = dr.oom
        oom = OomFinding(
            requested_bytes=o.requested_bytes,
            device_free_bytes=o.device_free_bytes,
            gap_bytes=None if o.device_free_bytes is None
            else o.requested_bytes - o.device_free_bytes,
            stream=o.stream,
            stack=capture.stacks.stack(o.stack_id),
            event_index=o.idx,
            count=len(dr.ooms),
        )
    impossible = _impossible(segments, live, pools, reserved - allocated - pending)
    state = _State(moment, live, held, segments, pools, _groups(held), reserved, allocated,
                   pending, impossible)
    diagnosis, caveats = diagnose(capture, dr, attributor, state, oom, capacity, history)
    if impossible is not None:
        caveats.insert(0, f"the state at this moment cannot exist ({impossible}): the "
                       "cached and free figures are not computable")
    # a snapshot records its segments even when there are none; a trace or a timeline does not
    segmented = not dr.segment_intervals.is_empty() or capture.source == "torch_snapshot"
    warnings = list(capture.warnings) + _replay_warnings(dr) + caveats
    return DeviceReport(
        path=capture.path,
        source=capture.source,
        device=dr.device,
        moment=moment,
        reserved_bytes=reserved,
        allocated_bytes=allocated,
        pending_free_bytes=state.pending_free,
        cached_unallocated_bytes=None if impossible else state.cached_unallocated,
        largest_free_block_bytes=None if impossible
        else max((p.largest_free_bytes for p in pools), default=0),
        pools=() if impossible else pools,
        peak_allocated_bytes=max(peak_bytes, allocated) if history else allocated,
        peak=peak if history else moment,
        oom=oom,
        groups=state.groups,
        by_pool_stream=_by_pool_stream(held),
        top_sites=_top_sites(capture, held),
        timeline=_timeline(capture, dr, peak, peak_bytes, attributor, held, moment,
                           (diagnosis.request_family, diagnosis.excess_family)),
        segments=segments,
        live_blocks=_with_family(live, held),
        n_events=dr.n_events,
        warnings=tuple(warnings),
        before_recording_bytes=int(held.filter(pl.col("alloc_idx") < 0)["size"].sum()),
        diagnosis=diagnosis,
        device_name=str(capture.metadata.get("device_names", {}).get(dr.device, "")),
        at=at,
        has_segments=segmented,
        reserved_known=segmented or dr.device in capture.metadata.get("reserved_timeline", {}),
        failed=dr.oom is not None,
    )


def _impossible(segments: pl.DataFrame, live: pl.DataFrame, pools: tuple[PoolFree, ...],
                cached: int) -> str | None:
    """Why the replayed state at a moment cannot be an allocator's, or None: segments that
    overlap, two live blocks at one address, more bytes live than reserved, a free block
    larger than all free bytes. Figures computed on such a state would be impossible
    (negative, or larger than their whole), so the report says "not computable" instead."""
    if cached < 0:
        return f"{-cached:,} bytes more live than reserved"
    if segments.height > 1:
        ordered = segments.sort("address")
        ends = (ordered["address"] + ordered["total_size"]).shift(1)
        if (ordered["address"] < ends).any():
            return "segments overlap"
    if live.height > 1 and live["address"].is_duplicated().any():
        return "several live blocks at one address"
    largest = max((p.largest_free_bytes for p in pools), default=0)
    if largest > cached:
        return f"a free block of {largest:,} bytes with {cached:,} bytes free"
    return None


def _with_family(live: pl.DataFrame, held: pl.DataFrame) -> pl.DataFrame:
    """The live blocks with the family of the allocated block at their address. One family
    per address (the first), so the join is one-to-one: an inconsistent capture can hold
    several live blocks at one address, and joining on a repeated key multiplies rows."""
    families = held.select("address", "family").unique("address", keep="first",
                                                        maintain_order=True)
    return live.join(families, on="address", how="left", maintain_order="left")


def _replay_warnings(dr: DeviceReplay) -> list[str]:
    """Where the replay found the capture at odds with itself: figures that cannot add up
    get their own warning, then the block and the segment disagreements, one line each."""
    out = [f"the figures are inconsistent ({m}): reserved and cached bytes are not to be "
           "trusted" for m in dr.mismatches if m.startswith(OVER_RESERVED)]
    blocks = [m for m in dr.mismatches if not m.startswith(OVER_RESERVED)]
    for what, found in (("replay disagrees with the final segments", blocks),
                        ("the trace's segment events disagree with each other or with the "
                         "final segments", dr.segment_mismatches)):
        if found:
            out.append(f"{what} in {len(found)} place(s), e.g. {found[0]}")
    return out


def _has_history(capture: Capture, dr: DeviceReplay) -> bool:
    """Whether the device's trace records allocations, not just the final state."""
    return dr.n_events > 0 and bool(
        (capture.device_events(dr.device)["action"] == "alloc").any())


def _peak(dr: DeviceReplay, history: bool) -> tuple[Moment, int]:
    """The peak of allocated bytes, counted as everywhere else: blocks in use, not blocks
    already freed and waiting on a stream (pending free)."""
    before = dr.lifetimes.filter((pl.col("alloc_idx") < 0) & (pl.col("free_req_idx") >= 0))
    base = int(before["size"].sum())
    if not history or dr.n_events == 0 or base > int(dr.allocated.max()):
        return Moment("peak", -1), base
    i = int(np.argmax(dr.allocated))
    return dr.at(i, "peak"), int(dr.allocated[i])


def _check_capacity(capture: Capture, dr: DeviceReplay, moment: Moment, capacity: int,
                    reserved: int) -> None:
    """A device capacity that contradicts the capture would make every "outside PyTorch"
    figure negative: refuse it rather than print it."""
    from snapana.errors import InputError

    where = f"device {dr.device} at event {moment.idx}"
    if capacity < reserved:
        raise InputError(f"capacity {fmt_bytes(capacity)} is less than the "
                         f"{fmt_bytes(reserved)} PyTorch itself reserved on {where}")
    if moment.kind == "oom" and dr.oom is not None and dr.oom.device_free_bytes is not None:
        floor = reserved + dr.oom.device_free_bytes
        if capacity < floor:
            raise InputError(f"capacity {fmt_bytes(capacity)} is less than reserved + device "
                             f"free at the OOM ({fmt_bytes(floor)}) on device {dr.device}")


def diagnose(capture: Capture, dr: DeviceReplay, attributor: Attributor, state: _State,
             oom: OomFinding | None, capacity: int | None,
             history: bool = True) -> tuple[Diagnosis, list[str]]:
    """Why it failed, what would have made it fit, and which knobs change that; with the
    warnings the diagnosis adds to the report (its input is left as it was)."""
    moment = state.moment
    segments, live, held = state.segments, state.live, state.held
    rules = attributor.rules  # the built-in packs plus any --rules file: knobs and markers too
    frameworks = sorted(frameworks_in(sorted({f[0] for f in capture.stacks.frames}), rules))
    fw = set(frameworks)
    request = req_family = req_label = req_site = None
    phase = _dominant_phase(held)
    outside = None
    causes: list[Cause] = []
    what_ifs: list[WhatIf] = []
    warnings: list[str] = []
    excess = alternative = None
    excess_knob = alternative_knob = None
    accumulating: ChunkLoop | None = None
    reloading = False
    lead: list[Knob] = []
    if oom is not None and dr.oom is not None:
        o = dr.oom
        request = o.requested_bytes
        ctx = attributor.context(o.stack_id, "0,0", o.stream, "active_allocated", request,
                                 o.idx)
        decision = attributor.decide(o.stack_id, ctx)
        req_family, req_label, phase = decision.family, decision.label, decision.phase
        req_site = attributor.site(o.stack_id)
        reloading = _reloading(attributor.rules.explain(capture.stacks.stack(o.stack_id), ctx)
                               .phase_rule_id)
        device_free = o.device_free_bytes or 0
        if capacity is not None and o.device_free_bytes is not None:
            outside = capacity - state.reserved - o.device_free_bytes
        causes = _causes(state, request, device_free, capacity, outside)
        baseline = would_fit(request, device_free, segments, live, stream=o.stream)
        if baseline.fits:
            warnings.append(
                "the replayed state would have fit the request: device_free or the "
                "segments at the OOM are incomplete, so what-ifs are approximate"
            )
        shown = list(state.groups[:WHATIF_FAMILIES])
        shown += [g for g in state.groups[WHATIF_FAMILIES:] if g.name == req_family]
        for g in shown:
            mine = held.filter(pl.col("family") == g.name)
            without = live.filter(~pl.col("address").is_in(mine["address"].implode()))
            fit = would_fit(request, device_free, segments, without, stream=o.stream)
            private = mine.filter(pl.col("pool") != "0,0")
            pools = tuple(sorted(set(private["pool"].to_list())))
            released = sum(p.reserved_bytes for p in state.pools if p.pool in pools)
            what_ifs.append(WhatIf(
                g.name, g.bytes, g.blocks, fit.fits, fit.spare_bytes, fit.how,
                _removable(g.name, fw, rules), int(private["size"].sum()), pools, released,
                segment_size_for(request) <= device_free + released if pools else None))
        accumulating = _accumulation(state.groups, req_family, o.stack_id)
        stop = (stop_knob(req_family, fw, phase, rules, offload=not reloading)
                if accumulating is not None and req_family else None)
        if accumulating is not None:
            excess, excess_knob = req_family, stop
        else:
            excess, excess_knob = _excess(what_ifs, fw, phase, rules, not reloading)
        alternative, alternative_knob = _excess([w for w in what_ifs if w.family != excess],
                                                fw, phase, rules, not reloading,
                                                avoid=excess_knob)
        lead = [k for k in (excess_knob, alternative_knob) if k is not None]
        what_ifs.sort(key=lambda w: (w.family != excess, w.family != alternative))
    else:
        for g in state.groups[:WHATIF_FAMILIES]:
            what_ifs.append(WhatIf(g.name, g.bytes, g.blocks, None, None, "peak lower by",
                                   _removable(g.name, fw, rules)))
    headroom = capacity - state.reserved if capacity is not None else None
    prescribe = dr.device >= 0 and (
        oom is not None or headroom is None or capacity is None
        or state.reserved >= FAR_FROM_CAPACITY * capacity)
    order = ([excess] if excess else []) + ([req_family] if req_family else [])
    order += [w.family for w in what_ifs if w.removable != "no" and w.fits]
    order += [w.family for w in what_ifs if w.removable != "no"]
    order = list(dict.fromkeys(order))
    held_causes: list[str] = [c.id for c in causes if c.holds]
    knobs = list(dict.fromkeys(
        lead + knobs_for(order, held_causes, fw, phase, rules, offload=not reloading)))
    diagnosis = Diagnosis(
        kind=moment_kind(moment), phase=phase, request_bytes=request,
        request_rounded_bytes=round_request(request) if request is not None else None,
        request_segment_bytes=segment_size_for(request) if request is not None else None,
        request_family=req_family, request_label=req_label, request_site=req_site,
        capacity_bytes=capacity, outside_pytorch_bytes=outside, causes=tuple(causes),
        what_ifs=tuple(what_ifs), excess_family=excess,
        excess_knob=excess_knob if prescribe else None,
        alternative_knob=alternative_knob if prescribe else None,
        knobs=tuple(knobs[:MAX_KNOBS]) if prescribe else (),
        frameworks=tuple(frameworks), accumulating=accumulating,
        alternative_family=alternative, reloading=reloading, headroom_bytes=headroom,
        prescribe=prescribe, history=history,
    )
    return diagnosis, warnings


def _reloading(phase_rule_id: str | None) -> bool:
    """The phase rule that named the OOM's phase marks reloading offloaded state: packs name
    such rules ``<pack>.phase_reload_*`` (verl, ms-swift: load_megatron_model_to_gpu)."""
    return phase_rule_id is not None and \
        phase_rule_id.rsplit(".", 1)[-1].startswith("phase_reload")


def _accumulation(groups: tuple[Group, ...], family: str | None,
                  stack_id: int) -> ChunkLoop | None:
    """The live copies the failing request's own family already holds from one loop: the
    loop of the request's own stack if it has one, else the family's largest."""
    group = next((g for g in groups if g.name == family), None)
    if group is None or not group.chunks:
        return None
    same = [c for c in group.chunks if c["stack_id"] == stack_id]
    return (same or list(group.chunks))[0]


def _removable(family: str, frameworks: set[str], rules: RuleSet) -> Removable:
    if family in transient_families():
        return "yes"
    if family in working_set_families():
        return "shrink"
    if family != "unknown" and can_release(family, frameworks, rules):
        return "offload"
    return "no"


_REMOVABLE_ORDER = {"yes": 0, "offload": 1}


def _excess(what_ifs: list[WhatIf], frameworks: set[str], phase: str, rules: RuleSet,
            offload: bool = True, avoid: Knob | None = None) -> tuple[str | None, Knob | None]:
    """The cheapest sufficient fix: among families that can go (step-transient, or model
    state an offload knob of a framework in use moves) and whose removal makes the request
    fit, the one whose knob ranks first (`knobs.preference`: a framework's own, lowering
    rather than bounding, cheapest cost class); then one that can go before model state, and
    the smallest. With ``offload=False`` (reloading offloaded state) an offload knob does not
    count, but the family still can go: it is state the offload should have moved. A family
    in a private pool counts when releasing its pool would fit the request and a knob
    releases it. Returns the family and the knob to name for it (None: none applies). A
    family whose knob would be `avoid` (the one already named) is no alternative."""
    best: tuple[tuple[bool, bool, int, int, int], str, Knob | None] | None = None
    for w in what_ifs:
        if w.removable not in _REMOVABLE_ORDER:
            continue
        if w.fits:
            k = best_knob(w.family, frameworks, phase, rules, offload=offload)
            if w.removable == "offload" and not offload:
                k = None  # offloading is the path that failed: no knob, still the state
        elif w.fits_if_pool_released:  # only if a knob releases its pool (engine sleep)
            k = next((k for k in knobs_for([w.family], [], frameworks, phase, rules,
                                           offload=offload) if k.direction == "releases"), None)
            if k is None:
                continue
        else:
            continue
        if avoid is not None and k == avoid:
            continue
        key = preference(k)[:3] if k is not None else (True, True, 9)
        rank = (*key, _REMOVABLE_ORDER[w.removable], w.bytes)
        if best is None or rank < best[0]:
            best = (rank, w.family, k)
    return (best[1], best[2]) if best else (None, None)


def _dominant_phase(held: pl.DataFrame) -> str:
    """At a peak there is no failing stack: name the phase most of the live bytes come from,
    ignoring blocks that predate recording."""
    recent = held.filter(pl.col("alloc_idx") >= 0)
    if recent.is_empty():
        return "unknown"
    by = recent.group_by("phase").agg(pl.col("size").sum()).sort("size", descending=True)
    return str(by["phase"][0])


def _causes(state: _State, request: int, device_free: int, capacity: int | None,
            outside: int | None) -> list[Cause]:
    rounded = round_request(request)
    default_free = [p for p in state.pools if p.pool == "0,0"]
    usable_free = sum(p.free_bytes for p in default_free)
    usable_largest = max((p.largest_free_bytes for p in default_free), default=0)
    other_free = sum(p.free_bytes for p in state.pools if p.pool != "0,0")
    cached = state.cached_unallocated
    share = cached / state.reserved if state.reserved and not state.impossible else 0.0
    fits_if_compacted = rounded <= device_free + usable_free
    fragmentation = (fits_if_compacted and usable_largest < rounded
                     and share >= FRAGMENTATION_SHARE)
    if state.impossible:  # cached figures are not computable: no fragmentation verdict
        fragmentation = False
    causes = [
        # Natural signs: "short by" is request minus device free (the headline's figure);
        # what compaction of the request's pool would leave is short or spare, never negative.
        Cause("real_demand", not fits_if_compacted or not fragmentation, {
            "requested_bytes": request, "device_free_bytes": device_free,
            "short_by_bytes": max(0, request - device_free),
            "allocated_bytes": state.allocated,
            **({} if state.impossible else {"cached_unallocated_bytes": cached}),
            "default_pool_free_bytes": usable_free,
            "short_after_compaction_bytes": max(0, rounded - device_free - usable_free),
            "spare_after_compaction_bytes": max(0, device_free + usable_free - rounded),
        }),
        *(() if state.impossible else (Cause("fragmentation", fragmentation, {
            "cached_unallocated_bytes": cached, "cached_share": round(share, 4),
            "share_threshold": FRAGMENTATION_SHARE,
            "largest_free_block_bytes": usable_largest, "rounded_request_bytes": rounded,
            "fits_if_compacted": fits_if_compacted,
        }),)),
        Cause("private_pool", other_free > 0 and rounded <= device_free + usable_free
              + other_free and not fits_if_compacted, {
            "private_pool_free_bytes": other_free, "default_pool_free_bytes": usable_free,
        }),
    ]
    if capacity is None or outside is None:
        causes.append(Cause("capacity_unknown", False, {}))
    else:
        causes.append(Cause("outside_pytorch", outside >= max(rounded, OUTSIDE_SHARE * capacity),
                            {"outside_pytorch_bytes": outside, "capacity_bytes": capacity,
                             "share": round(outside / capacity, 4) if capacity else 0.0}))
    return causes


def _pools(segments: pl.DataFrame, free: pl.DataFrame) -> tuple[PoolFree, ...]:
    """Reserved, free and largest free block per pool and stream; they add up to the device's
    reserved and cached-but-unallocated bytes (segments are disjoint: an expandable segment
    counts its mapped ranges once)."""
    out = []
    expandable = (pl.col("expandable").any() if "expandable" in segments.columns
                  else pl.lit(False)).alias("expandable")
    seg = segments.group_by("pool", "stream").agg(pl.col("total_size").sum().alias("reserved"),
                                                  expandable)
    fr = free.group_by("pool", "stream").agg(
        pl.col("size").sum().alias("free"), pl.col("size").max().alias("largest")
    )
    joined = seg.join(fr, on=["pool", "stream"], how="left").fill_null(0).sort("pool", "stream")
    for pool, stream, reserved, exp, free_b, largest in joined.select(
            "pool", "stream", "reserved", "expandable", "free", "largest").iter_rows():
        out.append(PoolFree(pool, int(stream), int(reserved), int(free_b), int(largest),
                            bool(exp)))
    return tuple(out)


def _groups(held: pl.DataFrame) -> tuple[Group, ...]:
    """Families first, then their sites; chunk loops (one site, many equal blocks) named."""
    inferred = (pl.col("evidence") == "inferred") if "evidence" in held.columns else pl.lit(False)
    agg = (
        held.group_by("family")
        .agg(pl.col("size").sum().alias("bytes"), pl.len().alias("blocks"),
             pl.col("size").filter(inferred).sum().alias("inferred"))
        .sort(["bytes", "family"], descending=[True, False])
    )
    groups = []
    for name, nbytes, blocks, inferred_bytes in agg.iter_rows():
        mine = held.filter(pl.col("family") == name)
        sub = (
            mine.group_by("site")
            .agg(pl.col("size").sum().alias("bytes"), pl.len().alias("blocks"),
                 pl.col("label").mode().first().alias("label"),
                 pl.col("rule_id").mode().first().alias("rule_id"))
            .sort(["bytes", "site"], descending=[True, False])
        )
        sites = tuple(
            GroupSite(site=site, bytes=int(b), blocks=int(n), label=label, rule_id=rule_id)
            for site, b, n, label, rule_id in sub.iter_rows()
        )
        chunks = _loops(str(name), mine)
        groups.append(Group(str(name), int(nbytes), int(blocks), label=family_label(name),
                            sites=sites, chunks=chunks, inferred_bytes=int(inferred_bytes or 0)))
    return tuple(groups)


def _loops(family: str, mine: pl.DataFrame) -> tuple[ChunkLoop, ...]:
    """Repeated live blocks of one stack (same site, same loop) in a family whose repeats are
    a loop's copies (`LOOP_FAMILIES`), in block bytes so they add up to the family's bytes;
    largest first. A site without a source frame (a profiler op, a timeline category, no
    frames) is not a loop, nor are blocks of wildly different sizes."""
    if family not in LOOP_FAMILIES:
        return ()
    sites = dict(mine.select("stack_id", "site").iter_rows())
    return tuple(
        ChunkLoop(site=site, stack_id=int(str(g.site_key)), count=g.count,
                  chunk_size=g.chunk_size, total=g.total, uniform=g.uniform,
                  min_size=g.min_size, max_size=g.max_size)
        for g in chunk_groups(mine.select("stack_id", "family", "size", "alloc_idx").iter_rows(),
                              min_count=2)
        for site in [str(sites.get(g.site_key) or "")]
        if g.chunk_size >= CHUNK_MIN_BYTES and site and not site.startswith("<")
        and g.max_size <= LOOP_SIZE_SPREAD * g.min_size
    )


def _by_pool_stream(held: pl.DataFrame) -> tuple[PoolStreamBytes, ...]:
    agg = (
        held.group_by("pool", "stream")
        .agg(pl.col("size").sum().alias("bytes"), pl.len().alias("blocks"))
        .sort(["bytes", "pool", "stream"], descending=[True, False, False])
    )
    return tuple(PoolStreamBytes(pool=pool, stream=stream, bytes=b, blocks=n)
                 for pool, stream, b, n in agg.iter_rows())


def _top_sites(capture: Capture, held: pl.DataFrame, limit: int = 15) -> tuple[Site, ...]:
    agg = (
        held.group_by("site")
        .agg(
            pl.col("size").sum().alias("bytes"),
            pl.len().alias("blocks"),
            pl.col("stack_id").sort_by("size", descending=True).first().alias("stack_id"),
            pl.col("family").mode().first().alias("family"),
        )
        .sort(["bytes", "site"], descending=[True, False])
        .head(limit)
    )
    return tuple(
        Site(site, int(b), int(n), capture.stacks.stack(int(sid)), family)
        for site, b, n, sid, family in agg.iter_rows()
    )


def _timeline(capture: Capture, dr: DeviceReplay, peak: Moment, peak_bytes: int,
              attributor: Attributor, held: pl.DataFrame, moment: Moment,
              named: tuple[str | None, ...]) -> Timeline:
    """The live-bytes series of the whole trace, per family too (with the growth of the
    dominant families and of those the verdict `named`), the events of the OOM and the
    peak, and on a clock the annotation windows; a view downsamples it."""
    on_clock = capture.has_time and dr.n_events > 0
    times = None
    bands: tuple[Band, ...] = ()
    if on_clock:
        col = capture.device_events(dr.device)["time_us"].fill_null(strategy="forward")
        times = col.fill_null(strategy="backward").to_numpy()
        bands = tuple(Band(name, start, end)
                      for start, end, name in AnnotationWindows(capture, dr.device).windows
                      if end < AnnotationWindows.OPEN_END)
    families, growth, sites = _families(dr, attributor, held, moment, peak, named)
    return Timeline(
        allocated=dr.allocated,
        reserved=dr.reserved,
        times_us=times,
        oom_idx=dr.oom.idx if dr.oom is not None else None,
        peak_idx=peak.idx,
        peak_bytes=peak_bytes,
        bands=bands,
        families=families,
        growth=growth,
        family_sites=sites,
        stacks=capture.stacks,
    )


def _families(dr: DeviceReplay, attributor: Attributor, held: pl.DataFrame, moment: Moment,
              peak: Moment, named: tuple[str | None, ...]) -> tuple[
        FamilyTimeline | None, tuple[FamilyGrowth, ...], dict[str, str]]:
    """Each family's live bytes over the trace, the growth of the dominant and `named`
    families, and each family's top site (nothing without history)."""
    if not dr.n_events:
        return None, (), {}
    families = family_timeline(attribute_lifetimes(attributor, dr, held), dr.n_events)
    growth = families.dominant(moment.idx, peak.idx, dr.allocated_at(moment),
                               tuple(f for f in named if f))
    sites = {f: attributor.site(sid) for f, sid in families.top_stacks().items()}
    return families, growth, sites
