"""Read `torch.profiler.profile.export_memory_timeline` outputs into the common model.

Two layouts, both JSON (optionally gzip), neither naming the device it was exported for:

- raw (`*.raw.json.gz`): `[[t_ns, action, bytes, category], ...]`, t_ns -1 for memory that
  existed before profiling; action 1 PREEXISTING, 2 CREATE, 3 INCREMENT_VERSION (written as a
  negative record for the old category and a positive one for the new), 4 DESTROY (negative);
- plot (`*.json`, `*.json.gz`): `[times_us, sizes]`, each `sizes` row the bytes per category
  at that time (slot 0 unused, slot k+1 is category k).

Neither has addresses or stacks, so blocks are synthesized: a negative record frees the most
recent live block of the same size and category. Totals are exact either way; the category
becomes the block's only frame, `('<memory_timeline>', 'GRADIENT', 0)`, which an attribution
rule maps to a family (one rule per category).
"""

from __future__ import annotations

from array import array
from pathlib import Path
from typing import Any

import polars as pl

from snapana.capture_kinds import CaptureKind
from snapana.errors import InputError
from snapana.limits import MAX_BYTES, MAX_TIME
from snapana.model import (
    EVENT_SCHEMA,
    SEGMENT_SCHEMA,
    Capture,
    ReadProgress,
    StackTable,
    unsegmented_blocks,
)
from snapana.sources.json_stream import stream_json

FRAME_FILE = "<memory_timeline>"
#: torch/profiler/_memory_profiler.py `_CATEGORY_TO_INDEX` (the key order of
#: `_CATEGORY_TO_COLORS`, with None last), the index the files store; unchanged since 2.1.
CATEGORIES = ("PARAMETER", "OPTIMIZER_STATE", "INPUT", "TEMPORARY", "ACTIVATION", "GRADIENT",
              "AUTOGRAD_DETAIL", "UNKNOWN")
#: What each category is in snapana's families (attribution/packs/families.toml). The
#: attribution pack is the authority; this is recorded in metadata for reports and tests.
CATEGORY_FAMILY = {
    "PARAMETER": "parameters",
    "OPTIMIZER_STATE": "optimizer_state",
    "INPUT": "activation_temporaries",
    "TEMPORARY": "activation_temporaries",
    "ACTIVATION": "saved_activations",
    "GRADIENT": "gradients",
    "AUTOGRAD_DETAIL": "activation_temporaries",
    "UNKNOWN": "unknown",
}
ACTIONS = {1: "PREEXISTING", 2: "CREATE", 3: "INCREMENT_VERSION", 4: "DESTROY"}
DEVICE = 0
_SYNTH_BASE = 0x7D00_0000_0000_0000


def category_name(index: Any) -> str:
    """The Category name stored at `index` (None and anything unknown -> UNKNOWN)."""
    if isinstance(index, int) and not isinstance(index, bool) and 0 <= index < len(CATEGORIES):
        return CATEGORIES[index]
    return "UNKNOWN"


class _Builder:
    """Synthesized blocks per (size, category), events in file order, live blocks at the end."""

    def __init__(self) -> None:
        self.table = StackTable()
        self.rows: list[tuple[str, int, int, int | None, int]] = []  # events, in order
        self.live: dict[int, tuple[int, int]] = {}  # addr -> (size, stack id)
        self.by_key: dict[tuple[int, str], list[int]] = {}
        self.by_size: dict[int, list[int]] = {}
        self.by_cat: dict[str, list[int]] = {}
        self._stack: dict[str, int] = {}
        self._next = _SYNTH_BASE
        self.unmatched = 0
        self.recategorized = 0

    def stack_for(self, category: str) -> int:
        sid = self._stack.get(category)
        if sid is None:
            fid = self.table.frame_id((FRAME_FILE, category, 0))
            sid = self._stack[category] = self.table.stack_id((fid,))
        return sid

    def _event(self, action: str, addr: int, size: int, time_us: int | None, sid: int) -> None:
        self.rows.append((action, addr, size, time_us, sid))

    @property
    def cols(self) -> dict[str, list[Any]]:
        """The events as columns of EVENT_SCHEMA."""
        rows = self.rows
        n = len(rows)
        return {"device": [DEVICE] * n, "idx": list(range(n)),
                "action": [r[0] for r in rows], "addr": [r[1] for r in rows],
                "size": [r[2] for r in rows], "stream": [0] * n,
                "time_us": [r[3] for r in rows], "stack_id": [r[4] for r in rows],
                "device_free": [None] * n}

    def alloc(self, size: int, category: str, time_us: int | None) -> None:
        self._next += 1
        addr = self._next
        sid = self._stack.get(category)
        if sid is None:
            sid = self.stack_for(category)
        self.live[addr] = (size, sid)
        self.by_key.setdefault((size, category), []).append(addr)
        self.by_size.setdefault(size, []).append(addr)
        self.by_cat.setdefault(category, []).append(addr)
        self.rows.append(("alloc", addr, size, time_us, sid))

    def can_free(self, size: int, category: str) -> bool:
        return bool(self._live_addrs(self.by_key.get((size, category))))

    def _live_addrs(self, addrs: list[int] | None) -> list[int] | None:
        while addrs and addrs[-1] not in self.live:
            addrs.pop()  # already freed through the other index
        return addrs

    def free(self, size: int, category: str, time_us: int | None) -> None:
        """Free the latest live block of this size and category (then of this size)."""
        addrs = self._live_addrs(self.by_key.get((size, category)))
        if not addrs:
            addrs = self._live_addrs(self.by_size.get(size))
            if addrs:
                self.recategorized += 1
        if addrs:
            self._free_addr(addrs.pop(), time_us)
            return
        # no such block: it predates the timeline; replay counts it as such
        self._free_unknown(size, category, time_us)

    def _free_addr(self, addr: int, time_us: int | None) -> int:
        size, sid = self.live.pop(addr)
        self._event("free_requested", addr, size, time_us, sid)
        self._event("free_completed", addr, size, time_us, sid)
        return size

    def _free_unknown(self, size: int, category: str, time_us: int | None) -> None:
        self.unmatched += 1
        self._next += 1
        sid = self.stack_for(category)
        self._event("free_requested", self._next, size, time_us, sid)
        self._event("free_completed", self._next, size, time_us, sid)

    def shrink(self, category: str, amount: int, time_us: int | None) -> None:
        """Remove `amount` bytes of a category (plot layout): free whole blocks, newest first,
        and re-allocate the remainder of the last one so the total stays exact."""
        addrs = self.by_cat.get(category)
        while amount > 0:
            addrs = self._live_addrs(addrs)
            if not addrs:
                self._free_unknown(amount, category, time_us)
                return
            size = self._free_addr(addrs.pop(), time_us)
            if size > amount:
                self.alloc(size - amount, category, time_us)
            amount -= size

    def capture(self, path: Path, warnings: list[str], layout: str) -> Capture:
        if self.unmatched:
            warnings.append(f"{self.unmatched} free(s) in the timeline match no live block of "
                            "that size; counted as allocated before profiling")
        if self.recategorized:
            warnings.append(f"{self.recategorized} free(s) matched a block of another category "
                            "(same size)")
        warnings.append("a memory timeline does not record its device; shown as device 0")
        return Capture(
            source=CaptureKind.MEMORY_TIMELINE,
            path=str(path),
            stacks=self.table,
            segments=pl.DataFrame(schema=SEGMENT_SCHEMA),
            blocks=unsegmented_blocks(DEVICE, self.live),
            events=pl.DataFrame(self.cols, schema=EVENT_SCHEMA),
            devices=[DEVICE],
            warnings=warnings,
            has_trace=True,
            has_time=any(r[3] is not None for r in self.rows),
            metadata={
                "device_names": {DEVICE: "device of the export (not recorded)"},
                "memory_timeline_layout": layout,
                "category_families": dict(CATEGORY_FAMILY),
            },
        )


def _raw_capture(path: Path, records: _Records) -> Capture:
    """Raw layout. Within one timestamp, frees of live blocks go first so that no moment shows
    more than the file's own per-time total; frees of blocks created at that same time wait
    until after the creations."""
    b = _Builder()
    times, sizes = records.t.tolist(), records.nbytes.tolist()
    names = {c: category_name(c) for c in set(records.cat)}
    cats = [names[c] for c in records.cat]
    known = [t for t in times if t >= 0]
    t_first = min(known) // 1000 if known else None
    i, n = 0, len(times)
    while i < n:
        t = times[i]
        j = i
        while j < n and times[j] == t:
            j += 1
        t_us = t_first if t < 0 else t // 1000
        deferred = []
        for k in range(i, j):
            nbytes = sizes[k]
            if nbytes < 0:
                name = cats[k]
                if b.can_free(-nbytes, name):
                    b.free(-nbytes, name, t_us)
                else:
                    deferred.append((-nbytes, name))
        for k in range(i, j):
            if sizes[k] > 0:
                b.alloc(sizes[k], cats[k], t_us)
        for size, name in deferred:
            b.free(size, name, t_us)
        i = j
    warnings = ["memory allocated before profiling (PREEXISTING) is shown as allocated at the "
                "first timestamp"] if any(t < 0 for t in times) else []
    return b.capture(path, warnings, "raw")


def _plot_capture(path: Path, times: list[Any], sizes: list[Any]) -> Capture:
    """Plot layout: per time, the change of each category becomes frees (first) then allocs."""
    b = _Builder()
    width = max((len(r) for r in sizes), default=0)
    prev = [0] * width
    for t, row in zip(times, sizes, strict=True):
        t_us = int(t) if t is not None and t >= 0 else None
        cur = [int(v) for v in row] + [0] * (width - len(row))
        for slot in range(width):
            if cur[slot] < prev[slot]:
                b.shrink(category_name(slot - 1), prev[slot] - cur[slot], t_us)
        for slot in range(width):
            if cur[slot] > prev[slot]:
                b.alloc(cur[slot] - prev[slot], category_name(slot - 1), t_us)
        prev = cur
    return b.capture(path, [], "plot")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_time(v: Any) -> bool:
    """A finite number (not a bool) inside ±MAX_TIME (NaN fails every comparison)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and -MAX_TIME < v < MAX_TIME


#: Most category slots a plot row may have (PyTorch writes 9).
MAX_WIDTH = 256


def _is_plot(items: list[Any]) -> bool:
    if len(items) != 2 or not isinstance(items[0], list) or not isinstance(items[1], list):
        return False
    times, sizes = items
    return (len(times) == len(sizes)
            and all(isinstance(t, (int, float)) and not isinstance(t, bool) for t in times)
            and all(isinstance(r, list) and all(_is_int(v) for v in r) for r in sizes))


def _check_plot(path: Path, times: list[Any], sizes: list[Any]) -> None:
    """Times finite, sizes in [0, 2**62), rows of a sane width, totals inside int64."""
    for i, t in enumerate(times):
        if not _is_time(t):
            raise InputError(f"{path}: invalid memory timeline: times[{i}] is not a usable "
                             "time")
    for i, row in enumerate(sizes):
        if len(row) > MAX_WIDTH:
            raise InputError(f"{path}: invalid memory timeline: sizes[{i}] has {len(row)} "
                             f"slots (at most {MAX_WIDTH})")
        if row and (min(row) < 0 or sum(row) >= MAX_BYTES):
            raise InputError(f"{path}: invalid memory timeline: sizes[{i}] holds a negative "
                             "or out-of-range byte count")


class _Records:
    """Raw records, four int64 columns (compact: a long timeline is millions of them)."""

    def __init__(self) -> None:
        self.t = array("q")
        self.action = array("q")
        self.nbytes = array("q")
        self.cat = array("q")
        self.moved = 0

    def add(self, rec: tuple[int, int, int, int]) -> None:
        self.t.append(rec[0])
        self.action.append(rec[1])
        self.nbytes.append(rec[2])
        self.cat.append(rec[3])
        self.moved += abs(rec[2])


def _record_problem(item: Any) -> str | None:
    """Why `item` is not a raw record [t_ns, action, bytes, category] (None if it is one)."""
    if not (isinstance(item, list) and len(item) == 4 and all(_is_int(v) for v in item)):
        return "not four integers"
    t, action, nbytes, cat = item
    if action not in ACTIONS:
        return f"unknown action {action}"
    if not -MAX_TIME < t < MAX_TIME:
        return "time out of range"
    if not -MAX_BYTES < nbytes < MAX_BYTES:
        return "byte count out of range"
    if not -MAX_BYTES < cat < MAX_BYTES:
        return "category out of range"
    return None


def load(path: Path | str, progress: ReadProgress | None = None) -> Capture:
    """Read either export_memory_timeline JSON layout into a Capture for device 0."""
    path = Path(path)
    items: list[Any] = []  # the first two, undecided: [times, sizes] is also two lists
    records = _Records()
    bad: list[Any] = [0, None]  # count, (index, why) of the first

    def on_item(item: Any) -> None:
        if len(items) < 2:
            items.append(item)
            return
        why = _record_problem(item)
        if why is None:
            records.add(item)
            if records.moved >= MAX_BYTES:
                raise InputError(f"{path}: invalid memory timeline: the records move more "
                                 "than 2**62 bytes")
        else:
            if bad[1] is None:
                bad[1] = (len(items) + len(records.t) + bad[0], why)
            bad[0] += 1

    kind, _ = stream_json(path, progress, on_item)
    if kind == "array" and not len(records.t) and _is_plot(items):
        _check_plot(path, items[0], items[1])
        return _plot_capture(path, items[0], items[1])
    head = [(i, _record_problem(item)) for i, item in enumerate(items)]
    if kind == "array" and head and isinstance(items[0], list) and len(items[0]) == 4 \
            and not _is_plot(items):  # the raw layout: name the first bad record
        for i, why in head:
            if why is not None:
                raise InputError(f"{path}: invalid memory timeline: record {i}: {why}")
    if kind == "array" and head and all(why is None for _, why in head):
        if bad[0]:
            i, why = bad[1]
            raise InputError(f"{path}: invalid memory timeline: record {i}: {why}")
        whole = _Records()
        for item in items:
            whole.add(tuple(item))
        for col in ("t", "action", "nbytes", "cat"):
            getattr(whole, col).extend(getattr(records, col))
        whole.moved += records.moved
        if whole.moved >= MAX_BYTES:
            raise InputError(f"{path}: invalid memory timeline: the records move more than "
                             "2**62 bytes")
        return _raw_capture(path, whole)
    raise InputError(f"{path}: JSON, but not an export_memory_timeline file (expected "
                     "[[t_ns, action, bytes, category], ...] or [times, sizes])")
