"""Wording shared by the text renderers, so markdown, terminal and HTML say the same thing."""

from __future__ import annotations

from snapana.diagnosis import DeviceReport
from snapana.units import fmt_bytes


def moment_text(r: DeviceReport) -> str:
    if r.moment.kind == "oom":
        return f"at the OOM (event {r.moment.idx})"
    return "at the snapshot (no OOM recorded)"


def headline_rows(r: DeviceReport) -> list[tuple[str, str]]:
    rows = []
    if r.oom is not None:
        rows.append(("requested (failed allocation)", fmt_bytes(r.oom["requested_bytes"])))
        rows.append(("device free at the OOM", fmt_bytes(r.oom["device_free_bytes"])))
        if r.oom["gap_bytes"] is not None:
            rows.append(("short by", fmt_bytes(r.oom["gap_bytes"])))
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
