"""Read `torch.cuda.memory._dump_snapshot` pickles safely into the common model.

Snapshots arrive from other machines and tickets, so they are never given to `pickle.load`.
The restricted unpickler below resolves no global at all: every opcode that could import or
call something (GLOBAL, STACK_GLOBAL, INST, OBJ, EXT1/2/4 resolve through `find_class`;
PERSID/BINPERSID through `persistent_load`) is refused the moment it is read. REDUCE, NEWOBJ,
NEWOBJ_EX and BUILD can only act on an object obtained that way, so they never get to run.

Builtin data alone can still be hostile while it is decoded: a dict key that is a tuple
nested 100,000 deep (hashing it overflows the C stack), or shared 60 levels deep (hashing it
never ends, in a C loop no signal interrupts), or a memo index of 2**30 (the unpickler
allocates and clears gigabytes). So a pickle is decoded in a bounded child process — the
same restricted unpickler, under a time limit and a memory limit proportional to the file —
which hands the traces back as flat columns and the rest re-pickled as builtins (`load`);
only a file the child cannot turn into plain columns is decoded a second time, here, once
the child has finished within its limits. Everything decoded is then validated,
once, before it becomes columns: types, ranges (sizes and addresses in [0, 2**62), finite
times, device indices), blocks inside their segment, strings and metadata bounded. The ranges
are those of PyTorch's own writers (see `snapana.limits`): a value PyTorch can write is never
refused; one that carries nothing (a frame's unknown line, 2**64 - 1) is normalised and the
capture says so in its warnings.
"""

from __future__ import annotations

import gc
import io
import json
import math
import mmap
import os
import pickle
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from operator import is_not
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import polars as pl

from snapana.caching_allocator import normalize_state
from snapana.capture_kinds import CaptureKind
from snapana.errors import InputError, UnsafePickleError
from snapana.limits import (
    LINE_RANGE,
    MAX_BYTES,
    MAX_DEVICE,
    MAX_DEVICES,
    MAX_LINE,
    MAX_STRING,
    MAX_TIME,
    POOL_ID_RANGE,
    STREAM_RANGE,
    decode_memory,
    decode_seconds,
    limit_hint,
    max_rows,
)
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
from snapana.sources import decode_pool, pickle_child
from snapana.sources._checks import first_event_outside_segments
from snapana.sources._io import (
    BoundedGzip,
    MetaError,
    first_line,
    open_input,
    sanitize,
)
from snapana.units import inert

if TYPE_CHECKING:
    import numpy as np

#: Trace actions PyTorch writes; others are kept but ignored by replay, with a warning.
KNOWN_ACTIONS = frozenset({"alloc", "free_requested", "free_completed", "free",
                           "segment_alloc", "segment_free", "segment_map", "segment_unmap",
                           "oom", "snapshot"})
_MAX_NAME = 256  # longest action, state or segment type
_INT64 = 2**63


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

    def __init__(self, raw: Any, total: int, progress: ReadProgress) -> None:
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


# ----- decoding --------------------------------------------------------------------------------

def _decode_in_child(path: Path, size: int, compressed: bool, columns: bool = False
                     ) -> tuple[dict[str, Any], mmap.mmap | memoryview] | None:
    """Decode the pickle once in a bounded child process; InputError when that crashes,
    runs out of its time, or needs memory no snapshot of this size needs. Decoding errors
    (a refused global, a truncated file) are left to the real decode, which says them.

    With ``columns``, the child's reply and payload when the snapshot is plain
    (`child_columns.CHILD_COLUMNS`: the trace buffers, then the rest as a pickle, from the
    file the child wrote them to or after its reply on stdout), else None: the caller
    decodes in-process. A child `pickle_child.start_early` started on this very
    file is taken rather than starting another."""
    try:
        st = os.stat(path)
        child = pickle_child.take(path, st, columns) if columns else None
        if child is None:
            child = decode_pool.start(path, size, compressed, columns)
        limit = child.limit
        returncode, out = child.wait()
    except subprocess.TimeoutExpired:
        raise InputError(f"{path}: decoding the pickle did not finish in time (a hostile or "
                         f"corrupt structure?); {limit_hint('SNAPANA_DECODE_SECONDS')}"
                         ) from None
    except OSError:
        return None  # no child process possible here: decode in-process as before
    head = out.find(b"\n")
    try:
        reply = json.loads(out[:head if head >= 0 else len(out)].decode("utf-8", "replace"))
    except ValueError:
        reply = None
    if returncode != 0 or not isinstance(reply, dict):
        sig = -returncode if returncode < 0 else 0
        if sig == 14:  # SIGALRM: the decode's own time limit
            raise InputError(f"{path}: decoding the pickle did not finish in "
                             f"{decode_seconds(size if not compressed else limit):.0f} s "
                             "(a hostile or corrupt structure?); "
                             f"{limit_hint('SNAPANA_DECODE_SECONDS')}")
        raise InputError(f"{path}: the pickle crashed the decoder "
                         f"({'signal ' + str(sig) if sig else 'exit ' + str(returncode)}"
                         "): corrupt or hostile data, nothing from it was executed")
    if reply.get("error") == "memory" or (
            reply.get("ok") and int(reply.get("peak") or 0) > decode_memory(
                int(reply.get("size") or 0))):
        raise InputError(f"{path}: decoding the pickle needs far more memory than a snapshot "
                         f"of its size (a hostile memo index or structure?); "
                         f"{limit_hint('SNAPANA_DECODE_MEMORY')}")
    # "limit" and "decode" errors: the in-process decode reports them in full
    if columns and reply.get("ok") and reply.get("plain"):
        if not child.to_file:
            return reply, memoryview(out)[head + 1:]
        return None if child.payload is None else (reply, child.payload)
    return None


def restricted_load(path: Path, progress: ReadProgress | None = None,
                    checked: bool = False) -> Any:
    """Decode a (possibly gzip-compressed) pickle of builtins only; raise InputError otherwise.
    ``checked``: the bounded child has already decoded this file within its limits."""
    return _restricted_load(path, progress, checked)[0]


def _restricted_load(path: Path, progress: ReadProgress | None = None,
                     checked: bool = False) -> tuple[Any, int]:
    """The decoded pickle and its decompressed size in bytes."""
    path = Path(path)
    stream, raw, compressed = open_input(path)
    try:
        size = os.fstat(raw.fileno()).st_size
        if not checked:
            _decode_in_child(path, size, compressed)
        src: Any = stream
        if progress is not None:
            src = io.BufferedReader(_CountingReader(stream, size, progress), 1 << 20)
        with _gc_paused():
            data = _RestrictedUnpickler(src).load()
        if progress is not None:
            progress(size, size)
        raw_stream = getattr(stream, "raw", None)
        decoded = raw_stream.done if isinstance(raw_stream, BoundedGzip) else size
        return data, decoded
    except UnsafePickleError as exc:
        raise UnsafePickleError(f"{path}: {exc}") from None
    except InputError:
        raise
    except (EOFError, pickle.UnpicklingError, ValueError, IndexError,
            KeyError, TypeError, AttributeError, MemoryError, OverflowError,
            UnicodeDecodeError, RecursionError) as exc:
        detail = first_line(exc)
        raise InputError(
            f"{path}: not a readable pickle (truncated or corrupt?): {detail}"
        ) from None
    except OSError as exc:
        raise InputError(f"{path}: cannot read: {exc.strerror or exc}") from None
    finally:
        stream.close()
        raw.close()


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


class _NotPlain(Exception):
    """Trace columns from the child hold a value the entry-by-entry path must judge."""


#: The child's buffers, by array typecode (`child_columns.CHILD_COLUMNS`): native byte order,
#: since the child runs on this machine.
_BUFFER_TYPES = {"B": "=u1", "i": "=i4", "q": "=i8"}


class _TraceColumns:
    """One device trace as the child sent it: `n` entries, distinct action strings and its
    stacks (a frame list per sequence of frame objects, in order of first use) with the key
    the stack column names each by, and flat arrays: actions index theirs, stacks hold
    keys."""

    #: The arrays, in the order `__init__` takes them.
    COLUMNS = ("action", "addr", "size", "stream", "time_us", "device_free", "stack")

    def __init__(self, n: int, actions: list[Any], frames: list[Any], frame_keys: list[Any],
                 arrays: list[Any]) -> None:
        self.n, self.actions, self.frames, self.frame_keys = n, actions, frames, frame_keys
        (self.action, self.addr, self.size, self.stream, self.time_us, self.device_free,
         self.stack) = arrays


def _load_columns(path: Path, progress: ReadProgress | None
                  ) -> tuple[dict[str, Any], dict[int, _TraceColumns], int, bool] | None:
    """The snapshot decoded once by the bounded child: everything but the traces as builtins,
    the traces as columns, the pickle's decompressed size and whether the child read the
    entries from the bytes (`pickle_scan`); None when the child could not make columns
    (decode in-process)."""
    import numpy as np
    import numpy.ma  # noqa: F401  polars reads masks through it when a column comes from
    # numpy: imported here, while the child decodes, rather than after (20 ms)

    stream, raw, compressed = open_input(path)
    try:
        size = os.fstat(raw.fileno()).st_size
        if progress is not None:
            progress(0, size)
        payload = _decode_in_child(path, size, compressed, columns=True)
    finally:
        stream.close()
        raw.close()
    if payload is None:
        return None
    reply, body = payload
    try:
        lengths = [int(n) for n in reply["bufs"]]
        dtypes = [_BUFFER_TYPES[k] for k in str(reply["kinds"])]
        rest_len = int(reply["rest"])
        if (rest_len + sum(lengths) != len(body) or len(dtypes) != len(lengths)
                or min(lengths, default=0) < 0 or rest_len < 0):
            return None  # (a negative count would make frombuffer read to the end)
        at = sum(lengths)
        with _gc_paused():
            data, metas = _RestrictedUnpickler(io.BytesIO(body[at:at + rest_len])).load()
        arrays: list[Any] = []
        at = 0
        for n, dtype in zip(lengths, dtypes, strict=True):  # views of the payload, not copies
            width = np.dtype(dtype).itemsize
            if n % width:
                return None
            arrays.append(np.frombuffer(body, dtype=dtype, count=n // width, offset=at))
            at += n
        # in the payload's order: each trace's forked columns (`forked` of them, made by
        # the child's forked process), then each trace's own (actions, stack keys and the
        # other numbers), each buffer named
        names = [str(x) for x in reply["names"]]
        forked = int(reply["forked"])
        full = [(dev, meta) for dev, meta in enumerate(metas) if meta is not None]
        if len(names) != len(arrays) or len(arrays) != 7 * len(full) or not 0 <= forked <= 7:
            return None
        split = forked * len(full)
        traces: dict[int, _TraceColumns] = {}
        for k, (dev, meta) in enumerate(full):
            n, actions, frames, frame_keys = meta
            mine = [*range(forked * k, forked * (k + 1)),
                    *range(split + (7 - forked) * k, split + (7 - forked) * (k + 1))]
            by_name = {names[j]: arrays[j] for j in mine}
            if set(by_name) != set(_TraceColumns.COLUMNS):
                return None
            cols = [by_name[c] for c in _TraceColumns.COLUMNS]
            if any(len(c) != n for c in cols) or len(frame_keys) != len(frames):
                return None
            traces[dev] = _TraceColumns(n, actions, frames, frame_keys, cols)
    except (KeyError, TypeError, ValueError, pickle.UnpicklingError, EOFError):
        return None  # not what the child writes: decode in-process
    if progress is not None:
        progress(size, size)
    return data, traces, int(reply.get("size") or size), bool(reply.get("scanned"))


# ----- validation --------------------------------------------------------------------------------

class _Bad(ValueError):
    """An invalid value: `where` names the field and entry, `what` says what is wrong."""

    def __init__(self, where: str, what: str) -> None:
        super().__init__(f"{where}: {what}")


def _describe(v: Any) -> str:
    """A short, safe description of a value (never str() of a container: it may be huge)."""
    if v is None or isinstance(v, (bool, float)):
        return repr(v)
    if isinstance(v, int):
        return repr(v) if abs(v) < 10**30 else f"an integer of {v.bit_length()} bits"
    if isinstance(v, str):
        return repr(v[:40]) + ("..." if len(v) > 40 else "")
    return f"a {type(v).__name__}"


def _int(v: Any, where: str, lo: int, hi: int, default: int | None = None,
         floats: bool = False) -> int | None:
    """An integer in [lo, hi); None/missing gives `default`; finite floats when allowed."""
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise _Bad(where, f"expected an integer, got {_describe(v)}")
    if isinstance(v, float):
        if not floats or not math.isfinite(v):
            raise _Bad(where, f"expected an integer, got {_describe(v)}")
        v = int(v)
    if not lo <= v < hi:
        raise _Bad(where, f"{_describe(v)} is out of range [{lo}, {hi})")
    return v


def _str(v: Any, where: str, default: str = "", limit: int = MAX_STRING) -> str:
    if v is None:
        return default
    if not isinstance(v, str):
        raise _Bad(where, f"expected a string, got {_describe(v)}")
    if len(v) > limit:
        raise _Bad(where, f"a string of {len(v):,} characters (limit {limit:,})")
    return inert(v, lines=False)  # controls and unpaired surrogates escaped, once


def _bytes(v: Any, where: str, default: int | None = 0) -> int | None:
    return _int(v, where, 0, MAX_BYTES, default)


def _dict(v: Any, where: str) -> dict[str, Any]:
    if not isinstance(v, dict):
        raise _Bad(where, f"expected a dict, got {_describe(v)}")
    return v


def _list(v: Any, where: str) -> list[Any]:
    if v is None:
        return []
    if not isinstance(v, (list, tuple)):
        raise _Bad(where, f"expected a list, got {_describe(v)}")
    return list(v) if isinstance(v, tuple) else v


def _flag(v: Any) -> bool:
    return isinstance(v, (bool, int)) and bool(v)


def _is_snapshot(data: Any) -> bool:
    if isinstance(data, list):  # PyTorch 1.13: a bare list of segments
        return all(isinstance(s, dict) and "blocks" in s for s in data)
    return isinstance(data, dict) and isinstance(data.get("segments"), list)


class _Interner:
    """Turns frame lists into stack ids, caching by object identity since PyTorch shares them;
    each distinct list is validated once (frames are dicts of strings and a line number)."""

    def __init__(self) -> None:
        self.table = StackTable()
        self._by_list_id: dict[int, int] = {}
        self._by_frame_dict: dict[int, int] = {}
        self._keepalive: list[Any] = []
        #: each distinct string object's checked text: one long name shared by thousands of
        #: frames through the pickle's memo is checked (and made inert) once, not per frame
        self._texts: dict[int, str] = {}
        #: distinct frames whose line PyTorch wrote as "none" (2**64 - 1, -1), read as 0
        self.unknown_lines = 0

    def __call__(self, frames: Any, where: Any = "frames") -> int:
        if frames is None or (isinstance(frames, (list, tuple)) and not frames):
            return EMPTY_STACK
        key = id(frames)
        sid = self._by_list_id.get(key)
        if sid is not None:
            return sid
        if not isinstance(frames, list):
            frames = _list(frames, where() if callable(where) else where)
        # frame dicts are shared too: each distinct one is validated and interned once
        by_dict = self._by_frame_dict
        ids = list(map(by_dict.get, map(id, frames)))
        if None in ids:
            at = where() if callable(where) else where
            fid = self.table.frame_id
            for k, f in enumerate(frames):
                if ids[k] is not None:
                    continue
                known = by_dict.get(id(f))  # the same dict earlier in this very list
                if known is not None:
                    ids[k] = known
                    continue
                f = _dict(f, f"{at}[{k}]")
                ids[k] = by_dict[id(f)] = fid((
                    self._text(f.get("filename"), f"{at}[{k}].filename"),
                    self._text(f.get("name"), f"{at}[{k}].name"),
                    self._line(f.get("line"), f"{at}[{k}].line")))
                self._keepalive.append(f)
        sid = self.table.stack_id(tuple(cast("list[int]", ids)))
        self._by_list_id[key] = sid
        self._keepalive.append(frames)
        return sid

    def _text(self, v: Any, where: str) -> str:
        """`_str` once per string object (the frame dicts kept alive keep their strings,
        so an id is not reused while the interner lives)."""
        got = self._texts.get(id(v))
        if got is None:
            got = self._texts[id(v)] = _str(v, where)
        return got

    def _line(self, v: Any, where: str) -> int:
        """A frame's line: PyTorch writes "no line" as 2**64 - 1 (uint64, Python path) or -1
        (int64, C++ path); those, and any line past MAX_LINE, are read as 0 and counted."""
        line = _int(v, where, *LINE_RANGE, 0) or 0
        if not 0 <= line < MAX_LINE:
            self.unknown_lines += 1
            return 0
        return line


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
    intern = _Interner()
    warnings: list[str] = []

    seg_cols, blk_cols, devices = _segments(data, intern)
    if len(devices) > MAX_DEVICES:
        raise _Bad("segments", f"more than {MAX_DEVICES} devices hold data")

    parts: list[pl.DataFrame] = []
    traces = _list(data.get("device_traces") or [], "device_traces")
    if len(traces) > MAX_DEVICE:
        raise _Bad("device_traces", f"{len(traces):,} device traces (at most {MAX_DEVICE})")
    has_time = False
    dropped_times = [0]
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
    devices |= traced
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

    if dropped_times[0]:
        n = dropped_times[0]
        warnings.append(f"{n} trace entr{'y has' if n == 1 else 'ies have'} a time outside "
                        f"±2**62 µs; {'its time was' if n == 1 else 'their times were'} ignored")
    if intern.unknown_lines:
        n = intern.unknown_lines
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
        metadata={
            k: sanitize(data[k], k) for k in ("user_metadata", "compile_context") if k in data
        },
    )
    return capture


def _check_event_totals(events: pl.DataFrame) -> None:
    """The bytes one device's trace moves stay inside int64 whatever the order: every running
    sum replay makes is bounded by this total."""
    totals = events.group_by("device").agg(pl.col("size").cast(pl.Float64).sum().alias("t"))
    over = totals.filter(pl.col("t") >= float(MAX_BYTES))
    if over.height:
        dev = over["device"][0]
        raise _Bad(f"device_traces[{dev}]", "the sizes of its entries add up to more than "
                   "2**62 bytes")
