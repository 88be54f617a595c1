"""Wording shared by the text renderers, so markdown, terminal and HTML say the same thing."""

from __future__ import annotations

from snapana.diagnosis import DeviceReport
from snapana.units import fmt_bytes

HOST_SOURCES = ("memray",)  # sources that measure a process's heap, not a caching allocator


def device_text(r: DeviceReport) -> str:
    return r.device_name or f"device {r.device}"


_MOMENT_NAMES = {"oom": "the OOM", "peak": "the peak", "snapshot": "the end of the capture"}


def moment_text(r: DeviceReport) -> str:
    """Which moment a report shows, and whether the user chose it (--at)."""
    if r.source in HOST_SOURCES:
        return "at the heap's high-water mark"
    m = r.moment
    where = "before the first event" if m.idx < 0 else f"event {m.idx}"
    if m.time_us is not None and m.kind == "time":
        where += f", trace time {m.time_us} µs"
    if r.at is not None:
        return f"at {_MOMENT_NAMES.get(m.kind, where)} ({where}; chosen with --at {r.at})"
    if m.kind == "oom":
        return f"at the OOM ({where})"
    if m.kind == "peak":
        return f"at the peak ({where}; no OOM recorded)"
    return "at the snapshot (no OOM, no allocation history recorded)"


def headline_rows(r: DeviceReport) -> list[tuple[str, str]]:
    rows = []
    if r.oom is not None:
        rows.append(("requested (failed allocation)", fmt_bytes(r.oom["requested_bytes"])))
        rows.append(("device free at the OOM", fmt_bytes(r.oom["device_free_bytes"])))
        if r.oom["gap_bytes"] is not None:
            rows.append(("short by", fmt_bytes(r.oom["gap_bytes"])))
    if r.source in HOST_SOURCES:
        return rows + [("heap at the high-water mark", fmt_bytes(r.allocated_bytes))]
    rows += [
        ("reserved by PyTorch", fmt_bytes(r.reserved_bytes)),
        ("allocated", fmt_bytes(r.allocated_bytes)),
        ("cached but unallocated", fmt_bytes(r.cached_unallocated_bytes)),
        ("largest free cached block", fmt_bytes(r.largest_free_block_bytes)),
        ("peak allocated (timeline)", fmt_bytes(r.peak_allocated_bytes)),
    ]
    if r.pending_free_bytes:
        rows.append(("freed, waiting on a stream", fmt_bytes(r.pending_free_bytes)))
    return rows


PHASE_NAMES = {"init": "model init", "forward": "forward", "backward": "backward",
               "optimizer": "optimizer step", "rollout": "rollout / generation",
               "logprobs": "log-prob", "weight_update": "weight update",
               "unknown": "an unidentified"}


def _chunk_phrase(r: DeviceReport, family: str) -> str:
    group = next((g for g in r.groups if g.name == family), None)
    if group is None or not group.chunks:
        return ""
    c = group.chunks[0]
    if not c["uniform"] or c["total"] * 2 < group.bytes:
        return ""  # a few repeated blocks among many: not what this family is made of
    return (f": {c['count']} chunks × {fmt_bytes(c['chunk_size'])} = "
            f"{fmt_bytes(c['total'])} from one site")


def _phase_words(phase: str) -> str:
    if phase == "unknown":
        return "phase not identified"
    return f"{PHASE_NAMES.get(phase, phase)} phase"


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def verdict(r: DeviceReport) -> str:
    """One paragraph a tired engineer can act on; the evidence follows it in every report."""
    d = r.diagnosis
    if d is None:
        return ""
    parts: list[str] = []
    if d.kind == "oom" and r.oom is not None:
        what = f"{d.request_label} at {d.request_site}" if d.request_label else d.request_site
        frag = d.cause("fragmentation")
        largest = frag.numbers["largest_free_block_bytes"] if frag else 0
        phase = ("Out of memory (phase not identified)" if d.phase == "unknown" else
                 f"Out of memory in the {PHASE_NAMES.get(d.phase, d.phase)} phase")
        parts.append(
            f"{phase}: a {fmt_bytes(d.request_bytes)} request ({what}) found "
            f"{fmt_bytes(r.oom['device_free_bytes'])} free on the device and no cached block "
            f"large enough in its pool (largest {fmt_bytes(largest)})."
        )
        if frag and frag.holds:
            parts.append(
                f"Fragmentation: {fmt_bytes(r.cached_unallocated_bytes)} is cached but "
                f"unallocated ({_pct(frag.numbers['cached_share'])} of reserved), yet no free "
                "block is large enough; compacted, the request would fit."
            )
        elif frag:
            parts.append(
                f"This is real demand, not fragmentation: only "
                f"{fmt_bytes(r.cached_unallocated_bytes)} is cached but unallocated "
                f"({_pct(frag.numbers['cached_share'])} of reserved)."
            )
        out = d.cause("outside_pytorch")
        if out and out.holds:
            parts.append(
                f"{fmt_bytes(d.outside_pytorch_bytes)} ({_pct(out.numbers['share'])} of the "
                "device) is held outside this process's PyTorch allocator: another process, "
                "NCCL, or a colocated inference engine."
            )
        elif d.cause("capacity_unknown"):
            parts.append("(Device capacity unknown: pass --capacity to measure memory held "
                         "outside PyTorch.)")
        pool = d.cause("private_pool")
        if pool and pool.holds:
            parts.append(f"{fmt_bytes(pool.numbers['private_pool_free_bytes'])} sits free in "
                         "private pools the request cannot use.")
        w = next((w for w in d.what_ifs if w.family == d.excess_family), None)
        if w is not None:
            parts.append(
                f"The excess that can go is {w.family} ({fmt_bytes(w.bytes)}"
                f"{_chunk_phrase(r, w.family)}): without it the request fits with "
                f"{fmt_bytes(w.spare_bytes)} to spare."
            )
        else:
            parts.append(f"No single family's removal makes it fit: the request itself "
                         f"({d.request_family}) must shrink.")
    else:
        top = ", ".join(f"{g.name} {fmt_bytes(g.bytes)}" for g in r.groups[:3])
        where = ("the high-water mark" if r.source in HOST_SOURCES else
                 "the peak" if d.kind == "peak" else "the snapshot")
        opening = (f"Shown {moment_text(r)}" if r.at is not None
                   else f"No OOM recorded: this diagnoses {where}")
        parts.append(
            f"{opening} ({fmt_bytes(r.allocated_bytes)} "
            f"allocated, {_phase_words(d.phase)}). Largest: {top}."
        )
    if d.knobs:
        k = d.knobs[0]
        parts.append(f"Knob: {k.knob} — {k.effect}.")
    return " ".join(parts)


def knob_rows(r: DeviceReport, limit: int = 6) -> list[tuple[str, str, str, str]]:
    d = r.diagnosis
    if d is None:
        return []
    return [(k.knob, ", ".join(k.families + k.causes), k.effect, k.caveat)
            for k in d.knobs[:limit]]


def what_if_rows(r: DeviceReport) -> list[tuple[str, str, str, str]]:
    d = r.diagnosis
    if d is None:
        return []
    rows = []
    for w in d.what_ifs:
        if w.fits is None:
            result = f"peak lower by {fmt_bytes(w.bytes)}"
        elif w.fits:
            result = f"fits ({w.how}), {fmt_bytes(w.spare_bytes)} to spare"
        else:
            result = f"still short by {fmt_bytes(-(w.spare_bytes or 0))}"
        rows.append((w.family, fmt_bytes(w.bytes), result,
                     {"yes": "yes", "offload": "by offloading",
                      "shrink": "only shrink (op in flight)"}.get(
                         w.removable, "no" if w.family == "unknown" else "no (model state)")))
    return rows


def cause_rows(r: DeviceReport) -> list[tuple[str, str, str]]:
    d = r.diagnosis
    if d is None:
        return []
    rows = []
    for c in d.causes:
        nums = ", ".join(
            f"{k.removesuffix('_bytes')}={fmt_bytes(v) if k.endswith('_bytes') else v}"
            for k, v in c.numbers.items()
        )
        rows.append((c.id, "yes" if c.holds else "no", nums))
    return rows
