"""The one place bytes become human text (renderers only) and human text becomes bytes (CLI)."""

from __future__ import annotations

import re

KiB = 1024
MiB = 1024**2
GiB = 1024**3

_UNITS = {"": 1, "b": 1, "k": KiB, "kb": KiB, "kib": KiB, "m": MiB, "mb": MiB, "mib": MiB,
          "g": GiB, "gb": GiB, "gib": GiB, "t": 1024**4, "tb": 1024**4, "tib": 1024**4}


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
    """Parse '80GiB', '79.25 GB', '1024' into bytes (GB is read as GiB, as nvidia-smi does)."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", text)
    if not m or m.group(2).lower() not in _UNITS:
        raise ValueError(f"cannot read {text!r} as a size (try 80GiB)")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])
