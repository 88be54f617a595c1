"""Machine-readable output: plain ints for bytes, stable keys (scripts and users read them)."""

from __future__ import annotations

import json
import math
from typing import Any

from snapana.analysis.compare import FamilyChange, SiteChange
from snapana.analysis.diagnosis.findings import Diagnosis, OomFinding
from snapana.analysis.family_timeline import FamilyGrowth
from snapana.analysis.scaling import replay_route
from snapana.limits import MAX_FRAME_TEXT
from snapana.model import Frame
from snapana.printed import Size
from snapana.render import Options
from snapana.render.check import CheckView
from snapana.render.scale import ScaleView
from snapana.render.text_log import TRACEBACK_SCOPE, TextLogView
from snapana.render.views import CaptureView, DeviceView, DiffView, RanksView
from snapana.render.whatif import WhatIfView
from snapana.units import encodable, shown_name


def _dump(data: dict[str, Any]) -> str:
    """JSON as the standard has it: a non-finite number an input carried (an allocator
    setting of Infinity in a hand-edited export) is written as text, never as the bare
    `Infinity` / `NaN` no strict parser reads; a lone surrogate (a file name's byte that is
    not UTF-8) as the text `\\udcff`, never the escape of a lone surrogate, which a strict
    parser refuses and a lax one hands on unencodable."""
    try:
        text = json.dumps(data, indent=2, allow_nan=False)
    except ValueError:
        text = ""
    if not text or "\\ud" in text:  # a surrogate's escape, or a pair's: rare, walked then
        text = json.dumps(_finite(data), indent=2, allow_nan=False)
    return text + "\n"


def _finite(value: Any) -> Any:
    """`value` with each non-finite float spelled as text ("inf", "-inf", "nan") and each
    string made encodable (`units.encodable`)."""
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    if isinstance(value, str):
        return encodable(value)
    if isinstance(value, dict):
        return {encodable(k) if isinstance(k, str) else k: _finite(v)
                for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def _frames(stack: tuple[Frame, ...]) -> list[dict[str, Any]]:
    """A stack as the JSON shows it: names bounded (`units.shown_name`; the API and an
    export keep them whole)."""
    return [{"filename": shown_name(f[0], MAX_FRAME_TEXT),
             "name": shown_name(f[1], MAX_FRAME_TEXT), "line": f[2]} for f in stack]


# ----- a capture --------------------------------------------------------------------------
def capture(view: CaptureView, options: Options) -> str:
    """The devices of the capture; under a rank table (`summary DIR`), the ranks first and
    the devices of the rank shown in full."""
    data: dict[str, Any] = {}
    if view.ranks is not None:
        data.update(ranks_dict(view.ranks))
    if view.device_rows:
        gpus = [d.report for d in view.devices if not d.host]
        data["device_table"] = {
            "columns": list(view.device_columns), "rows": [list(r) for r in view.device_rows],
            "note": view.device_note,
            "devices": [{"device": r.device, "peak_allocated_bytes": r.peak_allocated_bytes,
                         "oom_requested_bytes": r.oom.requested_bytes if r.oom else None,
                         "top_family": r.groups[0].name if r.groups else None,
                         "top_family_bytes": r.groups[0].bytes if r.groups else 0}
                        for r in gpus]}
    data["devices"] = [device_dict(d) for d in view.devices]
    if view.log_checks:
        data["log_checks"] = [{"title": c.title, "verdict": c.verdict,
                               "columns": list(c.COLUMNS), "rows": [list(r) for r in c.rows]}
                              for c in view.log_checks]
    return _dump(data)


def device_dict(d: DeviceView) -> dict[str, Any]:
    """One device. Figures the source cannot measure are null (a profiler trace has no
    reserved or cached figure), never 0."""
    r = d.report
    segments = r.has_segments and not d.host
    return {
        "file": r.path,
        "source": r.source,
        "device": r.device,
        "device_name": d.name,
        "host": d.host,
        "failed": r.failed,  # its trace records an OOM; devices come failing first
        "moment": {"kind": r.moment.kind, "event_index": r.moment.idx,
                   "time_us": r.moment.time_us, "asked_for": r.at,
                   "text": d.moment},
        "history": r.diagnosis.history,
        "reserved_bytes": r.reserved_bytes if r.reserved_known and not d.host else None,
        "allocated_bytes": r.allocated_bytes,
        "pending_free_bytes": r.pending_free_bytes,
        "cached_unallocated_bytes": r.cached_unallocated_bytes if segments else None,
        "largest_free_block_bytes": r.largest_free_block_bytes if segments else None,
        "pools": [{"pool": p.pool, "stream": p.stream, "reserved_bytes": p.reserved_bytes,
                   "free_bytes": p.free_bytes, "largest_free_bytes": p.largest_free_bytes,
                   "expandable": p.expandable}
                  for p in r.pools],
        "peak_allocated_bytes": r.peak_allocated_bytes,
        "peak": {"event_index": r.peak.idx, "time_us": r.peak.time_us},
        "oom": None if r.oom is None else _oom(r.oom),
        "headline": [{"what": k, "value": v} for k, v in d.headline],
        "groups": [
            {"family": g.name, "name": g.name, "bytes": g.bytes, "blocks": g.blocks,
             "label": g.label, "inferred_bytes": g.inferred_bytes,
             "sites": list(g.sites), "chunks": list(g.chunks),
             "repeats": d.group_notes.get(g.name, "")}
            for g in r.groups
        ],
        "diagnosis": _diagnosis(r.diagnosis, d),
        "growth": [{"family": g.family, "start_bytes": g.start_bytes,
                    "peak_bytes": g.peak_bytes, "moment_bytes": g.moment_bytes,
                    "max_bytes": g.max_bytes, "allocations": g.allocations,
                    "allocation_bytes": g.allocation_bytes, "uniform_size": g.uniform_size,
                    "phase": g.phase, "text": text}
                   for g, text in zip(r.timeline.growth if d.growth else (), d.growth,
                                      strict=True)],
        "by_pool_stream": list(r.by_pool_stream),
        "events": r.n_events,
        "before_recording_bytes": r.before_recording_bytes,
        "warnings": list(r.warnings),
    }


def _oom(o: OomFinding) -> dict[str, Any]:
    return {"requested_bytes": o.requested_bytes, "device_free_bytes": o.device_free_bytes,
            "gap_bytes": o.gap_bytes, "stream": o.stream, "event_index": o.event_index,
            "count": o.count, "stack": _frames(o.stack)}


def _diagnosis(d: Diagnosis, view: DeviceView) -> dict[str, Any]:
    """The findings, with the words every format shows (`verdict`, each cause's `status` and
    `reason`, each what-if's `result`): the same knob list, in the same order, as the text,
    markdown and HTML."""
    return {
        "headline": view.lead,
        "evidence": list(view.answer.evidence),
        "verdict": view.verdict,
        "kind": d.kind,
        "phase": d.phase,
        "request": None if d.request_bytes is None else {
            "requested_bytes": d.request_bytes, "rounded_bytes": d.request_rounded_bytes,
            "segment_bytes": d.request_segment_bytes, "family": d.request_family,
            "label": d.request_label, "site": d.request_site},
        "capacity_bytes": d.capacity_bytes,
        "outside_pytorch_bytes": d.outside_pytorch_bytes,
        "causes": [{"id": c.id, "holds": c.holds, "status": status, "reason": reason,
                    **c.numbers}
                   for c, (_, status, reason) in zip(d.causes, view.causes, strict=False)]
        + [{"id": "allocator_placement", "holds": True, "status": status, "reason": reason}
           for _, status, reason in view.causes[len(d.causes):]],
        "excess_family": d.excess_family,
        "accumulating": None if d.accumulating is None else {
            "family": d.excess_family, **d.accumulating},
        "alternative_family": d.alternative_family,
        "reloading": d.reloading,
        "headroom_bytes": d.headroom_bytes,
        "prescribe": d.prescribe,
        "empty": d.empty,
        "large_cache": d.large_cache,
        "small": d.small,
        "failed_elsewhere": d.failed_elsewhere,
        "workload": d.workload,
        "workload_evidence": list(d.evidence.workload.evidence) if d.evidence else [],
        "workload_statement": view.job.workload,
        "facts": dict(d.evidence.facts) if d.evidence else {},
        "allocator_settings": None if d.evidence is None or d.evidence.settings is None
        else dict(d.evidence.settings),
        "allocator_settings_statement": view.job.settings,
        "expandable_segments": d.evidence.expandable if d.evidence else None,
        "free_segment_bytes": dict(d.evidence.free_segment_bytes) if d.evidence else {},
        "knob_families": list(d.knob_families),
        "shortfall_bytes": d.shortfall_bytes,
        "without_copies": None if d.without_copies is None else {
            "bytes": d.without_copies.bytes, "blocks": d.without_copies.blocks,
            "fits": d.without_copies.fits, "spare_bytes": d.without_copies.spare_bytes,
            "spare_terms": [list(t) for t in d.without_copies.spare_terms]},
        "what_ifs": [{"family": w.family, "bytes": w.bytes, "blocks": w.blocks,
                      "fits": w.fits, "spare_bytes": w.spare_bytes,
                      "short_bytes": None if w.fits is None or w.fits else -(w.spare_bytes or 0),
                      "how": w.how, "removable": w.removable,
                      "private_pool_bytes": w.private_pool_bytes,
                      "private_pools": list(w.private_pools),
                      "private_pool_reserved_bytes": w.private_pool_reserved_bytes,
                      "fits_if_pool_released": w.fits_if_pool_released,
                      "spare_terms": [list(t) for t in w.spare_terms],
                      "window_replay": _window_replay(d.whatif_replays.get(w.family)),
                      "result": row[2], "can_go": row[3]}
                     for w, row in zip(view.what_if_items, view.what_ifs, strict=True)],
        "knobs": [{"id": k.id, "framework": k.framework, "knob": k.knob,
                   "families": list(k.families), "causes": list(k.causes),
                   "direction": k.direction, "cost": k.cost, "effect": k.effect,
                   "caveat": k.caveat, "workload": k.workload,
                   "applies": d.applies.get(k.id, ""),
                   # the generic knobs of the same mechanism listed as this one
                   "same_mechanism_as": list(d.same_as.get(k.id, ())),
                   "replay": _knob_replay(d.replays.get(k.id)),
                   "replayed_by": _replayed_by(k, row[6])}
                  for k, row in zip(d.knobs, view.knobs, strict=True)],
        "frameworks": list(d.frameworks),
        "oom_named": d.oom_named,
        # without history: the live blocks by size (count × size = total), related sizes in
        # one group, largest group first; and demand or fragmentation from the segments
        "size_groups": [{"total_bytes": g.total, "blocks": g.count,
                         "sizes": [{"size_bytes": row.size, "count": row.count,
                                    "total_bytes": row.total,
                                    "fraction_of_largest": g.ratio(row)} for row in g.rows]}
                        for g in d.size_groups],
        "size_rows": [{"blocks": b, "total": t, "share": sh, "related": rel}
                      for b, t, sh, rel in view.sizes],
        "demand_statement": view.demand,
    }


# ----- a diff -----------------------------------------------------------------------------
def diff(view: DiffView, options: Options) -> str:
    d = view.diff
    return _dump({
        "verdict": view.verdict,
        "before": vars(d.before),
        "after": vars(d.after),
        "peak_change_bytes": d.peak_change_bytes,
        "allocated_change_bytes": d.allocated_change_bytes,
        "reserved_change_bytes": d.reserved_change_bytes,
        "oom_gone": d.oom_gone,
        "families": [_family(f) for f in d.families],
        "sites": [_site(s) for s in d.sites],
        "new_sites": [[s.family, s.site] for s in d.new_sites],
        "vanished_sites": [[s.family, s.site] for s in d.vanished_sites],
        "growth": [{"family": c.family, "before": _grew(c.before), "after": _grew(c.after),
                    "change_bytes": c.change_bytes, "max_change_bytes": c.max_change_bytes,
                    "text": text}
                   for c, text in zip(d.growth, view.growth, strict=True)],
        "history_note": view.history_note,
    })


def _grew(g: FamilyGrowth | None) -> dict[str, int] | None:
    """A side's growth of one family (None: its trace never held the family)."""
    if g is None:
        return None
    return {"start_bytes": g.start_bytes, "moment_bytes": g.moment_bytes,
            "max_bytes": g.max_bytes}


def _family(f: FamilyChange) -> dict[str, Any]:
    return {"family": f.family, "label": f.label, "before_bytes": f.before_bytes,
            "after_bytes": f.after_bytes, "change_bytes": f.change_bytes,
            "before_blocks": f.before_blocks, "after_blocks": f.after_blocks,
            "status": f.status}


def _site(s: SiteChange) -> dict[str, Any]:
    return {"family": s.family, "site": s.site, "before_bytes": s.before_bytes,
            "after_bytes": s.after_bytes, "change_bytes": s.change_bytes,
            "before_blocks": s.before_blocks, "after_blocks": s.after_blocks,
            "before_chunks": s.before_chunks, "after_chunks": s.after_chunks,
            "status": s.status}


# ----- the ranks of a job -----------------------------------------------------------------
def ranks(view: RanksView, options: Options) -> str:
    return _dump(ranks_dict(view))


def ranks_dict(view: RanksView) -> dict[str, Any]:
    m = view.report
    entries: list[dict[str, Any]] = []
    for r in m.ranks:
        entries.append({
            "file": r.file, "rank": r.rank, "error": r.error, "device": r.device,
            "oom": r.oom, "reserved_bytes": r.reserved_bytes if not r.error else None,
            "allocated_bytes": r.allocated_bytes if not r.error else None,
            "peak_allocated_bytes": r.peak_allocated_bytes if not r.error else None,
            "top_family": r.top_family, "families": r.families,
            "first_oom": m.first_oom is r,
            "outlier_families": [o["family"] for o in m.outliers if o["file"] == r.file],
        })
    return {"headline": view.headline, "inputs": entries, "one_job": m.one_job,
            "why_not_one_job": m.why_not_one_job, "outliers": m.outliers,
            "skipped": list(m.skipped), "beside": list(m.beside)}


def _size(s: Size | None) -> dict[str, Any] | None:
    return None if s is None else {"bytes": s.bytes, "slack_bytes": s.slack, "printed": s.text}


def _request(r: Any, knobs: tuple[tuple[str, str], ...]) -> dict[str, Any] | None:
    """The failing request named from its traceback (None: no traceback read)."""
    if r is None:
        return None
    t = r.traceback
    return {"scope": TRACEBACK_SCOPE, "family": r.family, "label": r.label, "rule": r.rule_id,
            "phase": r.phase, "site": r.site or None, "code": r.code or None,
            "owners": [{"framework": fw, "where": w} for fw, w in r.owners],
            "workload": r.workload, "forward_only_pass": r.forward_only or None,
            "knobs": [{"knob": k, "why": why} for k, why in knobs],
            "traceback": {"line": t.first_line, "rank": t.rank,
                          "frames": [{"file": f.path, "line": f.line or None,  # 0: not known
                                      "function": f.function, "code": f.code}
                                     for f in t.frames]}}


def text_log(view: TextLogView, options: Options) -> str:
    """A text log's OOM messages: each figure as printed and in bytes (with the rounding it
    may carry), the split, the causes with their terms, the knobs, the notes."""
    messages = []
    for m in view.messages:
        msg, d = m.diagnosis.message, m.diagnosis
        messages.append({
            "line": msg.line, "rank": msg.rank, "device": msg.device, "backend": msg.backend,
            "wording": msg.wording, "releases": msg.releases, "prefix": msg.prefix,
            "request": _size(msg.request), "capacity": _size(msg.capacity),
            "free": _size(msg.free), "allocated": _size(msg.allocated),
            "reserved": _size(msg.reserved), "unallocated": _size(msg.unallocated),
            "this_process": _size(msg.this_process),
            "private_pools": _size(msg.private_pools), "allowed": _size(msg.allowed),
            "processes": [{"pid": pid, **(_size(s) or {})} for pid, s in msg.processes],
            "segment_bytes": d.segment,
            "split": [{"what": w, "bytes": n} for w, n in d.split],
            "shortfall_bytes": d.shortfall, "missing": list(d.missing),
            "causes": [{"id": c.id, "role": c.role, "needed_bytes": c.needed,
                        "share_of_shortfall": c.share,
                        "terms": [{"what": w, "bytes": n} for w, n in c.terms],
                        "text": t} for c, t in zip(d.causes, m.causes, strict=True)],
            "knobs": [{"knob": k, "why": why} for k, why in m.knobs],
            "failing_request": _request(m.finding, m.request_knobs),
            "notes": list(m.oddities), "verdict": m.verdict})
    sections = [{"id": sec.id, "title": sec.title, "verdict": sec.verdict,
                 "sentences": list(sec.sentences), "columns": list(sec.columns),
                 "rows": [list(r) for r in sec.rows],
                 "knobs": [{"knob": k, "why": why} for k, why in sec.knobs]}
                for sec in view.sections]
    return _dump({"source": "text_log", "title": view.title, "messages": messages,
                  "verdict": view.verdict, "sections": sections,
                  "ranks": {"columns": list(view.rank_columns),
                            "rows": [list(r) for r in view.rank_rows]},
                  "not_read": list(view.unrecognised), "record": list(view.record),
                  "settings": [{"setting": s.id, "framework": s.framework, "name": s.name,
                                "value": s.value, "printed": s.printed, "line": s.line,
                                "format": s.format, "log": s.source,
                                "changes_knobs": [k for k, sid in view.set_knobs
                                                  if sid == s.id]}
                               for s in view.settings]})


def _window_replay(p: Any) -> dict[str, Any] | None:
    """The window replayed without a family (None: not replayed)."""
    if p is None or p.changed is None:
        return None
    return {"oom_gone": not p.changed.simulated_ooms,
            "ooms": [{"event": i, "request_bytes": n} for i, n in p.changed.simulated_ooms],
            "peak_reserved_bytes": p.changed.peak_reserved,
            "peak_allocated_bytes": p.changed.peak_allocated}


def _replayed_by(k: Any, predicted: str) -> dict[str, Any]:
    """Which snapana whatif replays a knob (`how`: fit, fit_size, set, flag or none), and the
    knob table's "predicted by replay" words."""
    route = replay_route(k.id, k.simulate)
    return {"how": route.how, "command": route.command or None, "step": route.step or None,
            "predicted": predicted}


def _knob_replay(r: Any) -> dict[str, Any] | None:
    """A knob's replay in numbers (None: it has no allocator settings to replay)."""
    if r is None:
        return None
    p = r.prediction
    return {"settings": list(r.settings), "note": r.note or None,
            "oom_gone": r.oom_gone, "helps": r.helps,
            "peak_reserved_bytes": None if p is None else p.changed.peak_reserved,
            "recorded_peak_reserved_bytes": None if p is None else p.recorded.peak_reserved}


def whatif(view: WhatIfView, options: Options) -> str:
    """Each device's proof and prediction, with the figures of both runs in bytes."""
    def run(r: Any) -> dict[str, Any] | None:
        if r is None:
            return None
        return {"peak_reserved_bytes": r.peak_reserved, "peak_allocated_bytes": r.peak_allocated,
                "segment_events": len(r.simulated),
                "ooms": [{"event": i, "request_bytes": n} for i, n in r.simulated_ooms],
                "stopped": r.stopped or None, "cut_at_event": r.cut_at}
    devices = []
    for d in view.devices:
        p, r = d.prediction, d.prediction.recorded
        devices.append({
            "device": d.device, "proof": d.proof, "verdict": d.verdict,
            "reproduced": p.trusted, "recorded_segment_events": len(r.recorded),
            "divergence": None if r.divergence is None else {
                "position": r.divergence[0], "event": r.divergence[1], "why": r.divergence[2]},
            "recorded_ooms": r.recorded_ooms, "capacity_bytes": p.capacity,
            "recorded_capacity_bytes": p.recorded_capacity,
            "smallest_capacity_bytes": p.smallest, "smallest_note": p.smallest_note or None,
            "as_recorded": run(r), "changed": run(p.changed)})
    return _dump({"source": "whatif", "title": view.title, "change": view.change,
                  "devices": devices, "not_simulated": list(view.not_simulated),
                  "footer": view.footer})


def check(view: CheckView, options: Options) -> str:
    """Each budget line with its limit and measured figure (bytes, or a share)."""
    return _dump({"source": "check", "title": view.title, "budget": view.budget,
                  "where": view.where, "within_budget": not view.breaches,
                  "verdict": view.verdict,
                  "checks": [{"name": c.name, "limit": c.limit, "measured": c.actual,
                              "holds": c.ok, "detail": c.detail or None,
                              "limit_value": c.limit_value, "measured_value": c.actual_value}
                             for c in view.checks]})


def scale(view: ScaleView, options: Options) -> str:
    """Each device's runs in bytes, the largest size that fits and its proof, the
    assumptions and the blocks held fixed."""
    def run(r: Any) -> dict[str, Any] | None:
        if r is None:
            return None
        return {"sizes": dict(r.sizes), "peak_allocated_bytes": r.replay.peak_allocated,
                "peak_reserved_bytes": r.replay.peak_reserved, "fits": r.fits,
                "ooms": [{"event": i, "request_bytes": n} for i, n in r.replay.simulated_ooms],
                "stopped": r.replay.stopped or None}
    devices = []
    for d in view.devices:
        p, f = d.prediction, d.prediction.fit
        held = p.growth.held_fixed()
        devices.append({
            "device": d.device, "head": list(d.head), "proof": d.proof, "verdict": d.verdict,
            "sized_for": p.growth.sized_for or None,
            "padded_seq": p.growth.padded_seq() or None,
            "padded_for": p.growth.padded_for() or None,
            "recorded_seq": p.growth.sizes["seq"].recorded if "seq" in p.growth.sizes else None,
            "peak_shares": {"peak_bytes": p.shares.peak, **{
                k.replace(" ", "_") + "_bytes": v for k, v in p.shares.by.items()}},
            "recorded_peak_allocated_bytes": p.recorded_peak_allocated,
            "recorded_peak_reserved_bytes": p.recorded_peak_reserved,
            "at_recorded_size": run(p.proof), "at_asked_size": run(p.target),
            "capacity_bytes": p.capacity, "capacity_note": p.capacity_note,
            "fit": None if f is None else {
                "knob": f.knob, "largest": f.largest, "note": f.note or None,
                "withheld": f.withheld or None,
                "knobs": [{"id": k, "knob": name} for k, name in f.knobs],
                "replays": f.replays, "proof": run(f.proof), "past": run(f.past),
                "next_step": [{"id": k.id, "knob": k.text, "step": k.step or k.id,
                               "caveat": k.caveat or None,
                               "at_next": run(k.at_next), "largest": k.largest,
                               "largest_note": k.note or None}
                              for k in f.steps]},
            "fit_words": list(d.fit), "assumptions": list(d.assumptions),
            "held_fixed": [{"site": s, "family": fam, "why": w, "blocks": n, "bytes": b}
                           for s, fam, w, n, b in held.select(
                               "site", "family", "why", "blocks", "bytes").iter_rows()]})
    return _dump({"source": "whatif", "title": view.title, "change": view.change,
                  "devices": devices, "footer": view.footer})
