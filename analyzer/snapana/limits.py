"""Every bound snapana puts on its inputs, in one place.

Inputs come from other machines and tickets: each source checks them against these limits at
its boundary, before anything recursive, quadratic or native runs on them. The limits that a
genuine file could plausibly exceed (decompressed size, JSON value size, decoding time and
memory) can be raised with an environment variable, which the error message names.
"""

from __future__ import annotations

import os

#: Largest byte count or address accepted from an input (sizes, addresses, totals). Keeps
#: every sum of a few of them inside int64, the type of every byte column.
MAX_BYTES = 2**62
#: Largest magnitude of a timestamp (µs or ns) accepted from an input.
MAX_TIME = 2**62
#: Device indices accepted (0 .. MAX_DEVICE - 1), and the most devices one capture may hold:
#: a process sees one node's devices (8, at most 16 today); each device is a full report
#: (replay, attribution, figures), so a few hundred bytes per device must not buy seconds.
MAX_DEVICE = 4096
MAX_DEVICES = 64
#: Longest string a snapshot field (frame file or name, state, action) may hold.
MAX_STRING = 1 << 20
#: Deepest nesting kept from free-form metadata (allocator settings, user metadata, trace
#: metadata, annotations) and the most values kept from it.
MAX_META_DEPTH = 32
MAX_META_NODES = 100_000
#: Deepest stack kept (innermost frames): Python stops at 1,000 frames by default and real
#: snapshots hold tens to hundreds; deeper is a pickle's memo repeating one frame.
MAX_STACK_FRAMES = 4096
#: Most digits of an integer in JSON (int64 has 19).
MAX_JSON_DIGITS = 40


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        from snapana.units import parse_bytes

        return parse_bytes(raw) if not raw.isdigit() else int(raw)
    except (ValueError, ImportError):
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


def max_rows(decoded_bytes: int) -> int:
    """Most rows a snapshot pickle of `decoded_bytes` (decompressed) may decode to."""
    return _env_int("SNAPANA_MAX_ROWS", 0) or ROWS_FREE + decoded_bytes // MIN_ROW_BYTES


def limit_hint(var: str) -> str:
    return f"if the file is genuine, raise the limit with the environment variable {var}"
