"""Read `torch.cuda.memory._dump_snapshot` pickles safely into the common model.

Snapshots arrive from other machines and tickets, so they are never given to `pickle.load`.
The restricted unpickler below resolves no global at all: every opcode that could import or
call something (GLOBAL, STACK_GLOBAL, INST, OBJ, EXT1/2/4 resolve through `find_class`;
PERSID/BINPERSID through `persistent_load`) is refused the moment it is read. REDUCE, NEWOBJ,
NEWOBJ_EX and BUILD can only act on an object obtained that way, so they never get to run.
"""

from __future__ import annotations

import gc
import gzip
import io
import pickle
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import polars as pl

from snapana.errors import InputError, UnsafePickleError
from snapana.model import (
    BLOCK_SCHEMA,
    EMPTY_STACK,
    EVENT_SCHEMA,
    SEGMENT_SCHEMA,
    Capture,
    ReadProgress,
    StackTable,
    pool_key,
)

_STATE_ALIASES = {"active_awaiting_free": "active_pending_free"}


class _RestrictedUnpickler(pickle.Unpickler):
    """Builds builtin containers and scalars only; refuses any reference to code."""

    def find_class(self, module: str, name: str) -> Any:  # noqa: D102
        raise UnsafePickleError(
            f"refused: the pickle asks to load `{module}.{name}`; a memory snapshot holds only "
            "builtin data, so nothing from this file was executed"
        )

    def persistent_load(self, pid: Any) -> Any:  # noqa: D102
        raise UnsafePickleError(
            "refused: the pickle uses persistent ids (PERSID); nothing from it was executed"
        )


class _CountingReader(io.RawIOBase):
    """Wraps a binary file to report bytes consumed, for the progress bar."""

    def __init__(self, raw: io.BufferedIOBase, total: int, progress: ReadProgress) -> None:
        self._raw = raw
        self._total = total
        self._progress = progress
        self._done = 0
        self._next_report = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buf: Any) -> int:
        n = self._raw.readinto(buf)
        self._done += n or 0
        if self._done >= self._next_report:
            self._progress(self._done, self._total)
            self._next_report = self._done + max(self._total // 200, 1 << 20)
        return n or 0


@contextmanager
def _gc_paused() -> Iterator[None]:
    """Decoding builds millions of dicts and no garbage cycles; letting the cyclic collector
    scan that growing heap over and over costs more than the decoding itself."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def restricted_load(path: Path, progress: ReadProgress | None = None) -> Any:
    """Decode a (possibly gzip-compressed) pickle of builtins only; raise InputError otherwise."""
    try:
        size = path.stat().st_size
        with path.open("rb") as fh:
            head = fh.read(2)
            fh.seek(0)
            raw: Any = gzip.GzipFile(fileobj=fh) if head == b"\x1f\x8b" else fh
            if progress is not None:
                raw = io.BufferedReader(_CountingReader(raw, size, progress), 1 << 20)
            with _gc_paused():
                data = _RestrictedUnpickler(raw).load()
            if progress is not None:
                progress(size, size)
            return data
    except UnsafePickleError as exc:
        raise UnsafePickleError(f"{path}: {exc}") from None
    except (EOFError, pickle.UnpicklingError, gzip.BadGzipFile, ValueError, IndexError,
            KeyError, TypeError, AttributeError, MemoryError, OverflowError,
            UnicodeDecodeError, RecursionError) as exc:
        detail = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise InputError(
            f"{path}: not a readable pickle (truncated or corrupt?): {detail}"
        ) from None
    except OSError as exc:
        raise InputError(f"{path}: cannot read: {exc.strerror or exc}") from None


def load(path: Path, progress: ReadProgress | None = None) -> Capture:
    """Read a snapshot pickle into a Capture, accepting every layout PyTorch has written.

    The decoded trace entries are released chunk by chunk as they become columns, so peak
    memory stays close to the decoded pickle's own.
    """
    data = restricted_load(path, progress)
    return from_snapshot_dict(data, str(path), consume=True)


def _is_snapshot(data: Any) -> bool:
    if isinstance(data, list):  # PyTorch 1.13: a bare list of segments
        return all(isinstance(s, dict) and "blocks" in s for s in data)
    return isinstance(data, dict) and isinstance(data.get("segments"), list)


class _Interner:
    """Turns frame lists into stack ids, caching by object identity since PyTorch shares them."""

    def __init__(self) -> None:
        self.table = StackTable()
        self._by_list_id: dict[int, int] = {}
        self._keepalive: list[Any] = []

    def __call__(self, frames: Any) -> int:
        if not frames:
            return EMPTY_STACK
        key = id(frames)
        sid = self._by_list_id.get(key)
        if sid is not None:
            return sid
        fid = self.table.frame_id
        ids = tuple(
            fid((str(f.get("filename", "")), str(f.get("name", "")), int(f.get("line", 0) or 0)))
            for f in frames
            if isinstance(f, dict)
        )
        sid = self.table.stack_id(ids)
        self._by_list_id[key] = sid
        self._keepalive.append(frames)
        return sid


#: Trace entries converted to columns at a time (and, when consuming, then freed).
TRACE_CHUNK = 1 << 18


def _events_fast(chunk: list[Any], dev: int, start: int, intern: _Interner
                 ) -> pl.DataFrame | None:
    """Trace entries to event columns, one C-level pass per column; None when some value is
    not of the plain type a snapshot holds (the slow path then converts it as it can)."""
    n = len(chunk)
    get = dict.get
    try:
        frames = [get(e, "frames") for e in chunk]
        cols = {
            "device": pl.repeat(dev, n, dtype=pl.Int64, eager=True),
            "idx": pl.int_range(start, start + n, dtype=pl.Int64, eager=True),
            "action": pl.Series([get(e, "action", "") for e in chunk], dtype=pl.Utf8),
            "addr": pl.Series([get(e, "addr") for e in chunk], dtype=pl.Int64),
            "size": pl.Series([get(e, "size") for e in chunk], dtype=pl.Int64),
            "stream": pl.Series([get(e, "stream") for e in chunk], dtype=pl.Int64),
            "time_us": pl.Series([get(e, "time_us") for e in chunk], dtype=pl.Int64),
            "stack_id": _stack_ids(frames, intern),
            "device_free": pl.Series([get(e, "device_free") for e in chunk], dtype=pl.Int64),
        }
    except (TypeError, ValueError, OverflowError, pl.exceptions.PolarsError):
        return None
    if cols["action"].null_count():
        return None  # a None action: the slow path spells it as str() does
    df = pl.DataFrame(cols).with_columns(pl.col("addr", "size", "stream").fill_null(0))
    return df.select(list(EVENT_SCHEMA))


def _stack_ids(frames: list[Any], intern: _Interner) -> pl.Series:
    """Stack ids of a column of frame lists: interned once per distinct list object."""
    ids = pl.Series(list(map(id, frames)), dtype=pl.UInt64)
    first = ids.arg_unique()
    keys = ids.gather(first)
    sids = [intern(frames[p]) for p in first.to_list()]
    return ids.replace_strict(keys, pl.Series(sids, dtype=pl.Int64), return_dtype=pl.Int64)


def _events_slow(chunk: list[Any], dev: int, start: int, intern: _Interner) -> pl.DataFrame:
    ev_cols: dict[str, list[Any]] = {k: [] for k in EVENT_SCHEMA}
    for i, ev in enumerate(chunk, start):
        t = ev.get("time_us")
        free = ev.get("device_free")
        ev_cols["device"].append(dev)
        ev_cols["idx"].append(i)
        ev_cols["action"].append(str(ev.get("action", "")))
        ev_cols["addr"].append(int(ev.get("addr", 0) or 0))
        ev_cols["size"].append(int(ev.get("size", 0) or 0))
        ev_cols["stream"].append(int(ev.get("stream", 0) or 0))
        ev_cols["time_us"].append(int(t) if t is not None else None)
        ev_cols["stack_id"].append(intern(ev.get("frames")))
        ev_cols["device_free"].append(int(free) if free is not None else None)
    return pl.DataFrame(ev_cols, schema=EVENT_SCHEMA)


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


def from_snapshot_dict(data: Any, path: str, consume: bool = False) -> Capture:
    """Normalize the decoded snapshot (already known to be builtins only).

    With ``consume`` the trace lists inside ``data`` are emptied while they are converted,
    so the decoded entries can be freed early; the caller must not use ``data`` afterwards.
    """
    if not _is_snapshot(data):
        kind = type(data).__name__
        keys = f" with keys {sorted(map(str, data))[:5]}" if isinstance(data, dict) else ""
        raise InputError(
            f"{path}: a pickle, but not a CUDA memory snapshot ({kind}{keys}; expected the "
            "output of torch.cuda.memory._dump_snapshot)"
        )
    if isinstance(data, list):
        data = {"segments": data}
    try:
        with _gc_paused():
            return _normalize(data, path, consume)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise InputError(f"{path}: malformed snapshot: {type(exc).__name__}: {exc}") from None


def _normalize(data: dict[str, Any], path: str, consume: bool = False) -> Capture:
    intern = _Interner()
    warnings: list[str] = []

    seg_cols: dict[str, list[Any]] = {k: [] for k in SEGMENT_SCHEMA}
    blk_cols: dict[str, list[Any]] = {k: [] for k in BLOCK_SCHEMA}
    devices: set[int] = set()
    for seg in data["segments"]:
        dev = int(seg.get("device", 0))
        devices.add(dev)
        seg_addr = int(seg["address"])
        seg_cols["device"].append(dev)
        seg_cols["address"].append(seg_addr)
        seg_cols["total_size"].append(int(seg["total_size"]))
        seg_cols["stream"].append(int(seg.get("stream", 0) or 0))
        seg_cols["pool"].append(pool_key(seg.get("segment_pool_id")))
        seg_cols["segment_type"].append(str(seg.get("segment_type", "")))
        seg_cols["is_expandable"].append(bool(seg.get("is_expandable", False)))
        addr = seg_addr
        for blk in seg.get("blocks", []):
            size = int(blk["size"])
            state = str(blk.get("state", "inactive"))
            blk_cols["device"].append(dev)
            blk_cols["address"].append(int(blk.get("address", addr)))
            blk_cols["size"].append(size)
            blk_cols["requested_size"].append(int(blk.get("requested_size", size) or 0))
            blk_cols["state"].append(_STATE_ALIASES.get(state, state))
            blk_cols["stack_id"].append(intern(_block_frames(blk)))
            blk_cols["segment_address"].append(seg_addr)
            addr += size

    parts: list[pl.DataFrame] = []
    traces = data.get("device_traces") or []
    has_time = False
    for dev, trace in enumerate(traces):
        if not trace:
            continue
        devices.add(dev)
        for start in range(0, len(trace), TRACE_CHUNK):
            chunk = trace[start:start + TRACE_CHUNK]
            df = _events_fast(chunk, dev, start, intern)
            parts.append(df if df is not None else _events_slow(chunk, dev, start, intern))
            if consume:  # drop the decoded entries now: only the columns are needed
                trace[start:start + len(chunk)] = [None] * len(chunk)
            del chunk
        if consume:
            trace.clear()
    if parts:
        events = pl.concat(parts, rechunk=True) if len(parts) > 1 else parts[0]
        has_time = events["time_us"].null_count() < events.height
    else:
        events = pl.DataFrame(schema=EVENT_SCHEMA)

    settings = data.get("allocator_settings")
    overflowed = bool(data.get("trace_alloc_overflowed")) or bool(
        isinstance(settings, dict) and settings.get("trace_alloc_overflowed")
    )
    if overflowed:
        warnings.append(
            "the trace ring buffer overflowed: the oldest events were dropped, so blocks "
            "allocated before the first kept event show as 'allocated before recording'"
        )
    if "allocator_settings" not in data:
        warnings.append("older snapshot layout: no allocator_settings recorded")
    annotations = [a for a in (data.get("external_annotations") or []) if isinstance(a, dict)]

    capture = Capture(
        source="torch_snapshot",
        path=path,
        stacks=intern.table,
        segments=pl.DataFrame(seg_cols, schema=SEGMENT_SCHEMA),
        blocks=pl.DataFrame(blk_cols, schema=BLOCK_SCHEMA),
        events=events,
        devices=sorted(devices) or [0],
        allocator_settings=settings if isinstance(settings, dict) else None,
        annotations=annotations,
        warnings=warnings,
        has_trace=events.height > 0,
        has_time=has_time,
        metadata={
            k: data[k] for k in ("user_metadata", "compile_context") if k in data
        },
    )
    return capture
