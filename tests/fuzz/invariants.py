"""What must hold on every success: the figures of `summary -f json` are consistent."""

from __future__ import annotations

import json
from typing import Any

#: Byte figures that are differences and may be negative (spare after a what-if, the gap
#: between a request and the free memory, a shortfall, a diff's delta).
SIGNED = ("spare_bytes", "gap_bytes", "shortfall_bytes", "delta_bytes", "change_bytes")


def _no_constants(name: str) -> Any:
    raise ValueError(f"JSON holds {name}")


def strict_json(text: str) -> Any:
    """Parse JSON refusing NaN/Infinity (json.dumps writes them; JSON has no such values)."""
    return json.loads(text, parse_constant=_no_constants)


def _byte_figures(obj: Any, path: str = "") -> list[tuple[str, Any]]:
    found = []
    stack = [(obj, path)]
    while stack:
        o, p = stack.pop()
        if isinstance(o, dict):
            for k, v in o.items():
                stack.append((v, f"{p}.{k}"))
        elif isinstance(o, list):
            for i, v in enumerate(o):
                stack.append((v, f"{p}[{i}]"))
        elif p.rsplit(".", 1)[-1].endswith("bytes") or p.rsplit(".", 1)[-1] == "bytes":
            found.append((p, o))
    return found


def summary_violations(text: str) -> list[str]:
    """Invariants of a `summary -f json` output; [] when all hold."""
    try:
        doc = strict_json(text)
    except ValueError as exc:
        return [f"json: {exc}"]
    if not isinstance(doc, dict) or not isinstance(doc.get("devices"), list):
        return ["json: no devices list"]
    bad = []
    for i, dev in enumerate(doc["devices"]):
        where = f"devices[{i}]"
        alloc, reserved = dev.get("allocated_bytes"), dev.get("reserved_bytes")
        groups = dev.get("groups") or []
        total = sum(g.get("bytes", 0) for g in groups)
        if isinstance(alloc, int) and total != alloc:
            bad.append(f"groups: {where} groups sum to {total}, allocated_bytes is {alloc}")
        if isinstance(alloc, int) and isinstance(reserved, int) and alloc > reserved:
            bad.append(f"reserved: {where} allocated_bytes {alloc} > reserved_bytes {reserved}")
        for path, v in _byte_figures(dev, where):
            if v is None:
                continue
            if not isinstance(v, int) or isinstance(v, bool):
                bad.append(f"type: {path} = {v!r} is not an integer")
            elif v < 0 and not path.endswith(SIGNED):
                bad.append(f"negative: {path} = {v}")
    return bad


def cached_violation(text: str) -> str | None:
    """The issue's stricter reading: cached = reserved - allocated - pending free. Reported by
    the campaign, not enforced by the test (the figure belongs to diagnosis)."""
    try:
        doc = strict_json(text)
    except ValueError:
        return None
    for i, dev in enumerate(doc.get("devices") or []):
        try:
            want = dev["reserved_bytes"] - dev["allocated_bytes"] - dev["pending_free_bytes"]
            got = dev["cached_unallocated_bytes"]
        except (KeyError, TypeError):
            continue
        if isinstance(got, int) and got != want:
            return (f"cached: devices[{i}] cached_unallocated_bytes {got} != reserved - "
                    f"allocated - pending_free = {want}")
    return None
