"""What must hold on every success: the figures of `summary -f json` are consistent."""

from __future__ import annotations

import json
import re
from typing import Any

#: Byte figures that are differences and may be negative (spare after a what-if, the gap
#: between a request and the free memory, a shortfall, a diff's delta).
SIGNED = ("spare_bytes", "gap_bytes", "shortfall_bytes", "delta_bytes", "change_bytes")


def _no_constants(name: str) -> Any:
    raise ValueError(f"JSON holds {name}")


def strict_json(text: str) -> Any:
    """Parse JSON refusing NaN/Infinity (json.dumps writes them; JSON has no such values)."""
    return json.loads(text, parse_constant=_no_constants)


#: Objects a report echoes from its input as they were written (the allocator settings PyTorch
#: recorded, the job's metadata): their keys are the input's, not figures of the report.
ECHOED = ("allocator_settings", "metadata")


def _byte_figures(obj: Any, path: str = "") -> list[tuple[str, Any]]:
    found = []
    stack = [(obj, path)]
    while stack:
        o, p = stack.pop()
        if isinstance(o, dict):
            for k, v in o.items():
                if k not in ECHOED:
                    stack.append((v, f"{p}.{k}"))
        elif isinstance(o, list):
            for i, v in enumerate(o):
                stack.append((v, f"{p}[{i}]"))
        elif p.rsplit(".", 1)[-1].endswith("bytes") or p.rsplit(".", 1)[-1] == "bytes":
            found.append((p, o))
    return found


#: How a report flags figures that cannot add up: live blocks outside what the segments
#: reserve (a trace with segment events but not the final segments, a trace that lost some).
#: Such a report may show allocated > reserved and a negative cached figure: it says so.
INCONSISTENT = "the figures are inconsistent"


def summary_violations(text: str) -> list[str]:
    """Invariants of a `summary -f json` output; [] when all hold. Per device: the groups
    add up to allocated; reserved = allocated + pending free + cached unallocated (one
    definition, never a different figure); allocated <= reserved unless the device's
    warnings flag its figures as inconsistent; byte figures are integers and never negative
    (a figure of a state that cannot exist is null: "not computable"); the largest free
    block is at most the cached bytes; at the peak, allocated is the peak."""
    try:
        doc = strict_json(text)
    except ValueError as exc:
        return [f"json: {exc}"]
    if isinstance(doc, dict) and isinstance(doc.get("messages"), list):
        return text_log_violations(doc)
    if not isinstance(doc, dict) or not isinstance(doc.get("devices"), list):
        return ["json: no devices list"]
    bad = []
    for i, dev in enumerate(doc["devices"]):
        where = f"devices[{i}]"
        alloc, reserved = dev.get("allocated_bytes"), dev.get("reserved_bytes")
        pending, cached = dev.get("pending_free_bytes"), dev.get("cached_unallocated_bytes")
        flagged = any(INCONSISTENT in str(w) for w in dev.get("warnings") or [])
        groups = dev.get("groups") or []
        total = sum(g.get("bytes", 0) for g in groups)
        if isinstance(alloc, int) and total != alloc:
            bad.append(f"groups: {where} groups sum to {total}, allocated_bytes is {alloc}")
        if _ints(alloc, reserved) and alloc > reserved and not flagged:
            bad.append(f"reserved: {where} allocated_bytes {alloc} > reserved_bytes {reserved}"
                       " and no warning says the figures are inconsistent")
        if _ints(alloc, reserved, pending, cached) and cached != reserved - alloc - pending:
            bad.append(f"cached: {where} cached_unallocated_bytes {cached} != reserved - "
                       f"allocated - pending_free = {reserved - alloc - pending}")
        largest = dev.get("largest_free_block_bytes")
        if _ints(largest, cached) and largest > cached:
            bad.append(f"impossible: {where} largest_free_block_bytes {largest} > "
                       f"cached_unallocated_bytes {cached}")
        moment, peak = dev.get("moment") or {}, dev.get("peak_allocated_bytes")
        if (isinstance(moment, dict) and moment.get("kind") == "peak" and dev.get("history")
                and _ints(alloc, peak) and alloc != peak):
            bad.append(f"impossible: {where} allocated_bytes {alloc} at the peak, "
                       f"peak_allocated_bytes {peak}")
        for path, v in _byte_figures(dev, where):
            if v is None:
                continue
            if not isinstance(v, int) or isinstance(v, bool):
                bad.append(f"type: {path} = {v!r} is not an integer")
            elif v < 0 and not path.endswith(SIGNED):
                bad.append(f"negative: {path} = {v}")
    return _rank_violations(doc.get("inputs")) + bad


#: How the rank runner words an input whose analysis raised an unexpected exception (it
#: reports it and goes on with the other ranks; for the fuzzer that is an internal error).
UNEXPECTED = ": could not analyse: "


def _rank_violations(inputs: Any) -> list[str]:
    """The rank table of several inputs: an unexpected exception in a rank is a finding
    (`rank-internal`), and each analysed rank's families add up to its allocated bytes."""
    bad = []
    for i, entry in enumerate(inputs if isinstance(inputs, list) else []):
        error = str(entry.get("error") or "")
        if UNEXPECTED in error:
            bad.append(f"rank-internal: {error.split(UNEXPECTED, 1)[1][:160]}")
        elif not error and _ints(entry.get("allocated_bytes")):
            total = sum((entry.get("families") or {}).values())
            if total != entry["allocated_bytes"]:
                bad.append(f"groups: inputs[{i}] families sum to {total}, allocated_bytes "
                           f"is {entry['allocated_bytes']}")
    return bad


def _ints(*values: Any) -> bool:
    return all(isinstance(v, int) and not isinstance(v, bool) for v in values)


def text_log_violations(doc: dict[str, Any]) -> list[str]:
    """Invariants of a text log's `summary -f json` (issue 58): at most MAX_LOG_MESSAGES
    messages, each at a line of the text; every byte figure an integer within 2^64 (a
    printed figure past it is refused, never read as a float's rounding)."""
    from snapana.limits import MAX_LOG_MESSAGES

    bad = []
    messages = doc["messages"]
    if len(messages) > MAX_LOG_MESSAGES:
        bad.append(f"count: {len(messages)} messages, more than {MAX_LOG_MESSAGES}")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not _ints(m.get("line")) or m["line"] < 1:
            bad.append(f"line: messages[{i}] has no line of the text")
    for path, v in _byte_figures({k: v for k, v in doc.items() if k != "not_read"}):
        if v is None:
            continue
        if not isinstance(v, int) or isinstance(v, bool):
            bad.append(f"type: {path} = {v!r} is not an integer")
        elif abs(v) > 1 << 65:  # a sum of two figures of 2^64 at most
            bad.append(f"bound: {path} = {v} is past 2^65")
    return bad


#: A live markdown link or image: `](` not escaped (snapana's own card, `](card.png)`, is its
#: one image); raw HTML a renderer runs (`<img`, `<a `); zero-width characters that hide
#: text from the reader (U+200B, U+200D, U+FEFF).
_LIVE_LINK = re.compile(r"(?<!\\)\]\((?!card\.png\))")
_RAW_HTML = re.compile(r"<(img|a)[\s>/]", re.IGNORECASE)
_ZERO_WIDTH = re.compile("[\u200b\u200d\ufeff]")
_CODE_SPAN = re.compile(r"`[^`\n]+`")


def markdown_violations(text: str) -> list[str]:
    """Invariants of markdown output (issue 66): a name or a log line from the input shows
    as text, never as a link, an image, HTML or hidden characters."""
    bad = []
    shown = _CODE_SPAN.sub("``", text)  # a code span shows its text as it is
    for what, pattern, where in (("link", _LIVE_LINK, shown), ("html", _RAW_HTML, shown),
                                 ("zero-width", _ZERO_WIDTH, text)):
        m = pattern.search(where)
        if m:
            bad.append(f"{what}: {where[max(m.start() - 30, 0):m.end() + 30]!r}")
    return bad
