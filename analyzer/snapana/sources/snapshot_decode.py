"""Decode a snapshot pickle, bounded: the restricted unpickler (no global resolved, nothing
executed), the bounded child that decodes first (`pickle_child`), and its reply read back as
the traces' flat columns (`_load_columns`). `torch_snapshot` validates what this decodes.
"""

from __future__ import annotations

import gc
import io
import json
import mmap
import os
import pickle
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from snapana.errors import InputError, UnsafePickleError
from snapana.limits import decode_memory, decode_seconds, limit_hint
from snapana.model import ReadProgress
from snapana.sources import decode_pool, pickle_child
from snapana.sources._io import BoundedGzip, first_line, open_input


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
