"""How real captures lose their beginning, applied to a simulated snapshot so that its ground
truth still holds: recording started late (`start_late`: the model and optimizer were built
before `_record_memory_history`, so those blocks have no frames and no alloc event), or the
trace ring buffer wrapped (`ring_buffer`: only the last N entries survive, blocks keep their
frames)."""

from __future__ import annotations

import copy
from typing import Any


def _trace(snapshot: dict[str, Any]) -> list[dict[str, Any]]:
    traces = snapshot["device_traces"]
    if len(traces) != 1:
        raise ValueError("these transformations handle one-device snapshots")
    return list(traces[0])


def start_late(snapshot: dict[str, Any], first_event: int) -> dict[str, Any]:
    """The snapshot as if recording had begun just before trace entry `first_event`."""
    trace = _trace(snapshot)
    created: dict[int, int] = {}
    for i, entry in enumerate(trace):
        if entry["action"] == "alloc":
            created[int(entry["addr"])] = i
    out = copy.copy(snapshot)
    segments = []
    for seg in snapshot["segments"]:
        seg = dict(seg)
        blocks = []
        for block in seg["blocks"]:
            block = dict(block)
            early = created.get(int(block["address"]), -1) < first_event
            if block["state"] != "inactive" and early:
                block["frames"] = []  # allocated before recording: PyTorch keeps no stack
            blocks.append(block)
        seg["blocks"] = blocks
        segments.append(seg)
    out["segments"] = segments
    out["device_traces"] = [trace[first_event:]]
    start_us = trace[first_event]["time_us"] if first_event < len(trace) else None
    out["external_annotations"] = [
        a for a in snapshot.get("external_annotations", [])
        if start_us is None or a.get("time_us", 0) >= start_us]
    return out


def ring_buffer(snapshot: dict[str, Any], keep_last: int) -> dict[str, Any]:
    """The snapshot as if the trace ring buffer held only its last `keep_last` entries."""
    trace = _trace(snapshot)
    out = copy.copy(snapshot)
    out["device_traces"] = [trace[-keep_last:]]
    return out


def state_only(snapshot: dict[str, Any]) -> dict[str, Any]:
    """The snapshot as ``_dump_snapshot`` writes it when history was never recorded: the
    segments and their blocks, no trace and no block's stack."""
    _trace(snapshot)
    out = start_late(snapshot, len(_trace(snapshot)))
    out["device_traces"] = [[]]
    return out
