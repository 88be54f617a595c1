"""The diagnosis: the findings (`findings.py`) for one device of a capture at the moment the
session gives it, computed once.

A DeviceReport is built whole (its diagnosis included): why the allocation failed, which
families dominate, what-ifs and the knobs that change them. The types live in `findings.py`,
the vocabulary renderers read; this module is the algorithm.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import PurePath

import polars as pl

from snapana.allocator_model.rules import NPU_REQUEST_PAD, round_size, segment_size_for
from snapana.analysis.allocator_replay import offered_by_replay, replay_knobs, replay_without
from snapana.analysis.attribution.assign import Attributor
from snapana.analysis.attribution.engine import RuleSet
from snapana.analysis.diagnosis import moment_state as st
from snapana.analysis.diagnosis.causes import (
    CapacityUnknown,
    Cause,
    Demand,
    Fragmentation,
    LargeCache,
    OutsidePytorch,
    PrivatePool,
)
from snapana.analysis.diagnosis.findings import (
    Advice,
    ChunkLoop,
    Coverage,
    DeviceReport,
    Diagnosis,
    FailedRequest,
    Figures,
    Group,
    OomFinding,
    PoolFree,
    Remedy,
    Removable,
    Standing,
    WhatIf,
)
from snapana.analysis.evidence import JobEvidence, job_evidence
from snapana.analysis.knobs import (
    Knob,
    best_knob,
    can_release,
    fold_twins,
    frameworks_in,
    frees_in_phase,
    knobs_for,
    preference,
    reloads_offloaded,
    replay_candidates,
    stop_knob,
    transient_families,
    twin_words,
    undetermined_families,
    why_applies,
    working_set_families,
)
from snapana.analysis.placement import would_fit
from snapana.analysis.replay import OVER_RESERVED, DeviceReplay, Moment
from snapana.analysis.size_groups import size_groups
from snapana.caching_allocator import (
    ACTIVE_ALLOCATED,
    ACTIVE_PENDING_FREE,
    NPU_FRAME_MARK,
)
from snapana.model import EMPTY_STACK, Capture
from snapana.units import fmt_bytes

#: Fragmentation is the cause only when the cached-but-unallocated bytes are a real share of
#: what PyTorch reserved; below this the memory is genuinely in use (seed 000, S1 #3).
FRAGMENTATION_SHARE = 0.10
#: Memory outside PyTorch is a cause when it is at least this share of the device.
OUTSIDE_SHARE = 0.05
WHATIF_FAMILIES = 8
#: Knobs a diagnosis names (every format shows the same list, in this order).
MAX_KNOBS = 6
#: Without an OOM a knob is offered only for a family holding at least this share of the
#: allocated bytes at the moment: a knob for 0.2% of the peak is noise.
KNOB_SHARE = 0.10
#: Cached but unallocated above this share of reserved is worth saying, with what acts on it.
LARGE_CACHE_SHARE = 0.20
#: ... and at least this many bytes, where there is no shortfall to measure it against.
LARGE_CACHE_FLOOR = 1 << 30
#: Without an OOM, a device holding less than this (reserved and allocated) is smaller than
#: any GPU's memory by far: nothing needs to shrink, whatever the capacity.
SMALL_RESERVED = 1 << 30
#: Without an OOM, a capture whose reserved memory is below this share of a known capacity is
#: far from it: the report states the headroom instead of prescribing a knob.
FAR_FROM_CAPACITY = 0.75


@dataclass(frozen=True, eq=False)
class _AtMoment:
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


def device_report(capture: Capture, dr: DeviceReplay, attributor: Attributor, moment: Moment,
                  capacity: int | None = None, at: str | None = None) -> DeviceReport:
    """The findings at `moment` (the replay's: the session resolves it, this never does);
    `at` is what the user typed for it, shown as given (None: the moment of interest)."""
    history = dr.has_history
    peak, peak_bytes = dr.peak, dr.peak_allocated_bytes
    live = dr.blocks_at(moment)
    held = attributor.attribute(live.filter(pl.col("state") == ACTIVE_ALLOCATED))
    reserved = dr.reserved_at(moment)
    if capacity is not None:
        _check_capacity(capture, dr, moment, capacity, reserved)
    allocated = int(held["size"].sum())
    pending = int(live.filter(pl.col("state") == ACTIVE_PENDING_FREE)["size"].sum())
    segments = dr.segments_at(moment)
    pools = st.pools(segments, dr.free_blocks_at(moment))
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
    state = _AtMoment(moment, live, held, segments, pools, st.groups(held), reserved, allocated,
                      pending, impossible)
    lifetimes = st.lifetimes(dr, attributor, held, moment)
    extra = ({} if dr.oom is None or moment.kind != "oom" else
             {attributor.decide(dr.oom.stack_id, attributor.context(
                 dr.oom.stack_id, "0,0", dr.oom.stream, ACTIVE_ALLOCATED,
                 dr.oom.requested_bytes, dr.oom.idx)).family: [dr.oom.stack_id]})
    ev = job_evidence(capture, held, lifetimes, segments, live, attributor.rules, extra,
                      _devices_holding(capture), dr.n_events, attributor.free_phases)
    diagnosis, caveats = diagnose(capture, dr, attributor, state, oom, capacity, history, ev)
    if history:
        diagnosis = _replayed_knobs(capture, dr, diagnosis, attributor.rules, oom is not None)
    if history and oom is not None and lifetimes is not None and diagnosis.what_ifs:
        diagnosis = replace(diagnosis, whatif_replays=replay_without(
            capture, dr, lifetimes, [w.family for w in diagnosis.what_ifs]))
    if impossible is not None:
        caveats.insert(0, f"the state at this moment cannot exist ({impossible}): the "
                       "cached and free figures are not computable")
    # a snapshot records its segments even when there are none; a trace or a timeline does not
    segmented = not dr.segment_intervals.is_empty() or capture.source.row.allocator_segments
    warnings = list(capture.warnings) + _replay_warnings(dr) + caveats
    return DeviceReport(
        path=capture.path,
        source=capture.source,
        device=dr.device,
        moment=moment,
        figures=Figures(
            reserved_bytes=reserved,
            allocated_bytes=allocated,
            pending_free_bytes=state.pending_free,
            cached_unallocated_bytes=None if impossible else state.cached_unallocated,
            largest_free_block_bytes=None if impossible
            else max((p.largest_free_bytes for p in pools), default=0),
            peak_allocated_bytes=max(peak_bytes, allocated) if history else allocated,
            before_recording_bytes=int(held.filter(pl.col("alloc_idx") < 0)["size"].sum())),
        pools=() if impossible else pools,
        peak=peak if history else moment,
        oom=oom,
        groups=state.groups,
        by_pool_stream=st.by_pool_stream(held),
        top_sites=st.top_sites(capture, held),
        timeline=st.timeline(capture, dr, peak, peak_bytes, attributor, held, moment,
                           (diagnosis.request_family, diagnosis.excess_family), lifetimes),
        segments=segments,
        live_blocks=st.with_family(live, held),
        n_events=dr.n_events,
        warnings=tuple(warnings),
        diagnosis=diagnosis,
        device_name=_device_name(capture, dr),
        at=at,
        coverage=Coverage(
            has_segments=segmented,
            reserved_known=segmented or dr.device in capture.metadata.get("reserved_timeline",
                                                                          {}),
            failed=dr.oom is not None,
            not_replayed=dr.unreplayable is not None),
        stacks_recorded=bool(capture.blocks.height)
        and bool((capture.blocks["stack_id"].fill_null(EMPTY_STACK) != EMPTY_STACK).any()),
    )


def _replayed_knobs(capture: Capture, dr: DeviceReplay, d: Diagnosis, rules: RuleSet,
                    failed: bool) -> Diagnosis:
    """The knobs with allocator settings replayed over the recorded window: at a recorded
    OOM the replay decides those whose facts only argue its answer (`Knob.replay_decides`),
    offering one the replay shows removing the OOM and never one it shows does not, so the
    knob table and the causes tell one story; the order is the replay's (`offered_by_replay`)."""
    decided = [] if not (failed and d.prescribe) else [
        k for k in replay_candidates(list(d.knob_families), set(d.frameworks), d.phase, rules,
                                     offload=not d.reloading, workload=d.workload,
                                     ev=d.evidence)
        if k not in d.knobs]
    if not decided and not any(k.simulate for k in d.knobs):
        return d
    replays = replay_knobs(capture, dr, (*d.knobs, *decided))
    lead = [k for k in (d.excess_knob, d.alternative_knob) if k is not None]
    knobs = offered_by_replay(d.knobs, lead, decided, replays)[:MAX_KNOBS]
    applies = {k.id: d.applies.get(k.id) or _replay_applies(k, d) for k in knobs}
    return replace(d, advice=replace(d.advice, knobs=knobs, replays=replays, applies=applies))


def _replay_applies(k: Knob, d: Diagnosis) -> str:
    """Why a knob the replay alone offers applies: what the replay showed, and what the
    argument alone would have said (a sign it needs absent, or no cause it acts on held)."""
    facts = d.evidence.facts if d.evidence is not None else {}
    absent = [f for f in k.replay_decides if f not in facts]
    argued = (f"the sign it is argued from ({', '.join(absent)}) is absent" if absent else
              f"no cause it acts on ({', '.join(k.causes)}) holds by the cause checks")
    return (f"replayed with {', '.join(k.simulate)}, the recorded window runs without the "
            f"OOM: the replay decides, where {argued}")


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
    if live.height > 1 and segments.height:  # (a source without segments may make up
        ordered = live.sort("address")        # addresses: a profiler trace without Addr)
        ends = (ordered["address"] + ordered["size"]).shift(1)
        if (ordered["address"] < ends).any():
            return "live blocks overlap"
    largest = max((p.largest_free_bytes for p in pools), default=0)
    if largest > cached:
        return f"a free block of {largest:,} bytes with {cached:,} bytes free"
    free = sum(p.free_bytes for p in pools)
    if pools and free != cached:
        return (f"the pools' free bytes ({free:,}) differ from reserved less live "
                f"({cached:,})")
    return None


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


def _devices_holding(capture: Capture) -> int:
    """Devices of the capture that hold memory at its end: a segment or a live block."""
    held = set(capture.segments["device"].to_list()) if capture.segments.height else set()
    if capture.blocks.height:
        held |= set(capture.blocks["device"].to_list())
    return len(held)


def _check_capacity(capture: Capture, dr: DeviceReplay, moment: Moment, capacity: int,
                    reserved: int) -> None:
    """A device capacity that contradicts the capture would make every "outside PyTorch"
    figure negative: refuse it rather than print it."""
    from snapana.errors import InputError

    where = (f"device {dr.device} at event {moment.idx}" if moment.idx >= 0 else
             f"device {dr.device} at the snapshot" if not dr.n_events else
             f"device {dr.device} before its first recorded event")
    if capacity < reserved:
        raise InputError(f"capacity {fmt_bytes(capacity)} is less than the "
                         f"{fmt_bytes(reserved)} PyTorch itself reserved on {where}")
    if moment.kind == "oom" and dr.oom is not None and dr.oom.device_free_bytes is not None:
        floor = reserved + dr.oom.device_free_bytes
        if capacity < floor:
            raise InputError(f"capacity {fmt_bytes(capacity)} is less than reserved + device "
                             f"free at the OOM ({fmt_bytes(floor)}) on device {dr.device}")


@dataclass(frozen=True)
class _Job:
    """What every part of the diagnosis reads of the job: the frameworks whose knobs apply
    (with the host pack's for a process's heap), the rules, the workload and its evidence."""

    fw: set[str]
    rules: RuleSet
    workload: str | None
    ev: JobEvidence
    host: bool

    def removable(self, family: str, phase: str) -> Removable:
        return _removable(family, self.fw, self.rules, phase, self.workload, self.ev)


@dataclass(frozen=True)
class _AtOom:
    """What the OOM says: the failed request, the causes, each family's what-if and what to
    take away first."""

    request: FailedRequest
    phase: str
    outside: int | None
    causes: list[Cause]
    what_ifs: list[WhatIf]
    remedy: Remedy
    reloading: bool
    shortfall: int | None
    warnings: list[str]


def diagnose(capture: Capture, dr: DeviceReplay, attributor: Attributor, state: _AtMoment,
             oom: OomFinding | None, capacity: int | None,
             history: bool, ev: JobEvidence) -> tuple[Diagnosis, list[str]]:
    """Why it failed, what would have made it fit, and which knobs change that; with the
    warnings the diagnosis adds to the report (its input is left as it was). Every knob
    named passes its preconditions against the job's evidence `ev`."""
    rules = attributor.rules  # the built-in packs plus any --rules file: knobs and markers too
    frameworks = sorted(frameworks_in(sorted({f[0] for f in capture.stacks.frames}), rules))
    # a process's heap (memray) gets the host pack's knobs for the families that hold it
    host = capture.source.row.host_heap
    job = _Job(set(frameworks) | ({"host"} if host else set()), rules, ev.workload.answer, ev,
               host)
    at = None
    if oom is not None and dr.oom is not None:
        at = _at_oom(capture, dr, attributor, state, capacity, job)
        phase, what_ifs, remedy = at.phase, at.what_ifs, at.remedy
    else:
        phase = _moment_phase(state.held, state.moment.idx)
        what_ifs, remedy = _peak_what_ifs(state, job, phase), Remedy()
    shortfall = at.shortfall if at is not None else None
    standing = _standing(capture, dr, state, oom is not None, capacity, host, shortfall)
    order = _knob_order(state, what_ifs, remedy.excess_family,
                        at.request.family if at is not None else None, shortfall, host)
    knobs, folded = _offered(job, state, at, remedy, order, phase, standing.large_cache)
    remedy = _named_once(remedy, knobs, folded)
    prescribe = standing.prescribe
    advice = Advice(knobs=tuple(knobs[:MAX_KNOBS]) if prescribe else (),
                    applies={k.id: _applies(k, folded.get(k.id, ()), ev, list(order))
                             for k in knobs[:MAX_KNOBS]},
                    knob_families=tuple(order),
                    same_as={k.id: tuple(g.id for g in folded[k.id])
                             for k in knobs[:MAX_KNOBS] if k.id in folded})
    diagnosis = Diagnosis(
        kind=state.moment.kind, phase=phase, request=at.request if at is not None else None,
        capacity_bytes=capacity, outside_pytorch_bytes=at.outside if at is not None else None,
        causes=tuple(at.causes if at is not None else ()), what_ifs=tuple(what_ifs),
        frameworks=tuple(frameworks),
        remedy=remedy if prescribe else replace(remedy, excess_knob=None,
                                                alternative_knob=None),
        advice=advice, standing=standing, reloading=at.reloading if at is not None else False,
        history=history, workload=job.workload, evidence=ev, shortfall_bytes=shortfall,
        size_groups=() if history else size_groups(state.held["size"].to_list()),
        oom_named="" if oom is not None else _oom_named(capture),
    )
    return diagnosis, at.warnings if at is not None else []


def _at_oom(capture: Capture, dr: DeviceReplay, attributor: Attributor, state: _AtMoment,
            capacity: int | None, job: _Job) -> _AtOom:
    """The failed request placed in the state at the OOM: the causes, the state without each
    of the largest families (and without the request's own loop of copies), and the cheapest
    family to take away with the knob that does it."""
    o = dr.oom
    assert o is not None
    request = o.requested_bytes
    ctx = attributor.context(o.stack_id, "0,0", o.stream, ACTIVE_ALLOCATED, request, o.idx)
    decision = attributor.decide(o.stack_id, ctx)
    family, phase = decision.family, decision.phase
    reloading = reloads_offloaded(
        attributor.rules.explain(capture.stacks.stack(o.stack_id), ctx).phase_rule_id)
    device_free = o.device_free_bytes or 0
    outside = None
    if capacity is not None and o.device_free_bytes is not None:
        outside = capacity - state.reserved - o.device_free_bytes
    causes = _causes(state, request, device_free, capacity, outside)
    baseline = would_fit(request, device_free, state.segments, state.live, stream=o.stream)
    # a state that cannot exist (`_impossible`) places nothing: no shortfall, no what-if
    shortfall = None if state.impossible else max(0, -baseline.spare_bytes)
    warnings = []
    if baseline.fits and not state.impossible:
        warnings.append(
            "the replayed state would have fit the request: device_free or the "
            "segments at the OOM are incomplete, so what-ifs are approximate"
        )
    what_ifs = _oom_what_ifs(state, request, device_free, o.stream, family, job, phase)
    accumulating = _accumulation(state.groups, family, o.stack_id)
    without_copies = None
    if accumulating is not None and family and not state.impossible:
        copies = state.held.filter((pl.col("family") == family)
                                   & (pl.col("stack_id") == accumulating["stack_id"]))
        fit = would_fit(request, device_free, state.segments, state.live.filter(
            ~pl.col("address").is_in(copies["address"].implode())), stream=o.stream)
        without_copies = WhatIf(family, int(copies["size"].sum()), copies.height, fit.fits,
                                fit.spare_bytes, fit.how, job.removable(family, phase),
                                spare_terms=fit.spare_terms)
    remedy = _remedy(what_ifs, family, accumulating, without_copies, job, phase, reloading)
    what_ifs.sort(key=lambda w: (w.family != remedy.excess_family,
                                 w.family != remedy.alternative_family))
    return _AtOom(FailedRequest(request, round_size(request), segment_size_for(request), family,
                                decision.label, attributor.site(o.stack_id)),
                  phase, outside, causes, what_ifs, remedy, reloading, shortfall, warnings)


def _oom_what_ifs(state: _AtMoment, request: int, device_free: int, stream: int,
                  family: str | None, job: _Job, phase: str) -> list[WhatIf]:
    """The request placed without each of the largest families (and the request's own)."""
    if state.impossible:
        return []
    shown = list(state.groups[:WHATIF_FAMILIES])
    shown += [g for g in state.groups[WHATIF_FAMILIES:] if g.name == family]
    out = []
    for g in shown:
        mine = state.held.filter(pl.col("family") == g.name)
        without = state.live.filter(~pl.col("address").is_in(mine["address"].implode()))
        fit = would_fit(request, device_free, state.segments, without, stream=stream)
        private = mine.filter(pl.col("pool") != "0,0")
        pools = tuple(sorted(set(private["pool"].to_list())))
        released = sum(p.reserved_bytes for p in state.pools if p.pool in pools)
        out.append(WhatIf(
            g.name, g.bytes, g.blocks, fit.fits, fit.spare_bytes, fit.how,
            job.removable(g.name, phase), int(private["size"].sum()), pools, released,
            segment_size_for(request) <= device_free + released if pools else None,
            fit.spare_terms))
    return out


def _remedy(what_ifs: list[WhatIf], family: str | None, accumulating: ChunkLoop | None,
            without_copies: WhatIf | None, job: _Job, phase: str, reloading: bool) -> Remedy:
    """The family to take away first and its knob (an accumulating request's own family:
    the knob that stops it), and the cheapest alternative; a sufficient fix that costs less
    comes first."""
    fw, rules, workload, ev = job.fw, job.rules, job.workload, job.ev
    if accumulating is not None:
        excess, excess_knob = family, (stop_knob(family, fw, phase, rules, offload=not reloading,
                                                 workload=workload, ev=ev) if family else None)
    else:
        excess, excess_knob = _excess(what_ifs, fw, phase, rules, not reloading,
                                      workload=workload, ev=ev)
    alternative, alternative_knob = _excess([w for w in what_ifs if w.family != excess],
                                            fw, phase, rules, not reloading,
                                            avoid=excess_knob, workload=workload, ev=ev)
    if accumulating is not None and _cheaper(alternative_knob, excess_knob):
        # a sufficient fix that costs less (last step's gradients freed before this
        # forward, at no cost) comes before stopping the accumulation (recompute)
        excess, excess_knob, alternative, alternative_knob = (
            alternative, alternative_knob, excess, excess_knob)
    return Remedy(excess, alternative, accumulating, without_copies, excess_knob,
                  alternative_knob)


def _peak_what_ifs(state: _AtMoment, job: _Job, phase: str) -> list[WhatIf]:
    """Without an OOM: how much lower the moment would be without each of the largest."""
    out = []
    for g in state.groups[:WHATIF_FAMILIES]:
        removable = job.removable(g.name, phase)
        if job.host and removable == "no" and knobs_for([g.name], [], job.fw, phase, job.rules,
                                                        workload=job.workload, ev=job.ev):
            removable = "yes"  # a host knob stops keeping it (its caveat says the cost)
        out.append(WhatIf(g.name, g.bytes, g.blocks, None, None, "peak lower by", removable))
    return out


def _standing(capture: Capture, dr: DeviceReplay, state: _AtMoment, failed: bool,
              capacity: int | None, host: bool, shortfall: int | None) -> Standing:
    """Where the device stands: its headroom, whether it is empty, small, shown beside a
    device that failed, or holds a large cache; and so whether knobs are prescribed."""
    headroom = capacity - state.reserved if capacity is not None else None
    empty = state.allocated == 0 and state.reserved == 0 and not failed
    failed_elsewhere = None if failed else _failed_elsewhere(capture, dr.device)
    small = (not failed and not host and state.reserved < SMALL_RESERVED
             and state.allocated < SMALL_RESERVED)
    prescribe = host or dr.device >= 0 and not empty and not small and \
        failed_elsewhere is None and (
            failed or headroom is None or capacity is None
            or state.reserved >= FAR_FROM_CAPACITY * capacity)
    # a state that cannot exist has no computable cache (`_impossible`): nothing to say of it
    cached = not state.impossible and large_cache(state.reserved, state.cached_unallocated,
                                                  shortfall)
    return Standing(headroom, prescribe, empty, cached, small and not empty, failed_elsewhere)


def _knob_order(state: _AtMoment, what_ifs: list[WhatIf], excess: str | None,
                req_family: str | None, shortfall: int | None, host: bool) -> list[str]:
    """The families knobs are chosen for (`_knob_families`), the one to take away first,
    then the request's, those whose removal alone fits, those that can go, the largest."""
    eligible = _knob_families(state, what_ifs, req_family, shortfall)
    order = ([excess] if excess else []) + ([req_family] if req_family else [])
    if host:
        order += [g.name for g in state.groups if g.name != "unknown"]
    order += [w.family for w in what_ifs if w.removable != "no" and w.fits]
    order += [w.family for w in what_ifs if w.removable != "no"]
    order += [g.name for g in state.groups]
    return [f for f in dict.fromkeys(order) if f in eligible]


def _offered(job: _Job, state: _AtMoment, at: _AtOom | None, remedy: Remedy,
             order: list[str], phase: str,
             cached: bool) -> tuple[list[Knob], dict[str, tuple[Knob, ...]]]:
    """The knobs for the families in `order` and the causes that hold, those the verdict
    names first; a large cache's after them; an inference-only knob never before another
    where the workload is undetermined. One entry per mechanism (`fold_twins`), before the
    list is cut to `MAX_KNOBS`: with the generic knobs folded into each framework knob."""
    lead = [k for k in (remedy.excess_knob, remedy.alternative_knob) if k is not None]
    held_causes = [c.id for c in at.causes if c.holds] if at is not None else []
    reloading = at.reloading if at is not None else False
    knobs, folded = fold_twins(list(dict.fromkeys(
        lead + knobs_for(order, held_causes, job.fw, phase, job.rules, offload=not reloading,
                         workload=job.workload, ev=job.ev,
                         bytes_of=None if at is not None else
                         {g.name: g.bytes for g in state.groups}))))
    if cached:
        cache = [k for k in knobs_for([], [LargeCache.vocab_id], job.fw, phase, job.rules,
                                      workload=job.workload, ev=job.ev) if k not in knobs]
        knobs = knobs[:MAX_KNOBS - len(cache)] + cache
    if job.workload in (None, "undetermined"):
        # a forward that may be trained: an inference-only knob never comes before another
        knobs = sorted(knobs, key=lambda k: k.workload == "inference")
    return knobs, folded


def _named_once(remedy: Remedy, knobs: list[Knob],
                folded: Mapping[str, tuple[Knob, ...]]) -> Remedy:
    """The verdict's knobs named as the list names them: a generic knob folded into a
    framework's (`fold_twins`) by that framework's knob."""
    into = {g.id: k for k in knobs for g in folded.get(k.id, ())}

    def once(k: Knob | None) -> Knob | None:
        return into.get(k.id, k) if k is not None else None

    return replace(remedy, excess_knob=once(remedy.excess_knob),
                   alternative_knob=once(remedy.alternative_knob))


def _applies(k: Knob, generics: tuple[Knob, ...], ev: JobEvidence, order: list[str]) -> str:
    """Why knob `k` applies, with what the generic knobs folded into it said beyond that
    (`twin_words`): the one entry for their mechanism keeps the figures either gave."""
    parts = (why_applies(k, ev, order) or "", twin_words(k, generics, ev, order))
    return "; ".join(p for p in parts if p)


#: A file name that says it was written at an OOM: "oom" as a word of its own
#: (oom_snapshot.pickle, rank0-OOM.pickle), not inside another (room, zoom).
OOM_NAME = re.compile(r"(?:^|[^a-z])oom(?:[^a-z]|$)", re.IGNORECASE)


def _oom_named(capture: Capture) -> str:
    """What says a capture whose trace records no OOM was written at one: the recorder's
    sidecar (dumped by the OOM observer) or the file's name; "" when nothing does."""
    sidecar = capture.metadata.get("sidecar") or {}
    if sidecar.get("reason") == "oom":
        return "the recorder's sidecar says it dumped this at an OOM"
    name = capture.origin or PurePath(capture.path).name
    if OOM_NAME.search(name):
        return f"the file name {name} says so"
    return ""


def _failed_elsewhere(capture: Capture, device: int) -> int | None:
    """Another device of the capture whose trace records an OOM: the job died there."""
    if capture.events.is_empty():
        return None
    other = capture.events.filter((pl.col("action") == "oom") & (pl.col("device") != device))
    return None if other.is_empty() else int(other["device"][0])


def _cheaper(k: Knob | None, than: Knob | None) -> bool:
    """Knob `k` is of a cheaper cost class than `than` (free before extra compute, ...; see
    `knobs.preference`), or `than` is none: `k` should be named first."""
    return k is not None and (than is None or preference(k)[2] < preference(than)[2])


def large_cache(reserved: int, cached_unallocated: int, shortfall: int | None = None) -> bool:
    """More than `LARGE_CACHE_SHARE` of reserved is cached but unallocated, and that matters:
    at an OOM it is at least the shortfall; otherwise at least `LARGE_CACHE_FLOOR` (14 MiB of
    a 42 MiB process is a share, not a problem)."""
    floor = shortfall if shortfall else LARGE_CACHE_FLOOR
    return (reserved > 0 and cached_unallocated > LARGE_CACHE_SHARE * reserved
            and cached_unallocated >= floor)


def _knob_families(state: _AtMoment, what_ifs: list[WhatIf], request_family: str | None,
                   shortfall: int | None) -> set[str]:
    """The families a knob may be offered for. At an OOM (`shortfall` known): the request's
    own family, each family whose removal alone makes the request fit, and the largest
    families that can go (or shrink) until together they hold the shortfall, if they can.
    Without an OOM: the families holding at least `KNOB_SHARE` of the allocated bytes."""
    if shortfall is None:
        return {g.name for g in state.groups
                if state.allocated and g.bytes >= KNOB_SHARE * state.allocated}
    out = {w.family for w in what_ifs if w.fits or w.fits_if_pool_released}
    if request_family:
        out.add(request_family)
    together, total = [], 0
    for w in sorted(what_ifs, key=lambda w: -w.bytes):
        if w.fits or w.removable not in ("yes", "offload", "shrink"):
            continue
        together.append(w.family)
        total += w.bytes
        if total >= shortfall:
            return out | set(together)
    return out


def _accumulation(groups: tuple[Group, ...], family: str | None,
                  stack_id: int) -> ChunkLoop | None:
    """The live copies the failing request's own family already holds from one loop: the
    loop of the request's own stack if it has one, else the family's largest."""
    group = next((g for g in groups if g.name == family), None)
    if group is None or not group.chunks:
        return None
    same = [c for c in group.chunks if c["stack_id"] == stack_id]
    return (same or list(group.chunks))[0]


def _removable(family: str, frameworks: set[str], rules: RuleSet, phase: str,
               workload: str | None, ev: JobEvidence | None = None) -> Removable:
    if family in transient_families():
        return "yes"
    if family in working_set_families():
        return "shrink"
    if family == "unknown" or family in undetermined_families():
        return "unknown"
    if frees_in_phase(family, phase, frameworks, rules, workload, ev):
        return "yes"  # e.g. last step's gradients, held through this forward
    if can_release(family, frameworks, rules, workload, ev):
        return "offload"
    return "no"


_REMOVABLE_ORDER = {"yes": 0, "offload": 1}


def _excess(what_ifs: list[WhatIf], frameworks: set[str], phase: str, rules: RuleSet,
            offload: bool = True, avoid: Knob | None = None,
            workload: str | None = None,
            ev: JobEvidence | None = None) -> tuple[str | None, Knob | None]:
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
            k = best_knob(w.family, frameworks, phase, rules, offload=offload,
                          workload=workload, ev=ev)
            if w.removable == "offload" and not offload:
                k = None  # offloading is the path that failed: no knob, still the state
        elif w.fits_if_pool_released:  # only if a knob releases its pool (engine sleep)
            k = next((k for k in knobs_for([w.family], [], frameworks, phase, rules,
                                           offload=offload, workload=workload, ev=ev)
                      if k.direction == "releases"), None)
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


#: The rule that names a block the program's own code made with no library, module forward,
#: optimizer or autograd on its stack (packs/pytorch.toml): its frames place it in no phase.
PROGRAMS_OWN_RULE = "pytorch.program_own_code"


def _moment_phase(held: pl.DataFrame, idx: int) -> str:
    """At a peak there is no failing stack: the phase is that of the allocation the moment
    follows (where the job was: a peak inside the optimizer step is the step's, however many
    gradients the backward left), when its frames place it. Else the phase most of the live
    bytes come from, ignoring blocks that predate recording and (so that the verdict does
    not say "not identified" beside a family made "in the backward phase" for want of
    frames) blocks whose phase is not known; but where the program's own code made the
    allocation with nothing else on its stack (`PROGRAMS_OWN_RULE`: its own update, called
    from its own driver), its unplaced bytes count too and the model's do not: the model
    loaded earlier does not make a peak in the program's own update "model init"."""
    known = pl.col("phase") != "unknown"
    at = held.filter(pl.col("alloc_idx") == idx) if idx >= 0 else held.clear()
    last = at.filter(known)["phase"]
    if len(last):
        return str(last[0])
    own = bool(at.height) and bool((at["rule_id"] == PROGRAMS_OWN_RULE).any())
    recent = held.filter((pl.col("alloc_idx") >= 0) & (known | own)
                         & ~(pl.lit(own) & (pl.col("phase") == "init")))
    if recent.is_empty():
        return "unknown"
    # the most bytes; between equal ones the phase of the latest allocation (never the
    # order group_by happens to give)
    by = recent.group_by("phase").agg(pl.col("size").sum(), pl.col("alloc_idx").max()).sort(
        ["size", "alloc_idx"], descending=True)
    return str(by["phase"][0])


def _causes(state: _AtMoment, request: int, device_free: int, capacity: int | None,
            outside: int | None) -> list[Cause]:
    rounded = round_size(request)
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
        Demand(not fits_if_compacted or not fragmentation, {
            "requested_bytes": request, "rounded_request_bytes": rounded,
            "device_free_bytes": device_free, "short_by_bytes": max(0, request - device_free),
            "allocated_bytes": state.allocated,
            **({} if state.impossible else {"cached_unallocated_bytes": cached}),
            "default_pool_free_bytes": usable_free,
            "short_after_compaction_bytes": max(0, rounded - device_free - usable_free),
            "spare_after_compaction_bytes": max(0, device_free + usable_free - rounded),
        }),
        *(() if state.impossible else (Fragmentation(fragmentation, {
            "cached_unallocated_bytes": cached, "cached_share": round(share, 4),
            "share_threshold": FRAGMENTATION_SHARE,
            "largest_free_block_bytes": usable_largest, "rounded_request_bytes": rounded,
            "fits_if_compacted": fits_if_compacted,
        }),)),
        PrivatePool(other_free > 0 and rounded <= device_free + usable_free
              + other_free and not fits_if_compacted, {
            "private_pool_free_bytes": other_free, "default_pool_free_bytes": usable_free,
        }),
    ]
    if capacity is None or outside is None:
        causes.append(CapacityUnknown(False))
    else:
        causes.append(OutsidePytorch(outside >= max(rounded, OUTSIDE_SHARE * capacity),
                                     {"outside_pytorch_bytes": outside, "capacity_bytes": capacity,
                             "share": round(outside / capacity, 4) if capacity else 0.0}))
    return causes


def _device_name(capture: Capture, dr: DeviceReplay) -> str:
    """The device as the source names it; else, for a snapshot torch_npu wrote (it names its
    devices cuda:N), ``npu:N`` where the capture shows it: a frame in torch_npu, or the final
    blocks padded as only torch_npu's allocator pads requests. "" leaves the default name."""
    named = capture.metadata.get("device_names", {}).get(dr.device)
    if named:
        return str(named)
    npu = dr.request_pad == NPU_REQUEST_PAD or any(
        NPU_FRAME_MARK in frame[0] for frame in capture.stacks.frames)
    return f"npu:{dr.device}" if npu and capture.source.row.allocator_segments else ""


