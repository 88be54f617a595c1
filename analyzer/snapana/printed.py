"""A figure as a log prints it ("79.15 GiB", "14909 MiB"): its bytes and how far the printed
rounding may put them off. Shared by every reader of text (OOM messages, memory_summary,
nvidia-smi, vLLM)."""

from __future__ import annotations

from dataclasses import dataclass

from snapana.errors import InputError

#: `format_size`'s units (c10/util/... and CUDACachingAllocator.cpp): powers of 1024. Older
#: hand-written texts and other tools say KB/MB/GB for the same powers.
_UNITS = {"bytes": 1, "B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40,
          "KB": 1 << 10, "MB": 1 << 20, "GB": 1 << 30, "TB": 1 << 40}
#: A printed size: it starts where a run of digits starts (the lookbehind), and its runs are
#: possessive, so a search over a run of digits or dots tries each run once: linear time.
SIZE = r"(?<![\d.])(\d++(?:\.\d++)?+)\s?+(bytes|TiB|GiB|MiB|KiB|TB|GB|MB|KB|B)\b"
#: The largest size a text may print (2^64 bytes) and count (2^63): a figure past them is no
#: device's or job's; a 400-digit figure would otherwise overflow the float it is read as.
MAX_SIZE = 1 << 64
MAX_COUNT = 1 << 63
#: Digits a figure may have at most before its bound is checked exactly.
_MAX_DIGITS = 24


def whole(number: str) -> int:
    """A printed count (a device, a pid, a count of blocks or tokens): InputError past
    MAX_COUNT, said in one line (the digits are not converted past their bound)."""
    digits = number.lstrip("0")
    value = int(digits) if digits and len(digits) <= _MAX_DIGITS else 0
    if len(digits) > _MAX_DIGITS or value > MAX_COUNT:
        raise InputError(f"a printed count of {len(digits):,} digits ({number[:12]}...) is past "
                         "2^63: no job prints it")
    return value


def in_bounds(value: int, text: str) -> int:
    """A size in bytes read from `text`, InputError past MAX_SIZE."""
    if value > MAX_SIZE:
        raise InputError(f"a printed size of {text[:24]} is past 2^64 bytes: no device holds it")
    return value


@dataclass(frozen=True)
class Size:
    """A figure as printed: its bytes and how far the printed rounding may be off."""

    bytes: int
    slack: int
    text: str

    @staticmethod
    def parse(number: str, unit: str) -> Size:
        scale = _UNITS[unit]
        integer, _, fraction = number.partition(".")
        decimals = min(len(fraction), _MAX_DIGITS)  # more change nothing
        shown = f"{number[:12]}{'...' if len(number) > 12 else ''} {unit}"
        if len(integer.lstrip("0")) > _MAX_DIGITS:
            in_bounds(MAX_SIZE + 1, shown)
        value = in_bounds(round(float(number) * scale), shown)
        slack = (scale // 2) // (10 ** decimals) if scale > 1 else 0
        return Size(value, slack, f"{number} {unit}")
