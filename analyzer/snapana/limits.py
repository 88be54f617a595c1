"""Every bound snapana puts on its inputs, in one place.

Inputs come from other machines and tickets: each source checks them against these limits at
its boundary, before anything recursive, quadratic or native runs on them. The limits that a
genuine file could plausibly exceed (decompressed size, JSON value size, decoding time and
memory) can be raised with an environment variable, which the error message names.
"""

from __future__ import annotations

import os

from snapana.units import MAX_BYTES as MAX_BYTES
from snapana.units import parse_bytes

#: MAX_BYTES (imported above): the largest byte count or address accepted from an input
#: (sizes, addresses, totals); keeps every sum of a few of them inside int64, the type of every
#: byte column. Defined once, with the byte units (`units.py` sits below this module: the
#: limits below are read with its parser); every input check imports it from here.

#: Largest magnitude of a timestamp (µs or ns) accepted from an input.
MAX_TIME = 2**62
#: Device indices accepted (0 .. MAX_DEVICE - 1), and the most devices one capture may hold.
MAX_DEVICE = 4096
MAX_DEVICES = 1024
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


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        return parse_bytes(raw) if not raw.isdigit() else int(raw)
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


def limit_hint(var: str) -> str:
    return f"if the file is genuine, raise the limit with the environment variable {var}"
