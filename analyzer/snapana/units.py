"""The one place bytes become human text (renderers only) and human text becomes bytes (CLI),
and where text from an input is made inert before a terminal or a file shows it."""

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
#: (Possessive: the two runs of spaces around the unit never share a split, so a value of a
#: million tabs is refused in linear time.)
_SIZE_RE = re.compile(r"\s*+([0-9]++(?:\.[0-9]++)?+)\s*+([a-zA-Z]*+)\s*+")
#: Digits a size's whole part may have: more is past MAX_BYTES whatever its unit, and is
#: refused before it is converted.
_MAX_SIZE_DIGITS = 24
#: Larger than any device or host memory; keeps every byte figure inside int64. The input
#: checks read it from `limits`, the home of every bound.
MAX_BYTES = 1 << 62


#: Characters an input's string must not carry to a terminal, a text file or a ticket: C0
#: controls but tab and newline (ESC starts the sequences that clear a screen or write the
#: clipboard), DEL and C1 controls (0x9b is a CSI on its own), unpaired surrogates (legal
#: in a pickle, unencodable as UTF-8), line/paragraph separators, bidi overrides and marks,
#: and the invisible characters (zero-width space, joiners, BOM, soft hyphen, tag letters) that
#: make two different names look alike or hide text in a ticket.
_CONTROLS = (r"\x00-\x08\x0b-\x1f\x7f-\x9f\xad\u034f\u061c\u180e\u200b-\u200f\u2028\u2029"
             r"\u202a-\u202e\u2060-\u2064\u2066-\u206f\ufeff\ufff9-\ufffb\ud800-\udfff"
             r"\U000e0000-\U000e007f")
_UNSAFE = re.compile(f"[{_CONTROLS}]")
_UNSAFE_LINES = re.compile(f"[\\t\\n{_CONTROLS}]")
#: A lone surrogate: how Python hands over a file name's byte that is not UTF-8
#: (surrogateescape: b'\xff' -> '\udcff'), and what a pickle's string may hold.
_SURROGATES = re.compile("[\ud800-\udfff]")
#: What a styled terminal text may keep of its own: rich's SGR colour sequences.
_SGR = re.compile(r"(\x1b\[[0-9;]*m)")


def _escape(m: re.Match[str]) -> str:
    c = ord(m.group())
    if c < 0x100:
        return f"\\x{c:02x}"
    return f"\\u{c:04x}" if c < 0x10000 else f"\\U{c:08x}"


def inert(text: str, lines: bool = True) -> str:
    """`text` safe to print: each unsafe character (see `_UNSAFE`) shown escaped, as
    `\\x1b`; with `lines=False` tab and newline too (a single field, such as a frame's file
    name, must not start a line of its own)."""
    return (_UNSAFE if lines else _UNSAFE_LINES).sub(_escape, text)


def encodable(text: str) -> str:
    """`text` as UTF-8 can hold it (a Parquet column, a JSON string, a partition folder's
    name): each lone surrogate written escaped as `inert` shows it (`\\udcff`), everything
    else kept as it is, so a file name the filesystem gave with a byte that is not UTF-8
    is written the way it is printed, never a UnicodeEncodeError after the work."""
    return _SURROGATES.sub(_escape, text)


def shown_name(text: str, limit: int) -> str:
    """A frame's file or function name as a report shows it: whole up to `limit` characters
    (`limits.MAX_FRAME_TEXT`), else its start and how long it was."""
    if len(text) <= limit:
        return text
    mark = f"…[{len(text)} chars]"
    return text[:max(0, limit - len(mark))] + mark


def inert_styled(text: str) -> str:
    """`inert` for text a renderer styled: its SGR colour sequences kept, everything else
    escaped."""
    parts = _SGR.split(text)
    return "".join(p if i % 2 else inert(p) for i, p in enumerate(parts))


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


def quote(text: str, limit: int = 40) -> str:
    """A value from the command line, quoted back in an error: repr (controls escaped) and
    cut to `limit` characters, so a 5,000-digit value still makes one short line."""
    return repr(text[:limit]) + (f"... ({len(text):,} characters)" if len(text) > limit
                                 else "")


#: An integer as text: ASCII digits only, one optional sign. `str.isdigit` is True for
#: superscripts and circled digits ('²', '①') that `int` refuses, and `int` takes other
#: scripts' digits, '_' and Unicode blanks: neither is a test of "an integer" by itself.
_INT_RE = re.compile(r"[+-]?[0-9]+")
#: Digits past which a number is taken as out of any range (before `int` converts it).
_MAX_INT_CHARS = 40


def ascii_int(text: object, max_chars: int = _MAX_INT_CHARS) -> int | None:
    """The one test-and-convert of an integer written as text (command line, environment,
    a string field of an input): ASCII digits with one optional sign, blanks around it
    allowed, at most `max_chars` characters; None otherwise, never an exception."""
    if not isinstance(text, str):
        return None
    text = text.strip(" \t\r\n")
    if len(text) > max_chars or not _INT_RE.fullmatch(text):
        return None
    return int(text)


def parse_int(text: str, what: str, lo: int, hi: int) -> int:
    """The one integer parser of the command line (counts, indices, times): ASCII digits,
    one sign, in [lo, hi]; ValueError naming `what` and quoting the value otherwise."""
    if not isinstance(text, str) or not _INT_RE.fullmatch(text):
        raise ValueError(f"{what} {quote(str(text))} is not an integer (ASCII digits, one "
                         "optional sign)")
    n = ascii_int(text)  # None past 40 characters: int() refuses 4,300+ digits anyway
    if n is None or not lo <= n <= hi:
        raise ValueError(f"{what} {quote(text)} is out of range ({lo}..{hi})")
    return n


_ADDRESS_RE = re.compile(r"0[xX][0-9a-fA-F]{1,16}|[0-9]{1,20}")


def parse_address(text: str, what: str) -> int:
    """A block address: 0x followed by hex digits, or decimal (ASCII only)."""
    if not isinstance(text, str) or not _ADDRESS_RE.fullmatch(text):
        raise ValueError(f"{what} {quote(str(text))} is not an address (e.g. 0x7f3a00000000)")
    n = int(text, 0)
    if n >= MAX_BYTES:
        raise ValueError(f"{what} {quote(text)} is out of range (below 2**62)")
    return n


def parse_bytes(text: str) -> int:
    """Bytes from a size with an explicit unit: '80GiB', '81920 MiB', '80GB' (= 80·10^9),
    '512B'. The one size parser of the product (CLI flags, API arguments, rule packs)."""
    m = _SIZE_RE.fullmatch(text)
    if not m:
        raise ValueError(f"cannot read {quote(text)} as a size (e.g. 80GiB, 80GB, 81920MiB)")
    number, unit = m.group(1), m.group(2).lower()
    if not unit:
        raise ValueError(f"{quote(text)} has no unit: write e.g. {number[:20]}GiB (2^30 "
                         f"bytes), {number[:20]}GB (10^9 bytes) or {number[:20]}B")
    if unit not in _UNITS:
        hint = f" ({number[:20]}{unit[0].upper()}iB or {number[:20]}{unit[0].upper()}B?)" \
            if unit[0] in "kmgt" else ""
        raise ValueError(f"{quote(text)}: unknown unit {quote(m.group(2))}{hint}; units: B, "
                         "KiB, MiB, "
                         "GiB, TiB (binary), KB, MB, GB, TB (decimal)")
    too_long = len(number.split(".")[0].lstrip("0")) > _MAX_SIZE_DIGITS
    value = MAX_BYTES if too_long else int(Decimal(number[:4 * _MAX_SIZE_DIGITS])
                                            * _UNITS[unit])
    if value >= MAX_BYTES:
        raise ValueError(f"{quote(text)} is larger than any memory ({fmt_bytes(MAX_BYTES)} or "
                         "more)")
    return value


#: More memory than any accelerator has (the largest today hold 288 GB); a larger --capacity
#: is a typo (1TB for 1GB), and would make every "outside PyTorch" figure absurd.
MAX_DEVICE_BYTES = 512 * GiB


def parse_capacity(value: int | str) -> int:
    """A device's total memory, from bytes or a size string, checked to be plausible."""
    n = value if isinstance(value, int) and not isinstance(value, bool) else None
    if n is None:
        if not isinstance(value, str):
            raise ValueError(f"capacity must be bytes or a size like 80GiB, got "
                             f"{quote(repr(value))}")
        n = parse_bytes(value)
    if n <= 0 or n > MAX_DEVICE_BYTES:
        raise ValueError(f"capacity {quote(str(value))} is not a device size (0 < capacity <= "
                         f"{fmt_bytes(MAX_DEVICE_BYTES)}; e.g. 80GiB)")
    return n


def plural(n: int, noun: str) -> str:
    """"1 block", "2 blocks": a count with its noun (regular plurals only)."""
    return f"{n:,} {noun}" + ("" if n == 1 else "s")


def ordinal(n: int) -> str:
    """"1st", "2nd", "3rd", "4th", "11th", "12th", "13th", "21st": English ordinals, one
    rule for every sentence that counts (the teens take "th")."""
    suffix = "th" if n % 100 in (11, 12, 13) else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n:,}{suffix}"


#: Addresses at and above this one are made up, for blocks whose source records none (a
#: profiler trace's pre-existing memory): keys, never shown as a place in memory.
SYNTHETIC_ADDRESSES = 0x7E00_0000_0000_0000


def address_text(address: int) -> str:
    """An address as a person reads it; a made-up one says there is none."""
    return "no address recorded" if address >= SYNTHETIC_ADDRESSES else f"0x{address:x}"
