"""The code the bounded decode child runs to hand a snapshot's traces back as flat columns.

Text, not a module the child imports: `child_decode.CHILD` appends it to the decode's code,
and the child runs both as `python -I -S -c` (no site-packages, no snapana), so it may use
the standard library only (numpy comes through `pickle_scan`, where the parent names it).
"""

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
