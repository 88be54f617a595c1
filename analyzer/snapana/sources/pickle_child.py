"""The bounded child that decodes a snapshot pickle, and starting it early.

A snapshot pickle is decoded in a child process (`CHILD`: the restricted unpickler, under a
time limit and a memory limit proportional to the file; see `torch_snapshot`), which hands
the traces back as flat columns; from `SCAN_ENTRIES` entries on, it reads the trace entries
from the file's bytes with numpy (`pickle_scan`) and has the unpickler decode only the rest.
This module holds that child and starts it; it imports nothing heavy (no polars, no numpy),
so the command line can start decoding the one file it was given before it imports the
pipeline (`start_early`), and the decode runs while the parent imports. `torch_snapshot`
then takes the child already running for the same file, mode and limits (`take`), or starts
one. A child no one takes is ended when the process exits.
"""

from __future__ import annotations

import atexit
import mmap
import os
import selectors
import subprocess
import sys
import threading
import time
import zlib
from pathlib import Path

from snapana.children import DIE_WITH_PARENT, child_env
from snapana.limits import decode_memory, decode_seconds
from snapana.sources._io import GZIP_MAGIC, decompressed_limit

#: From how many trace entries on the child makes the traces' numbers (addresses, sizes,
#: streams, times) in a process it forks while it makes the rest (`CHILD_COLUMNS`, `split`):
#: below that, the fork and its copied pages cost more than the half it saves.
#: SNAPANA_SPLIT_ENTRIES sets it (0: always, as the fuzzer can; a number past every trace:
#: never, where the pages the two processes copy matter more than the time).
SPLIT_ENTRIES = 100_000


def _entries_from_env(var: str, default: int) -> int:
    """The environment variable `var` where it is a whole number, else `default`."""
    raw = os.environ.get(var, "").strip()
    try:
        return int(raw) if raw.isascii() and raw.isdigit() else default
    except ValueError:  # more digits than int() takes
        return default


def split_entries() -> int:
    """SNAPANA_SPLIT_ENTRIES where it is a whole number, else SPLIT_ENTRIES."""
    return _entries_from_env("SNAPANA_SPLIT_ENTRIES", SPLIT_ENTRIES)


#: From how many trace entries on the child reads a file's entries from its bytes
#: (`pickle_scan`) rather than having the unpickler make a dict of each: below that, the
#: numpy it imports for that costs more than the dicts. SNAPANA_SCAN_ENTRIES sets it (0:
#: always, as the fuzzer can; a number past every trace: never).
SCAN_ENTRIES = 100_000


def scan_entries() -> int:
    """SNAPANA_SCAN_ENTRIES where it is a whole number, else SCAN_ENTRIES."""
    return _entries_from_env("SNAPANA_SCAN_ENTRIES", SCAN_ENTRIES)


def _scan_env() -> dict[str, str]:
    """What the child needs to read entries from the bytes: `pickle_scan`'s file, the
    directory numpy is imported from and from how many entries on (its `-I -S` leaves
    site-packages out), with numpy's math libraries on one thread; empty where numpy is
    not found."""
    import importlib.util

    try:
        spec = importlib.util.find_spec("numpy")
    except (ImportError, ValueError):
        return {}
    places = list(spec.submodule_search_locations or []) if spec is not None else []
    if not places:
        return {}
    return {"SNAPANA_CHILD_SCAN": str(Path(__file__).with_name("pickle_scan.py")),
            "SNAPANA_CHILD_NUMPY": os.path.dirname(places[0]),
            "SNAPANA_CHILD_SCAN_MIN": str(scan_entries()),
            "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}

#: Appended to `CHILD` when the parent asks for columns (argv[7] == "columns"): each device
#: trace that holds only plain entries (dicts of ints, strings, frame lists) becomes flat
#: integer buffers (their array typecodes in the reply's `kinds`), built by C-level passes
#: (map over itemgetter, array from a list), so the parent never decodes the trace itself.
#: The rest of the snapshot (segments, blocks, metadata) and, per trace, its distinct action
#: strings and its stacks (the first frame list of each sequence of frame objects, with the
#: key the stack column names it by: PyTorch writes a new list per entry, of shared frame
#: dicts, so a million entries hold a few hundred stacks) travel as a builtins-only pickle
#: the parent reads with the restricted unpickler. Anything else (a float time, a bool, a
#: value past int64, a non-dict entry) and the reply is `plain: false`: the parent then
#: decodes and validates in-process, naming the offending entry. The payload holds every
#: trace's addresses, sizes and times (int64), then every trace's actions, streams,
#: device_free and stack keys, then that pickle; the reply lists the buffers' lengths,
#: typecodes and names in that order. From argv[8] entries on, a forked process makes the
#: addresses, sizes and times into the payload file (argv[9]) while the child makes the
#: rest. A trace `scanned` read from the bytes (a `pickle_scan.ScannedTrace`) gives the same
#: columns from its arrays (the reply says `scanned: true`), and is never forked over.
CHILD_COLUMNS = r"""
from array import array
from collections import deque
from itertools import compress, count, repeat
from operator import eq, getitem, itemgetter, ne, not_
NONE = type(None)
NULL = -(1 << 63)  # marks None in time_us / device_free: outside both columns' valid ranges
def holds(a, values):
    # whether one of `values` is an element of the int64 array `a`: its 8 bytes found at a
    # multiple of 8 (a C search, where array.count would make a Python int per element);
    # after many misaligned finds, True (the caller then checks element by element)
    raw, tries = a.tobytes(), 0
    for v in values:
        pat = v.to_bytes(8, sys.byteorder, signed=True)
        at = raw.find(pat)
        while at >= 0:
            if at % 8 == 0 or tries > 64:
                return True
            tries += 1
            at = raw.find(pat, at + 1)
    return False
def column(trace, key, default):
    # each entry's value: one C pass when all have the key; else a missing key reads as
    # `default`
    if type(trace) is SCANNED:
        return trace.column(key, default)
    try:
        return list(map(itemgetter(key), trace))
    except KeyError:
        n = len(trace)
        return list(map(dict.get, trace, repeat(key, n), repeat(default, n)))
def places_apart(sub):
    # three places in a frame list, as 64ths of its length, where the distinct stacks among
    # the first lists of `sub` differ most often (chosen one after the other, each telling
    # apart the most of them with those before it): stacks share most frames (the
    # allocator's innermost, the entry point's outermost, the model's between) and differ
    # where the allocating op and layer are, which no fixed place finds in every program
    seen = {}
    for lst in sub[:SAMPLE]:
        seen.setdefault(tuple(map(id, lst)), lst)
        if len(seen) >= 256:
            break
    stacks = list(seen.values())
    # each place's frame (its id) in every stack, read once: a column per place
    at = [tuple(id(lst[(len(lst) * f) >> 6]) for lst in stacks) for f in range(64)]
    chosen = [tuple(map(len, stacks))]
    places = []
    for _ in range(3):
        f = max(range(64), key=lambda f: len(set(zip(*chosen, at[f]))))
        places.append(f)
        chosen.append(at[f])
    return places
def rounds(sub):
    # (matched, to): for each list of `sub` (non-empty lists) found equal to an earlier one,
    # its index and that of the first equal list. In rounds of C-level passes, each list not
    # yet matched is compared (==: frame by frame, identity first) with the first unmatched
    # list of its kind (the hash of its length and of the frames, those very objects, at the
    # `places_apart`). Rounds stop when one matches under a sixteenth of the lists left; a
    # list left unmatched stays apart (the parent interns it as well). Indices are int64
    # arrays: a million lists are a million Python ints otherwise
    size = list(map(len, sub))
    longest = max(size, default=0)
    kinds = array("q", map(hash, zip(size, *(
        map(id, map(getitem, sub, map([(k * f) >> 6 for k in range(longest + 1)].__getitem__,
                                      size)))
        for f in places_apart(sub)))))
    del size
    matched, to = array("q"), array("q")
    left = array("q", range(len(sub)))
    while left:
        firsts = {}
        rep = array("q", map(firsts.setdefault, map(kinds.__getitem__, left), left))
        same = bytes(map(eq, map(sub.__getitem__, left), map(sub.__getitem__, rep)))
        matched.extend(compress(left, same))
        to.extend(compress(rep, same))
        found = same.count(1) - len(firsts)  # each first list matches itself
        left = array("q", compress(left, map(not_, same)))
        del rep, same
        if found * 16 < len(left):
            break
    return matched, to  # (the first list of each kind among them, matching itself)
def equal_earlier(lists, places):
    # {place: place of the first equal list} for each list equal to an earlier one (`lists`
    # in order, at `places`), empty lists included
    full = array("q", compress(range(len(lists)), lists))  # the non-empty lists
    matched, to = rounds(list(map(lists.__getitem__, full)))
    moved = bytes(map(ne, matched, to))  # a first list matched itself: not a match
    matched, to = compress(matched, moved), compress(to, moved)
    at = places.__getitem__
    merged = dict(zip(map(at, map(full.__getitem__, matched)),
                      map(at, map(full.__getitem__, to))))
    empty = [p for lst, p in zip(lists, places) if lst == []]
    merged.update(zip(empty[1:], repeat(empty[0]) if empty else ()))
    return merged
def first_equal(lists):
    # each list's representative, as an int64 array: the position of the first list equal to
    # it (a None, the first None's)
    n = len(lists)
    rep = array("q", range(n))
    put = rep.__setitem__
    full = array("q", compress(range(n), lists))  # the non-empty lists
    if len(full) == n:  # (as PyTorch writes them): no position to map
        matched, to = rounds(lists)
    else:
        falsy = list(compress(range(n), map(not_, lists)))
        for same in ([p for p in falsy if lists[p] is None],
                     [p for p in falsy if lists[p] is not None]):  # None, and []
            if same:
                deque(map(put, same, repeat(same[0])), 0)
        matched, to = rounds(list(map(lists.__getitem__, full)))
        matched, to = map(full.__getitem__, matched), map(full.__getitem__, to)
    deque(map(put, matched, to), 0)
    return rep
def column_of(trace, n, name):
    # one number column of a trace by name, as an int64 array; None when not plain (None
    # is kept, as NULL, in time_us only)
    if type(trace) is SCANNED:
        return trace.column_of(name, column_of)
    if name == "device_free":
        return device_free(trace, n)
    nullable = name == "time_us"
    v = column(trace, name, None)  # a missing key reads as None
    try:  # array() refuses None, a float, a string, past int64; reads a bool as 0/1
        a = array("q", v)
    except TypeError:
        a = None
    if a is None or holds(a, (0, 1, NULL) if nullable else (0, 1)):
        # None, a key missing, or a 0/1 that may be a bool or NULL: judged one by one
        kinds = set(map(type, v))
        if not kinds <= {int, NONE}:
            return None
        if nullable and v.count(NULL):
            return None  # the value NULL itself in the file: let the parent judge it
        if NONE in kinds:  # else `a` is right as built (a stream of 0s, say)
            a = array("q", [(NULL if nullable else 0) if x is None else x for x in v])
    return a
def device_free(trace, n):
    # only OOM entries carry it; the others are filled in C, not read
    free = array("q", [NULL]) * n
    for i in compress(range(n), map(dict.__contains__, trace, repeat("device_free", n))):
        x = trace[i]["device_free"]
        if x is not None:
            if type(x) is not int or x == NULL:
                return None  # not an int, or NULL itself: let the parent judge it
            free[i] = x
    return free
def write_numbers(traces, names, fd, at):
    # each trace's `names` columns written to `fd` from offset `at` on, in a row; False
    # when one is not plain
    for trace in traces:
        for name in names:
            b = column_of(trace, len(trace), name)
            if b is None:
                return False
            view = memoryview(b).cast("B")
            while view:
                k = os.pwrite(fd, view, at)
                view, at = view[k:], at + k
    return True
def split(traces, names):
    # the traces' `names` columns made in a forked process (the decoded objects shared,
    # copy on write) while this one makes the rest: the two cores take half each. (Its pid,
    # the pipe it says it is done on) (in `helpers`, so that a trace found not plain stops
    # it), or None where no fork is possible or worth it
    if fd is None or not hasattr(os, "fork") or sum(map(len, traces)) < split_min:
        return None
    parent = os.getpid()
    try:
        done, says = os.pipe()
    except OSError:
        return None
    try:
        pid = os.fork()
    except OSError:
        os.close(done)
        os.close(says)
        return None
    if pid == 0:
        ok = False
        try:
            os.close(1)  # the parent reads stdout to its end: that is this child's, not ours
            os.close(2)
            os.close(done)
            try:
                signal.alarm(int(seconds + per_byte * size) + 1)
            except (NameError, AttributeError):
                pass
            try:  # ended with this child, if it is killed first (a timeout, Ctrl-C): Linux
                import ctypes
                ctypes.CDLL(None).prctl(1, 9)  # PR_SET_PDEATHSIG, SIGKILL
            except (ImportError, OSError, AttributeError):
                pass
            if os.getppid() == parent:  # (not already gone)
                ok = write_numbers(traces, names, fd, 0)
            if ok:  # its CPU seconds say it is done; closed here, not by the exit, which
                # frees the copied pages first
                os.write(says, repr(time.process_time()).encode())
                os.close(says)
        except BaseException:
            ok = False
        os._exit(0 if ok else 3)
    os.close(says)
    helper = (pid, done)
    helpers.append(helper)
    return helper
def joined(helper):
    # the forked process's CPU seconds when it wrote every number, else None: read from
    # its pipe, which it closes before the kernel frees what it copied (40 ms on a million
    # entries); it is reaped after this process has replied (`reap`)
    helpers.remove(helper)
    pid, done = helper
    said = []
    while True:
        got = os.read(done, 64)
        if not got:
            break
        said.append(got)
    os.close(done)
    try:
        cpu = float(b"".join(said).decode("ascii"))
    except (ValueError, UnicodeDecodeError):
        os.waitpid(pid, 0)  # it failed: this process replies and ends at once
        return None
    ended.append(pid)
    return cpu
def reap():
    # the forked processes that said they were done, once they have exited
    for pid in ended:
        try:
            os.waitpid(pid, 0)
        except OSError:
            pass
#: how many frame lists of a trace tell whether it holds a list per entry
SAMPLE = 4096
def list_per_entry(frames):
    # whether most of the first entries' frame lists are lists of their own (as PyTorch
    # writes them) rather than shared with others
    head = frames[:SAMPLE]
    return len(set(map(id, head))) * 2 > len(head)
def stacks(frames, n):
    # (each entry's stack key, the stacks, their keys): the key is where the first frame
    # list equal to the entry's appears; None when one is not a list. Shared lists (few
    # objects) are told apart by identity first, a list per entry entry by entry
    code = "i" if n < 1 << 31 else "q"
    if list_per_entry(frames):
        if not set(map(type, frames)) <= {list, NONE}:
            return None
        rep = first_equal(frames)
        places = list(compress(range(n), map(eq, rep, count())))
        return array(code, rep), [frames[p] for p in places], places
    # each entry's key is where its frame list (that very object) first appears, in one
    # pass (setdefault keeps the first position of an id)
    first = {}
    keys = array(code, map(first.setdefault, map(id, frames), count()))
    places = list(first.values())
    del first
    return merge_equal(keys, [frames[p] for p in places], places, code)
def merge_equal(keys, distinct, places, code):
    # `stacks` from each entry's key, the place of the first entry holding the very object
    # it holds (`places`, where `distinct` are)
    if not set(map(type, distinct)) <= {list, NONE}:
        return None
    # then where the first equal list appears: PyTorch writes a new list per captured
    # traceback (of shared frame dicts), so a real trace holds a list per entry or so
    # and a few hundred stacks; each stack goes to the parent once
    merged = equal_earlier(distinct, places)
    if merged:
        keys = array(code, map(merged.get, keys, keys))
        kept = [p not in merged for p in places]
        distinct, places = list(compress(distinct, kept)), list(compress(places, kept))
    return keys, distinct, places
def scanned_stacks(trace, n):
    # `stacks` of a trace read from the bytes: the first places by identity come from the
    # scan, in numpy; where most of the first lists are lists of their own (not how a read
    # entry holds its frames), as `stacks` does
    keys, places, distinct = trace.first_places("frames")
    if len(set(keys[:SAMPLE].tolist())) * 2 > min(n, SAMPLE):
        return stacks(trace.column("frames", None), n)
    code = "i" if n < 1 << 31 else "q"
    return merge_equal(array(code, keys.astype("i%d" % array(code).itemsize).tobytes()),
                       distinct, places, code)
def columns(data):
    # (payload, buffers, where the forked columns end, buffer lengths, typecodes and names
    # in the payload's order, forked columns per trace, the forked process's CPU seconds)
    # or None when not plain. The payload: every trace's forked columns (int64, n each),
    # then every trace's own (its actions and stack keys, and the other numbers), then the
    # rest as a pickle
    if type(data) is not dict:
        return None
    traces = data.get("device_traces")
    if traces is None:
        traces = []
    if type(traces) is not list:
        return None
    full = [t for t in traces if t]
    if not all(type(t) is list or type(t) is SCANNED for t in full):
        return None
    scanned = any(type(t) is SCANNED for t in full)
    # a forked process makes addresses, sizes and times, this one the rest; not where the
    # frame lists are one per entry: comparing them takes this one far longer than the
    # numbers take, and after a fork every page either process writes (a reference count)
    # costs a fault, which on a gigabyte of decoded lists costs more than the numbers
    forked, here = ["addr", "size", "time_us"], ["stream", "device_free"]
    region = 8 * len(forked) * sum(map(len, full))  # where the forked columns end
    head = full[0][:SAMPLE] if full and not scanned else []
    per_entry = bool(head) and set(map(type, head)) == {dict} and list_per_entry(
        column(head, "frames", None))
    helper = None if per_entry or scanned else split(full, forked)
    metas, own, own_names = [], [], []
    for trace in traces:
        if not trace:
            metas.append(None)
            continue
        if not (trace.plain() if type(trace) is SCANNED else set(map(type, trace)) == {dict}):
            return None
        n = len(trace)
        if type(trace) is SCANNED:
            table, codes = trace.distinct("action", "")
        else:
            acts = column(trace, "action", "")
            table = list(dict.fromkeys(acts))  # types checked on the distinct values only
        if not set(map(type, table)) <= {str, NONE}:
            return None
        # a byte per entry where the distinct actions fit (always, from PyTorch): bytes()
        # over a map costs half of array("i")
        small = len(table) <= 256
        if type(trace) is SCANNED:
            width = "B" if small else "i"
            own.append(array(width, codes.astype("u%d" % array(width).itemsize).tobytes()))
        else:
            code = dict(zip(table, range(len(table))))
            own.append(array("B", bytes(map(code.__getitem__, acts))) if small
                       else array("i", map(code.__getitem__, acts)))
            del acts
        table = ["" if a is None else a for a in table]
        for name in here:
            b = column_of(trace, n, name)
            if b is None:
                return None
            own.append(b)
        got = scanned_stacks(trace, n) if type(trace) is SCANNED else stacks(
            column(trace, "frames", None), n)
        if got is None:
            return None
        own.append(got[0])
        own_names += ["action", *here, "stack"]
        metas.append((n, table, got[1], got[2]))
        del got
    made, cpu_split = None, 0.0
    if helper is not None:
        cpu_split = joined(helper)
        if cpu_split is None:
            return None
    elif fd is not None:  # made here, after the rest
        if not write_numbers(full, forked, fd, 0):
            return None
    else:
        made = [column_of(t, len(t), name) for t in full for name in forked]
        if None in made:
            return None
    rest = dict(data)
    if "device_traces" in data:
        rest["device_traces"] = [[] if m else t for m, t in zip(metas, traces)]
    blob = pickle.dumps((rest, metas), protocol=4)
    lengths = [8 * len(t) for t in full for _ in forked]
    kinds = "q" * len(lengths) + "".join(b.typecode for b in own)
    names = [name for _ in full for name in forked] + own_names
    lengths += [len(b) * b.itemsize for b in own]
    if made is not None:
        own = made + own
    return blob, own, region, lengths, kinds, names, len(forked), cpu_split
# the payload goes to the file the parent passed (argv[9]), which it maps, and the reply
# comes after it on stdout (a whole reply line means a whole payload); with no file, the
# payload follows the reply on stdout
split_min = int(sys.argv[8])
fd = int(sys.argv[9]) if len(sys.argv) > 9 else None
helpers, ended = [], []
def columns_or_none(data):
    try:
        return columns(data)
    except (ValueError, TypeError, OverflowError, RecursionError, MemoryError, OSError):
        return None
got = columns_or_none(data)
if got is None and SCANNED is not None:
    # entries read from the bytes, not all plain: the parent would decode the file itself,
    # with no memory limit; so it is decoded whole here first, under this process's limit,
    # its peak judged as without the scan (and its columns made, where they are plain)
    SCANNED = data = None
    forget_scan()
    try:
        data = decode_whole()
    except MemoryError:
        reply(error="memory")
    except BaseException as exc:
        reply(error="decode", detail=type(exc).__name__)
    peak = own_peak()
    got = columns_or_none(data)
for pid, _ in helpers:  # a trace not plain: its numbers are not needed
    os.kill(pid, 9)
    os.waitpid(pid, 0)
if got is None:
    reply(ok=True, size=size, peak=peak, plain=False, cpu_decode=cpu_decode,
          scanned=SCANNED is not None, tried=TRIED)
# `data` stays: os._exit frees it
blob, bufs, region, lengths, kinds, names, forked, cpu_split = got
head = json.dumps(dict(ok=True, size=size, peak=peak, plain=True, rest=len(blob),
                       cpu_decode=cpu_decode, cpu_columns=time.process_time() - cpu_decode,
                       scanned=SCANNED is not None, tried=TRIED,
                       cpu_split=cpu_split, bufs=lengths, kinds=kinds, names=names,
                       forked=forked))
try:  # the work is done: writing waits on the parent reading, which its own timeout bounds
    signal.alarm(0)
except (NameError, AttributeError):
    pass
line = head.encode() + b"\n"
if fd is not None:
    out = open(fd, "wb")
    out.seek(region)  # the numbers are there already
else:
    out = sys.stdout.buffer
    out.write(line)
try:
    for b in bufs:
        out.write(memoryview(b).cast("B"))
    out.write(blob)
    out.flush()
except OSError as exc:
    if fd is None:  # stdout: the parent is gone
        raise
    # the temporary file cannot take the payload (a full disk, a file-size limit): the
    # decode itself passed its limits, so the parent decodes in-process
    reply(ok=True, size=size, peak=peak, plain=False, cpu_decode=cpu_decode,
          scanned=SCANNED is not None, tried=TRIED, unwritten=exc.strerror or str(exc))
if fd is not None:
    sys.stdout.buffer.write(line)
    sys.stdout.buffer.flush()
# its output ends here: the parent takes it now, not after the kernel frees this process's
# memory (0.3 s for the 2 GB a 5M-entry trace decodes to), which happens before an exit
# closes these
if SERVED is not None:
    reap()
    raise SERVED()
os.close(1)
os.close(2)
reap()
os._exit(0)
"""

#: Run by `start` as `python -I -S -c CHILD PATH LIMIT MEM_BASE MEM_FACTOR SECONDS
#: SECONDS_PER_BYTE MODE SPLIT_ENTRIES [PAYLOAD_FD]`: counts the decompressed bytes
#: (bounded), sets its memory limit and an alarm from that size, decodes with the same
#: restricted unpickler and writes one JSON line. SIGALRM's default action ends the process
#: even inside a C loop.
CHILD = r"""
import gc, gzip, io, json, os, pickle, sys, time, zlib
gc.disable()  # millions of dicts and no cycles: collecting would cost more than decoding
path = sys.argv[1]
limit, base, factor = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
seconds, per_byte = float(sys.argv[5]), float(sys.argv[6])
# set by `SERVER`, where this file is one of many a long-lived process decodes: the reply
# ends this file's run (raised), not the process
SERVED = globals().get("SERVED")
def reply(**kw):
    sys.stdout.write(json.dumps(kw) + "\n")
    sys.stdout.flush()
    if SERVED is not None:
        raise SERVED()
    os._exit(0)
class Refused(Exception):
    pass
class Restricted(pickle.Unpickler):
    def find_class(self, module, name):
        raise Refused(module + "." + name)
    def persistent_load(self, pid):
        raise Refused("persistent id")
class TooBig(Exception):
    pass
SCANNED = None  # the type of a trace `scanned` read from the bytes
NUMPY_RSS = 0  # what importing numpy for the scan made resident, left out of the peak
BEFORE_SCAN = 0  # this process's resident bytes before that
def forget_scan():
    # once the scan's objects are freed: what stays resident of it left out of the peak,
    # which restarts now, so a file decoded whole after it is judged as without it
    global NUMPY_RSS
    NUMPY_RSS = max(own_memory()[1] - BEFORE_SCAN, 0)
    reset_peak()
def own_status():
    # this process's memory figures in bytes, by name (VmSize, VmRSS, VmHWM, ...): its own
    # (ru_maxrss would include the parent's, from before exec)
    got = {}
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("Vm"):
                    got[line.split(":")[0]] = int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return got
def own_memory():
    # (virtual, resident) bytes of this process now
    got = own_status()
    return got.get("VmSize", 0), got.get("VmRSS", 0)
def room(more):
    # the memory limit raised by `more` bytes (within the hard limit set with it)
    try:
        import resource
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        if soft != resource.RLIM_INFINITY:
            resource.setrlimit(resource.RLIMIT_AS, (min(soft + more, hard), hard))
    except (ImportError, ValueError, OSError):
        pass
def reset_peak():
    # the peak resident memory (VmHWM) reset to now, where Linux allows it
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
    except OSError:
        pass
TRIED = False  # whether `scanned` read the file (its sample held entries to read)
# a value's opcode -> its length (LONG1: before its bytes), as `pickle_scan` reads them
VALUE_LEN = {0x4B: 2, 0x4D: 3, 0x4A: 5, 0x8A: 2, 0x4E: 1, 0x68: 2, 0x6A: 5}
def entries_ahead(least):
    # whether 16 windows of 16 KB spread over the file (in the middle of each sixteenth,
    # past the segments that start it) hold entries `pickle_scan` reads (a dict of
    # referenced keys and plain values) densely enough for `least` in the whole file:
    # PyTorch's own layout (a new frame list per entry) holds none, and is then decoded
    # whole without numpy's import and the file read twice
    found, width = 0, 1 << 14
    with open(path, "rb") as f:
        for k in range(16):
            f.seek(size * (2 * k + 1) // 32)
            raw = f.read(width) + bytes(32)
            at = raw.find(b"}\x94(")
            while 0 <= at < width:
                end, pairs = at + 3, 0
                while raw[end] in (0x68, 0x6A) and pairs < 16:
                    end += 2 if raw[end] == 0x68 else 5
                    n = VALUE_LEN.get(raw[end], 0)
                    if raw[end] == 0x8A:
                        n = 2 + raw[end + 1] if raw[end + 1] <= 8 else 0
                    if not n:
                        break
                    end, pairs = end + n, pairs + 1
                found += raw[end] == 0x75  # SETITEMS: an entry read to its end
                at = raw.find(b"}\x94(", at + 3)
    return found * size >= least * 16 * width
def scanned():
    # the snapshot with its large traces' entries read from the file's bytes by
    # `pickle_scan` (SNAPANA_CHILD_SCAN: its file, with numpy's directory and from how many
    # entries on) and the rest decoded; None where that reader does not take the file (it
    # is then decoded whole)
    global SCANNED, TRIED, NUMPY_RSS, BEFORE_SCAN
    try:
        where, numpy_dir, least = (os.environ[k] for k in (
            "SNAPANA_CHILD_SCAN", "SNAPANA_CHILD_NUMPY", "SNAPANA_CHILD_SCAN_MIN"))
        least = int(least)
        if size < 16 * least or (least and not entries_ahead(least)):
            return None
        with open(path, "rb") as f:
            head = f.read(3)
        if head not in (b"\x80\x04\x95", b"\x80\x05\x95"):
            return None  # not framed as the scan takes: numpy is not even imported
        TRIED = True
        vm, BEFORE_SCAN = own_memory()
        sys.path.append(numpy_dir)
        import importlib.util
        spec = importlib.util.spec_from_file_location("snapana_pickle_scan", where)
        scan = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(scan)
        # numpy stays once imported: the memory limit and the peak leave it out, so a
        # file the scan does not take is decoded within the same room as without it
        vm_now, rss_now = own_memory()
        NUMPY_RSS = max(rss_now - BEFORE_SCAN, 0)
        room(max(vm_now - vm, 0))
        with open(path, "rb") as f:
            plan = scan.scan(f, limit, least)
        got = None if plan is None else plan.traces(
            Restricted(io.BytesIO(plan.stream)).load())
        del plan
    except Exception:  # anything: the whole file is decoded as before, and judged
        got = None
    if got is None:
        forget_scan()
        return None
    data, traces = got
    data["device_traces"] = traces
    SCANNED = scan.ScannedTrace
    return data
class Bounded(io.RawIOBase):
    def __init__(self, f):
        self.f, self.n = f, 0
    def readable(self):
        return True
    def readinto(self, b):
        k = self.f.readinto(b)
        self.n += k
        if self.n > limit:
            raise TooBig()
        return k
def stream():
    f = open(path, "rb")
    gz = f.read(2) == b"\x1f\x8b"
    f.seek(0)
    return Bounded(gzip.GzipFile(fileobj=f) if gz else f), gz
def decode_whole():
    src, _ = stream()
    return Restricted(io.BufferedReader(src, 1 << 20)).load()
try:
    src, gz = stream()
    if gz:
        buf = bytearray(1 << 20)
        try:
            while src.readinto(buf):
                pass
        except (EOFError, OSError, zlib.error):
            # truncated or corrupt: decoded below as far as it goes, under the same limits
            # (the parent's decode, which has none, must never get further than this one)
            pass
        size = src.n
    else:
        size = os.fstat(src.f.fileno()).st_size
    try:
        import resource
        cap = base + factor * size
        # (a hard limit above it, for `room`: what importing numpy for the scan takes; a
        # served file leaves the hard limit as it is, for the next file's own)
        hard = cap + (1 << 29) if SERVED is None else resource.getrlimit(
            resource.RLIMIT_AS)[1]
        if hard != resource.RLIM_INFINITY:
            cap = min(cap, hard)
        resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    except (ImportError, ValueError, OSError):
        pass
    try:
        import signal
        signal.alarm(int(seconds + per_byte * size) + 1)
    except (ImportError, AttributeError):
        pass
    data = scanned() if sys.argv[7] == "columns" and not gz else None
    if data is None:
        data = decode_whole()
except MemoryError:
    reply(error="memory")
except TooBig:
    reply(error="limit")
except BaseException as exc:
    reply(error="decode", detail=type(exc).__name__)
cpu_decode = time.process_time()
def own_peak():
    # this process's peak resident bytes, numpy's import for the scan left out
    return max(own_status().get("VmHWM", 0) - NUMPY_RSS, 0)
peak = own_peak()
if sys.argv[7] != "columns":
    reply(ok=True, size=size, peak=peak)
try:  # making columns is linear work: it gets a time limit of its own, as long again
    signal.alarm(int(seconds + per_byte * size) + 1)
except (NameError, AttributeError):
    pass
""" + CHILD_COLUMNS


class Child:
    """A running decode child: its process, the limit of decompressed bytes it was given,
    the timeout its parent waits for it with and, in columns mode, the anonymous file it
    writes its payload to (`payload_file`), which `wait` maps as `payload` and closes."""

    def __init__(self, proc: subprocess.Popen[bytes], limit: int, timeout: float,
                 fd: int | None = None) -> None:
        self.proc, self.limit, self.timeout, self.fd = proc, limit, timeout, fd
        self.to_file = fd is not None
        self.payload: mmap.mmap | None = None

    def wait(self) -> tuple[int, bytes]:
        """(exit status, stdout); TimeoutExpired (the child killed) past the timeout. A
        child with a payload file that closed its output after a whole reply line (written
        after the payload), and is still exiting, counts as exited 0: what it wrote is
        complete; its exit is reaped later. When the child had a payload file and wrote to
        it, `payload` is that file, mapped (the map holds its own descriptor until the
        columns made from it are dropped)."""
        try:
            if os.name != "posix":
                out, _ = self.proc.communicate(timeout=self.timeout)
                status = self.proc.returncode
            else:
                deadline = time.monotonic() + self.timeout
                out = self._read_to_end(deadline)
                status = self.proc.poll()
                if status is None and not (self.to_file and out.endswith(b"\n")):
                    status = self.proc.wait(max(deadline - time.monotonic(), 0.0))
        except subprocess.TimeoutExpired:
            self.kill()
            raise
        if self.fd is not None:
            try:
                size = os.fstat(self.fd).st_size
                self.payload = _map(self.fd, size) if size else None
            except (OSError, ValueError):
                self.payload = None  # the caller finds the payload missing: decodes itself
            finally:
                self._close()
        if status is None:  # reaped when its exit comes, off this thread
            threading.Thread(target=self.proc.wait, daemon=True).start()
            status = 0
        return status, out

    def _read_to_end(self, deadline: float) -> bytes:
        """The child's stdout and stderr read until both end (stderr's bytes dropped: read
        only so the child never blocks on it), by `deadline`; then both are closed."""
        pipes = [f for f in (self.proc.stdout, self.proc.stderr) if f is not None]
        chunks: list[bytes] = []
        with selectors.DefaultSelector() as sel:
            for f in pipes:
                sel.register(f, selectors.EVENT_READ)
            while sel.get_map():
                left = deadline - time.monotonic()
                if left <= 0:
                    raise subprocess.TimeoutExpired(self.proc.args, self.timeout)
                for key, _ in sel.select(left):
                    data = os.read(key.fd, 1 << 16)
                    if not data:
                        sel.unregister(key.fileobj)
                    elif key.fileobj is self.proc.stdout:
                        chunks.append(data)
        for f in pipes:
            f.close()
        return b"".join(chunks)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        try:
            self.proc.communicate(timeout=30)
        except (subprocess.TimeoutExpired, ValueError, OSError):
            pass
        self._close()

    def _close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def _map(fd: int, size: int) -> mmap.mmap:
    """The payload file mapped read-only, its pages mapped in one call where the system can
    (MAP_POPULATE): the parent reads all of it, and a page fault per 4 KB page costs 4 µs on
    some machines (40 ms for a million entries' columns)."""
    populate = getattr(mmap, "MAP_POPULATE", 0)
    if populate and hasattr(mmap, "MAP_SHARED") and hasattr(mmap, "PROT_READ"):
        try:
            return mmap.mmap(fd, size, flags=mmap.MAP_SHARED | populate, prot=mmap.PROT_READ)
        except OSError:
            pass
    return mmap.mmap(fd, size, access=mmap.ACCESS_READ)


def payload_file() -> int | None:
    """A file descriptor of an anonymous file for the child's columns, or None where none
    can be made and passed (then they come on its stdout). The parent maps what the child
    wrote there, where a pipe costs 3.5 ms per MB here and even reading the file 1 ms
    (a million entries are 45 MB of columns)."""
    if os.name != "posix":
        return None
    try:
        if hasattr(os, "memfd_create"):
            return os.memfd_create("snapana-columns", os.MFD_CLOEXEC)
        import tempfile

        with tempfile.TemporaryFile() as f:  # already unlinked: no name to clean up
            return os.dup(f.fileno())
    except OSError:
        return None


def plan(path: Path, size: int, compressed: bool, columns: bool
         ) -> tuple[list[str], int, float]:
    """What decoding `path` (`size` bytes on disk) is given: the child's arguments (its file,
    the limit of decompressed bytes, its memory and time limits, its mode), that limit, and
    how long its parent waits for it."""
    limit = decompressed_limit(size)[0] if compressed else size
    base = decode_memory(0)
    factor = decode_memory(1) - base
    seconds = decode_seconds(0)
    per_byte = decode_seconds(1 << 20) - seconds
    args = [str(path), str(limit), str(base), str(factor), repr(seconds),
            repr(per_byte / (1 << 20)), "columns" if columns else "check"]
    budget = seconds + per_byte / (1 << 20) * limit
    return args, limit, budget * (2 if columns else 1) + 30 + limit / (20 << 20)


def start(path: Path, size: int, compressed: bool, columns: bool) -> Child:
    """Start the child on `path` (`size` bytes on disk); OSError when no process can be
    started here."""
    args, limit, timeout = plan(path, size, compressed, columns)
    cmd = [sys.executable, "-I", "-S", "-c", DIE_WITH_PARENT + CHILD, *args,
           str(split_entries())]
    env = child_env({k: v for k, v in os.environ.items()
                     if k in ("PATH", "SYSTEMROOT", "LANG")})
    if columns:
        env.update(_scan_env())
    fd = payload_file() if columns else None
    if fd is not None:
        cmd.append(str(fd))
    try:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, env=env,
                                pass_fds=() if fd is None else (fd,))
    except BaseException:
        if fd is not None:
            os.close(fd)
        raise
    note_started(proc.pid, "child")
    return Child(proc, limit, timeout, fd)


def note_started(pid: int, what: str) -> None:
    """Where SNAPANA_CHILD_LOG names a file, a line appended to it for each decode process
    started (its pid, and `child` for a one-file child or `pool` for a long-lived one): how
    tests and benchmarks count them across worker processes."""
    log = os.environ.get("SNAPANA_CHILD_LOG")
    if log:
        try:
            with open(log, "a", encoding="utf-8") as fh:
                fh.write(f"{pid} {what}\n")
        except OSError:
            pass


#: Children started early, by what identifies their file and mode.
_EARLY: dict[tuple[object, ...], Child] = {}


def _key(path: Path, st: os.stat_result, columns: bool) -> tuple[object, ...]:
    return (os.path.abspath(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, columns,
            os.environ.get("SNAPANA_DECODE_SECONDS"), os.environ.get("SNAPANA_DECODE_MEMORY"),
            os.environ.get("SNAPANA_MAX_RATIO"), os.environ.get("SNAPANA_MAX_DECOMPRESSED"),
            split_entries(), scan_entries())


def _looks_like_pickle(path: Path) -> tuple[os.stat_result, bool] | None:
    """(stat, gzip?) of a regular file that starts like a snapshot pickle (protocol 2-5,
    plain or gzip), else None. Opened non-blocking: never waits on a FIFO."""
    import stat

    try:
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode):
            return None
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        try:
            head = os.read(fd, 2)
            if head == GZIP_MAGIC:
                import gzip
                import io

                os.lseek(fd, 0, os.SEEK_SET)
                try:
                    with gzip.GzipFile(fileobj=io.BytesIO(os.read(fd, 1 << 16))) as gz:
                        inner = gz.read(2)
                except (OSError, EOFError, zlib.error):  # corrupt: the reader says so
                    return None
                return (st, True) if inner[:1] == b"\x80" and inner[1:2] in (
                    b"\x02", b"\x03", b"\x04", b"\x05") else None
        finally:
            os.close(fd)
    except OSError:
        return None
    ok = head[:1] == b"\x80" and head[1:2] in (b"\x02", b"\x03", b"\x04", b"\x05")
    return (st, False) if ok else None


def start_early(path: Path) -> None:
    """Start decoding `path` now, in columns, when it is a regular file that starts like a
    snapshot pickle; `take` hands the child to the reader. Anything odd: nothing started
    (the reader then checks the file and says what is wrong)."""
    found = _looks_like_pickle(path)
    if found is None:
        return
    st, compressed = found
    key = _key(path, st, True)
    if key in _EARLY:
        return
    try:
        _EARLY[key] = start(path, st.st_size, compressed, True)
    except OSError:
        return
    if len(_EARLY) == 1:
        atexit.register(_end_untaken)


def take(path: Path, st: os.stat_result, columns: bool) -> Child | None:
    """The child `start_early` started on this very file (same device, inode, size and
    modification time, same mode and limits), handed over once; else None."""
    if not _EARLY:
        return None
    return _EARLY.pop(_key(path, st, columns), None)


def _end_untaken() -> None:
    """A child started early but never taken (the command failed first): ended, not left
    running."""
    while _EARLY:
        _EARLY.popitem()[1].kill()
