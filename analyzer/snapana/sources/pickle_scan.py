"""Reading a snapshot pickle's trace entries from its bytes, without the unpickler making them.

A million-entry trace decodes to a million dicts, which then have to be read back into
columns: two thirds of the time a large report takes. Most entries are written alike, as a
dict of memoized keys and plain values (`}` MEMOIZE MARK, then a key by BINGET and an int,
None or BINGET each, then SETITEMS). This module finds those entries in the bytes and reads
them for all entries at once with numpy (`_walk`), checks them against a walk over every
other opcode in the file (`_Walker`, so an entry is only ever read where the unpickler would
read one), and rewrites the pickle with each run of such entries replaced by a marker
(`Plan.stream`): the restricted unpickler then decodes only the rest, and the entries come
back as `ScannedTrace`s, columns with the unpickler's own objects for what they reference.

It runs in the bounded decode child (`pickle_child`), under its time and memory limits, and
never executes anything: it reads bytes into numbers. Whatever it does not recognise (another
protocol, another opcode, a reference it cannot place) makes `scan` return None, and the child
decodes the file as before; so does a decoded result that does not hold every marker where a
trace's entries go. A file decoded this way yields the same columns as one decoded whole.
"""

from __future__ import annotations

import os
import struct
from bisect import bisect_left, bisect_right
from collections.abc import Iterator
from typing import Any, Protocol

import numpy as np

#: How many entries are read together: their arrays (a few MB) stay in the cache.
CHUNK = 1 << 14

#: The pair (key, value) steps an entry may take: PyTorch writes 6 to 9 keys per entry.
MAX_PAIRS = 16

#: Value kinds read from an entry: no such key, an int, None, a memo reference.
MISSING, INT, NONE, REF = 0, 1, 2, 3

#: The trace entry keys the columns read, by code; any other string key is `OTHER`.
NAMES = ("action", "addr", "size", "stream", "time_us", "frames", "device_free")
OTHER = len(NAMES)

#: int64's smallest value: what the child's columns write for None (time_us, device_free).
NULL = -(1 << 63)

_EMPTY_DICT, _MEMOIZE, _MARK, _SETITEMS = 0x7D, 0x94, 0x28, 0x75
_BINGET, _LONG_BINGET = 0x68, 0x6A
_BININT1, _BININT2, _BININT, _LONG1, _NONE = 0x4B, 0x4D, 0x4A, 0x8A, 0x4E
_ENTRY_HEAD = _EMPTY_DICT | _MEMOIZE << 8 | _MARK << 16

# a value's opcode -> (its length with the opcode, LONG1's before its bytes; its kind; the
# mask of the bytes after it that hold it)
_VALUE_LEN = np.zeros(256, np.int64)
_VALUE_KIND = np.zeros(256, np.uint8)  # MISSING: not a value this reader takes
_VALUE_MASK = np.zeros(256, np.int64)
for _op, (_len, _kind, _mask) in {
    _BININT1: (2, INT, 0xFF), _BININT2: (3, INT, 0xFFFF), _BININT: (5, INT, 0xFFFFFFFF),
    _LONG1: (2, INT, 0), _NONE: (1, NONE, 0),
    _BINGET: (2, REF, 0xFF), _LONG_BINGET: (5, REF, 0xFFFFFFFF),
}.items():
    _VALUE_LEN[_op], _VALUE_KIND[_op], _VALUE_MASK[_op] = _len, _kind, _mask

# ---- the walk over every other opcode --------------------------------------------------------

# opcode -> the bytes it takes, for those of a fixed length that build only builtins
_FIXED = {
    b"(": 1, b")": 1, b"]": 1, b"}": 1, b"0": 1, b"1": 1, b"2": 1, b"N": 1, b"\x88": 1,
    b"\x89": 1, b"a": 1, b"e": 1, b"s": 1, b"u": 1, b"t": 1, b"\x85": 1, b"\x86": 1,
    b"\x87": 1, b"l": 1, b"d": 1, b"\x8f": 1, b"\x90": 1, b"\x91": 1,
    b"K": 2, b"M": 3, b"J": 5, b"G": 9,
}
# opcode -> (bytes of its length field, that field's struct format): a string, bytes or
# long of that many bytes follows
_SIZED = {
    b"\x8c": (1, "<B"), b"X": (4, "<I"), b"\x8d": (8, "<Q"), b"U": (1, "<B"),
    b"T": (4, "<i"), b"C": (1, "<B"), b"B": (4, "<I"), b"\x8e": (8, "<Q"),
    b"\x96": (8, "<Q"), b"\x8a": (1, "<B"), b"\x8b": (4, "<i"),
}
_TEXT = {b"\x8c"[0], b"X"[0], b"\x8d"[0]}
_STOP, _MEMO, _GET, _LONG_GET = b"."[0], b"\x94"[0], b"h"[0], b"j"[0]


class Source(Protocol):
    """What the pickle is read from: an open binary file."""

    def readinto(self, buffer: Any, /) -> int | None: ...


class _Unknown(Exception):
    """An opcode, a protocol or a layout this reader does not take: decode the whole file."""


def _unframed(source: Source, limit: int) -> tuple[bytearray, list[int]]:
    """The pickle read from `source` (at most `limit` bytes) with protocol 4's FRAME headers
    taken out (frames only tell a reader how much to fetch at once), each frame read into
    place, padded with zero bytes so reads past an entry stay in bounds, and where each frame
    after the first starts in it; `_Unknown` for another protocol, an opcode between frames
    or more than `limit` bytes."""
    data = bytearray(limit + PADDING)  # zero pages until a frame is read into them
    view = memoryview(data)
    if source.readinto(view[:2]) != 2 or data[0] != 0x80 or data[1] not in (4, 5):
        raise _Unknown("protocol")
    at, used = 2, 2
    bounds: list[int] = []
    header = bytearray(9)
    while True:
        got = source.readinto(header)
        if not got:
            break
        if got != 9 or header[0] != 0x95:
            # unframed bytes (a pickle may stop framing): none in PyTorch's
            raise _Unknown("unframed")
        (length,) = struct.unpack_from("<Q", header, 1)
        used += 9 + length
        if used > limit or source.readinto(view[at:at + length]) != length:
            raise _Unknown("frame")
        if at > 2:
            bounds.append(at)
        at += length
    view.release()
    del data[at + PADDING:]
    return data, bounds


#: Zero bytes after the pickle: an entry read past the end meets a zero byte (no opcode this
#: reader takes) within one pair, and a pair takes at most 15 bytes, read 8 at a time.
PADDING = 32

# opcode -> a key reference's length with the opcode, and the mask of the bytes after it
_KEY_LEN = np.zeros(256, np.int64)
_KEY_MASK = np.zeros(256, np.int64)
_KEY_LEN[_BINGET], _KEY_MASK[_BINGET] = 2, 0xFF
_KEY_LEN[_LONG_BINGET], _KEY_MASK[_LONG_BINGET] = 5, 0xFFFFFFFF


class _Entries:
    """Every place in the bytes that starts like an entry (`start`), read as one: where it
    ends (`end`, -1 where it is not an entry this reader takes) and, per pair step, each
    entry's key reference, value kind and value (`keys`, `kinds`, `values`: MISSING past
    an entry's last pair, where its key reads 0)."""

    def __init__(self, data: bytearray) -> None:
        head = np.frombuffer(data, np.uint8)[:-PADDING]
        # 8 bytes from every offset, as little-endian int64 (an unaligned view)
        words = np.ndarray((len(data) - 8,), dtype="<i8", buffer=data, strides=(1,))
        step = CHUNK * 64  # bytes searched at a time, so the search's flags stay in cache
        found = [lo + np.flatnonzero(head[lo:lo + step] == _EMPTY_DICT)
                 for lo in range(0, len(head), step)]
        start = np.concatenate(found) if found else np.zeros(0, np.int64)
        self.start = start[(words[start] & 0xFFFFFF) == _ENTRY_HEAD]
        self.end = np.full(len(self.start), -1, np.int64)
        self.keys: list[np.ndarray] = []
        self.kinds: list[np.ndarray] = []
        self.values: list[np.ndarray] = []
        self._walk(words)

    def _walk(self, words: np.ndarray) -> None:
        """All entries read in lockstep, a pair per step, `CHUNK` entries at a time (their
        arrays stay in the processor's cache): each step reads every entry's next opcode, so
        a step costs a few passes over the entries, not a Python loop."""
        n = len(self.start)
        for lo in range(0, n, CHUNK):
            hi = min(lo + CHUNK, n)
            for step, (key, kind, value) in enumerate(self._pairs(words, lo, hi)):
                if step == len(self.keys):
                    self.keys.append(np.zeros(n, np.uint32))
                    self.kinds.append(np.zeros(n, np.uint8))
                    self.values.append(np.zeros(n, np.int64))
                self.keys[step][lo:hi] = key
                self.kinds[step][lo:hi] = kind
                self.values[step][lo:hi] = value

    def _pairs(self, words: np.ndarray, lo: int, hi: int
               ) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """Entries `lo` to `hi` read a pair per step: each step's (key reference, value
        kind, value) per entry, MISSING for an entry past its last pair. An entry that ends
        or is found unreadable goes to a zero byte after the pickle (`sink`), where it reads
        nothing."""
        sink = len(words) + 8 - PADDING
        at = self.start[lo:hi] + 3
        for step in range(MAX_PAIRS + 1):
            w = words[at]
            op = w & 0xFF
            done = np.flatnonzero(op == _SETITEMS)
            self.end[lo + done] = at[done] + 1
            key_len = _KEY_LEN[op]
            going = key_len > 0
            if step == MAX_PAIRS or not going.any():
                return  # (entries with more pairs stay unreadable)
            key = (w >> 8) & _KEY_MASK[op]
            at = np.where(going, at + key_len, sink)
            vw = words[at]
            vop = vw & 0xFF
            length = _VALUE_LEN[vop]
            value = (vw >> 8) & _VALUE_MASK[vop]
            signed = np.flatnonzero(vop == _BININT)
            if len(signed):
                value[signed] = (vw[signed] << 24) >> 32
            big = np.flatnonzero(vop == _LONG1)
            if len(big):
                width = (vw[big] >> 8) & 0xFF
                fits = width <= 8
                shift = np.where(fits, 64 - 8 * width, 0) & 63
                raw = words[at[big] + 2]
                value[big] = np.where(width == 0, 0, (raw << shift) >> shift)
                length[big] = np.where(fits, 2 + width, 0)  # past int64: not plain
            kind = _VALUE_KIND[vop]
            kind[length == 0] = MISSING
            yield key, kind, value
            at = np.where(length > 0, at + length, sink)


class _Run:
    """Consecutive entries the walk found at an opcode boundary: their indices in
    `_Entries`, where their bytes start and end, and the memo index of the first one's dict
    (each entry memoizes its dict and nothing else)."""

    def __init__(self, begin: int, memo: int) -> None:
        self.parts: list[tuple[int, int]] = []
        self.begin, self.end, self.memo = begin, begin, memo

    def members(self) -> np.ndarray:
        """Its entries' indices among the readable ones."""
        return np.concatenate([np.arange(a, b + 1) for a, b in self.parts])


def _op_starts(data: bytearray, at: int) -> list[int]:
    """Where each opcode of the readable entry at `at` starts, its SETITEMS included."""
    starts = [at, at + 1, at + 2]
    at += 3
    while data[at] != _SETITEMS:
        starts.append(at)
        at += 2 if data[at] == _BINGET else 5
        starts.append(at)
        op = data[at]
        at += 2 + data[at + 1] if op == _LONG1 else int(_VALUE_LEN[op])
    return [*starts, at]


#: Opcodes the walk takes outside entries whatever their number, and what a jump over
#: entries counts as, in opcodes (see `_Walker`): a file whose entries come one or two at a
#: time is not one to read from the bytes.
WALK_FREE = 1 << 16
JUMP_STEPS = 64


class _Walker:
    """A walk over the pickle's opcodes from the first to STOP, opcode by opcode, that jumps
    over each run of entries `_Entries` read: so every entry used is one the unpickler would
    read as one. It counts memo slots, keeps the strings memoized (keys are found by them)
    and every memo reference outside the runs, and checks that each frame of the file
    (`bounds`, where they start) starts at an opcode, where the unpickler reads a FRAME: a
    frame starting inside an opcode is part of its bytes to the unpickler. It walks at most
    `WALK_FREE` opcodes and four per readable entry outside the runs (one Python step each:
    a file with shared frame lists needs a few hundredths per entry): past that, the file is
    not one to read so (`_Unknown`), and the unpickler's C loop decodes it faster."""

    def __init__(self, data: bytearray, entries: _Entries, bounds: list[int]) -> None:
        ok = entries.end >= 0
        self.index = np.flatnonzero(ok)  # the readable entries' indices in `entries`
        self.starts = entries.start[ok]
        self.bounds = bounds
        self.budget = WALK_FREE + 4 * len(self.starts)
        ends = entries.end[ok]
        # where each readable entry ends the next starts: runs go through without a stop
        joined = ends[:-1] == self.starts[1:]
        self.breaks = np.flatnonzero(~joined)
        self.ends = ends
        self.data = data
        self.memo = 0
        self.strings: dict[int, str] = {}
        self.refs: list[int] = []
        self.runs: list[_Run] = []
        self.stop = -1
        self._walk()

    def _entry_at(self, at: int, starts: list[int]) -> int:
        """The readable entry starting at `at` (its index among them), or -1."""
        i = bisect_left(starts, at)
        return i if i < len(starts) and starts[i] == at else -1

    def _bounds_in(self, first: int, last: int, starts: list[int]) -> None:
        """Each frame starting inside the readable entries `first` to `last` (each ending
        where the next starts) starts at one of their opcodes: the entry it falls in is
        one of them (another place read as an entry may start inside one)."""
        lo = bisect_right(self.bounds, starts[first])
        hi = bisect_left(self.bounds, int(self.ends[last]))
        for bound in self.bounds[lo:hi]:
            entry = starts[bisect_right(starts, bound, first, last + 1) - 1]
            if bound not in _op_starts(self.data, entry):
                raise _Unknown("a frame starts inside an opcode")

    def _jump(self, i: int, at: int, starts: list[int]) -> int:
        """Through readable entries from the `i`th on, for as long as each ends where the
        next starts; returns where the last ends."""
        run = self.runs[-1] if self.runs and self.runs[-1].end == at else None
        if run is None:
            run = _Run(at, self.memo)
            self.runs.append(run)
        k = int(np.searchsorted(self.breaks, i))
        last = int(self.breaks[k]) if k < len(self.breaks) else len(self.starts) - 1
        self._bounds_in(i, last, starts)
        run.parts.append((i, last))
        self.memo += last - i + 1
        run.end = int(self.ends[last])
        return run.end

    def _walk(self) -> None:
        data, fixed, sized = self.data, _FIXED_LEN, _SIZED_LEN
        at, size = 2, len(data) - PADDING
        last_text = None  # (where it ends, the string) of the string just read
        starts = self.starts.tolist()
        bounds, b = self.bounds, 0
        bound = bounds[0] if bounds else size
        steps = 0
        while at < size:
            while bound <= at:
                if bound < at:
                    raise _Unknown("a frame starts inside an opcode")
                b += 1
                bound = bounds[b] if b < len(bounds) else size
            steps += 1
            if steps > self.budget:
                raise _Unknown("too many opcodes outside entries")
            op = data[at]
            if op == _EMPTY_DICT and starts:
                i = self._entry_at(at, starts)
                if i >= 0:
                    at = self._jump(i, at, starts)
                    steps += JUMP_STEPS  # a jump costs as much Python as that, and a run
                    b = bisect_left(bounds, at)  # (those inside the entries are checked)
                    bound = bounds[b] if b < len(bounds) else size
                    continue
            n = fixed[op]
            if n:
                at += n
                continue
            if op == _MEMO:
                if last_text is not None and last_text[0] == at:
                    self.strings[self.memo] = last_text[1]
                self.memo += 1
                at += 1
            elif op == _GET:
                self.refs.append(data[at + 1])
                at += 2
            elif op == _LONG_GET:
                self.refs.append(int.from_bytes(data[at + 1:at + 5], "little"))
                at += 5
            elif op == _STOP:
                self.stop = at
                return
            elif (how := sized[op]) is not None:
                width, fmt = how
                (length,) = struct.unpack_from(fmt, data, at + 1)
                if length < 0:
                    raise _Unknown("length")
                begin = at + 1 + width
                at = begin + length
                if op in _TEXT and at <= size:
                    try:
                        last_text = (at, data[begin:at].decode("utf-8", "surrogatepass"))
                    except UnicodeDecodeError:
                        raise _Unknown("text") from None
            else:
                raise _Unknown(f"opcode {op:#x}")
        raise _Unknown("no STOP")


_FIXED_LEN = [0] * 256
for _code, _n in _FIXED.items():
    _FIXED_LEN[_code[0]] = _n
_SIZED_LEN: list[tuple[int, str] | None] = [None] * 256
for _code, _how in _SIZED.items():
    _SIZED_LEN[_code[0]] = _how


class Plan:
    """A pickle to decode in place of the file (`stream`), its runs of entries replaced by
    markers, and what `traces` needs to put the entries back."""

    def __init__(self, stream: bytes, nonce: bytes, runs: list[np.ndarray],
                 entries: _Entries, names: np.ndarray, refs: np.ndarray) -> None:
        self.stream, self.nonce, self.runs = stream, nonce, runs
        self.entries, self.names, self.refs = entries, names, refs
        self._codes: list[np.ndarray] | None = None

    def codes(self) -> list[np.ndarray]:
        """Per pair step, every entry's key as a code: its index in `NAMES`, `OTHER`, or -2
        where the entry has no pair at that step."""
        if self._codes is None:
            e, top = self.entries, len(self.names) - 1
            self._codes = [np.where(kinds != MISSING, self.names[np.clip(keys, 0, top)], -2)
                           for keys, kinds in zip(e.keys, e.kinds, strict=True)]
        return self._codes

    def traces(self, decoded: Any) -> tuple[dict[str, Any], list[Any]] | None:
        """(the snapshot, its traces) from what the unpickler made of `stream`: each trace
        with runs is a `ScannedTrace`. None (the file is then decoded whole) unless every
        run's marker fills, in order, as many places of a trace as the run has entries, no
        marker is anywhere else, and nothing else references the snapshot, its traces or a
        trace with runs (which no longer hold what the file wrote)."""
        if type(decoded) is not tuple or len(decoded) != 2:
            return None
        data, objects = decoded
        if type(data) is not dict or type(objects) is not tuple or len(objects) != len(
                self.refs):
            return None
        traces = data.get("device_traces")
        if type(traces) is not list or not all(type(t) is list for t in traces):
            return None
        k = 0
        out: list[Any] = []
        for trace in traces:
            places: list[tuple[int, int]] = []  # (where a run starts, the run)
            at = 0
            while k < len(self.runs):
                mark, size = self._marker(k), len(self.runs[k])
                try:
                    at = trace.index(mark, at)
                except ValueError:
                    break
                if trace[at:at + size].count(mark) != size:
                    return None
                places.append((at, k))
                at, k = at + size, k + 1
            out.append(ScannedTrace(self, trace, places, objects) if places else trace)
        if k != len(self.runs) or not self._alone(data, traces, out):
            return None
        return data, out

    def _marker(self, k: int) -> bytes:
        return self.nonce + k.to_bytes(4, "little")

    def _alone(self, data: dict[str, Any], traces: list[Any], out: list[Any]) -> bool:
        """Whether, of everything the snapshot holds (the runs' places aside), nothing is a
        marker, and the snapshot, its traces and each trace with runs are each referenced
        from their own place only."""
        own = {id(data): 0, id(traces): 1}
        skip: dict[int, list[tuple[int, int]]] = {}
        for trace, got in zip(traces, out, strict=True):
            if isinstance(got, ScannedTrace):
                own[id(trace)] = 1
                skip[id(trace)] = got.spans
        seen = dict.fromkeys(own, 0)
        width, nonce = len(self.nonce) + 4, self.nonce
        visited = {id(data)}
        todo: list[Any] = [data]
        while todo:
            x = todo.pop()
            if type(x) is dict:
                items: Any = [*x.keys(), *x.values()]
            elif id(x) in skip:
                items = _outside(x, skip[id(x)])
            else:
                items = x
            for y in items:
                t = type(y)
                if t is bytes:
                    if len(y) == width and y.startswith(nonce):
                        return False
                elif t in _CONTAINERS:
                    key = id(y)
                    if key in seen:
                        seen[key] += 1
                    if key not in visited:
                        visited.add(key)
                        todo.append(y)
        return seen == own


#: The builtins the unpickler makes that hold other objects.
_CONTAINERS = {dict, list, tuple, set, frozenset}


def _outside(trace: list[Any], spans: list[tuple[int, int]]) -> list[Any]:
    """The elements of `trace` outside the spans [start, stop)."""
    out, at = [], 0
    for start, stop in spans:
        out += trace[at:start]
        at = stop
    return out + trace[at:]


class ScannedTrace:
    """One device's trace: its entries read from the bytes (runs, at `spans` of the trace)
    and those the unpickler made (`others`, at their places), in the file's order; read by
    the decode child's columns as it reads a list of entry dicts."""

    def __init__(self, plan: Plan, trace: list[Any], places: list[tuple[int, int]],
                 objects: tuple[Any, ...]) -> None:
        self.n = len(trace)
        self.spans = [(at, at + len(plan.runs[k])) for at, k in places]
        members = [plan.runs[k] for _, k in places]
        self.members = np.concatenate(members) if members else np.zeros(0, np.int64)
        self.others = _outside(trace, self.spans)
        is_run = np.zeros(self.n, bool)
        for start, stop in self.spans:
            is_run[start:stop] = True
        self.run_at = np.flatnonzero(is_run)
        self.other_at = np.flatnonzero(~is_run)
        self.plan, self.objects = plan, objects
        self._read: list[tuple[np.ndarray, np.ndarray]] | None = None

    def __len__(self) -> int:
        return self.n

    def __bool__(self) -> bool:
        return self.n > 0

    def plain(self) -> bool:
        """Whether every entry the unpickler made is a dict, as every read one is."""
        return all(type(x) is dict for x in self.others)

    def _pairs(self, name: int) -> tuple[np.ndarray, np.ndarray]:
        """Each read entry's (value kind, value) for the key `NAMES[name]`: the last pair
        with that key, as a dict keeps; MISSING where there is none. Entries laid out as
        the first (each key at the same step: PyTorch writes every entry alike) take the
        step's arrays whole; the others are read step by step."""
        if self._read is None:
            self._read = self._read_all()
        return self._read[name]

    def _read_all(self) -> list[tuple[np.ndarray, np.ndarray]]:
        e, m = self.plan.entries, self.members
        codes = [c[m] for c in self.plan.codes()]
        if not len(m):
            return [(np.zeros(0, np.uint8), np.zeros(0, np.int64))] * len(NAMES)
        layout = [int(c[0]) for c in codes]
        alike = np.ones(len(m), bool)
        for c, first in zip(codes, layout, strict=True):
            alike &= c == first
        apart = np.flatnonzero(~alike)
        out = []
        for name in range(len(NAMES)):
            at = [s for s, code in enumerate(layout) if code == name]
            if at:
                kind, value = e.kinds[at[-1]][m], e.values[at[-1]][m]
            else:
                kind, value = np.zeros(len(m), np.uint8), np.zeros(len(m), np.int64)
            if len(apart):
                kind[apart] = MISSING
                value[apart] = 0
                sub = m[apart]
                for c, kinds, values in zip(codes, e.kinds, e.values, strict=True):
                    hit = c[apart] == name
                    kind[apart[hit]] = kinds[sub[hit]]
                    value[apart[hit]] = values[sub[hit]]
            out.append((kind, value))
        return out

    def _slots(self, key: str, default: Any) -> tuple[np.ndarray, list[Any]]:
        """(each entry's place in a pool, the pool): the objects the entries hold for
        `key`, `default` where they have none. A referenced value is the unpickler's
        object, so the same object for every entry referencing it."""
        kind, value = self._pairs(NAMES.index(key))
        pool: list[Any] = [default, None, 0]  # MISSING, NONE, an int (never a plain value)
        pick = np.where(kind == MISSING, 0, np.where(kind == NONE, 1, 2))
        ref = kind == REF
        if ref.any():
            pick[ref] = 3 + np.searchsorted(self.plan.refs, value[ref])
        pool += self.objects
        at = len(pool)
        pool += [x.get(key, default) for x in self.others]
        full = np.empty(self.n, np.int64)
        full[self.run_at] = pick
        full[self.other_at] = np.arange(at, at + len(self.others))
        return full, pool

    def column(self, key: str, default: Any) -> list[Any]:
        """Each entry's value for `key` (`default` where it has none), in order."""
        full, pool = self._slots(key, default)
        return list(map(pool.__getitem__, full.tolist()))

    def _classes(self, key: str, default: Any, same: Any
                 ) -> tuple[np.ndarray, np.ndarray, list[Any]]:
        """(each entry's class, each class's first entry, one value per class), the
        classes numbered in order of first appearance: entries are of one class where
        `same(value)` is."""
        full, pool = self._slots(key, default)
        used = np.flatnonzero(np.bincount(full, minlength=len(pool)))
        ids: dict[Any, int] = {}
        of_slot = np.zeros(len(pool), np.int64)
        for slot in used.tolist():
            of_slot[slot] = ids.setdefault(same(pool[slot]), len(ids))
        cls = of_slot[full]
        first = _first_places(cls, len(ids))
        order = np.argsort(first, kind="stable")
        rank = np.empty(len(order), np.int64)
        rank[order] = np.arange(len(order))
        first = first[order]
        return rank[cls], first, [pool[full[p]] for p in first.tolist()]

    def distinct(self, key: str, default: Any) -> tuple[list[Any], np.ndarray]:
        """(the distinct values of `key` in order of first appearance, each entry's index
        among them): what `dict.fromkeys` and a lookup make of the column."""
        codes, _, table = self._classes(key, default, lambda x: x)
        return table, codes

    def first_places(self, key: str) -> tuple[np.ndarray, list[int], list[Any]]:
        """(each entry's key: the place of the first entry holding the very object it holds
        for `key`, those places, those objects)."""
        cls, first, objects = self._classes(key, None, id)
        return first[cls], first.tolist(), objects

    def column_of(self, name: str, others_column: Any) -> Any:
        """A number column as the child makes it (`others_column(entries, n, name)` for the
        entries the unpickler made): an int64 array, or None where a value is not a plain
        number (a reference, in a file no one writes that way)."""
        from array import array

        kind, value = self._pairs(NAMES.index(name))
        if (kind == REF).any():
            return None
        nullable = name in ("time_us", "device_free")
        empty = NULL if nullable else 0
        if nullable and (value[kind == INT] == NULL).any():
            return None  # the value NULL itself in the file: as the child judges it
        full = np.empty(self.n, np.int64)
        full[self.run_at] = np.where(kind == INT, value, empty)
        if self.others:
            got = others_column(self.others, len(self.others), name)
            if got is None:
                return None
            full[self.other_at] = np.frombuffer(got, np.int64)
        out = array("q")
        out.frombytes(full.data.cast("B"))
        return out


def _first_places(cls: np.ndarray, count: int) -> np.ndarray:
    """Where each of `count` classes (0..count-1, each present in `cls`) first appears,
    `CHUNK` places at a time: only a class not yet seen is searched for, in its chunk."""
    first = np.full(count, -1, np.int64)
    seen = np.zeros(count, bool)
    left = count
    for lo in range(0, len(cls), CHUNK):
        part = cls[lo:lo + CHUNK]
        new = np.flatnonzero(~seen[part])
        if len(new):
            # the first place of each class new in this chunk
            values, at = np.unique(part[new], return_index=True)
            first[values] = lo + new[at]
            seen[values] = True
            left -= len(values)
            if not left:
                break
    return first


def scan(source: Source, limit: int, min_entries: int) -> Plan | None:
    """A plan to decode the snapshot pickle `source` holds (at most `limit` bytes) with its
    trace entries read here, or None where this reader does not take the file or it holds
    fewer than `min_entries` entries it could read (decode it whole)."""
    try:
        return _scan(*_unframed(source, limit), min_entries)
    except _Unknown:
        return None


def _scan(data: bytearray, bounds: list[int], min_entries: int) -> Plan | None:
    entries = _Entries(data)
    least = max(min_entries, 1)
    if int((entries.end >= 0).sum()) < least:
        return None
    walker = _Walker(data, entries, bounds)
    if walker.stop < 0 or not walker.runs:
        return None
    names = _key_names(walker)
    runs = _Runs(walker, entries)
    taken = runs.traces(names)
    if int(runs.size[taken].sum()) < least:
        return None
    refs = runs.references(taken, walker)
    if refs is None:
        return None
    nonce = os.urandom(16)
    pieces: list[bytes | memoryview] = [b"\x80\x04"]
    view = memoryview(data)
    at = 2
    kept: list[np.ndarray] = []
    for k, r in enumerate(np.flatnonzero(taken)):
        run = walker.runs[r]
        pieces.append(view[at:run.begin])
        count = int(runs.size[r])
        # a slot per entry's dict (None: the memo numbers after stay the file's), then the
        # marker and a copy of it (DUP) per entry after the first: as many stack items as
        # entries, so an opcode that takes a number of them fails or succeeds as on the file
        pieces.append(b"N" + b"\x94" * count + b"0C\x14" + nonce + k.to_bytes(4, "little")
                      + b"2" * (count - 1))
        kept.append(runs.members[runs.first[r]:runs.first[r] + count])
        at = run.end
    pieces.append(view[at:walker.stop])
    pieces.append(b"(" + b"".join(b"j" + int(r).to_bytes(4, "little") for r in refs)
                  + b"t\x86.")
    return Plan(b"".join(pieces), nonce, kept, entries, names, refs)


def _key_names(walker: _Walker) -> np.ndarray:
    """Per memo index, the code of the key name memoized there (`NAMES`, `OTHER`), -1 where
    no string is."""
    names = np.full(walker.memo + 1, -1, np.int8)
    for at, text in walker.strings.items():
        names[at] = NAMES.index(text) if text in NAMES else OTHER
    return names


class _Runs:
    """The walk's runs side by side: every run's entries (`members`, indices in `_Entries`,
    run after run), per run its first member's place in `members`, its size and the memo
    index of its first dict, and per entry in `_Entries` its run (`run_of`, -1: none)."""

    def __init__(self, walker: _Walker, entries: _Entries) -> None:
        self.entries = entries
        parts = [walker.index[r.members()] for r in walker.runs]
        self.size = np.array([len(p) for p in parts], np.int64)
        self.first = np.concatenate([[0], np.cumsum(self.size)[:-1]]).astype(np.int64)
        self.members = np.concatenate(parts)
        self.memo = np.array([r.memo for r in walker.runs], np.int64)
        self.run_of = np.full(len(entries.start), -1, np.int64)
        self.run_of[self.members] = np.repeat(np.arange(len(parts)), self.size)

    def traces(self, names: np.ndarray) -> np.ndarray:
        """Per run, whether every entry in it is a trace entry this reader takes: each key
        a string memoized before the run, one of them "action"."""
        e, run = self.entries, self.run_of
        member = run >= 0
        base = np.where(member, self.memo[np.maximum(run, 0)], 0)
        fine = np.ones(len(run), bool)
        action = np.zeros(len(run), bool)
        for keys, kinds in zip(e.keys, e.kinds, strict=True):
            present = kinds != MISSING
            fine &= ~(present & (keys >= base))
            code = names[np.where(present & fine, keys, 0)]
            fine &= ~(present & (code < 0))
            action |= present & (code == 0)
        bad = ~(fine & action)[member]
        return np.bincount(run[member], weights=bad, minlength=len(self.size)) == 0

    def references(self, taken: np.ndarray, walker: _Walker) -> np.ndarray | None:
        """The memo indices the taken runs' values reference (sorted, distinct), or None
        where a reference would differ once their dicts are no longer made: any reference
        (the walk's, or a run's, taken or not) to a taken run's slots, or a value of a
        taken run referencing a slot not filled before the run."""
        e, run = self.entries, self.run_of
        member = run >= 0
        mine = member & taken[np.maximum(run, 0)]
        base = np.where(member, self.memo[np.maximum(run, 0)], 0)
        # the taken runs' memo slots, as a bool per memo index
        edge = np.zeros(walker.memo + 2, np.int64)
        np.add.at(edge, self.memo[taken], 1)
        np.add.at(edge, self.memo[taken] + self.size[taken], -1)
        gone = np.cumsum(edge)[:-1] > 0
        if gone[np.minimum(np.asarray(walker.refs, np.int64), walker.memo)].any():
            return None
        seen = np.zeros(walker.memo + 1, bool)
        others = member & ~mine
        for keys, kinds, values in zip(e.keys, e.kinds, e.values, strict=True):
            if others.any() and gone[np.minimum(keys[others & (kinds != MISSING)],
                                                 walker.memo)].any():
                return None  # (a taken run's keys are strings, checked by `traces`)
            is_ref = member & (kinds == REF)
            refs = values[is_ref]
            if gone[np.minimum(refs, walker.memo)].any():
                return None
            if (mine[is_ref] & (refs >= base[is_ref])).any():
                return None
            seen[refs[mine[is_ref]]] = True
        return np.flatnonzero(seen)
