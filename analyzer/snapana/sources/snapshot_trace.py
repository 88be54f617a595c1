"""A snapshot's device traces as the events table: from the child's columns
(`_events_columns`), else entry by entry in chunks, one C-level pass per column where every
value is of the plain type PyTorch writes (`_events_fast`) and a validating pass naming the
first offending entry where not (`_events_slow`).
"""

from __future__ import annotations

import math
from functools import partial
from operator import is_not
from typing import TYPE_CHECKING, Any

import polars as pl

from snapana.limits import MAX_BYTES, MAX_DEVICE, MAX_DEVICES, MAX_TIME, STREAM_RANGE
from snapana.model import EVENT_SCHEMA
from snapana.sources.snapshot_decode import _NotPlain, _TraceColumns
from snapana.sources.snapshot_values import (
    _MAX_NAME,
    _Bad,
    _bytes,
    _dict,
    _int,
    _Interner,
    _list,
    _str,
)

if TYPE_CHECKING:
    import numpy as np

_INT64 = 2**63


#: Trace entries converted to columns at a time (and, when consuming, then freed).
TRACE_CHUNK = 1 << 18
_NONE = type(None)


def _only(values: list[Any], *types: type) -> bool:
    """All values are exactly of these types (C-speed: a set of types)."""
    return set(map(type, values)) <= set(types)


def _events_fast(chunk: list[Any], dev: int, start: int, intern: _Interner
                 ) -> pl.DataFrame | None:
    """Trace entries to event columns, one C-level pass per column; None when some value is
    not of the plain type a snapshot holds or out of range (the slow path then validates
    entry by entry and names the first offending one). Types are checked before any value
    reaches polars, which must only ever see strings and integers."""
    n = len(chunk)
    if not _only(chunk, dict):
        return None
    get = dict.get
    actions = [get(e, "action", "") for e in chunk]
    ints = {k: [get(e, k) for e in chunk] for k in ("addr", "size", "stream", "time_us",
                                                      "device_free")}
    frames = [get(e, "frames") for e in chunk]
    if not _only(actions, str) or not _only(frames, list, _NONE):
        return None
    for v in ints.values():
        types = set(map(type, v))
        if not types <= {int, _NONE}:
            return None
        # in int64 before polars sees them (polars prints to stderr on an overflow)
        known: list[Any] = list(filter(partial(is_not, None), v)) if _NONE in types else v
        if known and (min(known) < -_INT64 or max(known) >= _INT64):
            return None
    try:
        cols = {k: pl.Series(v, dtype=pl.Int64) for k, v in ints.items()}
        action = pl.Series(actions, dtype=pl.Utf8)
    except (TypeError, ValueError, OverflowError, pl.exceptions.PolarsError):
        return None
    bad = ((cols["addr"] < 0) | (cols["addr"] >= MAX_BYTES) | (cols["size"] < 0)
           | (cols["size"] >= MAX_BYTES) | (cols["device_free"] < 0)
           | (cols["device_free"] >= MAX_BYTES)
           # not abs(): polars' abs() wraps at the int64 minimum (-2**63 stays negative)
           | (cols["time_us"] <= -MAX_TIME) | (cols["time_us"] >= MAX_TIME)
           | (action.str.len_chars() > _MAX_NAME))
    if bad.any():
        return None
    df = pl.DataFrame({
        "device": pl.repeat(dev, n, dtype=pl.Int64, eager=True),
        "idx": pl.int_range(start, start + n, dtype=pl.Int64, eager=True),
        "action": action,
        **cols,
        "stack_id": _stack_ids(frames, intern, dev, start),
    }).with_columns(pl.col("addr", "size", "stream").fill_null(0))
    return df.select(list(EVENT_SCHEMA))


def _stack_ids_by_key(stack: np.ndarray, keys: np.ndarray, sids: np.ndarray, n: int
                      ) -> np.ndarray:
    """Each entry's stack id from its stack key: a key is where the child first saw that
    stack (a position in the trace), so a table over the positions maps every entry in one
    gather (the first of equal keys names it); `_NotPlain` for a key the child did not
    list."""
    import numpy as np

    if not n:
        return sids[:0]
    if not len(keys) or keys.min() < 0 or keys.max() >= n or stack.min() < 0 \
            or stack.max() >= n:
        raise _NotPlain
    distinct, first = np.unique(keys, return_index=True)  # a few hundred stacks
    table = np.full(n, -1, dtype=np.int64)
    table[distinct] = first
    which = table[stack]
    if which.min() < 0:
        raise _NotPlain  # a stack key the child did not list
    return sids[which]


def _events_columns(tc: _TraceColumns, dev: int, intern: _Interner) -> pl.DataFrame:
    """Event columns from the child's arrays: the same checks as `_events_fast`, on whole
    columns; `_NotPlain` when a value is out of range (the caller then decodes in-process
    so the entry-by-entry path names it). Distinct frame lists are interned once each."""
    import numpy as np

    if any(len(a) > _MAX_NAME for a in tc.actions):
        raise _NotPlain
    null = -(1 << 63)
    try:
        sids = np.asarray([intern(f, f"device_traces[{dev}].frames") for f in tc.frames],
                          dtype=np.int64)
        keys = np.asarray(tc.frame_keys, dtype=np.int64)
    except (_Bad, TypeError, ValueError, OverflowError):
        raise _NotPlain from None
    stack_ids = _stack_ids_by_key(np.asarray(tc.stack), keys, sids, tc.n)
    df = pl.DataFrame({
        "device": pl.repeat(dev, tc.n, dtype=pl.Int64, eager=True),
        "idx": pl.int_range(0, tc.n, dtype=pl.Int64, eager=True),
        "action": pl.Series(tc.actions, dtype=pl.Utf8).gather(
            pl.Series(tc.action, dtype=pl.Int32)),
        "addr": pl.Series(tc.addr, dtype=pl.Int64),
        "size": pl.Series(tc.size, dtype=pl.Int64),
        "stream": pl.Series(tc.stream, dtype=pl.Int64),
        "time_us": pl.Series(tc.time_us, dtype=pl.Int64),
        "stack_id": pl.Series(stack_ids, dtype=pl.Int64),
        "device_free": pl.Series(tc.device_free, dtype=pl.Int64),
    }).with_columns(pl.col("time_us", "device_free").replace(null, None))
    bad = df.select(
        ((pl.col("addr") < 0) | (pl.col("addr") >= MAX_BYTES) | (pl.col("size") < 0)
         | (pl.col("size") >= MAX_BYTES) | (pl.col("device_free") < 0)
         | (pl.col("device_free") >= MAX_BYTES) | (pl.col("time_us").abs() >= MAX_TIME)
         ).any()).item()
    if bad:
        raise _NotPlain
    return df.select(list(EVENT_SCHEMA))


def _stack_ids(frames: list[Any], intern: _Interner, dev: int, start: int) -> pl.Series:
    """Stack ids of a column of frame lists: interned once per distinct list object."""
    ids = pl.Series(list(map(id, frames)), dtype=pl.UInt64)
    first = ids.arg_unique()
    keys = ids.gather(first)
    sids = [intern(frames[p], lambda p=p: f"device_traces[{dev}][{start + p}].frames")
            for p in first.to_list()]
    return ids.replace_strict(keys, pl.Series(sids, dtype=pl.Int64), return_dtype=pl.Int64)


def _time(v: Any, where: str, dropped: list[int]) -> int | None:
    """A trace entry's time: an integer (PyTorch writes int64 µs) or a finite float; one
    outside ±MAX_TIME is dropped (counted in ``dropped``), not refused."""
    if isinstance(v, int) and not isinstance(v, bool) and not -MAX_TIME < v < MAX_TIME:
        dropped[0] += 1
        return None
    if isinstance(v, float) and math.isfinite(v) and not -MAX_TIME < v < MAX_TIME:
        dropped[0] += 1
        return None
    return _int(v, where, -MAX_TIME, MAX_TIME, None, floats=True)


def _events_slow(chunk: list[Any], dev: int, start: int, intern: _Interner,
                 dropped: list[int]) -> pl.DataFrame:
    ev_cols: dict[str, list[Any]] = {k: [] for k in EVENT_SCHEMA}
    for i, ev in enumerate(chunk, start):
        at = f"device_traces[{dev}][{i}]"
        ev = _dict(ev, at)
        ev_cols["device"].append(dev)
        ev_cols["idx"].append(i)
        ev_cols["action"].append(_str(ev.get("action"), f"{at}.action", "", _MAX_NAME))
        ev_cols["addr"].append(_bytes(ev.get("addr"), f"{at}.addr"))
        ev_cols["size"].append(_bytes(ev.get("size"), f"{at}.size"))
        ev_cols["stream"].append(_int(ev.get("stream"), f"{at}.stream", *STREAM_RANGE, 0))
        ev_cols["time_us"].append(_time(ev.get("time_us"), f"{at}.time_us", dropped))
        ev_cols["stack_id"].append(intern(ev.get("frames"), f"{at}.frames"))
        ev_cols["device_free"].append(_bytes(ev.get("device_free"), f"{at}.device_free",
                                             None))
    return pl.DataFrame(ev_cols, schema=EVENT_SCHEMA)


def _trace_parts(data: dict[str, Any], devices: set[int], intern: _Interner, consume: bool,
                 columns: dict[int, _TraceColumns], dropped_times: list[int]
                 ) -> tuple[list[pl.DataFrame], set[int]]:
    """Each device trace's events (the child's `columns` where it made them, else chunks of
    `TRACE_CHUNK` entries), and the devices whose traces hold any; `devices`: those the
    segments hold, counted against MAX_DEVICES with them. With ``consume`` the decoded
    entries are dropped as they become columns."""
    parts: list[pl.DataFrame] = []
    traces = _list(data.get("device_traces") or [], "device_traces")
    if len(traces) > MAX_DEVICE:
        raise _Bad("device_traces", f"{len(traces):,} device traces (at most {MAX_DEVICE})")
    traced: set[int] = set()
    for dev, trace in enumerate(traces):
        if columns and dev in columns:
            traced.add(dev)
            if len(devices | traced) > MAX_DEVICES:
                raise _Bad("device_traces", f"more than {MAX_DEVICES} devices hold data")
            parts.append(_events_columns(columns.pop(dev), dev, intern))
            continue
        if not trace:
            continue
        trace = _list(trace, f"device_traces[{dev}]")
        traced.add(dev)
        if len(devices | traced) > MAX_DEVICES:
            raise _Bad("device_traces", f"more than {MAX_DEVICES} devices hold data")
        for start in range(0, len(trace), TRACE_CHUNK):
            chunk = trace[start:start + TRACE_CHUNK]
            df = _events_fast(chunk, dev, start, intern)
            parts.append(df if df is not None
                         else _events_slow(chunk, dev, start, intern, dropped_times))
            if consume:  # drop the decoded entries now: only the columns are needed
                trace[start:start + len(chunk)] = [None] * len(chunk)
            del chunk
        if consume:
            trace.clear()
    return parts, traced
