"""Read torch.profiler chrome traces (`profile_memory=True`) into the common model.

The profiler writes one `[memory]` instant event per allocation and free (frees carry negative
`Bytes`), and `[OutOfMemory]` when the allocator gives up. It writes no stacks for them, so a
memory event gets the stack of the `cpu_op` / `python_function` / `user_annotation` events
that enclose it in time on the same thread. The file is streamed: traces of long runs reach
gigabytes, and only the memory events and the intervals of those three kinds are kept.

Two layouts exist. Modern traces give `Addr`, `Total Allocated` and `Total Reserved`; 2021-era
traces give only `Bytes`, so frees are paired with an earlier allocation of the same size and
the timeline starts at zero when profiling started.
"""

from __future__ import annotations

import bisect
import math
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, TypeGuard

import numpy as np
import polars as pl

from snapana import data_file
from snapana.capture_kinds import CaptureKind
from snapana.errors import InputError
from snapana.limits import MAX_BYTES, MAX_DEVICE, MAX_TIME
from snapana.model import (
    EMPTY_STACK,
    EVENT_SCHEMA,
    OP_FILE,
    SEGMENT_SCHEMA,
    Capture,
    Frame,
    ReadProgress,
    StackTable,
    unsegmented_blocks,
)
from snapana.sources._io import MetaError, sanitize
from snapana.sources.json_stream import stream_json
from snapana.units import SYNTHETIC_ADDRESSES, ascii_int

CPU_DEVICE = -1
_MEMORY = "[memory]"
_OOM = "[OutOfMemory]"
#: Interval categories that become frames, with their nesting rank when two share start and
#: end (a Python function calls an annotation which calls an op, never the other way round).
#: "Operator" is the 2021 spelling of "cpu_op".
_FRAME_CATS = {"python_function": 0, "user_annotation": 1, "cpu_op": 2, "Operator": 2}
_PY_NAME = re.compile(r"^(?P<file>.+)\((?P<line>\d+)\): (?P<func>.+)$")


@dataclass(frozen=True, slots=True)
class DeviceType:
    """One c10::DeviceType the profiler writes in `Device Type` (device_types.toml)."""

    number: int
    torch: str  # what torch calls such a device: the report names it `<torch>:<id>`
    properties: bool  # kineto's `deviceProperties` describe it (name, totalGlobalMem)


class DeviceTypeEntry(data_file.Table, frozen=True, kw_only=True):
    """``[[type]]`` of device_types.toml."""

    number: int
    torch: str
    properties: bool = False


@data_file.schema("sources/device_types.toml")
class DeviceTypesFile(data_file.Table, frozen=True, kw_only=True):
    type: list[DeviceTypeEntry]


class DtypeEntry(data_file.Table, frozen=True, kw_only=True):
    """``[[dtype]]`` of op_casts.toml: an `Input type` name and its bytes per element."""

    name: str
    bytes: int


class OpCastsFile(data_file.Table, frozen=True, kw_only=True):
    """op_casts.toml: the casts an op makes of its own arguments, as a trace shows them."""

    cast: str
    ops: frozenset[str]
    dtype: list[DtypeEntry]

    @property
    def itemsize(self) -> dict[str, int]:
        return {d.name: d.bytes for d in self.dtype}


data_file.schema("sources/op_casts.toml")(OpCastsFile)


@lru_cache(maxsize=1)
def op_casts_file() -> OpCastsFile:
    """op_casts.toml, read once."""
    return data_file.packaged("sources/op_casts.toml", OpCastsFile)


@lru_cache(maxsize=1)
def device_types() -> dict[int, DeviceType]:
    """The device types of device_types.toml by number: data, so a ROCm trace's 6 is read as
    its CUDA twin's 1 is without a branch for it."""
    data = data_file.packaged("sources/device_types.toml", DeviceTypesFile)
    return {t.number: DeviceType(t.number, t.torch, t.properties) for t in data.type}


# ----- collecting events ---------------------------------------------------------------------

_Interval = tuple[float, float, int, str, str | None]
_Shaped = tuple[float, float, str, list[Any], list[Any]]


class _Bad(ValueError):
    """An invalid field of a trace event: `where` names it, `what` says why."""

    def __init__(self, where: str, what: str) -> None:
        super().__init__(f"{where}: {what}")


def _describe(v: Any) -> str:
    """A short, safe description of a value (never str() of a container: it may be huge)."""
    if v is None or isinstance(v, (bool, int, float)):
        text = repr(v)
        return text if len(text) <= 40 else text[:37] + "..."
    if isinstance(v, str):
        return repr(v[:40]) + ("..." if len(v) > 40 else "")
    return f"a {type(v).__name__}"


def _scalar_key(v: Any) -> str | None:
    """A pid or tid as a string; None when it is not a scalar (a list, an object)."""
    if v is None or isinstance(v, (str, bool, int, float)):
        return str(v) if not isinstance(v, str) or len(v) <= 256 else None
    return None


def thread_key(ev: dict[str, Any]) -> tuple[str, str] | None:
    """(pid, tid) as strings: 2021 traces write an op's tid as "123" and a memory event's as 123.
    None when either is not a scalar."""
    pid, tid = _scalar_key(ev.get("pid")), _scalar_key(ev.get("tid"))
    return None if pid is None or tid is None else (pid, tid)


def _finite(v: Any, bound: float) -> TypeGuard[int | float]:
    """A number (not a bool) strictly inside ±bound: finite, and no int too large for a
    float (math.isfinite would raise on one)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return False
    return -bound < v < bound  # False for NaN and ±inf too


def _text_ok(s: str, limit: int) -> bool:
    """A string short enough and encodable (no lone surrogates from a JSON escape)."""
    if len(s) > limit:
        return False
    if s.isascii():
        return True
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


@dataclass(slots=True)
class _MemEvent:
    """The fields of one `[memory]` / `[OutOfMemory]` event the model uses (not its dict)."""

    order: int
    ts: float
    thread: tuple[str, str]
    name: str
    nbytes: int
    addr: int | None
    total_alloc: int | None
    total_reserved: int | None
    device: tuple[int, int]
    stack_id: int = EMPTY_STACK
    #: an op's cast of its own argument (`op_casts`): (op, argument positions, input bytes)
    cast: tuple[str, tuple[int, ...], int] | None = None

    @classmethod
    def from_args(cls, order: int, ts: float, thread: tuple[str, str], name: str,
                  args: dict[str, Any], where: str = "args") -> _MemEvent:
        return cls(order, ts, thread, name,
                   _arg(args, "Bytes", where, -MAX_BYTES + 1, MAX_BYTES) or 0,
                   _arg(args, "Addr", where, 0, MAX_BYTES),
                   _arg(args, "Total Allocated", where, -MAX_BYTES + 1, MAX_BYTES),
                   _arg(args, "Total Reserved", where, -MAX_BYTES + 1, MAX_BYTES),
                   device_key(args, where))


def _arg(args: dict[str, Any], key: str, where: str, lo: int, hi: int) -> int | None:
    """An integer argument in [lo, hi): None when absent or null (or not a number, as the
    profiler never writes), InputError-worthy when a number out of range or not finite."""
    v = args.get(key)
    if v is None or isinstance(v, bool):
        return None
    if isinstance(v, str):
        n = ascii_int(v)
        if n is None:
            return None
        v = n
    if isinstance(v, float):
        if not math.isfinite(v):
            raise _Bad(f"{where}.{key}", f"{_describe(v)} is not a finite number")
        v = int(v)
    if not isinstance(v, int):
        return None
    if not lo <= v < hi:
        raise _Bad(f"{where}.{key}", f"{_describe(v)} is out of range")
    return v


@dataclass
class _Collector:
    """Keeps what the model needs from each trace event as it streams past. Intervals with
    unusable fields are skipped (they only name stacks); a memory event with an invalid
    field is refused, naming it."""

    memory: list[_MemEvent] = field(default_factory=list)
    #: thread -> [(start, end, rank, name, "Call stack" of 2021-layout ops)]
    intervals: dict[tuple[str, str], list[_Interval]] = field(default_factory=dict)
    #: thread -> [(start, end, name, Input Dims, Input type)] of op_casts.toml's ops
    shaped: dict[tuple[str, str], list[_Shaped]] = field(default_factory=dict)
    n_events: int = 0
    n_bad: int = 0
    n_skipped: int = 0
    _names: dict[str, str] = field(default_factory=dict)

    def __call__(self, ev: Any) -> None:
        self.n_events += 1
        if not isinstance(ev, dict):
            self.n_bad += 1
            return
        ph = ev.get("ph")
        if ph == "X":
            cat = ev.get("cat", "")
            rank = _FRAME_CATS.get(cat) if isinstance(cat, str) else None
            if rank is None:
                return
            ts, dur = ev.get("ts"), ev.get("dur", 0)
            name, thread = ev.get("name"), thread_key(ev)
            if (not _finite(ts, MAX_TIME) or not _finite(dur, MAX_TIME) or dur < 0
                    or not isinstance(name, str) or not _text_ok(name, 1 << 16)
                    or thread is None):
                self.n_skipped += 1
                return
            args = ev.get("args")
            raw_call = args.get("Call stack") if isinstance(args, dict) else None
            name = self._names.setdefault(name, name)  # one string per distinct name
            call = (self._names.setdefault(raw_call, raw_call)
                    if isinstance(raw_call, str) and _text_ok(raw_call, 1 << 20) else None)
            self.intervals.setdefault(thread, []).append((ts, ts + dur, rank, name, call))
            casts = op_casts_file()
            if rank == 2 and (name == casts.cast or name in casts.ops) and isinstance(args, dict):
                dims, types = args.get("Input Dims"), args.get("Input type")
                if isinstance(dims, list) and isinstance(types, list):
                    self.shaped.setdefault(thread, []).append((ts, ts + dur, name, dims, types))
        elif ph == "i" or ph == "I":
            marker = ev.get("name")
            if marker == _MEMORY or marker == _OOM:
                where = f"traceEvents[{self.n_events - 1}]"
                ts, args = ev.get("ts"), ev.get("args")
                if not isinstance(ts, (int, float)) or not isinstance(args, dict):
                    self.n_bad += 1
                    return
                if not _finite(ts, MAX_TIME):
                    raise _Bad(f"{where}.ts", f"{_describe(ts)} is not a usable time")
                thread = thread_key(ev)
                if thread is None:
                    raise _Bad(f"{where}.pid/tid", "not a number or a string")
                self.memory.append(_MemEvent.from_args(len(self.memory), ts, thread, marker,
                                                       args, f"{where}.args"))


def looks_like_trace(meta: dict[str, Any], kind: str, collector: _Collector) -> bool:
    """A chrome trace: an object with `traceEvents`, or an array of event objects."""
    if kind == "object":
        return "traceEvents" in meta
    return collector.n_events > 0 and collector.n_bad < collector.n_events


# ----- stacks by time containment ------------------------------------------------------------

_OBJ_ADDR = re.compile(r" at 0x[0-9a-fA-F]+>$")


def op_frame(rank: int, name: str) -> Frame:
    """The frame an enclosing profiler event stands for."""
    if rank == 0:
        # '<built-in method matmul of Tensor object at 0x7f..>': drop the object address so
        # one call site is one frame.
        name = _OBJ_ADDR.sub(">", name)
        m = _PY_NAME.match(name)
        if m:
            return (m["file"], m["func"], int(m["line"]))
        return ("<python>", name, 0)  # in PROFILER_FILES
    if rank == 1:
        return ("<annotation>", name, 0)
    return (OP_FILE, name, 0)


def call_stack_frames(text: str) -> list[Frame]:
    """Frames of a 2021-layout "Call stack" arg: `file.py(12): func;...`, innermost first."""
    frames = []
    for part in text.split(";"):
        part = part.strip()
        if part:
            m = _PY_NAME.match(part)
            frames.append((m["file"], m["func"], int(m["line"])) if m else ("<python>", part, 0))
    return frames


def assign_stacks(intervals: list[_Interval], events: list[_MemEvent], table: StackTable) -> None:
    """Give each memory event the enclosing intervals of its thread, innermost first.

    One sweep over intervals sorted by start (outer first on ties) with a stack of open ones:
    O((intervals + events) log) rather than a scan per event. Intervals that overlap without
    nesting (clock granularity) are handled by checking each open interval's end, and the
    stack id is reused while nothing was pushed or popped and no open interval has ended.
    2021-layout ops carry the Python stack as a "Call stack" arg; the innermost one found is
    appended after the op frames.
    """
    intervals.sort(key=lambda iv: (iv[0], -iv[1], iv[2]))
    frame_ids: dict[tuple[int, str], int] = {}
    call_ids: dict[str, tuple[int, ...]] = {}
    open_: list[tuple[float, int, str, str | None]] = []  # (end, rank, name, call stack)
    j, n = 0, len(intervals)
    cached: int | None = None
    valid_until = float("inf")
    for ev in sorted(events, key=lambda e: (e.ts, e.order)):
        t = ev.ts
        while j < n and intervals[j][0] <= t:
            start, end, rank, name, call = intervals[j]
            j += 1
            while open_ and open_[-1][0] < start:
                open_.pop()
            open_.append((end, rank, name, call))
            cached = None
        while open_ and open_[-1][0] < t:
            open_.pop()
            cached = None
        if cached is None or t > valid_until:
            ids: list[int] = []
            valid_until = float("inf")
            caller: str | None = None
            for end, rank, name, call in reversed(open_):
                if end < t:
                    continue
                valid_until = min(valid_until, end)
                fid = frame_ids.get((rank, name))
                if fid is None:
                    fid = frame_ids[(rank, name)] = table.frame_id(op_frame(rank, name))
                ids.append(fid)
                caller = caller or call
            if caller:
                py = call_ids.get(caller)
                if py is None:
                    py = call_ids[caller] = tuple(
                        table.frame_id(f) for f in call_stack_frames(caller))
                ids.extend(py)
            cached = table.stack_id(tuple(ids))
        ev.stack_id = cached


def _tensor_bytes(dims: Any, dtype: Any, itemsize: dict[str, int]) -> int | None:
    """A tensor argument's bytes from its recorded dims and type; None when not one."""
    if not isinstance(dims, list) or not dims or not isinstance(dtype, str) \
            or dtype not in itemsize or not all(isinstance(d, int) and d > 0 for d in dims):
        return None
    return math.prod(dims) * itemsize[dtype]


def _enclosing(by_name: dict[str, tuple[list[float], list[_Shaped]]], name: str, lo: float,
               hi: float) -> _Shaped | None:
    """The innermost interval called `name` that spans [lo, hi] (the latest to start); a
    few steps back from the last one to start before `lo`, as same-name ops rarely nest."""
    starts, ivs = by_name.get(name, ([], []))
    i = bisect.bisect_right(starts, lo) - 1
    for iv in ivs[max(i - 8, 0):i + 1][::-1]:
        if hi <= iv[1]:
            return iv
    return None


def op_casts(shaped: list[_Shaped], events: list[_MemEvent], table: StackTable) -> None:
    """Mark each allocation made by an op's cast of its own argument (op_casts.toml): the
    `aten::to` frame directly inside an op's frame. Why: autocast's `cached_cast` is such a
    cast, and the argument it copied (which one, by its recorded dims) says whether it is the
    op's weight, which a trace made after the model was built holds no block of."""
    spec = op_casts_file()
    if not shaped:
        return
    itemsize = spec.itemsize
    shaped.sort(key=lambda iv: (iv[0], -iv[1]))
    by_name: dict[str, tuple[list[float], list[_Shaped]]] = {}
    for iv in shaped:
        starts, ivs = by_name.setdefault(iv[2], ([], []))
        starts.append(iv[0])
        ivs.append(iv)
    cast_frame, found = ("<op>", spec.cast, 0), {}
    for ev in events:
        if ev.nbytes <= 0:
            continue
        if ev.stack_id not in found:
            frames = table.stack(ev.stack_id) if ev.stack_id != EMPTY_STACK else []
            k = next((i for i, f in enumerate(frames) if tuple(f) == cast_frame), -1)
            parent = frames[k + 1] if 0 <= k < len(frames) - 1 else None
            found[ev.stack_id] = parent[1] if parent and parent[0] == "<op>" \
                and parent[1] in spec.ops else None
        op_name = found[ev.stack_id]
        if op_name is None:
            continue
        cast = _enclosing(by_name, spec.cast, ev.ts, ev.ts)
        op = cast and _enclosing(by_name, op_name, cast[0], cast[1])
        if not (cast and op and cast[3] and cast[4]):
            continue
        size = _tensor_bytes(cast[3][0], cast[4][0], itemsize)
        at = tuple(i for i, d in enumerate(op[3]) if d == cast[3][0])
        if size is not None and at:
            ev.cast = (op_name, at, size)


# ----- the model -----------------------------------------------------------------------------

def _int(v: Any) -> int | None:
    """An integer from a number or a string of digits; None for anything else, and for
    numbers that are not finite or out of range."""
    if isinstance(v, bool) or v is None:
        return None
    if isinstance(v, float):
        return int(v) if math.isfinite(v) and abs(v) < MAX_BYTES else None
    if isinstance(v, int):
        return v if abs(v) < MAX_BYTES else None
    if isinstance(v, str) and len(v) <= 40:
        try:
            n = int(v)
        except ValueError:
            return None
        return n if abs(n) < MAX_BYTES else None
    return None


def device_key(args: dict[str, Any], where: str = "args") -> tuple[int, int]:
    """(Device Type, Device Id) as the profiler wrote them (CPU has id -1)."""
    return (_arg(args, "Device Type", where, 0, 256) or 0,
            _arg(args, "Device Id", where, -1, MAX_DEVICE) or 0)


def _device_names(keys: list[tuple[int, int]], props: Any, warnings: list[str]
                  ) -> tuple[dict[tuple[int, int], int], dict[int, str], dict[int, int]]:
    """Map each (type, id) to a model device: CPU -> -1, accelerator n -> n."""
    by_id: dict[int | None, dict[str, Any]] = {}
    if isinstance(props, list):
        by_id = {_int(p.get("id")): p for p in props[:MAX_DEVICE] if isinstance(p, dict)}
    mapping: dict[tuple[int, int], int] = {}
    names: dict[int, str] = {}
    capacity: dict[int, int] = {}
    for dtype, did in sorted(keys):
        if dtype == 0:
            dev, name = CPU_DEVICE, "CPU"
        else:
            dev = did
            known = device_types().get(dtype)
            name = f"{known.torch if known else f'device type {dtype}'}:{did}"
            prop = by_id.get(did) if known and known.properties else None
            if prop is not None:
                gpu = prop.get("name", "?")
                gpu = gpu if isinstance(gpu, str) and _text_ok(gpu, 256) else "?"
                name = f"{name} ({gpu})"
                cap = _int(prop.get("totalGlobalMem"))
                if cap and cap > 0:
                    capacity[dev] = cap
            if dev in names:
                dev = dtype * 1000 + did
                warnings.append(f"two device kinds share id {did}; {name} is shown as device "
                                f"{dev}")
        mapping[(dtype, did)] = dev
        names[dev] = name
    return mapping, names, capacity


@dataclass
class _DeviceBuild:
    """Events, live blocks and totals of one device, built in time order."""

    device: int
    cols: dict[str, list[Any]] = field(default_factory=lambda: {k: [] for k in EVENT_SCHEMA})
    total_alloc: list[int | None] = field(default_factory=list)
    total_reserved: list[int | None] = field(default_factory=list)
    live: dict[int, tuple[int, int]] = field(default_factory=dict)  # addr -> (size, stack)
    by_size: dict[int, list[int]] = field(default_factory=dict)  # size -> live synth addrs
    pre_freed: int = 0
    unmatched_frees: int = 0
    reused_addrs: int = 0
    synthesized: int = 0
    #: alloc event position -> its op cast (`op_casts`)
    casts: dict[int, tuple[str, tuple[int, ...], int]] = field(default_factory=dict)

    def add(self, action: str, addr: int, size: int, ev: _MemEvent,
            device_free: int | None = None) -> None:
        c = self.cols
        c["device"].append(self.device)
        c["idx"].append(len(c["idx"]))
        c["action"].append(action)
        c["addr"].append(addr)
        c["size"].append(size)
        c["stream"].append(0)
        c["time_us"].append(int(ev.ts))
        c["stack_id"].append(ev.stack_id)
        c["device_free"].append(device_free)
        self.total_alloc.append(ev.total_alloc)
        self.total_reserved.append(ev.total_reserved)


def _next_synth(counter: list[int]) -> int:
    counter[0] += 1
    return SYNTHETIC_ADDRESSES + counter[0]  # no address recorded (2021 layout, pre-existing)


def build_device(dev: int, events: list[_MemEvent], counter: list[int]) -> _DeviceBuild:
    """Turn one device's memory events (in time order) into model events and live blocks."""
    b = _DeviceBuild(dev)
    for ev in events:
        nbytes = ev.nbytes
        if ev.name == _OOM:
            b.add("oom", 0, abs(nbytes), ev)
            continue
        if nbytes == 0:
            continue
        addr = ev.addr
        size = abs(nbytes)
        if nbytes > 0:
            if addr is None:
                addr = _next_synth(counter)
                b.by_size.setdefault(size, []).append(addr)
                b.synthesized += 1
            elif addr in b.live:
                b.reused_addrs += 1
            b.live[addr] = (size, ev.stack_id)
            if ev.cast is not None:
                b.casts[len(b.cols["idx"])] = ev.cast
            b.add("alloc", addr, size, ev)
            continue
        if addr is None:
            same = b.by_size.get(size)
            addr = same.pop() if same else None
            if addr is None:
                addr = _next_synth(counter)
                b.synthesized += 1
        if b.live.pop(addr, None) is None:
            b.pre_freed += size
            b.unmatched_frees += 1
        b.add("free_requested", addr, size, ev)
        b.add("free_completed", addr, size, ev)
    return b


def _totals_array(values: list[int | None]) -> np.ndarray | None:
    if not values or all(v is None for v in values):
        return None
    arr = np.array([-1 if v is None else v for v in values], dtype=np.int64)
    return arr


def _baseline(b: _DeviceBuild, events: list[_MemEvent], warnings: list[str], name: str) -> int:
    """Bytes allocated before profiling that the trace never frees, from `Total Allocated`.

    `Total Allocated` after the first event minus that event's own bytes is what was live
    when recording began; the part freed during the trace already shows up as frees without
    an allocation, so only the rest becomes a block.
    """
    for ev in events:
        if ev.name != _MEMORY:
            continue
        if ev.total_alloc is None:
            return 0
        before = ev.total_alloc - ev.nbytes
        rest = before - b.pre_freed
        if rest < 0:
            warnings.append(f"{name}: the trace frees {b.pre_freed} bytes allocated before "
                            f"profiling but `Total Allocated` says only {before} were live")
            return 0
        return rest
    return 0


def _check_totals(b: _DeviceBuild, baseline: int, warnings: list[str], name: str) -> None:
    """Warn when the running sum drifts from the profiler's own `Total Allocated`."""
    acts, sizes = b.cols["action"], b.cols["size"]
    running = baseline + b.pre_freed
    drift = 0
    first: int | None = None
    for i, (act, size, total) in enumerate(zip(acts, sizes, b.total_alloc, strict=True)):
        if act == "alloc":
            running += size
        elif act == "free_requested":
            running -= size
        if total is not None and act != "oom" and total != running:
            drift += 1
            first = i if first is None else first
    if drift:
        warnings.append(f"{name}: the running sum of `Bytes` differs from `Total Allocated` at "
                        f"{drift} event(s), first at event {first} (events missing from the "
                        "trace?)")


def load(path: Path | str, progress: ReadProgress | None = None) -> Capture:
    """Read a chrome trace with `[memory]` events into a Capture (one device per allocator)."""
    path = Path(path)
    collector = _Collector()
    try:
        kind, meta = stream_json(path, progress, collector)
    except _Bad as exc:
        raise InputError(f"{path}: invalid [memory] event: {exc}") from None
    if not looks_like_trace(meta, kind, collector):
        keys = f" (keys: {sorted(k[:40] for k in meta)[:5]})" if kind == "object" else ""
        raise InputError(f"{path}: JSON, but not a torch.profiler chrome trace{keys}; expected "
                         "an object with `traceEvents`")
    if not collector.memory:
        raise InputError(f"{path}: a JSON profiler trace without [memory] events; record it "
                         "with torch.profiler.profile(profile_memory=True)")
    try:
        return from_events(path, collector, meta)
    except _Bad as exc:
        raise InputError(f"{path}: invalid trace: {exc}") from None
    except MetaError as exc:
        raise InputError(f"{path}: invalid trace metadata: {exc}") from None


def from_events(path: Path, collector: _Collector, meta: dict[str, Any]) -> Capture:
    """Build the Capture from the collected memory events and intervals."""
    warnings: list[str] = []
    if collector.n_skipped:
        warnings.append(f"{collector.n_skipped} profiler event(s) with an unusable time, "
                        "duration, name or thread were not used for stacks")
    moved: dict[tuple[int, int], int] = {}
    for ev in collector.memory:  # every running sum stays far inside int64
        moved[ev.device] = moved.get(ev.device, 0) + abs(ev.nbytes)
        if moved[ev.device] >= MAX_BYTES:
            raise _Bad(f"device {ev.device}", "its [memory] events move more than 2**62 bytes")
    if len(moved) > MAX_DEVICE:
        raise _Bad("traceEvents", f"memory events on {len(moved)} devices")
    table = StackTable()
    by_thread: dict[tuple[str, str], list[_MemEvent]] = {}
    for ev in collector.memory:
        by_thread.setdefault(ev.thread, []).append(ev)
    for thread, evs in by_thread.items():
        assign_stacks(collector.intervals.get(thread, []), evs, table)
        op_casts(collector.shaped.get(thread, []), evs, table)
    collector.intervals.clear()
    collector.shaped.clear()

    by_key: dict[tuple[int, int], list[_MemEvent]] = {}
    for ev in collector.memory:
        by_key.setdefault(ev.device, []).append(ev)
    mapping, names, capacity = _device_names(list(by_key), meta.get("deviceProperties"),
                                             warnings)
    counter = [0]
    ev_frames: list[pl.DataFrame] = []
    blocks: list[pl.DataFrame] = []
    totals: dict[int, dict[str, np.ndarray | None]] = {}
    reserved_timeline: dict[int, np.ndarray] = {}
    casts: dict[int, dict[int, tuple[str, tuple[int, ...], int]]] = {}
    no_addr = False
    for key, evs in sorted(by_key.items(), key=lambda kv: mapping[kv[0]]):
        dev = mapping[key]
        evs.sort(key=lambda e: (e.ts, e.order))
        b = build_device(dev, evs, counter)
        no_addr = no_addr or b.synthesized > 0
        name = names[dev]
        if b.reused_addrs:
            warnings.append(f"{name}: {b.reused_addrs} allocation(s) reuse an address that was "
                            "never freed in the trace (free events missing?)")
        if b.unmatched_frees and not any(e.addr is not None for e in evs):
            warnings.append(f"{name}: {b.unmatched_frees} free(s) match no earlier allocation "
                            "of the same size; counted as allocated before profiling")
        baseline = _baseline(b, evs, warnings, name)
        _check_totals(b, baseline, warnings, name)
        if baseline > 0:
            addr = _next_synth(counter)
            b.live[addr] = (baseline, EMPTY_STACK)
        blocks.append(unsegmented_blocks(dev, b.live))
        if b.casts:
            casts[dev] = b.casts
        ev_frames.append(pl.DataFrame(b.cols, schema=EVENT_SCHEMA))
        totals[dev] = {"allocated": _totals_array(b.total_alloc),
                       "reserved": _totals_array(b.total_reserved)}
        res = totals[dev]["reserved"]
        if dev != CPU_DEVICE and res is not None and bool((res >= 0).all()) and res.any():
            reserved_timeline[dev] = res
    if no_addr:
        warnings.append(
            "older trace layout (no `Addr`): frees are paired with the latest allocation of "
            "the same size, so totals are exact but a block may show the stack of another "
            "same-size allocation; the timeline is relative to the start of profiling "
            "(memory allocated before it is not counted)"
        )
    events = pl.concat(ev_frames) if ev_frames else pl.DataFrame(schema=EVENT_SCHEMA)
    trace_meta = sanitize({k: v for k, v in meta.items()
                           if k not in ("traceEvents", "deviceProperties")}, "trace")
    return Capture(
        source=CaptureKind.KINETO_TRACE,
        path=str(path),
        stacks=table,
        segments=pl.DataFrame(schema=SEGMENT_SCHEMA),
        blocks=pl.concat(blocks) if blocks else unsegmented_blocks(0, {}),
        events=events,
        devices=sorted(names),
        warnings=warnings,
        has_trace=True,
        has_time=True,
        capacity_bytes=capacity,
        metadata={
            "device_names": names,
            "kineto_totals": totals,
            # The caching allocator's reserved bytes after each event, where the trace has them
            # (modern GPU traces); replay has no segments to compute it from.
            "reserved_timeline": reserved_timeline,
            "trace": trace_meta,
            # per device: alloc event position -> (op, which of its arguments the cast
            # copied, by dims; that argument's bytes): an op's casts of its own arguments
            "op_casts": casts,
            "device_properties": sanitize(meta.get("deviceProperties"), "deviceProperties"),
        },
    )
