"""Read `torch.cuda.memory._dump_snapshot` pickles safely into the common model.

Snapshots arrive from other machines and tickets, so they are never given to `pickle.load`.
The restricted unpickler (`snapshot_decode`) resolves no global at all: every opcode that
could import or call something (GLOBAL, STACK_GLOBAL, INST, OBJ, EXT1/2/4 resolve through
`find_class`; PERSID/BINPERSID through `persistent_load`) is refused the moment it is read.
REDUCE, NEWOBJ, NEWOBJ_EX and BUILD can only act on an object obtained that way, so they
never get to run.

Builtin data alone can still be hostile while it is decoded: a dict key that is a tuple
nested 100,000 deep (hashing it overflows the C stack), or shared 60 levels deep (hashing it
never ends, in a C loop no signal interrupts), or a memo index of 2**30 (the unpickler
allocates and clears gigabytes). So a pickle is decoded in a bounded child process — the
same restricted unpickler, under a time limit and a memory limit proportional to the file —
which hands the traces back as flat columns and the rest re-pickled as builtins (`load`);
only a file the child cannot turn into plain columns is decoded a second time, here, once
the child has finished within its limits. Everything decoded is then validated, once, before
it becomes columns (`snapshot_values`, `snapshot_trace`): types, ranges (sizes and addresses
in [0, 2**62), finite times, device indices), blocks inside their segment, strings and
metadata bounded. The ranges
are those of PyTorch's own writers (see `snapana.limits`): a value PyTorch can write is never
refused; one that carries nothing (a frame's unknown line, 2**64 - 1) is normalised and the
capture says so in its warnings.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import polars as pl

from snapana.caching_allocator import normalize_state
from snapana.capture_kinds import CaptureKind
from snapana.errors import InputError
from snapana.limits import (
    MAX_BYTES,
    MAX_DEVICE,
    MAX_DEVICES,
    MAX_TIME,
    POOL_ID_RANGE,
    STREAM_RANGE,
    limit_hint,
    max_rows,
)
from snapana.model import (
    BLOCK_SCHEMA,
    EVENT_SCHEMA,
    SEGMENT_SCHEMA,
    Capture,
    CaptureMetadata,
    ReadProgress,
    pool_key,
)
from snapana.sources._checks import first_event_outside_segments
from snapana.sources._io import (
    MetaError,
    first_line,
    sanitize,
)
from snapana.sources.snapshot_decode import (
    _gc_paused,
    _load_columns,
    _NotPlain,
    _restricted_load,
    _TraceColumns,
    restricted_load,
)
from snapana.sources.snapshot_trace import _trace_parts
from snapana.sources.snapshot_values import (
    _MAX_NAME,
    _Bad,
    _bytes,
    _describe,
    _dict,
    _flag,
    _int,
    _Interner,
    _is_snapshot,
    _list,
    _str,
)

__all__ = ["KNOWN_ACTIONS", "from_snapshot_dict", "load", "restricted_load"]

#: Trace actions PyTorch writes; others are kept but ignored by replay, with a warning.
KNOWN_ACTIONS = frozenset({"alloc", "free_requested", "free_completed", "free",
                           "segment_alloc", "segment_free", "segment_map", "segment_unmap",
                           "oom", "snapshot"})


def load(path: Path, progress: ReadProgress | None = None) -> Capture:
    """Read a snapshot pickle into a Capture, accepting every layout PyTorch has written.

    The pickle is decoded once, in the bounded child, which hands back the traces as flat
    columns (`child_columns.CHILD_COLUMNS`); only a snapshot whose trace holds values of
    another type than PyTorch writes (or one the columns then find out of range) is decoded
    again here, by the entry-by-entry path that names the offending value. On that path the decoded
    entries are released chunk by chunk as they become columns.
    """
    path = Path(path)
    got = _load_columns(path, progress)
    checked = True  # the child decoded the file whole within its limits
    if got is not None:
        data, columns, decoded, scanned = got
        try:
            return from_snapshot_dict(data, str(path), columns=columns, decoded_bytes=decoded)
        except _NotPlain:
            # decoded again below, where the offending entry is named; entries the child
            # read from the bytes were never decoded whole, so that decode is bounded again
            checked = not scanned
    data, decoded = _restricted_load(path, progress, checked=checked)
    return from_snapshot_dict(data, str(path), consume=True, decoded_bytes=decoded)


def _block_frames(block: dict[str, Any]) -> Any:
    """Modern blocks carry `frames`; legacy ones carry `history` (newest entry last)."""
    if block.get("frames"):
        return block["frames"]
    history = block.get("history")
    if isinstance(history, list) and history:
        last = history[-1]
        if isinstance(last, dict):
            return last.get("frames") or []
    return []


def from_snapshot_dict(data: Any, path: str, consume: bool = False,
                       columns: dict[int, _TraceColumns] | None = None,
                       decoded_bytes: int | None = None) -> Capture:
    """Normalize the decoded snapshot (already known to be builtins only), validating it.

    With ``consume`` the trace lists inside ``data`` are emptied while they are converted,
    so the decoded entries can be freed early; the caller must not use ``data`` afterwards.
    ``columns``: device traces the bounded child already turned into columns (`load`).
    With ``decoded_bytes`` (the pickle's decompressed size) the rows it decoded to are
    bounded by that size (`limits.max_rows`), before any per-row work here.
    """
    if not _is_snapshot(data):
        kind = type(data).__name__
        keys = ""
        if isinstance(data, dict):  # only string keys are shown: others may be hostile
            names = sorted(k[:40] for k in list(data)[:1000] if isinstance(k, str))[:5]
            keys = f" with keys {names}"
        raise InputError(
            f"{path}: a pickle, but not a CUDA memory snapshot ({kind}{keys}; expected the "
            "output of torch.cuda.memory._dump_snapshot)"
        )
    if isinstance(data, list):
        data = {"segments": data}
    if decoded_bytes is not None:
        _check_rows(data, path, decoded_bytes,
                    sum(tc.n for tc in columns.values()) if columns else 0)
    try:
        with _gc_paused():
            return _normalize(data, path, consume, columns or {})
    except _Bad as exc:
        raise InputError(f"{path}: invalid snapshot: {exc}") from None
    except MetaError as exc:
        raise InputError(f"{path}: invalid snapshot metadata: {exc}") from None
    except (KeyError, TypeError, ValueError, AttributeError, OverflowError,
            pl.exceptions.PolarsError) as exc:
        raise InputError(f"{path}: malformed snapshot: {type(exc).__name__}: "
                         f"{first_line(exc)}") from None
    except RecursionError:
        raise InputError(f"{path}: malformed snapshot: nested too deep") from None


def _check_rows(data: dict[str, Any], path: str, decoded_bytes: int,
                column_rows: int = 0) -> None:
    """Refuse a pickle that decodes to more rows than its size can hold as distinct dicts:
    one dict referenced through the memo again and again (5,000 blocks in 10 KB, millions of
    trace entries in a few MB) would cost every later stage per reference. `column_rows`:
    trace entries the bounded child already turned into columns."""
    def length(v: Any) -> int:
        return len(v) if isinstance(v, (list, tuple)) else 0

    segs = data.get("segments")
    rows = length(segs) + sum(length(s.get("blocks")) for s in (segs or ())
                              if isinstance(s, dict))
    traces = data.get("device_traces")
    rows += sum(map(length, traces)) if isinstance(traces, (list, tuple)) else 0
    rows += length(data.get("external_annotations")) + column_rows
    most = max_rows(decoded_bytes)
    if rows > most:
        raise InputError(
            f"{path}: {decoded_bytes:,} bytes of pickle decode to {rows:,} segments, blocks "
            f"and trace entries (at most {most:,} for its size): the same entry referenced "
            f"over and over, not a snapshot PyTorch wrote; {limit_hint('SNAPANA_MAX_ROWS')}")


def _segments(data: dict[str, Any], intern: _Interner
              ) -> tuple[dict[str, list[Any]], dict[str, list[Any]], set[int]]:
    seg_cols: dict[str, list[Any]] = {k: [] for k in SEGMENT_SCHEMA}
    blk_cols: dict[str, list[Any]] = {k: [] for k in BLOCK_SCHEMA}
    devices: set[int] = set()
    reserved: dict[int, int] = {}
    for si, seg in enumerate(data["segments"]):
        at = f"segments[{si}]"
        seg = _dict(seg, at)
        dev = _int(seg.get("device"), f"{at}.device", 0, MAX_DEVICE, 0)
        assert dev is not None
        devices.add(dev)
        seg_addr = _bytes(seg.get("address"), f"{at}.address", None)
        if seg_addr is None:
            raise _Bad(f"{at}.address", "missing")
        total = _bytes(seg.get("total_size"), f"{at}.total_size", None)
        if total is None:
            raise _Bad(f"{at}.total_size", "missing")
        if seg_addr + total > MAX_BYTES:
            raise _Bad(at, "address + total_size is out of range")
        reserved[dev] = reserved.get(dev, 0) + total
        if reserved[dev] >= MAX_BYTES:
            raise _Bad(at, f"the segments of device {dev} add up to more than 2**62 bytes")
        seg_cols["device"].append(dev)
        seg_cols["address"].append(seg_addr)
        seg_cols["total_size"].append(total)
        seg_cols["stream"].append(_int(seg.get("stream"), f"{at}.stream", *STREAM_RANGE, 0))
        pool = seg.get("segment_pool_id")
        if isinstance(pool, (tuple, list)) and len(pool) == 2:
            _int(pool[0], f"{at}.segment_pool_id[0]", *POOL_ID_RANGE)
            _int(pool[1], f"{at}.segment_pool_id[1]", *POOL_ID_RANGE)
        seg_cols["pool"].append(pool_key(pool))
        seg_cols["segment_type"].append(_str(seg.get("segment_type"), f"{at}.segment_type",
                                             "", _MAX_NAME))
        expandable = seg.get("is_expandable", False)
        if not isinstance(expandable, (bool, int)) and expandable is not None:
            raise _Bad(f"{at}.is_expandable", f"expected a bool, got {_describe(expandable)}")
        seg_cols["is_expandable"].append(bool(expandable))
        addr = seg_addr
        end = seg_addr + total
        used = 0
        for bi, blk in enumerate(_list(seg.get("blocks"), f"{at}.blocks")):
            bat = f"{at}.blocks[{bi}]"
            blk = _dict(blk, bat)
            if "size" not in blk:
                raise _Bad(f"{bat}.size", "missing")
            size = _bytes(blk["size"], f"{bat}.size")
            assert size is not None
            state = _str(blk.get("state"), f"{bat}.state", "inactive", _MAX_NAME)
            b_addr = _bytes(blk.get("address"), f"{bat}.address", addr)
            assert b_addr is not None
            if b_addr < seg_addr or b_addr + size > end:
                raise _Bad(bat, f"block [0x{b_addr:x}, +{size}) lies outside its segment "
                           f"[0x{seg_addr:x}, +{total})")
            # PyTorch lists a segment's blocks in address order, each starting where the
            # previous one ends; blocks that overlap (or share an address) cannot exist
            if b_addr < addr:
                raise _Bad(bat, f"block [0x{b_addr:x}, +{size}) overlaps the block before it "
                           f"in its segment (which ends at 0x{addr:x}); no allocator state "
                           "has this")
            if size == 0 and state.startswith("active"):
                raise _Bad(bat, f"an {state} block of 0 bytes; the allocator never hands "
                           "out an empty block")
            used += size
            if used > total:
                raise _Bad(bat, f"the blocks of the segment add up to more than its "
                           f"total_size {total}")
            requested = _bytes(blk.get("requested_size"), f"{bat}.requested_size", size)
            blk_cols["device"].append(dev)
            blk_cols["address"].append(b_addr)
            blk_cols["size"].append(size)
            blk_cols["requested_size"].append(requested or 0)
            blk_cols["state"].append(normalize_state(state))
            blk_cols["stack_id"].append(intern(_block_frames(blk), lambda bat=bat: f"{bat}.frames"))
            blk_cols["segment_address"].append(seg_addr)
            addr = b_addr + size
    _check_segments_apart(seg_cols)
    return seg_cols, blk_cols, devices


def _check_segments_apart(seg_cols: dict[str, list[Any]]) -> None:
    """Segments of one device are disjoint ranges of its address space (cudaMalloc never
    returns memory twice); two that overlap would count the same bytes twice."""
    order = sorted(range(len(seg_cols["address"])),
                   key=lambda i: (seg_cols["device"][i], seg_cols["address"][i]))
    for a, b in zip(order, order[1:], strict=False):
        if seg_cols["device"][a] != seg_cols["device"][b]:
            continue
        end = seg_cols["address"][a] + seg_cols["total_size"][a]
        if seg_cols["address"][b] < end:
            raise _Bad(f"segments[{b}]", f"segment at 0x{seg_cols['address'][b]:x} overlaps "
                       f"segments[{a}] [0x{seg_cols['address'][a]:x}, 0x{end:x}) on device "
                       f"{seg_cols['device'][a]}; no allocator state has this")


def _annotations(raw: Any, warnings: list[str]) -> list[dict[str, Any]]:
    """external_annotations (record_function ranges): dicts with a device, a stage, a name and
    a finite time; other keys are kept, bounded."""
    out = []
    for i, a in enumerate(_list(raw, "external_annotations")):
        at = f"external_annotations[{i}]"
        if not isinstance(a, dict):
            continue  # not an annotation: ignored, as before
        a = sanitize(a, at, max_depth=8, max_nodes=10_000)
        if "device" in a:
            a["device"] = _int(a["device"], f"{at}.device", 0, MAX_DEVICE, None)
        if "time_us" in a:
            a["time_us"] = _int(a["time_us"], f"{at}.time_us", -MAX_TIME, MAX_TIME, None,
                                floats=True)
        for key in ("stage", "name"):
            if key in a:
                a[key] = _str(a[key], f"{at}.{key}", "", 4096)
        out.append(a)
    return out


def _normalize(data: dict[str, Any], path: str, consume: bool = False,
               columns: dict[int, _TraceColumns] | None = None) -> Capture:
    """The decoded snapshot as a Capture: segments and blocks, the device traces as events
    (checked against the segments), annotations, metadata and the warnings they call for."""
    intern = _Interner()
    warnings: list[str] = []

    seg_cols, blk_cols, devices = _segments(data, intern)
    if len(devices) > MAX_DEVICES:
        raise _Bad("segments", f"more than {MAX_DEVICES} devices hold data")

    dropped_times = [0]
    parts, traced = _trace_parts(data, devices, intern, consume, columns or {}, dropped_times)
    devices |= traced
    has_time = False
    if parts:
        events = pl.concat(parts, rechunk=True) if len(parts) > 1 else parts[0]
        has_time = events["time_us"].null_count() < events.height
        _check_event_totals(events)
        bad = first_event_outside_segments(events, pl.DataFrame(seg_cols, schema=SEGMENT_SCHEMA))
        if bad is not None:
            raise _Bad(f"device_traces[{bad['device']}][{bad['idx']}]",
                       f"{bad['action']} at 0x{bad['addr']:x} lies outside every segment of "
                       f"device {bad['device']}")
        unknown = events.filter(~pl.col("action").is_in(list(KNOWN_ACTIONS)))
        if unknown.height:
            first = unknown.row(0, named=True)
            warnings.append(
                f"{unknown.height} trace entr{'y has' if unknown.height == 1 else 'ies have'} "
                f"an action snapana does not know (first: {first['action'][:40]!r} at "
                f"device_traces[{first['device']}][{first['idx']}]); ignored")
    else:
        events = pl.DataFrame(schema=EVENT_SCHEMA)

    _note_warnings(data, dropped_times[0], intern.unknown_lines, warnings)
    settings = data.get("allocator_settings")
    annotations = _annotations(data.get("external_annotations") or [], warnings)

    capture = Capture(
        source=CaptureKind.TORCH_SNAPSHOT,
        path=path,
        stacks=intern.table,
        segments=pl.DataFrame(seg_cols, schema=SEGMENT_SCHEMA),
        blocks=pl.DataFrame(blk_cols, schema=BLOCK_SCHEMA),
        events=events,
        devices=sorted(devices) or [0],
        allocator_settings=(sanitize(settings, "allocator_settings")
                            if isinstance(settings, dict) else None),
        annotations=annotations,
        warnings=warnings,
        has_trace=events.height > 0,
        has_time=has_time,
        metadata=cast("CaptureMetadata", {
            k: sanitize(data[k], k) for k in ("user_metadata", "compile_context") if k in data
        }),
    )
    return capture


def _note_warnings(data: dict[str, Any], dropped_times: int, unknown_lines: int,
                   warnings: list[str]) -> None:
    """What the capture's warnings say about its decode: times dropped, frames without a
    line, an overflowed ring buffer, an older layout."""
    if dropped_times:
        n = dropped_times
        warnings.append(f"{n} trace entr{'y has' if n == 1 else 'ies have'} a time outside "
                        f"±2**62 µs; {'its time was' if n == 1 else 'their times were'} ignored")
    if unknown_lines:
        n = unknown_lines
        warnings.append(
            f"{n} stack frame{'s' if n > 1 else ''} carr{'y' if n > 1 else 'ies'} no line number "
            "(PyTorch writes an unknown line as 2**64-1 or -1); shown as line 0")
    settings = data.get("allocator_settings")
    overflowed = _flag(data.get("trace_alloc_overflowed")) or bool(
        isinstance(settings, dict) and _flag(settings.get("trace_alloc_overflowed"))
    )
    if overflowed:
        warnings.append(
            "the trace ring buffer overflowed: the oldest events were dropped, so blocks "
            "allocated before the first kept event show as 'allocated before recording'"
        )
    if "allocator_settings" not in data:
        warnings.append("older snapshot layout: no allocator_settings recorded")


def _check_event_totals(events: pl.DataFrame) -> None:
    """The bytes one device's trace moves stay inside int64 whatever the order: every running
    sum replay makes is bounded by this total."""
    totals = events.group_by("device").agg(pl.col("size").cast(pl.Float64).sum().alias("t"))
    over = totals.filter(pl.col("t") >= float(MAX_BYTES))
    if over.height:
        dev = over.sort("device")["device"][0]  # the first device, not group_by's order
        raise _Bad(f"device_traces[{dev}]", "the sizes of its entries add up to more than "
                   "2**62 bytes")
