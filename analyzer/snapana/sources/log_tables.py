"""The tables a log holds beside an OOM message (issue 44): `torch.cuda.memory_summary()` and
`nvidia-smi`.

Both are found by their headers and read row by row, a log prefix before each line allowed.
Their figures are as printed, with the rounding each printer does:

- `memory_summary()` (torch/cuda/memory.py, PyTorch 1.4+) prints each figure as an integer
  of the unit its row's "all" value picks (B, then KiB/MiB/... from 768 of the smaller
  unit), *rounded down*: "14909 MiB" is 14909 to 14910 MiB. Before 2.0 the units were
  written KB/MB/GB for the same powers of 1024 (pytorch#91854). "Requested memory" is there
  from 2.0 (the `requested_bytes` statistic); "Oversize allocations / GPU segments" from
  1.10 (`max_split_size_mb`).
- `nvidia-smi` prints each GPU's "used / total" and each process's usage in whole MiB.
  NVML's "used" leaves out the memory the driver reserves (drivers 510+), so total − used
  is not the free memory CUDA reports; it is never computed here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from snapana.log_model import SUMMARY_ROWS
from snapana.printed import Size, in_bounds, whole

#: `_format_size`'s units, and the KB/MB/GB spelling of the same powers before PyTorch 2.0.
_SUMMARY_UNITS = {"B": 0, "KiB": 1, "MiB": 2, "GiB": 3, "TiB": 4, "PiB": 5,
                  "KB": 1, "MB": 2, "GB": 3, "TB": 4, "PB": 5}
#: (Every run possessive: no two quantifiers share the characters they may take, so a row of
#: spaces or digits is matched in linear time.)
_SUMMARY_HEAD = re.compile(r"PyTorch (?:CUDA|HIP) memory summary, device ID (\d++)")
_SUMMARY_OOMS = re.compile(r"(?:CUDA|HIP) OOMs: (\d++)\s*+\|\s*+(?:cuda|hip)Malloc retries: "
                           r"(\d++)", re.IGNORECASE)
_CELL = r"\|\s*+(\d++)\s*+(B|KiB|MiB|GiB|TiB|PiB|KB|MB|GB|TB|PB|K|M)?+\s*+"
_SUMMARY_ROW = re.compile(r"\|\s*+(" + "|".join(map(re.escape, SUMMARY_ROWS)) + r"|from large pool"
                          r"|from small pool)\s*+" + _CELL * 4 + r"\|")
_COUNT_UNITS = {None: 1, "K": 1000, "M": 1000 * 1000}
#: Lines a summary may span (11 metrics of 3 rows each, rules between them).
SUMMARY_SPAN = 60


@dataclass(frozen=True)
class MemorySummary:
    """One `memory_summary()` table: its device, OOM and retry counters, and each row's four
    figures (bytes as `Size`, counts as (value, slack))."""

    line: int
    device: int
    ooms: int | None
    retries: int | None
    sizes: dict[str, tuple[Size, ...]]  # row key (".large" / ".small" for its pools)
    counts: dict[str, tuple[tuple[int, int], ...]]


def _floored(number: str, unit: str | None) -> Size:
    """A figure `_format_size` rounded down to its unit: from the printed value to one unit
    more, as its middle give or take half a unit."""
    scale = 1 << (10 * _SUMMARY_UNITS[unit or "B"])
    text = f"{number} {unit or 'B'}"
    return Size(in_bounds(whole(number) * scale + scale // 2, text), scale // 2, text)


def read_summaries(lines: list[str]) -> list[MemorySummary]:
    out = []
    for i, line in enumerate(lines):
        head = _SUMMARY_HEAD.search(line)
        if head is None:
            continue
        ooms = retries = None
        sizes: dict[str, tuple[Size, ...]] = {}
        counts: dict[str, tuple[tuple[int, int], ...]] = {}
        metric, is_size = "", True
        for row in lines[i + 1:i + 1 + SUMMARY_SPAN]:
            if _SUMMARY_HEAD.search(row):
                break
            if (c := _SUMMARY_OOMS.search(row)) is not None:
                ooms, retries = whole(c.group(1)), whole(c.group(2))
            if (m := _SUMMARY_ROW.search(row)) is None:
                continue
            name = m.group(1)
            if name in SUMMARY_ROWS:
                metric, is_size = SUMMARY_ROWS[name]
                key = metric
            elif metric:
                key = f"{metric}.{name.split()[1]}"
            else:
                continue
            cells = [(m.group(2 + 2 * k), m.group(3 + 2 * k)) for k in range(4)]
            if is_size:
                sizes[key] = tuple(_floored(n, u) for n, u in cells)
            else:
                counts[key] = tuple(_count(n, u) for n, u in cells)
        out.append(MemorySummary(i + 1, whole(head.group(1)), ooms, retries, sizes, counts))
    return out


def _count(number: str, unit: str | None) -> tuple[int, int]:
    """A count `_format_count` rounded down to thousands or millions: (middle, slack)."""
    scale = _COUNT_UNITS.get(unit, 1)
    return whole(number) * scale + scale // 2, scale // 2


# ----- nvidia-smi ------------------------------------------------------------------------------

_SMI_HEAD = re.compile(r"NVIDIA-SMI ([\d.]++)\s++Driver Version: ([\d.]++)(?:\s++CUDA Version: "
                       r"([\d.]++|N/A))?+")
#: A GPU's first row ("|   0  NVIDIA H100 80GB HBM3   On  |") and, on the next, its memory.
#: Its first cell is taken whole and split in `_gpu_cell` (name, then On or Off): a pattern
#: with the name between two runs of spaces would rescan them from every split.
_SMI_GPU = re.compile(r"^\|\s++(\d++)\s++([^|]*+)\|")
_SMI_MEMORY = re.compile(r"\|\s*+(\d++)MiB\s*+/\s*+(\d++)MiB\s*+\|")
#: A process row: GPU, [GI CI] (MIG, 2018+ drivers), PID, type, then name and usage (the
#: rest of the cell, split in `_process_cell`).
_SMI_PROCESS = re.compile(r"^\|\s++(\d++)\s++(?:(?:N/A|\d++)\s++(?:N/A|\d++)\s++)?+(\d++|\*++)"
                          r"\s++(C\+G|M\+C|C|G|M)\s++([^|]*+)\|")
#: The usage that ends a process row's cell: MiB, N/A (WDDM, containers) or hidden.
_SMI_USAGE = re.compile(r"(\d++|N/A|\*++)(?:MiB)?+")
#: Lines a table may span (a header, 8 GPUs of 4 lines, a process list).
SMI_SPAN = 400
_MIB = 1 << 20


@dataclass(frozen=True)
class SmiGpu:
    index: int
    name: str
    used: Size
    total: Size


@dataclass(frozen=True)
class SmiProcess:
    gpu: int
    pid: int | None  # None: hidden ('******' in a redacted paste)
    kind: str  # C (compute), G (graphics), C+G, M (MPS)
    name: str
    used: Size | None  # None: "N/A" (Windows WDDM, some containers) or hidden


@dataclass(frozen=True)
class SmiTable:
    line: int
    driver: str
    cuda: str | None
    gpus: tuple[SmiGpu, ...]
    processes: tuple[SmiProcess, ...]


def _mib(n: str) -> Size:
    return Size(in_bounds(whole(n) * _MIB, f"{n} MiB"), _MIB // 2, f"{n} MiB")


def _prefix_free(line: str) -> str:
    """The table's own part of a log line: from its first '|' (a log prefix before it)."""
    at = line.find("|")
    return line[at:] if at >= 0 else line


def _gpu_row(row: str) -> tuple[int, str] | None:
    """(index, name) of a GPU's first row: its first cell ends with On or Off (persistence
    mode) after the name."""
    g = _SMI_GPU.match(row)
    if g is None:
        return None
    name, _, mode = g.group(2).rstrip().rpartition(" ")
    if mode not in ("On", "Off") or not name.strip():
        return None
    return whole(g.group(1)), name.strip()


def _process_row(row: str) -> SmiProcess | None:
    """A process row: its last cell's last word is the usage, the words before it the name."""
    p = _SMI_PROCESS.match(row)
    if p is None:
        return None
    name, _, usage = p.group(4).rstrip().rpartition(" ")
    u = _SMI_USAGE.fullmatch(usage)
    if u is None or not name.strip():
        return None
    pid = whole(p.group(2)) if p.group(2).isdigit() else None
    used = _mib(u.group(1)) if u.group(1).isdigit() else None
    return SmiProcess(whole(p.group(1)), pid, p.group(3), name.strip(), used)


def read_smi(lines: list[str]) -> list[SmiTable]:
    out = []
    for i, line in enumerate(lines):
        head = _SMI_HEAD.search(line)
        if head is None:
            continue
        gpus: list[SmiGpu] = []
        procs: list[SmiProcess] = []
        in_processes = False
        end = min(len(lines), i + 1 + SMI_SPAN)
        for k in range(i + 1, end):
            row = _prefix_free(lines[k])
            if _SMI_HEAD.search(row):
                break
            if "Processes:" in row:
                in_processes = True
                continue
            if in_processes:
                if (p := _process_row(row)) is not None:
                    procs.append(p)
                elif row.startswith("+") and procs:
                    break
                continue
            g = _gpu_row(row)
            if g is not None and k + 1 < end:
                mem = _SMI_MEMORY.search(_prefix_free(lines[k + 1]))
                if mem is not None:
                    gpus.append(SmiGpu(g[0], g[1], _mib(mem.group(1)), _mib(mem.group(2))))
        if gpus or procs:
            out.append(SmiTable(i + 1, head.group(2), head.group(3), tuple(gpus),
                                tuple(procs)))
    return out
