"""The words of several devices of one process and of the ranks of a job (`snapana
ranks`), shared by every format."""

from __future__ import annotations

import os

from snapana.analysis.diagnosis.findings import DeviceReport
from snapana.analysis.ranks.aggregate import MultiReport, RankSummary
from snapana.render.wording.single import _MOMENT_NAMES, device_text
from snapana.units import fmt_bytes, inert, plural

# ----- the devices of one process ----------------------------------------------------------

DEVICE_COLUMNS = ("device", "shown at", "peak allocated", "OOM", "top family")
#: Peaks further apart than this factor are called uneven.
SKEW_FACTOR = 1.5


def _family_bytes(r: DeviceReport, family: str) -> int:
    return next((g.bytes for g in r.groups if g.name == family), 0)


def device_rows(reports: list[DeviceReport]) -> list[tuple[str, str, str, str, str]]:
    """A row per GPU of one process: its peak, its OOM and the family holding most."""
    return [(device_text(r), _MOMENT_NAMES.get(r.moment.kind, f"event {r.moment.idx}"),
             fmt_bytes(r.peak_allocated_bytes),
             f"yes, {fmt_bytes(r.oom.requested_bytes)} request" if r.oom is not None else "no",
             f"{r.groups[0].name} {fmt_bytes(r.groups[0].bytes)}" if r.groups else "-")
            for r in reports]


def skew_text(reports: list[DeviceReport]) -> str:
    """How far apart the devices' peaks are, and what an uneven spread implies: only among
    devices that held memory (a device the job never used is no replica), and "peak" only
    where history was recorded (a state-only capture has one moment)."""
    idle = [r for r in reports if not (r.peak_allocated_bytes or r.reserved_bytes)]
    reports = [r for r in reports if r not in idle]
    unused = (" " + ", ".join(device_text(r) for r in idle) +
              (" holds" if len(idle) == 1 else " hold") + " no memory.") if idle else ""
    if len(reports) < 2:
        return (f"Only {device_text(reports[0])} holds memory: nothing to compare."
                if reports else "No device holds memory.") + unused
    if not all(r.diagnosis.history for r in reports):
        return _skew(reports, "holds", "hold alike") + unused
    return _skew(reports, "peaked at", "peak alike") + unused


def _skew(reports: list[DeviceReport], verb: str, alike: str) -> str:
    hi = max(reports, key=lambda r: r.peak_allocated_bytes)
    lo = min(reports, key=lambda r: r.peak_allocated_bytes)
    if hi.peak_allocated_bytes <= SKEW_FACTOR * lo.peak_allocated_bytes:
        return (f"The {len(reports)} devices {alike} ({fmt_bytes(lo.peak_allocated_bytes)}"
                f" to {fmt_bytes(hi.peak_allocated_bytes)}).")
    others = ", ".join(f"{device_text(r)} at {fmt_bytes(r.peak_allocated_bytes)}"
                       for r in sorted(reports, key=lambda r: -r.peak_allocated_bytes)
                       if r is not hi)
    ran_out = " and ran out of memory" if hi.oom is not None else ""
    ratio = (f"{hi.peak_allocated_bytes / lo.peak_allocated_bytes:.1f}× the smallest"
             if lo.peak_allocated_bytes else "the smallest holds nothing")
    text = (f"Uneven: {device_text(hi)} {verb} {fmt_bytes(hi.peak_allocated_bytes)}"
            f"{ran_out} while {others} ({ratio}).")
    if hi.groups:
        top = hi.groups[0].name
        text += (f" Devices holding replicas of one model (nn.DataParallel, data parallel) "
                 f"should {alike.split()[0]} alike, so look at what {device_text(hi)} holds "
                 "beyond the "
                 f"others: {top} {fmt_bytes(hi.groups[0].bytes)} there, "
                 f"{fmt_bytes(_family_bytes(lo, top))} on {device_text(lo)}; if the model is "
                 f"split across them (pipeline or manual placement), moving layers off "
                 f"{device_text(hi)} evens them out.")
    return text


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


_SEPARATORS = "_-. "


def short_names(files: list[str]) -> list[str]:
    """Each file's name without what all of them share at the start: the part that tells
    them apart ('oom_snapshot_rank0.pickle', ... -> '…rank0.pickle', ...). The prefix is cut
    at a separator (_ - . or space), so a rank number is never split."""
    names = [f.replace("\\", "/").rsplit("/", 1)[-1] for f in files]
    if len(names) < 2:
        return names
    cut = len(os.path.commonprefix(names))
    cut = max((i + 1 for i in range(cut) if names[0][i] in _SEPARATORS), default=0)
    if cut < 4 or any(len(n) == cut for n in names):
        return names
    return ["…" + n[cut:] for n in names]


def rank_label(m: MultiReport, r: RankSummary) -> str:
    """A rank by its number, else by the distinguishing part of its file name."""
    if r.rank is not None:
        return f"rank {r.rank}"
    return short_names([x.file for x in m.ranks])[m.ranks.index(r)]


def _no_oom(r: RankSummary) -> str:
    """A rank with no OOM entry: "no" only where history was recorded (a state-only dump
    cannot tell: the OOM the job hit before it left no entry)."""
    if r.history:
        return "no"
    return "unknown: no history, written at an OOM" if r.oom_named else "unknown: no history"


def rank_rows(m: MultiReport) -> list[tuple[str, str, str, str, str, str, str]]:
    out = []
    names = short_names([r.file for r in m.ranks])
    for r, name in zip(m.ranks, names, strict=True):
        oom = "-" if r.error else (f"yes, {fmt_bytes(r.oom['requested_bytes'])} request"
                                   if r.oom is not None else _no_oom(r))
        # a file name is one cell: a newline or tab in it is shown escaped, never a new line
        out.append((str(r.rank) if r.rank is not None else "?", inert(name, lines=False),
                    oom, fmt_bytes(r.reserved_bytes) if not r.error else "-",
                    fmt_bytes(r.allocated_bytes) if not r.error else "-",
                    r.top_family or "-", _note(m, r)))
    return out


def _no_oom_recorded(m: MultiReport) -> str:
    """No rank's history records an OOM: said as much, and where a dump without history says
    it was written at one (its name, its sidecar), that too, as its row does ("unknown: no
    history, written at an OOM"), so the headline never denies what a row says."""
    named = [r for r in m.ok if r.oom is None and not r.history and r.oom_named]
    if not named:
        return "No input recorded an OOM."
    return (f"No input's history records an OOM; {plural(len(named), 'dump')} without "
            f"history {'was' if len(named) == 1 else 'were'} written at one (see "
            f"{'its' if len(named) == 1 else 'their'} row).")


#: Files of a folder not taken as inputs, listed by name in the headline (the rest counted).
SKIPPED_SHOWN = 10


def ranks_headline(m: MultiReport) -> str:
    n_ok, n = len(m.ok), len(m.ranks)
    parts = [f"{plural(n, 'input')}, {n_ok} analysed."]
    if m.skipped:
        shown = "; ".join(m.skipped[:SKIPPED_SHOWN])
        more = f"; and {len(m.skipped) - SKIPPED_SHOWN} more" \
            if len(m.skipped) > SKIPPED_SHOWN else ""
        parts.append(f"{plural(len(m.skipped), 'other file')} not taken as inputs: "
                     f"{shown}{more}.")
    if m.beside:
        parts.append(f"{plural(len(m.beside), 'other capture')} of this folder: "
                     f"{'; '.join(m.beside)}.")
    first = m.first_oom
    if first is not None and first.oom is not None:
        name = inert(first.file.rsplit("/", 1)[-1], lines=False)
        who = f"rank {first.rank} ({name})" if first.rank is not None else name
        parts.append(f"First to run out of memory: {who},"
                     f" a {fmt_bytes(first.oom['requested_bytes'])} request.")
    else:
        parts.append(_no_oom_recorded(m))
    if m.outliers:
        o = m.outliers[0]
        who = (f"rank {o['rank']}" if o["rank"] is not None
               else inert(o["file"].rsplit("/", 1)[-1], lines=False))
        parts.append(f"{len(m.outliers)} outlier(s), e.g. {who}: {o['family']} "
                     f"{fmt_bytes(o['bytes'])} vs median {fmt_bytes(o['median_bytes'])}.")
    if not m.one_job:
        parts.append("These files do not look like one job (" + "; ".join(m.why_not_one_job)
                     + "): compare them with care.")
    return " ".join(parts)
