"""The one place bytes become human text (renderers only) and human text becomes bytes (CLI)."""

from __future__ import annotations

import re
from decimal import Decimal

KiB = 1024
MiB = 1024**2
GiB = 1024**3

#: Every unit the product reads. Binary units are powers of 1024; decimal ones powers of 1000,
#: as storage vendors mean "GB". A bare number or a one-letter unit ("80",
#: "80G") is refused: which of the two it means is exactly the mistake this avoids.
_UNITS = {"b": 1,
          "kib": KiB, "mib": MiB, "gib": GiB, "tib": 1024**4,
          "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12}
_SIZE_RE = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*")
#: Larger than any device or host memory; keeps every byte figure inside int64. The input
#: checks read it from `limits`, the home of every bound.
MAX_BYTES = 1 << 62


def fmt_bytes(n: int | None, signed: bool = False) -> str:
    """Format an integer byte count the way the PyTorch OOM message does (binary units)."""
    if n is None:
        return "n/a"
    sign = "-" if n < 0 else ("+" if signed and n > 0 else "")
    v = abs(int(n))
    for unit, scale in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if v >= scale:
            return f"{sign}{v / scale:.2f} {unit}"
    return f"{sign}{v} B"


def parse_bytes(text: str) -> int:
    """Bytes from a size with an explicit unit: '80GiB', '81920 MiB', '80GB' (= 80·10^9),
    '512B'. The one size parser of the product (CLI flags, API arguments, rule packs)."""
    m = _SIZE_RE.fullmatch(text)
    if not m:
        raise ValueError(f"cannot read {text!r} as a size (e.g. 80GiB, 80GB, 81920MiB)")
    number, unit = m.group(1), m.group(2).lower()
    if not unit:
        raise ValueError(f"{text!r} has no unit: write e.g. {number}GiB (2^30 bytes), "
                         f"{number}GB (10^9 bytes) or {number}B")
    if unit not in _UNITS:
        hint = f" ({number}{unit[0].upper()}iB or {number}{unit[0].upper()}B?)" \
            if unit[0] in "kmgt" else ""
        raise ValueError(f"{text!r}: unknown unit {m.group(2)!r}{hint}; units: B, KiB, MiB, "
                         "GiB, TiB (binary), KB, MB, GB, TB (decimal)")
    value = int(Decimal(number) * _UNITS[unit])
    if value >= MAX_BYTES:
        raise ValueError(f"{text!r} is larger than any memory ({fmt_bytes(MAX_BYTES)} or more)")
    return value


#: More memory than any accelerator has (the largest today hold 288 GB); a larger --capacity
#: is a typo (1TB for 1GB), and would make every "outside PyTorch" figure absurd.
MAX_DEVICE_BYTES = 512 * GiB


def parse_capacity(value: int | str) -> int:
    """A device's total memory, from bytes or a size string, checked to be plausible."""
    n = value if isinstance(value, int) and not isinstance(value, bool) else None
    if n is None:
        if not isinstance(value, str):
            raise ValueError(f"capacity must be bytes or a size like 80GiB, got {value!r}")
        n = parse_bytes(value)
    if n <= 0 or n > MAX_DEVICE_BYTES:
        raise ValueError(f"capacity {value!r} is not a device size (0 < capacity <= "
                         f"{fmt_bytes(MAX_DEVICE_BYTES)}; e.g. 80GiB)")
    return n
