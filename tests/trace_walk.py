"""An independent walker of a torch.profiler chrome trace's memory events, for tests and
benchmarks: plain json over the file, never snapana. Each `[memory]` instant event carries
the allocator's running `Total Allocated` after it (torch/csrc/profiler: the reporter's own
counter) and the signed `Bytes` it moved; the peak allocated is the largest running total,
which must equal the running sum of `Bytes` from the first event (on the CPU the counter
starts at profiling start: blocks made before it are not counted, nor their frees)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path


def memory_events(path: Path, device_type: int = 0) -> list[dict]:
    """The trace's `[memory]` events on one device type (0: CPU, 1: CUDA), by time."""
    data = path.read_bytes()
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    events = [e for e in json.loads(data)["traceEvents"]
              if e.get("name") == "[memory]" and e["args"].get("Device Type") == device_type]
    return [e["args"] for e in sorted(events, key=lambda e: e["ts"])]  # stable: ties kept


def peak_allocated(path: Path, device_type: int = 0) -> int:
    """The largest `Total Allocated` the trace records, checked against the running sum of
    `Bytes` (a trace where the two disagree is no ground truth)."""
    events = memory_events(path, device_type)
    running = peak = 0
    for e in events:
        running += e["Bytes"]
        peak = max(peak, running)
    recorded = max((e["Total Allocated"] for e in events), default=0)
    if recorded != peak:
        raise ValueError(f"{path}: Total Allocated peaks at {recorded:,}, the running sum of "
                         f"Bytes at {peak:,}")
    return recorded
