"""Every bound snapana puts on its inputs, in one place.

Inputs come from other machines and tickets: each source checks them against these limits at
its boundary, before anything recursive, quadratic or native runs on them. The limits that a
genuine file could plausibly exceed (decompressed size, JSON value size, decoding time and
memory) can be raised with an environment variable, which the error message names.

Snapshot bounds are derived from what PyTorch's writers put in a pickle (every version since
1.13): the Python path ``torch/csrc/cuda/Module.cpp`` ``THCPModule_memorySnapshot`` (what
``torch.cuda.memory._snapshot`` / ``_dump_snapshot`` pickle), the C++ path
``torch/csrc/cuda/memory_snapshot.cpp`` ``_memory_snapshot_pickled`` (int64 casts), the frame
symbolizer ``torch/csrc/profiler/python/combined_traceback.cpp`` ``py_symbolize`` and the
allocator's ``SegmentInfo`` / ``BlockInfo`` / ``TraceEntry`` in
``c10/cuda/CUDACachingAllocator.h``. A value a writer can produce is never refused: where it
carries no information (an unknown line number) it is normalised and the capture gets a
warning; only values no writer can produce, or that would make the analysis meaningless, are
refused.
"""

from __future__ import annotations

import os
import re

from snapana.units import MAX_BYTES as MAX_BYTES
from snapana.units import ascii_int, parse_bytes

#: MAX_BYTES (defined with the byte units, imported here: every input check reads it from
#: this module): the largest byte count or address accepted from an input (sizes, addresses,
#: totals). Keeps every sum of a few of them inside int64, the type of every byte column.
#: PyTorch writes sizes and addresses as ``size_t`` (Python path) or ``int64_t`` (C++ path),
#: but they are device virtual addresses and byte counts of one GPU: CUDA's unified address
#: space is 49 bits wide and no device holds 2**62 bytes, so a larger value is no real capture.

#: Largest magnitude of a timestamp (µs or ns) accepted from an input. PyTorch's
#: ``TraceEntry`` time is an int64 of microseconds since the epoch (about 2**51 today); a
#: snapshot trace time outside this bound is dropped with a warning, not refused.
MAX_TIME = 2**62
#: Device indices accepted (0 .. MAX_DEVICE - 1), and the most devices one capture may hold:
#: ``c10::DeviceIndex`` is an int8 (int16 in older releases): real indices are below 128, and
#: a process sees one node's devices (8, at most 16 today); each device is a full report
#: (replay, attribution, figures), so a few hundred bytes per device must not buy seconds.
MAX_DEVICE = 4096
MAX_DEVICES = 64
#: events spread over a trace at which the families named among blocks held together
#: (autocast's copies, K/V pairs, hand-written state) are decided, besides the OOM and the
#: peak: each costs one attribution of the blocks live there (session._set_moments)
SET_DECISION_MOMENTS = 16
#: Range of a stack frame's ``line`` PyTorch can write: ``py_symbolize`` stores the
#: ``uint64_t`` lineno of ``unwind::Frame`` (so CPython's "no line" -1 from
#: ``PyCode_Addr2Line`` arrives as 2**64 - 1), the C++ pickler casts it to ``int64_t`` (-1).
#: Lines outside [0, MAX_LINE) carry no line and are read as 0 (unknown), with a warning.
LINE_RANGE = (-(2**63), 2**64)
MAX_LINE = 2**31
#: Range of each half of a ``segment_pool_id``: ``MempoolId_t`` is a pair of
#: ``unsigned long long`` (Python path) or of ``int64_t`` (C++ path).
POOL_ID_RANGE = (-(2**63), 2**64)
#: Range of a ``stream``: ``int64_t(cudaStream_t)`` on both paths.
STREAM_RANGE = (-(2**63), 2**63)
#: Longest string a snapshot field (frame file or name, state, action) or a metadata value
#: may hold (a binary metadata value: this many bytes).
MAX_STRING = 1 << 20
#: Deepest nesting kept from free-form metadata (allocator settings, user metadata, trace
#: metadata, annotations) and the most values kept from it.
MAX_META_DEPTH = 32
MAX_META_NODES = 100_000
#: Largest sidecar read (an inventory of 10^5 tensors is ~20 MB of JSON).
MAX_SIDECAR_BYTES = 256 << 20
#: Largest export marker file read (`snapana-export.json`: metadata, never tables).
MAX_MARKER_BYTES = 64 << 20
#: Deepest stack kept (innermost frames): Python stops at 1,000 frames by default and real
#: snapshots hold tens to hundreds; deeper is a pickle's memo repeating one frame.
MAX_STACK_FRAMES = 4096
#: Longest frame file or function name a report shows (characters); the model, the API and
#: an export keep the whole name. Real paths and Python names are far shorter; demangled C++
#: template symbols run to 3,300 characters in the corpus and are told apart by their start.
#: Longer is cut, its end saying how long it was: one long name shared through a pickle's
#: memo by thousands of stacks would otherwise multiply into every site and stack shown.
MAX_FRAME_TEXT = 512


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        n = ascii_int(raw)
        return parse_bytes(raw) if n is None else n
    except ValueError:
        return default


def max_decompressed() -> int:
    """Absolute cap on the bytes a compressed input may expand to."""
    return _env_int("SNAPANA_MAX_DECOMPRESSED", 16 << 30)


def max_ratio() -> int:
    """Cap on decompressed / compressed size, beyond the first RATIO_FREE bytes."""
    return _env_int("SNAPANA_MAX_RATIO", 100)


#: Decompressed bytes always allowed whatever the ratio (small files compress very well).
RATIO_FREE = 8 << 20


def max_json_value() -> int:
    """Longest single JSON value (one trace event, one top-level field), in characters."""
    return _env_int("SNAPANA_MAX_JSON_VALUE", 256 << 20)


def decode_seconds(size: int) -> float:
    """Time a snapshot pickle of `size` (decompressed) bytes may take to decode."""
    base = float(_env_int("SNAPANA_DECODE_SECONDS", 4))
    return base + size / (2 << 20)  # real pickles decode at 20+ MB/s; allow 2 MB/s


def decode_memory(size: int) -> int:
    """Peak memory decoding a pickle of `size` (decompressed) bytes may take: real snapshots
    take under 10x their size (shared frames); anything far beyond is not a snapshot."""
    return _env_int("SNAPANA_DECODE_MEMORY", 0) or (512 << 20) + 48 * size


#: Rows (segments, blocks, trace entries, annotations) a decoded snapshot may hold whatever
#: its size, and the fewest bytes each further row must take in the decompressed pickle. A row
#: PyTorch writes is its own dict (tens of bytes: the corpus holds 40+ per row); a pickle can
#: reference one dict thousands of times for 2-5 bytes each, and every later stage costs per
#: row, so rows beyond the size's worth are a memo amplification, not a capture.
ROWS_FREE = 1 << 14
MIN_ROW_BYTES = 8


#: An export folder's Parquet table may decode to at most EXPORT_INFLATION times its file's
#: bytes (plus EXPORT_FREE): Parquet's run-length and dictionary encodings and its page
#: compression make a real table 3-30x its file; a few hundred KB inflating to GiBs is a
#: bomb. Its rows are bounded by the same rule per byte of file (4 rows a byte: a column of
#: one repeated value takes almost nothing, but every row costs every later stage).
EXPORT_INFLATION = 64
EXPORT_FREE = 64 << 20
EXPORT_ROWS_PER_BYTE = 4


def export_bounds(file_bytes: int) -> tuple[int, int]:
    """(most rows, most decoded bytes) one export table of `file_bytes` may hold."""
    return (ROWS_FREE + EXPORT_ROWS_PER_BYTE * file_bytes,
            EXPORT_FREE + EXPORT_INFLATION * file_bytes)


#: Memory reading an export table takes per byte its pages decode to (Arrow's buffers, the
#: polars copy, the checks' temporaries; measured 2.2x for a 2M-row table), with the
#: analysis after it: what must be free before the read starts.
EXPORT_READ_FACTOR = 4


def memory_headroom() -> int | None:
    """Bytes this process may still take: the address-space limit (`ulimit -v`, a batch
    system's cap) less what it maps now, and the machine's available memory; None where
    neither is known. A Rust allocation that fails aborts the process (polars, pyarrow), so
    an input too large for this headroom is refused before it is read."""
    import resource

    room: list[int] = []
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    status = _proc_kib("/proc/self/status", "VmSize")
    if soft != resource.RLIM_INFINITY and status is not None:
        room.append(soft - status)
    available = _proc_kib("/proc/meminfo", "MemAvailable")
    if available is not None:
        swap = _proc_kib("/proc/meminfo", "SwapFree") or 0
        room.append(available + swap)
    return min(room) if room else None


def _proc_kib(path: str, key: str) -> int | None:
    try:
        with open(path, encoding="ascii", errors="replace") as fh:
            for line in fh:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) << 10
    except (OSError, ValueError, IndexError):
        return None
    return None


def max_rows(decoded_bytes: int) -> int:
    """Most rows a snapshot pickle of `decoded_bytes` (decompressed) may decode to."""
    return _env_int("SNAPANA_MAX_ROWS", 0) or ROWS_FREE + decoded_bytes // MIN_ROW_BYTES


def limit_hint(var: str) -> str:
    return f"if the file is genuine, raise the limit with the environment variable {var}"


def memray_cpu_seconds(size: int) -> float:
    """CPU time memray's reader may use on a capture of `size` bytes: work grows with the
    records a capture holds, and a compressed MiB holds millions (a 1.7 MB capture of 88
    million allocations takes memray ~30 s of CPU), so the bound is generous per MiB and only
    stops what no legitimate file needs. CPU time, not wall time: a busy machine does not
    make a genuine capture fail."""
    per_mib = _env_int("SNAPANA_MEMRAY_SECONDS_PER_MIB", 600)
    return 30.0 + per_mib * size / (1 << 20)


def memray_read_seconds(size: int) -> float:
    """Wall-clock time memray's reader may take: far above its CPU bound (a shared machine
    may give it a tenth of a core); only a reader that neither reads nor computes meets it."""
    return 10 * memray_cpu_seconds(size)


def memray_stall_seconds() -> float:
    """How long memray's reader may go without reading further into the capture before the
    end of the file (a hang on a hostile file, not work)."""
    return float(_env_int("SNAPANA_MEMRAY_STALL_SECONDS", 120))


#: A text log is read from its end (where a dying job's OOM stands): at most this many bytes,
#: and at most this many OOM messages read and shown (a log can repeat one a million times;
#: the anchors past them are counted, never read, and each shown message costs the renderers
#: a dozen lines: 1,000 keep a 100 KB text of anchors under a second).
MAX_LOG_BYTES = 256 << 20
#: NUL bytes a file's start may have before the bytes its kind is told by: a log rotated by
#: copytruncate (logrotate) starts with a hole of them as long as the part cut away. Past
#: it, the file is refused as unrecognised.
MAX_LEADING_NULS = 16 << 20
MAX_LOG_MESSAGES = 1_000
#: A text log's line is matched up to this many characters: every pattern of the text readers
#: runs over at most this much at a time, so reading is linear in the text whatever a line
#: holds (a real log line, even a JSON record carrying a traceback, is far shorter). A longer
#: line is read up to it and the reading says so.
MAX_LOG_LINE = 8192

#: A user's rule pack is read up to this many bytes (the built-in packs together are ~0.3 MiB).
MAX_PACK_BYTES = 8 << 20

#: Deepest nesting of arrays and inline tables read from a TOML input (a budget, a user's
#: rule pack): theirs is 1 to 3; the TOML reader recurses per level (5,000 levels raise
#: RecursionError), so depth is checked before it runs.
MAX_TOML_DEPTH = 16


def toml_too_deep(text: str) -> str | None:
    """Why `text` is nested past MAX_TOML_DEPTH, in words; None when it is not."""
    depth = _toml_nesting(text)
    if depth <= MAX_TOML_DEPTH:
        return None
    return f"arrays or tables nested {depth:,} deep (at most {MAX_TOML_DEPTH} are read)"


#: One token of a TOML text that can hold a bracket: a comment, a string of any of the four
#: kinds (an unclosed one runs to its end: its line, or the text), or a bracket. No
#: alternative can backtrack into another, so the scan is linear in the text.
_TOML_TOKEN = re.compile(
    r'#[^\n]*'
    r'|"""(?:[^"\\]|\\.?|"(?!""))*(?:"""|\Z)'
    r"|'''(?:[^']|'(?!''))*(?:'''|\Z)"
    r'|"(?:[^"\\\n]|\\.?)*(?:"|(?=\n)|\Z)'
    r"|'[^'\n]*'?"
    r"|([\[{])|[\]}]",
    re.DOTALL,
)


def _toml_nesting(text: str) -> int:
    """The deepest nesting of [ and { outside strings and comments, read by one pattern in
    one pass (a bracket inside a quoted name, a multi-line string or a comment does not
    count)."""
    depth = deepest = 0
    for token in _TOML_TOKEN.finditer(text):
        if token.group(1) is not None:
            depth += 1
            deepest = max(deepest, depth)
        elif token.group() in ("]", "}"):
            depth = max(0, depth - 1)
    return deepest
