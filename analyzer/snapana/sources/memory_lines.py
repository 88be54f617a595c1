"""The memory lines frameworks print about themselves, read into figures (issue 57): SGLang's
start-up budget, torch_memory_saver's refusals, vLLM V1's weights / KV cache / profiling
lines, Megatron's report_memory, DeepSpeed's see_memory_usage. The formats are data
(`memory_lines.toml`, each with the format string it was read from); this module only finds
and reads them.

Each line is looked at once: a format's literal anchor is found with str.find, and its
pattern, bounded repetitions only, is matched at that position; lines longer than
MAX_MEMORY_LINE are not read (a ServerArgs repr runs to a few thousand characters). A rank
is read from the line's prefix (torchrun's "[rank3]:", Megatron's "[Rank 3]", SGLang's
"TP3", vLLM's "rank=3")."""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

from snapana import data_file
from snapana.printed import Size

#: Lines longer than this are not read for memory figures.
MAX_MEMORY_LINE = 65_536
#: Places an anchor is tried on one line (a short anchor such as DeepSpeed's "MA ").
MAX_ANCHORS_PER_LINE = 16
#: How much of a line's start is searched for its rank tag.
RANK_SPAN = 300

_PIECES = {"num": r"\d{1,9}(?:\.\d{1,6})?", "int": r"\d{1,20}", "count": r"\d[\d,]{0,26}",
           # a size with the unit it was printed in (a library that picks the unit per figure)
           "size": r"\d{1,9}(?:\.\d{1,6})? (?:bytes|KiB|MiB|GiB|KB|MB|GB)"}
#: A rank tag: torchrun's "[rank3]", Megatron's "[Rank 3]", SGLang's "TP3" (its tensor
#: parallel rank: one process per GPU), vLLM's "rank=3".
RANK_TAG = re.compile(r"\[[Rr]ank ?(\d{1,6})\]|\bTP(\d{1,4})\b|\brank=(\d{1,6})\b")
_BYTE_UNITS = {"GB", "GiB", "MB", "MiB", "KB", "KiB", "bytes", "B"}


Unit = Literal["GB", "GiB", "MB", "MiB", "KB", "KiB", "bytes", "B", "count", "float", "printed"]


class LineEntry(data_file.Table, frozen=True, kw_only=True):
    """``[[line]]``: one format a framework prints, and the format string it was read from."""

    id: str
    framework: str  # a [[framework]]'s id
    source: str
    anchor: str
    pattern: str
    units: dict[str, Unit]
    label: Literal["prefix", "previous", ""] = ""
    #: a figure line printed under another: it counts only within `within` lines after a
    #: line of format `after` (a bare 'Requested : 5 MB' elsewhere is nobody's)
    after: str = ""
    within: int = 0


class FrameworkEntry(data_file.Table, frozen=True, kw_only=True):
    """``[[framework]]``: a framework whose lines are read; its judge
    (`analysis.framework_memory`) is registered under the same id."""

    id: str
    name: str  # as a report's section names it


@data_file.schema("sources/memory_lines.toml")
class MemoryLinesFile(data_file.Table, frozen=True, kw_only=True):
    framework: list[FrameworkEntry]
    line: list[LineEntry]


@lru_cache(maxsize=1)
def _file() -> MemoryLinesFile:
    """The formats file, read once; a line whose framework is not declared is refused."""
    path = "sources/memory_lines.toml"
    data = data_file.packaged(path, MemoryLinesFile)
    declared = {f.id for f in data.framework}
    ids = {entry.id for entry in data.line}
    for n, entry in enumerate(data.line):
        if entry.framework not in declared:
            raise data_file.refuse(path, f"line[{n}].framework",
                                   f"{entry.framework!r} is no [[framework]]'s id")
        if entry.after and (entry.after not in ids or entry.within < 1):
            raise data_file.refuse(path, f"line[{n}].after",
                                   f"{entry.after!r} is no [[line]]'s id, or within < 1")
    return data


def framework_names() -> dict[str, str]:
    """Each framework whose lines are read -> its name in a report (``[[framework]]``)."""
    return {f.id: f.name for f in _file().framework}


@dataclass(frozen=True)
class LineFormat:
    id: str
    framework: str
    anchor: str
    pattern: re.Pattern[str]
    units: dict[str, str]
    source: str  # the framework source and format string it was read from
    label: str = ""  # "prefix" | "previous" | ""
    after: str = ""  # the format it is printed under ("": none)
    within: int = 0


@dataclass(frozen=True)
class MemoryLine:
    """One memory line: its format, rank, figures (bytes as Size, counts as int, shares as
    float), and the name it gives itself (Megatron's '(after 10 iterations)')."""

    line: int  # 1-based
    format: str
    framework: str
    rank: int | None
    figures: dict[str, Size | int | float]
    label: str = ""
    source: str = ""  # the log it was read from

    def size(self, name: str) -> Size | None:
        v = self.figures.get(name)
        return v if isinstance(v, Size) else None

    def number(self, name: str) -> float | None:
        v = self.figures.get(name)
        return v if isinstance(v, int | float) and not isinstance(v, bool) else None


@lru_cache(maxsize=1)
def line_formats() -> tuple[LineFormat, ...]:
    out = []
    for entry in _file().line:
        pattern = entry.pattern
        for name, piece in _PIECES.items():
            pattern = pattern.replace("{" + name + "}", piece)
        out.append(LineFormat(entry.id, entry.framework, entry.anchor, re.compile(pattern),
                              dict(entry.units), entry.source, entry.label, entry.after,
                              entry.within))
    return tuple(out)


def _figure(value: str, unit: str) -> Size | int | float:
    if unit == "count":
        return int(value.replace(",", ""))
    if unit == "float":
        return float(value)
    if unit == "bytes":
        return Size(int(value), 0, f"{value} bytes")
    if unit == "printed":  # "{size}": the number and its own unit
        number, printed_unit = value.split(" ", 1)
        return Size.parse(number, printed_unit)
    negative = value.startswith("-")
    size = Size.parse(value.lstrip("-"), unit)
    return Size(-size.bytes, size.slack, value + " " + unit) if negative else size


def _rank(head: str) -> int | None:
    m = RANK_TAG.search(head[-RANK_SPAN:])
    if m is None:
        return None
    return int(next(g for g in m.groups() if g is not None))


def read_memory_lines(lines: list[str]) -> list[MemoryLine]:
    """Every framework memory line of `lines`, in order."""
    formats = line_formats()
    under = {f.id: f for f in formats if f.after}
    last: dict[str, int] = {}  # format -> the 1-based line it was last read on
    out = []
    for i, line in enumerate(lines):
        if len(line) > MAX_MEMORY_LINE:
            continue
        for f in formats:
            at = line.find(f.anchor)
            tries = 0
            while at >= 0 and tries < MAX_ANCHORS_PER_LINE:
                m = f.pattern.match(line, at)
                if m is not None:
                    head = under.get(f.id)
                    if head is None or 0 < i + 1 - last.get(head.after, -head.within) \
                            <= head.within:
                        out.append(_read(f, m, line, lines, i, at))
                        last[f.id] = i + 1
                    break
                at = line.find(f.anchor, at + 1)
                tries += 1
    return out


def _read(f: LineFormat, m: re.Match[str], line: str, lines: list[str], i: int,
          at: int) -> MemoryLine:
    figures = {name: _figure(value, f.units[name])
               for name, value in m.groupdict().items() if value is not None}
    label = ""
    if f.label == "prefix":
        head = line[:at]
        label = head[head.rfind("]") + 1:].strip()[:200]
    elif f.label == "previous" and i:
        label = lines[i - 1].strip()[:200]
    return MemoryLine(i + 1, f.id, f.framework, _rank(line[:at]), figures, label)
