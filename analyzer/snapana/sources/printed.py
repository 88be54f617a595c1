"""A figure as a log prints it ("79.15 GiB", "14909 MiB"): its bytes and how far the printed
rounding may put them off. Shared by every reader of text (OOM messages, memory_summary,
nvidia-smi, vLLM)."""

from __future__ import annotations

from dataclasses import dataclass

#: `format_size`'s units (c10/util/... and CUDACachingAllocator.cpp): powers of 1024. Older
#: hand-written texts and other tools say KB/MB/GB for the same powers.
_UNITS = {"bytes": 1, "B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40,
          "KB": 1 << 10, "MB": 1 << 20, "GB": 1 << 30, "TB": 1 << 40}
SIZE = r"(\d+(?:\.\d+)?)\s?(bytes|TiB|GiB|MiB|KiB|TB|GB|MB|KB|B)\b"


@dataclass(frozen=True)
class Size:
    """A figure as printed: its bytes and how far the printed rounding may be off."""

    bytes: int
    slack: int
    text: str

    @staticmethod
    def parse(number: str, unit: str) -> Size:
        scale = _UNITS[unit]
        decimals = len(number.split(".", 1)[1]) if "." in number else 0
        value = round(float(number) * scale)
        slack = (scale // 2) // (10 ** decimals) if scale > 1 else 0
        return Size(value, slack, f"{number} {unit}")
