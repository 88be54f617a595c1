"""The words of one capture's device: the verdict, the moment, the headline numbers and the
rows of each table of a single report, shared by every format."""

from __future__ import annotations

from collections.abc import Callable

from snapana.analysis.allocator_replay import KnobReplay, Prediction
from snapana.analysis.diagnosis.causes import (
    EXPANDABLE_RULE,
    VERDICT_ORDER,
    Fragmentation,
    LargeCache,
)
from snapana.analysis.diagnosis.findings import (
    ChunkLoop,
    DeviceReport,
    Diagnosis,
    Group,
    WhatIf,
)
from snapana.analysis.diagnosis.palette import UNKNOWN, UNKNOWN_PHASE
from snapana.analysis.family_timeline import FamilyGrowth
from snapana.analysis.knobs import COST_WORDS, INFERENCE, TRAINING, Knob
from snapana.analysis.scaling import ReplayRoute, replay_route
from snapana.render.allocation_bands import AllocationsView
from snapana.units import fmt_bytes, parse_bytes, plural

#: A figure of a state that cannot exist (the report's warnings say why).
NOT_COMPUTABLE = "not computable"

#: The exact calls that make the next capture carry allocation history.
RECORD_HISTORY = ("torch.cuda.memory._record_memory_history(max_entries=100000) before the "
                  "step, then torch.cuda.memory._dump_snapshot(\"snap.pickle\") (or run the "
                  "job under: snapana record -o DIR -- python train.py)")


def is_host(r: DeviceReport) -> bool:
    """Host memory (memray's heap, the profiler's CPU allocations): no GPU knob applies."""
    return r.source.row.host_heap or r.device < 0


def device_text(r: DeviceReport) -> str:
    """The device as PyTorch names it: cuda:0, cpu; a source's own name when it has one."""
    name = r.device_name
    if name in ("CPU", "cpu"):
        return "cpu"
    if not name:
        return f"cuda:{r.device}" if r.device >= 0 else "host"
    return name


def other_device_text(r: DeviceReport, device: int) -> str:
    """Another device of the same capture, named as this one is (npu:1 beside npu:0)."""
    prefix, sep, _ = device_text(r).partition(":")
    return f"{prefix}:{device}" if sep and prefix in ("cuda", "npu") else f"cuda:{device}"


_MOMENT_NAMES = {"oom": "the OOM", "peak": "the peak", "snapshot": "the end of the capture"}


def moment_text(r: DeviceReport) -> str:
    """Which moment a report shows, and whether the user chose it (--at)."""
    if r.source.row.host_heap:
        return "at the heap's high-water mark"
    m = r.moment
    where = "before the first recorded event" if m.idx < 0 else f"event {m.idx}"
    if m.time_us is not None and r.diagnosis.at_time:
        where += f", trace time {m.time_us} µs"
    if r.at is not None:
        return f"at {_MOMENT_NAMES.get(m.kind, where)} ({where}; chosen with --at {r.at})"
    if not r.diagnosis.history and not r.diagnosis.at_oom:
        if r.not_replayed:  # recorded, not usable (the warnings say why)
            return "at the snapshot (its trace cannot be replayed: see the warnings)"
        return "at the snapshot (no allocation history recorded)"
    if r.diagnosis.at_oom:
        return f"at the OOM ({where})"
    if r.diagnosis.at_peak:
        return f"at the peak ({where}; no OOM recorded)"
    return "at the snapshot (no OOM, no allocation history recorded)"


def headline_rows(r: DeviceReport) -> list[tuple[str, str]]:
    """The figures the report is about, each measured one way everywhere: "allocated" is the
    bytes of blocks in use (not those freed and waiting on a stream, shown on their own);
    figures the source cannot measure are left out, not shown as 0."""
    rows = []
    d = r.diagnosis
    if r.oom is not None:
        rows.append(("requested (failed allocation)", fmt_bytes(r.oom.requested_bytes)))
        if r.oom.device_free_bytes is not None:
            rows.append(("device free at the OOM", fmt_bytes(r.oom.device_free_bytes)))
        if r.oom.gap_bytes is not None and r.oom.gap_bytes > 0:
            rows.append(("short by", fmt_bytes(r.oom.gap_bytes)))
    if r.source.row.host_heap:
        return rows + [("heap at the high-water mark", fmt_bytes(r.allocated_bytes))]
    if r.reserved_known:
        rows.append(("reserved by PyTorch", fmt_bytes(r.reserved_bytes)))
    rows.append(("allocated", fmt_bytes(r.allocated_bytes)))
    if r.pending_free_bytes:
        rows.append(("pending free (freed, waiting on a stream)",
                     fmt_bytes(r.pending_free_bytes)))
    if r.has_segments:
        for what, v in (("cached but unallocated", r.cached_unallocated_bytes),
                        ("largest free cached block", r.largest_free_block_bytes)):
            rows.append((what, NOT_COMPUTABLE if v is None else fmt_bytes(v)))
    if d.history:
        rows.append(("peak allocated", fmt_bytes(r.peak_allocated_bytes)))
    if d.capacity_bytes is not None:
        rows.append(("device capacity", fmt_bytes(d.capacity_bytes)))
        if d.outside_pytorch_bytes is not None:
            rows.append(("outside PyTorch", fmt_bytes(d.outside_pytorch_bytes)))
        elif r.oom is None and d.headroom_bytes is not None and r.reserved_known:
            rows.append(("headroom (capacity − reserved)", fmt_bytes(d.headroom_bytes)))
    return rows


PHASE_NAMES = {"init": "model init", "forward": "forward", "backward": "backward",
               "optimizer": "optimizer step", "rollout": "rollout / generation",
               "logprobs": "log-prob", "weight_update": "weight update",
               "unknown": "an unidentified"}


def repeat_text(c: ChunkLoop) -> str:
    """A loop's live copies as arithmetic a reader can check: "7 × 486.00 MiB = 3.32 GiB" only
    when every copy has the same size and the printed product gives the printed total;
    otherwise "8 blocks, 12.00 MiB–171.00 MiB, total 942.38 MiB"."""
    size, total = fmt_bytes(c["chunk_size"]), fmt_bytes(c["total"])
    if c["uniform"] and c["count"] * c["chunk_size"] == c["total"] and \
            fmt_bytes(round(c["count"] * parse_bytes(size))) == total:
        return f"{c['count']} × {size} = {total}"
    if c["min_size"] == c["max_size"]:
        return f"{plural(c['count'], 'block')} of {size} each, total {total}"
    return (f"{plural(c['count'], 'block')}, "
            f"{fmt_bytes(c['min_size'])}–{fmt_bytes(c['max_size'])}, "
            f"total {total}")


def growth_text(r: DeviceReport, g: FamilyGrowth) -> str:
    """How one family got to the moment, checkable against the family timeline:
    "saved_logprob_softmax: 0 B → 3.32 GiB at the OOM; 7 × 486.00 MiB allocated in the
    window and still live, in the forward phase"."""
    when = {"oom": "at the OOM", "peak": "at the peak", "snapshot": "at the end"}.get(
        r.moment.kind, f"at event {r.moment.idx}")
    text = f"{g.family}: {fmt_bytes(g.start_bytes)} → {fmt_bytes(g.moment_bytes)} {when}"
    if fmt_bytes(g.max_bytes) != fmt_bytes(g.moment_bytes):
        text += f" (at most {fmt_bytes(g.max_bytes)} before it)"
    if not g.allocations:
        return text + (before_window_text(g) if g.moment_bytes else "")
    loop = ChunkLoop(site="", stack_id=0, count=g.allocations, chunk_size=g.uniform_size or 0,
                     total=g.allocation_bytes, uniform=g.uniform_size is not None,
                     min_size=g.uniform_size or 0, max_size=g.uniform_size or 0)
    made = repeat_text(loop) if g.uniform_size else \
        f"{g.allocations} block{'s' if g.allocations > 1 else ''}, " \
        f"{fmt_bytes(g.allocation_bytes)}"
    phase = f", in the {_phase_words(g.phase)}" if g.phase != UNKNOWN_PHASE else ""
    return f"{text}; {made} allocated in the window and still live{phase}"


#: why a block with frames has no allocation event in the trace
UNTRACED = ("allocated while recording, but its allocation events are not in the trace (the "
            "ring buffer wrapped or recording restarted: raise max_entries)")


def before_window_text(g: FamilyGrowth) -> str:
    """Where a family's bytes from before the trace's first event came from: blocks without
    frames predate recording; blocks with frames were recorded, their events lost."""
    if g.untraced_bytes >= g.moment_bytes:
        return f"; all of it {UNTRACED}"
    if not g.untraced_bytes:
        return "; all of it allocated before recording began"
    return (f"; {fmt_bytes(g.untraced_bytes)} of it {UNTRACED}, the rest allocated before "
            "recording began")


def growth_lines(r: DeviceReport) -> list[str]:
    """One line per family that held or gained most by the moment (`Timeline.growth`)."""
    return [growth_text(r, g) for g in r.timeline.growth]


def allocations_note(a: AllocationsView) -> str:
    """What the allocation bands hold, counted: "the 100 largest of 1,447 allocations on
    their own, 120 held through the window as 3 family bands, 1,227 more as one band"."""
    n = a.count("allocation")
    parts = [f"the {n:,} largest of {a.allocations:,} allocations on their own"
             if n < a.allocations else f"all {n:,} allocations"]
    held = [b for b in a.bands if b.kind == "held"]
    if held:
        parts.append(f"{a.count('held'):,} held through the window as {len(held)} family "
                     f"band{'s' if len(held) > 1 else ''}")
    if a.count("other"):
        parts.append(f"{a.count('other'):,} more as one band")
    return ", ".join(parts)


def group_note(g: Group) -> str:
    """The family's largest loop of live copies ('' when it has none)."""
    return f"{repeat_text(g.chunks[0])} from one site" if g.chunks else ""


def _phase_words(phase: str) -> str:
    if phase == UNKNOWN_PHASE:
        return "phase not identified"
    return f"{PHASE_NAMES.get(phase, phase)} phase"


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def cost_text(k: Knob) -> str:
    return COST_WORDS.get(k.cost, k.cost)


def _what_if(d: Diagnosis, family: str | None) -> WhatIf | None:
    return next((w for w in d.what_ifs if w.family == family), None) if family else None


def spare_sum(w: WhatIf) -> str:
    """The spare as the sum it is ("device free 7.02 GiB + releasable cached 13.00 GiB −
    new segment 13.00 GiB = 7.02 GiB"), every term from placement."""
    text = ""
    for i, (what, n, sign) in enumerate(w.spare_terms):
        op = "− " if sign < 0 else ("+ " if i else "")
        text += f"{' ' if i else ''}{op}{what} {fmt_bytes(n)}"
    return f"{text} = {fmt_bytes(w.spare_bytes)}" if text else fmt_bytes(w.spare_bytes)


def _fit_words(w: WhatIf) -> str:
    if w.fits:
        return (f"without it the request fits with {fmt_bytes(w.spare_bytes)} to spare "
                f"({spare_sum(w)})")
    return f"even without it the request is still short by {fmt_bytes(-(w.spare_bytes or 0))}"


def pool_words(w: WhatIf) -> str:
    """Why removing a family in a private pool does not give the request its memory."""
    pools = ", ".join(w.private_pools)
    one = len(w.private_pools) == 1
    where = ("it sits" if w.private_pool_bytes == w.bytes else
             f"{fmt_bytes(w.private_pool_bytes)} of it sits")
    text = (f"{where} in private pool{'' if one else 's'} {pools}: freeing those blocks frees "
            f"memory for {'that pool' if one else 'those pools'} only, not for the request")
    if w.fits_if_pool_released:
        text += (f"; releasing the pool{'' if one else 's'} "
                 f"({fmt_bytes(w.private_pool_reserved_bytes)} reserved) would let it fit")
    return text


def expandable(r: DeviceReport) -> bool:
    """The default pool's segments are expandable (`expandable_segments:True`)."""
    return r.expandable


def _oom_verdict(r: DeviceReport, parts: list[str]) -> set[str]:
    """The sentences of an OOM verdict; returns the knobs it named."""
    d = r.diagnosis
    assert r.oom is not None
    named: set[str] = set()
    what = f"{d.request_label} at {d.request_site}" if d.request_label else d.request_site
    phase = ("Out of memory while reloading offloaded state" if d.reloading else
             "Out of memory (phase not identified)" if not d.phase_known else
             f"Out of memory in the {PHASE_NAMES.get(d.phase, d.phase)} phase")
    opening = f"{phase}: a {fmt_bytes(d.request_bytes)} request ({what})"
    if r.oom.device_free_bytes is not None:
        opening += f" found {fmt_bytes(r.oom.device_free_bytes)} free on the device"
        if r.oom.gap_bytes is not None and r.oom.gap_bytes > 0:
            opening += f" (short by {fmt_bytes(r.oom.gap_bytes)})"
    frag = d.cause(Fragmentation)
    if r.has_segments and frag is not None and r.expandable:
        opening += (f", too little to map the pages it needed: {EXPANDABLE_RULE} (largest "
                    f"free cached block {frag.b('largest_free_block_bytes')})")
    elif r.has_segments and frag is not None:
        opening += (" and no cached block large enough in its pool (largest "
                    f"{frag.b('largest_free_block_bytes')})")
    parts.append(opening + ".")
    parts += [said for kind in VERDICT_ORDER
              if (c := d.cause(kind)) is not None and (said := c.verdict(r))]
    acc, first = d.accumulating, _what_if(d, d.excess_family)
    if acc is not None and d.excess_family and d.excess_family == d.request_family:
        stop = d.excess_knob
        sentence = (f"The failing request's own family, {d.excess_family}, already holds "
                    f"{repeat_text(acc)} live from one site ({acc['site']})")
        if stop is not None:
            sentence += (f": stop the accumulation with {stop.knob} ({cost_text(stop)})")
            named.add(stop.id)
        else:
            sentence += ": no knob of a framework in use stops it"
        copies = d.without_copies
        if copies is not None and copies.fits is not None:
            sentence += "; " + _fit_words(copies).replace("without it", "without those copies")
        parts.append(sentence + ".")
    elif first is not None and d.excess_family:
        note = group_note(next(g for g in r.groups if g.name == first.family))
        head = f"{first.family} ({fmt_bytes(first.bytes)}{': ' + note if note else ''})"
        k = d.excess_knob
        if first.fits and d.reloading and first.by_offload:
            parts.append(
                f"The excess is {head}, still on the GPU while offloaded state is reloaded: "
                f"{_fit_words(first)}. No offload knob is offered (offloading is the path "
                "that failed): check that the offload released it.")
        elif first.fits:
            parts.append(f"The excess that can go is {head}: {_fit_words(first)}"
                         + (f"; {k.knob} ({cost_text(k)}) acts on it" if k else "") + ".")
            if k:
                named.add(k.id)
        else:
            parts.append(f"The excess to release is {head}: {pool_words(first)}"
                         + (f" — {k.knob} ({cost_text(k)})" if k else "") + ".")
            if k:
                named.add(k.id)
    else:
        parts.append("No single family that can go makes it fit: the request itself "
                     f"({d.request_family}) must shrink.")
    alt = _what_if(d, d.alternative_family)
    if alt is not None:
        k = d.alternative_knob
        if alt.fits and d.reloading and alt.by_offload:
            parts.append(f"Also sufficient: {alt.family} ({fmt_bytes(alt.bytes)}), still on "
                         "the GPU while offloaded state is reloaded (no offload knob offered).")
        elif alt.fits:
            parts.append(f"Cheapest alternative that also suffices: {alt.family} "
                         f"({fmt_bytes(alt.bytes)})"
                         + (f" with {k.knob} ({cost_text(k)})" if k else "") + ".")
        else:
            parts.append(f"Alternative: {alt.family} ({fmt_bytes(alt.bytes)}): "
                         f"{pool_words(alt)}" + (f" — {k.knob} ({cost_text(k)})" if k else "")
                         + ".")
        if k:
            named.add(k.id)
    return named


def _top(r: DeviceReport, n: int = 3) -> str:
    return ", ".join(f"{g.name} {fmt_bytes(g.bytes)}" for g in r.groups[:n])


def uses_torch(r: DeviceReport) -> bool:
    """PyTorch is in the stacks of the sites the report shows: only then is PyTorch's own
    capture advice worth giving for a host capture."""
    return any("torch/" in f[0].replace("\\", "/") for s in r.top_sites for f in s.stack)


def host_history_note(r: DeviceReport) -> str:
    """What a heap capture has instead of an allocation timeline, and (for a PyTorch job
    only) how to record the GPU side too."""
    note = ("memray keeps the heap's high-water mark (the most host memory the process held "
            "at once) and samples of RSS and heap size, not a per-allocation timeline: the "
            "state above is that high-water mark.")
    if uses_torch(r):
        note += f" For the GPU side of this PyTorch job, record its history: {RECORD_HISTORY}."
    return note


def _site_words(g: Group) -> str:
    return f" (top site {g.sites[0]['site']})" if g.sites else ""


def _host_verdict(r: DeviceReport, parts: list[str]) -> None:
    """A heap's high-water mark (memray): the bytes at it and who holds them, each family
    with its top site, so code no rule knows is still named by where it allocates."""
    sites = sum(g.blocks for g in r.groups)
    parts.append(f"At the heap's high-water mark (the most host memory the process held at "
                 f"once): {fmt_bytes(r.allocated_bytes)} in {sites} allocation "
                 f"site{'s' if sites != 1 else ''}.")
    if r.groups:
        parts.append("Largest: " + ", ".join(f"{g.name} {fmt_bytes(g.bytes)}{_site_words(g)}"
                                             for g in r.groups[:3]) + ".")
    else:
        parts.append("Nothing is allocated.")


def history_statement(r: DeviceReport) -> str:
    """Whether allocation history was recorded, the one statement every section makes of it
    ('' where it was)."""
    if r.diagnosis.history:
        return ""
    n = r.n_events
    if n and (r.stacks_recorded or any(s.stack for s in r.top_sites)):
        return ("History recording was on (the blocks carry the stacks that allocated them), "
                f"but the trace kept only {n} entr{'y' if n == 1 else 'ies'} and no "
                "allocation")
    return "No allocation history was recorded: this snapshot holds only the final state"


#: Of reserved, at least this share allocated reads as demand (the cache holds little).
DEMAND_SHARE = 0.9
SIZE_VERDICT_GROUPS = 3  # size groups the verdict of a history-less state names


def _fraction(ratio: int) -> str:
    return {2: "half", 4: "a quarter"}.get(ratio, f"1/{ratio}")


def size_text(count: int, size: int) -> str:
    """`count` blocks of `size` as arithmetic a reader can check (as `repeat_text`): "N × S
    = T" only when the printed product gives the printed total."""
    return repeat_text({"site": "", "stack_id": -1, "count": count, "chunk_size": size,
                        "total": count * size, "uniform": True, "min_size": size,
                        "max_size": size})


def size_rows(r: DeviceReport) -> list[tuple[str, str, str, str]]:
    """The live blocks by size, related sizes under the largest of their group (blocks and
    total as `size_text`, total, share of allocated, relation)."""
    rows = []
    total = r.allocated_bytes or 1
    for g in r.diagnosis.size_groups:
        for row in g.rows:
            ratio = g.ratio(row)
            rows.append((size_text(row.count, row.size), fmt_bytes(row.total),
                         _pct(row.total / total),
                         "" if ratio == 1 else
                         f"{_fraction(ratio)} of {fmt_bytes(g.largest)}"))
    return rows


def _sizes_words(r: DeviceReport) -> str:
    """The largest size groups in a sentence: where a history-less state's memory is."""
    groups = r.diagnosis.size_groups[:SIZE_VERDICT_GROUPS]
    if not groups:
        return ""
    parts = []
    for g in groups:
        head = g.rows[0]
        text = size_text(head.count, head.size)
        if len(g.rows) > 1:
            text += " with " + ", ".join(
                f"{row.count} of {fmt_bytes(row.size)} ({_fraction(g.ratio(row))} of that "
                "size)" for row in g.rows[1:])
        parts.append(text)
    held = sum(g.total for g in groups)
    return (f"By size, the largest tensors are {'; '.join(parts)}: "
            f"{_pct(held / (r.allocated_bytes or 1))} of allocated in "
            f"{plural(sum(g.count for g in groups), 'block')} (the sizes table lists them).")


def demand_statement(r: DeviceReport) -> str:
    """Demand or fragmentation, from the segments alone: how much of reserved is allocated,
    and in what pieces the rest is free ('' where the source has no segments)."""
    cached = r.cached_unallocated_bytes
    if not r.has_segments or not r.reserved_known or not r.reserved_bytes or cached is None:
        return ""
    share = r.allocated_bytes / r.reserved_bytes
    largest = r.largest_free_block_bytes or 0
    if share >= DEMAND_SHARE:
        return (f"{_pct(share)} of the {fmt_bytes(r.reserved_bytes)} PyTorch reserved is "
                f"allocated to live tensors ({fmt_bytes(cached)} cached but unallocated): "
                "the memory went to demand, not fragmentation.")
    if largest >= cached / 2:
        return (f"{fmt_bytes(cached)} of the {fmt_bytes(r.reserved_bytes)} PyTorch reserved "
                f"({_pct(cached / r.reserved_bytes)}) is cached but unallocated, most of it in "
                f"one free piece of {fmt_bytes(largest)}: memory the cache kept, not lost to "
                "fragmentation.")
    expandable = r.diagnosis.evidence is not None and r.diagnosis.evidence.expandable
    larger = ("maps new memory at an expandable segment's end" if expandable else
              "needs a new segment")
    return (f"{fmt_bytes(cached)} of the {fmt_bytes(r.reserved_bytes)} PyTorch reserved "
            f"({_pct(cached / r.reserved_bytes)}) is cached but unallocated in pieces of at most "
            f"{fmt_bytes(largest)}: fragmentation holds that share (a larger request "
            f"{larger}).")


def verdict(r: DeviceReport) -> str:
    """One paragraph a tired engineer can act on; the evidence follows it in every report."""
    d = r.diagnosis
    parts: list[str] = []
    named: set[str] = set()
    if d.empty:
        return (f"{device_text(r)} holds nothing {moment_text(r)}: 0 B allocated, 0 B "
                "reserved. There is nothing on this device to diagnose.")
    if d.at_oom and r.oom is not None:
        named = _oom_verdict(r, parts)
    elif r.source.row.host_heap and r.at is None:
        _host_verdict(r, parts)
    elif not d.history and r.at is None:
        blocks = sum(g.blocks for g in r.groups)
        state = f"{fmt_bytes(r.allocated_bytes)} allocated in {plural(blocks, 'block')}"
        if r.reserved_known:
            state += f", {fmt_bytes(r.reserved_bytes)} reserved"
        if d.oom_named:
            parts.append(
                f"Written at an OOM ({d.oom_named}); the trace records no allocation, so the "
                f"failed request is not known. {history_statement(r)}, so there is no peak or "
                "timeline to show, and no block can be tied to the phase that made it. At the "
                f"snapshot: {state}.")
        else:
            parts.append(
                f"{history_statement(r)}, so there is no OOM, peak or timeline to show (an "
                "OOM the job hit before this dump left no entry), and no "
                f"block can be tied to the phase that made it. At the snapshot: {state}.")
        # a large cache gets its own sentence below (with what acts on it)
        for words in (_sizes_words(r), "" if d.large_cache else demand_statement(r)):
            if words:
                parts.append(words)
        if r.groups:
            framed = any(g.name != UNKNOWN for g in r.groups)
            parts.append(f"Largest: {_top(r)}" + (
                " (families from the blocks' own frames)." if framed else
                " (no frames: sites cannot be named)."))
        parts.append(f"To see how memory got here, record history next time: {RECORD_HISTORY}"
                     + (" (with max_entries large enough to hold the step)." if r.n_events
                        else "."))
    else:
        where = ("the high-water mark" if r.source.row.host_heap else
                 "the peak" if d.at_peak else "the snapshot")
        opening = (f"Shown {moment_text(r)}" if r.at is not None
                   else f"No OOM recorded: this diagnoses {where}")
        largest = f" Largest: {_top(r)}." if r.groups else " Nothing is allocated."
        parts.append(f"{opening} ({fmt_bytes(r.allocated_bytes)} allocated, "
                     f"{_phase_words(d.phase)}).{largest}")
    if r.oom is None and is_host(r):
        parts.append("This is host memory: no GPU knob applies" + (
            "; the knobs below act on the host side." if d.knobs else "."))
    elif r.oom is None and d.capacity_bytes and d.headroom_bytes is not None and not d.prescribe:
        what = "reserved" if r.reserved_known else "allocated"
        used = r.reserved_bytes if r.reserved_known else r.allocated_bytes
        parts.append(
            f"Far from capacity: {fmt_bytes(used)} {what} of {fmt_bytes(d.capacity_bytes)}"
            f" ({_pct(used / d.capacity_bytes)}), {fmt_bytes(d.headroom_bytes)} of "
            "headroom: nothing needs to shrink.")
    elif r.oom is None and d.failed_elsewhere is not None:
        parts.append(f"The job ran out of memory on {other_device_text(r, d.failed_elsewhere)}: "
                     "this device is "
                     "shown for comparison, and its knobs would not have changed that.")
    elif r.oom is None and d.small:
        what = "reserved" if r.reserved_known else "allocated"
        used = r.reserved_bytes if r.reserved_known else r.allocated_bytes
        parts.append(f"Small: {fmt_bytes(used)} {what}, far below any GPU's memory: nothing "
                     "needs to shrink.")
    if d.large_cache and not is_host(r):
        parts.append(_cache_words(r))
    if d.knobs and d.evidence is not None and not is_host(r) and \
            d.workload in (None, "undetermined"):
        parts.append(_workload_words(d))
    if d.knobs and d.knobs[0].id not in named:
        k = d.knobs[0]
        lead = ("Knob" if d.at_oom and r.oom is not None else
                "To make it fit" if d.oom_named and not d.history else
                "If this peak must shrink" if d.history else "If this state must shrink")
        if not d.at_oom and d.capacity_bytes is not None and d.headroom_bytes is not None:
            lead = (f"Near capacity ({fmt_bytes(d.headroom_bytes)} of headroom); "
                    "if this peak must shrink")
        parts.append(f"{lead}: {k.knob} ({cost_text(k)}) — {k.effect}.")
        replayed = d.replays.get(k.id)
        changed = replayed.prediction.changed if replayed and replayed.prediction else None
        if replayed is not None and replayed.oom_gone and changed is not None:
            parts.append("Replayed through the allocator model, the recorded window runs "
                         "with it to its end: the OOM goes away (peak reserved "
                         f"{fmt_bytes(changed.peak_reserved)}).")
        named.add(k.id)
    for k in d.knobs:  # an allocator setting the replay bears out, where the verdict is silent
        if k.id not in named and k.id in d.replays and d.replays[k.id].oom_gone:
            parts.append(f"Also: {k.knob} ({cost_text(k)}) — "
                         f"{replay_gone_words(d.replays[k.id])}.")
    return " ".join(parts)


def _workload_words(d: Diagnosis) -> str:
    """The workload and, where it is not known, the advice for either answer."""
    assert d.evidence is not None
    text = d.evidence.workload.sentence
    if d.workload not in (None, "undetermined"):
        return text
    trained = next((k for k in d.knobs if k.workload == TRAINING), None)
    frozen = next((k for k in d.knobs if k.workload == INFERENCE), None)
    if trained and frozen:
        text += (f" If this forward is trained: {trained.knob}; if it is not: {frozen.knob} "
                 "(which would break a trained one).")
    elif trained:
        text += f" If this forward is trained: {trained.knob}."
    elif frozen:
        text += f" Only if this forward is not trained: {frozen.knob}."
    return text


def _cache_words(r: DeviceReport) -> str:
    """A large cache, said with what acts on it (the knobs on it the diagnosis offers)."""
    d = r.diagnosis
    if r.cached_unallocated_bytes is None:  # not computable: the diagnosis never flags it
        return ""
    share = r.cached_unallocated_bytes / r.reserved_bytes
    text = (f"The cache is large: {fmt_bytes(r.cached_unallocated_bytes)} of the "
            f"{fmt_bytes(r.reserved_bytes)} PyTorch reserved ({_pct(share)}) is cached but "
            "unallocated")
    if d.capacity_bytes and r.reserved_bytes >= 0.9 * d.capacity_bytes:
        text += f", with the device near its {fmt_bytes(d.capacity_bytes)} capacity"
    knobs = [k.knob for k in d.knobs if LargeCache.vocab_id in k.causes
             and (k.id not in d.replays or d.replays[k.id].helps is not False)]
    if knobs:
        text += "; acting on it: " + "; ".join(knobs) + " (caveats in the knob list)"
    return text + "."


KNOB_COLUMNS = ("knob", "cost", "acts on", "effect", "caveat", "applies because",
                "predicted by replay")


def knob_rows(r: DeviceReport) -> list[tuple[str, str, str, str, str, str, str]]:
    """Every knob of the diagnosis, in its order, with the evidence that it applies to this
    job and what replaying it predicts: every format shows this same list."""
    d = r.diagnosis
    return [(k.knob, cost_text(k), ", ".join(k.families + k.causes), k.effect, k.caveat,
             d.applies.get(k.id, ""), replay_text(d.replays.get(k.id), knob_route(k)))
            for k in d.knobs]


def knob_route(k: Knob) -> ReplayRoute:
    """Which snapana whatif replays knob `k` (scaling.toml and the pack's allocator
    settings): the same for every format."""
    return replay_route(k.id, k.simulate)


#: Why a knob has no replay in the report, and where whatif replays it, by how whatif
#: replays it (`scaling.ReplayRoute.how`).
_NOT_REPLAYED: dict[str, Callable[[ReplayRoute], str]] = {
    "none": lambda route: "not simulated (no mechanical model of it)",
    "fit": lambda route: (
        f"not simulated in this report: {route.command} replays it"
        f"{f' as {route.step}' if route.step else ''}, one size past the largest that fits"),
    "fit_size": lambda route: (
        f"not simulated in this report: {route.command} replays other {route.key} "
        "sizes; the largest that fits is this knob's setting"),
    "set": lambda route: (
        f"not simulated in this report (no recorded window to replay): {route.command} "
        "replays it where a trace is recorded"),
}


def _not_replayed(route: ReplayRoute | None) -> str:
    """Why a knob has no replay in the report, and where whatif replays it."""
    route = route or ReplayRoute("none")
    words = _NOT_REPLAYED.get(route.how)
    if words is not None:
        return words(route)
    return (f"not simulated in this report: {route.command} replays it over the recorded "
            "window (not --fit: it changes when memory is freed, not what a size needs)")


#: What a replay of a recorded OOM's window cannot say, in every sentence that predicts one.
WINDOW_ENDS = "the window ends at the OOM: what the job does after it is not recorded"


def replay_text(r: KnobReplay | None, route: ReplayRoute | None = None) -> str:
    """What the allocator model predicts for a knob over the recorded window, in words; not
    replayed here, which whatif replays it (`route`), or that none has a model of it."""
    if r is None:
        return _not_replayed(route)
    p = r.prediction
    if p is None or p.changed is None:
        return r.note
    c, rec = p.changed, p.recorded
    peaks = (f"peak reserved {fmt_bytes(c.peak_reserved)} (as recorded, in the model: "
             f"{fmt_bytes(rec.peak_reserved)})")
    if rec.recorded_ooms:
        if not c.simulated_ooms:
            margin = replay_margin(r)
            spare = f", {fmt_bytes(margin)} to spare at its peak" if margin is not None else ""
            return (f"the recorded OOM goes away{spare}; {peaks}; a simulation of the recorded "
                    f"window ({WINDOW_ENDS})")
        return (f"the recorded OOM stays (event {c.simulated_ooms[0][0]}); {peaks}; a "
                "simulation of the recorded window")
    if c.peak_reserved >= rec.peak_reserved:
        return (f"no OOM either way, and peak reserved does not fall: {peaks}; the replay "
                "does not bear this knob out here (a simulation of the recorded window)")
    return f"no OOM either way; {peaks}; a simulation of the recorded window"


def replay_margin(replay: KnobReplay | None) -> int | None:
    """What PyTorch could still hold at the changed run's peak (capacity − peak reserved),
    where a replay predicts the recorded OOM goes away and the capacity is known."""
    if replay is None or replay.oom_gone is not True or replay.prediction is None:
        return None
    p = replay.prediction
    if p.capacity is None or p.changed is None:
        return None
    return p.capacity - p.changed.peak_reserved


def replay_gone_words(replay: KnobReplay) -> str:
    """The replay's prediction that the OOM goes away, with its margin and what the window
    is (it ends at the OOM: what the job would do after it is in no file)."""
    margin = replay_margin(replay)
    spare = f", {fmt_bytes(margin)} to spare at its peak" if margin is not None else ""
    return ("replayed through the allocator model, the recorded window runs to its end "
            f"without the OOM{spare} ({WINDOW_ENDS})")


def workload_statement(r: DeviceReport) -> str:
    """The one statement about the workload every section and format makes."""
    ev = r.diagnosis.evidence
    return ev.workload.sentence if ev is not None else ""


def settings_statement(r: DeviceReport) -> str:
    """The allocator settings the capture records, one line (none for host memory)."""
    ev = r.diagnosis.evidence
    if ev is None or not r.source.row.allocator_segments:
        return ""
    return ev.settings_line()


_CAN_GO = {"yes": "yes", "offload": "by offloading", "shrink": "only shrink (op in flight)",
           "unknown": "not known"}


def _window_words(p: Prediction) -> str:
    """The whole window replayed without a family: the recorded OOM, and the peak."""
    assert p.changed is not None
    if p.changed.simulated_ooms:
        return ("replaying the window without it, the job still runs out of memory (event "
                f"{p.changed.simulated_ooms[0][0]})")
    return ("replaying the window without it, the recorded OOM goes away (peak reserved "
            f"{fmt_bytes(p.changed.peak_reserved)})")


#: A what-if row for a family under this share of allocated is left out (unless it alone
#: makes the request fit, or the verdict names it): a few KiB cannot change the outcome.
WHATIF_MIN_SHARE = 0.01


def shown_what_ifs(r: DeviceReport) -> list[WhatIf]:
    """The what-ifs a report shows: none without a request and without history (each row
    would only restate the family's size at the snapshot), and not the negligible ones."""
    d = r.diagnosis
    if not d.history and all(w.fits is None for w in d.what_ifs):
        return []
    floor = WHATIF_MIN_SHARE * r.allocated_bytes
    named = {d.excess_family, d.alternative_family, d.request_family}
    return [w for w in d.what_ifs if w.fits or w.bytes >= floor or w.family in named]


def what_if_rows(r: DeviceReport) -> list[tuple[str, str, str, str]]:
    d = r.diagnosis
    rows = []
    for w in shown_what_ifs(r):
        if w.fits is None:
            result = (f"peak lower by {fmt_bytes(w.bytes)}" if d.history else
                      f"{fmt_bytes(w.bytes)} less at the high-water mark"
                      if r.source.row.host_heap else
                      f"{fmt_bytes(w.bytes)} less at the snapshot")
        elif w.fits:
            result = f"fits ({w.how}), {fmt_bytes(w.spare_bytes)} to spare: {spare_sum(w)}"
        else:
            result = f"still short by {fmt_bytes(-(w.spare_bytes or 0))}"
        if w.private_pool_bytes and w.fits is not None:
            result += f" — {pool_words(w)}"
        replayed = d.whatif_replays.get(w.family)
        if replayed is not None and replayed.changed is not None:
            result += f" — {_window_words(replayed)}"
        can_go = _CAN_GO.get(w.removable, "no (model state)")
        if w.by_offload and d.reloading:
            can_go = "by offloading (not offered: the OOM is in the reload)"
        rows.append((w.family, fmt_bytes(w.bytes), result, can_go))
    return rows


def cause_rows(r: DeviceReport) -> list[tuple[str, str, str]]:
    """Each cause the diagnosis checked: its name, holds / rejected / not measured, and why,
    in words, with the headline's own figures (each in its kind's words: `causes.py`)."""
    rows = [(c.label, c.status, c.reason(r)) for c in r.diagnosis.causes]
    return rows + allocator_rows(r)


def allocator_rows(r: DeviceReport) -> list[tuple[str, str, str]]:
    """The knobs' allocator settings the replay shows removing the recorded OOM, as a cause
    row: the cause checks and the knob table tell one story (a demand the allocator's own
    placement made too large for the device, which the setting's placement fits)."""
    d = r.diagnosis
    return [("the allocator's placement", f"{k.knob} removes it (replay)",
             f"{k.knob}: {replay_gone_words(d.replays[k.id])}")
            for k in d.knobs if k.id in d.replays and d.replays[k.id].oom_gone]


def inferred_note(g: Group) -> str:
    """How much of a family was inferred rather than decided by a stack rule ('' if none)."""
    if not g.inferred_bytes:
        return ""
    if g.inferred_bytes == g.bytes:
        return "all inferred"
    return f"{fmt_bytes(g.inferred_bytes)} inferred"


_EVIDENCE_WORDS = {"inventory": "named tensor (sidecar)", "frames": "stack frames (a rule)",
                   "inferred": "inferred", "unknown": "none: no rule decided it"}


def evidence_note(g: Group) -> str:
    """What decided the family's bytes: "stack frames (a rule)" when one kind did it all,
    else each kind with its bytes ("stack frames (a rule) 3.10 GiB, inferred 1.00 GiB")."""
    if len(g.evidence) == 1:
        return _EVIDENCE_WORDS.get(g.evidence[0][0], g.evidence[0][0])
    return ", ".join(f"{_EVIDENCE_WORDS.get(e, e)} {fmt_bytes(b)}" for e, b in g.evidence)
