"""Machine-readable output: plain ints for bytes, stable keys (scripts and users read them)."""

from __future__ import annotations

import json
from typing import Any

from snapana.compare import FamilyChange, SiteChange
from snapana.diagnosis import Diagnosis, OomFinding
from snapana.model import Frame
from snapana.render import Options
from snapana.render.views import CaptureView, DeviceView, DiffView, RanksView


def _dump(data: dict[str, Any]) -> str:
    return json.dumps(data, indent=2) + "\n"


def _frames(stack: tuple[Frame, ...]) -> list[dict[str, Any]]:
    return [{"filename": f[0], "name": f[1], "line": f[2]} for f in stack]


# ----- a capture --------------------------------------------------------------------------
def capture(view: CaptureView, options: Options) -> str:
    return _dump({"devices": [device_dict(d) for d in view.devices]})


def device_dict(d: DeviceView) -> dict[str, Any]:
    r = d.report
    return {
        "file": r.path,
        "source": r.source,
        "device": r.device,
        "device_name": d.name,
        "moment": {"kind": r.moment.kind, "event_index": r.moment.idx,
                   "time_us": r.moment.time_us, "asked_for": r.at},
        "reserved_bytes": r.reserved_bytes,
        "allocated_bytes": r.allocated_bytes,
        "pending_free_bytes": r.pending_free_bytes,
        "cached_unallocated_bytes": r.cached_unallocated_bytes,
        "largest_free_block_bytes": r.largest_free_block_bytes,
        "pools": [{"pool": p.pool, "stream": p.stream, "reserved_bytes": p.reserved_bytes,
                   "free_bytes": p.free_bytes, "largest_free_bytes": p.largest_free_bytes}
                  for p in r.pools],
        "peak_allocated_bytes": r.peak_allocated_bytes,
        "peak": {"event_index": r.peak.idx, "time_us": r.peak.time_us},
        "oom": None if r.oom is None else _oom(r.oom),
        "groups": [
            {"family": g.name, "name": g.name, "bytes": g.bytes, "blocks": g.blocks,
             "label": g.label, "inferred_bytes": g.inferred_bytes,
             "sites": list(g.sites), "chunks": list(g.chunks)}
            for g in r.groups
        ],
        "diagnosis": _diagnosis(r.diagnosis, d.verdict),
        "by_pool_stream": list(r.by_pool_stream),
        "events": r.n_events,
        "before_recording_bytes": r.before_recording_bytes,
        "warnings": list(r.warnings),
    }


def _oom(o: OomFinding) -> dict[str, Any]:
    return {"requested_bytes": o.requested_bytes, "device_free_bytes": o.device_free_bytes,
            "gap_bytes": o.gap_bytes, "stream": o.stream, "event_index": o.event_index,
            "count": o.count, "stack": _frames(o.stack)}


def _diagnosis(d: Diagnosis, text: str) -> dict[str, Any]:
    return {
        "verdict": text,
        "kind": d.kind,
        "phase": d.phase,
        "request": None if d.request_bytes is None else {
            "requested_bytes": d.request_bytes, "rounded_bytes": d.request_rounded_bytes,
            "segment_bytes": d.request_segment_bytes, "family": d.request_family,
            "label": d.request_label, "site": d.request_site},
        "capacity_bytes": d.capacity_bytes,
        "outside_pytorch_bytes": d.outside_pytorch_bytes,
        "causes": [{"id": c.id, "holds": c.holds, **c.numbers} for c in d.causes],
        "excess_family": d.excess_family,
        "what_ifs": [{"family": w.family, "bytes": w.bytes, "blocks": w.blocks,
                      "fits": w.fits, "spare_bytes": w.spare_bytes, "how": w.how,
                      "removable": w.removable} for w in d.what_ifs],
        "knobs": [{"id": k.id, "framework": k.framework, "knob": k.knob,
                   "families": list(k.families), "causes": list(k.causes),
                   "direction": k.direction, "effect": k.effect, "caveat": k.caveat}
                  for k in d.knobs],
        "frameworks": list(d.frameworks),
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
    })


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
    return _dump({"inputs": entries, "one_job": m.one_job,
                  "why_not_one_job": m.why_not_one_job, "outliers": m.outliers})
