"""The words every format shares, so the terminal, markdown, JSON and HTML say the same thing:
the verdicts, the moment, the headline numbers and the rows of each table. The view-models
(`views.py`) call these once; renderers only lay the results out.
"""

from __future__ import annotations

from pathlib import Path

from snapana.compare import CaptureDiff, Side, SiteChange
from snapana.diagnosis import DeviceReport, Group
from snapana.ranks import MultiReport, RankSummary
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
        rows.append(("requested (failed allocation)", fmt_bytes(r.oom.requested_bytes)))
        rows.append(("device free at the OOM", fmt_bytes(r.oom.device_free_bytes)))
        if r.oom.gap_bytes is not None:
            rows.append(("short by", fmt_bytes(r.oom.gap_bytes)))
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
    parts: list[str] = []
    if d.kind == "oom" and r.oom is not None:
        what = f"{d.request_label} at {d.request_site}" if d.request_label else d.request_site
        frag = d.cause("fragmentation")
        largest = int(frag.numbers["largest_free_block_bytes"]) if frag else 0
        phase = ("Out of memory (phase not identified)" if d.phase == "unknown" else
                 f"Out of memory in the {PHASE_NAMES.get(d.phase, d.phase)} phase")
        parts.append(
            f"{phase}: a {fmt_bytes(d.request_bytes)} request ({what}) found "
            f"{fmt_bytes(r.oom.device_free_bytes)} free on the device and no cached block "
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
            parts.append(f"{fmt_bytes(int(pool.numbers['private_pool_free_bytes']))} sits free in "
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
    return [(k.knob, ", ".join(k.families + k.causes), k.effect, k.caveat)
            for k in d.knobs[:limit]]


def what_if_rows(r: DeviceReport) -> list[tuple[str, str, str, str]]:
    d = r.diagnosis
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
    rows: list[tuple[str, str, str]] = []
    for c in d.causes:
        nums = ", ".join(
            f"{k.removesuffix('_bytes')}={fmt_bytes(int(v)) if k.endswith('_bytes') else v}"
            for k, v in c.numbers.items()
        )
        rows.append((c.id, "yes" if c.holds else "no", nums))
    return rows


# ----- a diff ------------------------------------------------------------------------------

TOP_FAMILIES = 3  # families named in the verdict


def signed(n: int) -> str:
    return fmt_bytes(n, signed=True) if n else "±0"


def _oom_phrase(d: CaptureDiff) -> str:
    b, a = d.before, d.after
    if b.has_oom and not a.has_oom:
        return "no OOM after"
    if b.has_oom and a.has_oom:
        return "still OOM after"
    if a.has_oom:
        return "OOM after (none before)"
    return "no OOM either side"


def diff_verdict(d: CaptureDiff) -> str:
    """One line: the families that moved most, the peak, and whether the OOM is gone —
    e.g. 'saved_logprob_softmax -3.32 GiB (gone); peak -2.44 GiB; no OOM after'."""
    if d.is_empty:
        return "no change: same families, sites and peak"
    moved = [f for f in d.families if f.change_bytes][:TOP_FAMILIES]
    parts = []
    if moved:
        parts.append(", ".join(f"{f.family} {signed(f.change_bytes)}"
                               + {"vanished": " (gone)", "new": " (new)"}.get(f.status, "")
                               for f in moved))
    else:
        parts.append("families unchanged")
    parts.append(f"peak {signed(d.peak_change_bytes)}")
    parts.append(_oom_phrase(d))
    return "; ".join(parts)


def side_text(s: Side) -> str:
    where = {"oom": "at the OOM", "peak": "at the peak", "snapshot": "at the snapshot"}.get(
        s.moment_kind, s.moment_kind)
    req = f", failed request {fmt_bytes(s.request_bytes)}" if s.request_bytes else ""
    return f"{Path(s.path).name} (device {s.device}, {where}, event {s.moment_idx}{req})"


def totals(d: CaptureDiff) -> list[tuple[str, int, int, int]]:
    b, a = d.before, d.after
    return [
        ("peak allocated", b.peak_allocated_bytes, a.peak_allocated_bytes, d.peak_change_bytes),
        ("allocated at the moment", b.allocated_bytes, a.allocated_bytes,
         d.allocated_change_bytes),
        ("reserved at the moment", b.reserved_bytes, a.reserved_bytes,
         d.reserved_change_bytes),
    ]


def total_rows(d: CaptureDiff) -> list[tuple[str, str, str, str]]:
    return [(k, fmt_bytes(b), fmt_bytes(a), signed(c)) for k, b, a, c in totals(d)]


def family_rows(d: CaptureDiff, all_rows: bool = False) -> list[tuple[str, str, str, str, str]]:
    return [(f.family, fmt_bytes(f.before_bytes), fmt_bytes(f.after_bytes),
             signed(f.change_bytes), f.status)
            for f in d.families if all_rows or f.status != "same"]


def site_rows(d: CaptureDiff, limit: int = 20) -> list[tuple[str, str, str, str, str, str]]:
    moved = [s for s in d.sites if s.status != "same"][:limit]
    return [(s.family, s.site, fmt_bytes(s.before_bytes), fmt_bytes(s.after_bytes),
             signed(s.change_bytes), _chunk_note(s) or s.status) for s in moved]


def _chunk_note(s: SiteChange) -> str:
    if s.before_chunks and not s.after_chunks:
        return f"{s.status}: {s.before_chunks} chunks gone"
    if s.after_chunks and not s.before_chunks:
        return f"{s.status}: {s.after_chunks} chunks"
    return ""


# ----- the ranks of a job -------------------------------------------------------------------

RANK_COLUMNS = ("rank", "file", "OOM", "reserved", "allocated", "top family", "note")


def _note(m: MultiReport, r: RankSummary) -> str:
    if r.error:
        return f"failed: {r.error}"
    notes = []
    if m.first_oom is r:
        notes.append("FIRST OOM")
    fams = [o["family"] for o in m.outliers if o["file"] == r.file]
    if fams:
        notes.append("outlier: " + ", ".join(fams))
    return "; ".join(notes)


def rank_rows(m: MultiReport) -> list[tuple[str, str, str, str, str, str, str]]:
    out = []
    for r in m.ranks:
        oom = "-" if r.error else (f"yes, {fmt_bytes(r.oom['requested_bytes'])} request"
                                   if r.oom is not None else "no")
        out.append((str(r.rank) if r.rank is not None else "?", r.file.rsplit("/", 1)[-1],
                    oom, fmt_bytes(r.reserved_bytes) if not r.error else "-",
                    fmt_bytes(r.allocated_bytes) if not r.error else "-",
                    r.top_family or "-", _note(m, r)))
    return out


def ranks_headline(m: MultiReport) -> str:
    n_ok, n = len(m.ok), len(m.ranks)
    parts = [f"{n} inputs, {n_ok} analysed."]
    first = m.first_oom
    if first is not None and first.oom is not None:
        parts.append(f"First to run out of memory: rank {first.rank} "
                     f"({first.file.rsplit('/', 1)[-1]}),"
                     f" a {fmt_bytes(first.oom['requested_bytes'])} request.")
    else:
        parts.append("No input recorded an OOM.")
    if m.outliers:
        o = m.outliers[0]
        parts.append(f"{len(m.outliers)} outlier(s), e.g. rank {o['rank']}: {o['family']} "
                     f"{fmt_bytes(o['bytes'])} vs median {fmt_bytes(o['median_bytes'])}.")
    if not m.one_job:
        parts.append("These files do not look like one job (" + "; ".join(m.why_not_one_job)
                     + "): compare them with care.")
    return " ".join(parts)


def inferred_note(g: Group) -> str:
    """How much of a family was inferred rather than decided by a stack rule ('' if none)."""
    if not g.inferred_bytes:
        return ""
    if g.inferred_bytes == g.bytes:
        return "all inferred"
    return f"{fmt_bytes(g.inferred_bytes)} inferred"
