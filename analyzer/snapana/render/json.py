"""Machine-readable summary: plain ints for bytes, one entry per device."""

from __future__ import annotations

import json
from typing import Any

from snapana.diagnosis import DeviceReport, Diagnosis
from snapana.model import Frame
from snapana.render.text import device_text, verdict


def _frames(stack: tuple[Frame, ...]) -> list[dict[str, Any]]:
    return [{"filename": f[0], "name": f[1], "line": f[2]} for f in stack]


def device_dict(r: DeviceReport) -> dict[str, Any]:
    oom = None
    if r.oom is not None:
        oom = {k: v for k, v in r.oom.items() if k != "stack"}
        oom["stack"] = _frames(r.oom["stack"])
    return {
        "file": r.path,
        "source": r.source,
        "device": r.device,
        "device_name": device_text(r),
        "moment": {"kind": r.moment.kind, "event_index": r.moment.idx,
                   "time_us": r.moment.time_us, "asked_for": r.at},
        "reserved_bytes": r.reserved_bytes,
        "allocated_bytes": r.allocated_bytes,
        "pending_free_bytes": r.pending_free_bytes,
        "cached_unallocated_bytes": r.cached_unallocated_bytes,
        "largest_free_block_bytes": r.largest_free_block_bytes,
        "pools": [vars(p) for p in r.pools],
        "peak_allocated_bytes": r.peak_allocated_bytes,
        "peak": {"event_index": r.peak.idx, "time_us": r.peak.time_us},
        "oom": oom,
        "groups": [
            {"family": g.name, "name": g.name, "bytes": g.bytes, "blocks": g.blocks,
             "label": g.label, "sites": g.sites, "chunks": g.chunks}
            for g in r.groups
        ],
        "diagnosis": _diagnosis(r.diagnosis, verdict(r)),
        "by_pool_stream": r.by_pool_stream,
        "events": r.n_events,
        "before_recording_bytes": r.before_recording_bytes,
        "warnings": r.warnings,
    }


def _diagnosis(d: Diagnosis | None, text: str) -> dict[str, Any] | None:
    if d is None:
        return None
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
        "what_ifs": [vars(w) for w in d.what_ifs],
        "knobs": [{"id": k.id, "framework": k.framework, "knob": k.knob,
                   "families": list(k.families), "causes": list(k.causes),
                   "direction": k.direction, "effect": k.effect, "caveat": k.caveat}
                  for k in d.knobs],
        "frameworks": d.frameworks,
    }


def render(reports: list[DeviceReport]) -> str:
    return json.dumps({"devices": [device_dict(r) for r in reports]}, indent=2) + "\n"
