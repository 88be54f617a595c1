"""The code the bounded decode child runs: count, limit and decode a snapshot pickle with the
restricted unpickler, and reply in one JSON line.

Text, not a module the child imports: `pickle_child.start` and `decode_pool` run it as
`python -I -S -c` (no site-packages, no snapana), so it may use the standard library only.
"""

from snapana.sources.child_columns import CHILD_COLUMNS

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
