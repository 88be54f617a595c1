"""Memory budgets for CI (issue 47): limits written as data (a TOML file), checked against one
capture's findings, each a line that holds or is breached with the figure that breaches it.

    # budget.toml
    no_oom = true                 # no device of the capture ran out of memory
    peak_allocated = "60 GiB"     # at most, on the device shown (the failing one, else the
    peak_reserved = "70 GiB"      #   largest peak)
    cached_share = 0.25           # cached-but-unallocated / reserved at the moment, at most
    [families]                    # bytes each family holds at the moment (OOM, else peak)
    kv_cache = "20 GiB"
    [chunks]                      # live copies of a family's repeated chunk at the moment
    saved_logprob_softmax = 2

Sizes carry their unit (`units.parse_bytes`); a family is one of the vocabulary's ids, so a
typo is refused rather than met by a family that holds nothing. A figure the capture cannot
give (reserved memory of a capture that records none) is refused too: a budget that cannot be
measured must not pass.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tomllib

from snapana.analysis.attribution.families import family_ids
from snapana.analysis.diagnosis.findings import DeviceReport
from snapana.errors import InputError
from snapana.limits import toml_too_deep
from snapana.units import fmt_bytes, parse_bytes, quote

#: The keys a budget file may hold at its top level.
FIGURES = ("no_oom", "peak_allocated", "peak_reserved", "cached_share", "families", "chunks")


@dataclass(frozen=True)
class Budget:
    """What a budget file asks; None where it asks nothing."""

    no_oom: bool | None = None
    peak_allocated: int | None = None
    peak_reserved: int | None = None
    cached_share: float | None = None
    families: Mapping[str, int] | None = None
    chunks: Mapping[str, int] | None = None


@dataclass(frozen=True)
class Check:
    """One line of the budget against the capture: `actual` within `limit`, or not."""

    name: str  # e.g. "peak_reserved", "family kv_cache"
    limit: str  # the budget, in words ("at most 20.00 GiB")
    actual: str  # the figure ("24.79 GiB")
    ok: bool
    detail: str = ""  # where a breach comes from (the family's top site), "" when it holds
    limit_value: float = 0.0
    actual_value: float = 0.0


#: A budget file is a few lines; anything larger is not one.
MAX_BUDGET_BYTES = 1 << 20
#: The largest count of chunks a budget may name (an int64, as every count of the capture).
MAX_BUDGET_COUNT = (1 << 63) - 1


def read_budget_file(path: Path) -> Budget:
    """A budget file: a regular file (never a FIFO that would block), small, UTF-8; noted as
    an input so no output may replace it."""
    from snapana.sources._io import read_small_text

    text = read_small_text(path, MAX_BUDGET_BYTES, "a budget file")
    return read_budget(text, str(path))


def read_budget(text: str, where: str) -> Budget:
    """A budget from TOML text; InputError naming the key for anything it cannot read."""
    if len(text) > MAX_BUDGET_BYTES:
        raise InputError(f"{where}: over {MAX_BUDGET_BYTES >> 20} MiB: not a budget")
    if (deep := toml_too_deep(text)) is not None:
        raise InputError(f"{where}: {deep}: not a budget")
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise InputError(f"{where}: not a TOML budget: {str(exc)[:200]}") from None
    except ValueError:  # an integer past Python's 4,300 digits: no budget's figure
        raise InputError(f"{where}: a number of thousands of digits: not a budget") from None
    except RecursionError:  # nesting the scan above did not see
        raise InputError(f"{where}: nested too deep: not a budget") from None
    unknown = [k for k in data if k not in FIGURES]
    if unknown:
        raise InputError(f"{where}: unknown budget {quote(unknown[0])} (known: "
                         f"{', '.join(FIGURES)})")
    if not data:
        raise InputError(f"{where}: the budget sets no limit (keys: {', '.join(FIGURES)})")
    no_oom = data.get("no_oom")
    if no_oom is not None and not isinstance(no_oom, bool):
        raise InputError(f"{where}: no_oom is true or false")
    share = data.get("cached_share")
    if share is not None and (isinstance(share, bool) or not isinstance(share, int | float)
                              or not 0 <= share <= 1):
        raise InputError(f"{where}: cached_share is a share of reserved, from 0 to 1")
    return Budget(
        no_oom=no_oom,
        peak_allocated=_size(data, "peak_allocated", where),
        peak_reserved=_size(data, "peak_reserved", where),
        cached_share=None if share is None else float(share),
        families=_table(data, "families", where, _size_value),
        chunks=_table(data, "chunks", where, _count_value),
    )


def _size(data: Mapping[str, Any], key: str, where: str) -> int | None:
    return None if key not in data else _size_value(data[key], f"{where}: {key}")


def _size_value(value: Any, what: str) -> int:
    if not isinstance(value, str):
        raise InputError(f"{what}: a size with its unit, in quotes (e.g. \"20 GiB\")")
    try:
        return parse_bytes(value.replace(" ", ""))
    except ValueError as exc:
        raise InputError(f"{what}: {exc}") from None


def _count_value(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InputError(f"{what}: a count of blocks (a whole number, 0 or more)")
    if value > MAX_BUDGET_COUNT:
        raise InputError(f"{what}: a count past 2^63 ({len(str(value)):,} digits): no capture "
                         "holds it")
    return value


def _table(data: Mapping[str, Any], key: str, where: str, read: Any) -> dict[str, int] | None:
    if key not in data:
        return None
    table = data[key]
    if not isinstance(table, dict):
        raise InputError(f"{where}: [{key}] is a table of family = limit")
    out = {}
    for family, value in table.items():
        out[known_family(family, f"{where}: [{key}]")] = read(value, f"{where}: [{key}] {family}")
    return out


def known_family(family: str, where: str) -> str:
    """`family` if the vocabulary has it; else InputError naming it and the known ids. A typo
    would be a family that holds nothing, a budget always met (the pytest marker asks too)."""
    known = family_ids()
    if family not in known:
        raise InputError(f"{where} {quote(family)} is not a family (known: "
                         f"{', '.join(sorted(known))})")
    return family


def check(budget: Budget, shown: DeviceReport, reports: list[DeviceReport]) -> list[Check]:
    """Each line of `budget` against the device `shown` (its moment: the OOM, else the peak)
    and, for no_oom, every device of the capture (`reports`)."""
    out: list[Check] = []
    if budget.no_oom is not None and budget.no_oom:
        failed = [r for r in reports if r.oom is not None]
        out.append(Check(
            "no_oom", "no device runs out of memory",
            "; ".join(f"{r.device_name or f'cuda:{r.device}'} ran out of memory: a "
                      f"{fmt_bytes(r.oom.requested_bytes)} request" for r in failed
                      if r.oom is not None) or "no OOM recorded",
            not failed, "", 0, float(len(failed))))
    if budget.peak_allocated is not None:
        out.append(_at_most("peak_allocated", shown.peak_allocated_bytes,
                            budget.peak_allocated))
    if budget.peak_reserved is not None:
        out.append(_at_most("peak_reserved", _peak_reserved(shown), budget.peak_reserved))
    if budget.cached_share is not None:
        if shown.cached_unallocated_bytes is None or not shown.reserved_bytes:
            raise InputError("cached_share: this capture's cached memory is not known (no "
                             "segments, or a state that cannot exist): the budget cannot "
                             "be checked")
        share = shown.cached_unallocated_bytes / shown.reserved_bytes
        out.append(Check("cached_share", f"at most {budget.cached_share:.1%} of reserved",
                         f"{share:.1%} ({fmt_bytes(shown.cached_unallocated_bytes)} of "
                         f"{fmt_bytes(shown.reserved_bytes)})",
                         share <= budget.cached_share, "", budget.cached_share, share))
    held = {g.name: g for g in shown.groups}
    for family, limit in (budget.families or {}).items():
        g = held.get(family)
        bytes_ = g.bytes if g is not None else 0
        site = g.sites[0]["site"] if g is not None and g.sites else ""
        c = _at_most(f"family {family}", bytes_, limit)
        out.append(Check(c.name, c.limit, c.actual, c.ok,
                         "" if c.ok else f"top site: {site}" if site else "",
                         c.limit_value, c.actual_value))
    for family, most in (budget.chunks or {}).items():
        g = held.get(family)
        loops = g.chunks if g is not None else ()
        count = max((c["count"] for c in loops), default=0)
        loop = max(loops, key=lambda c: c["count"], default=None)
        out.append(Check(
            f"chunks {family}", f"at most {most} live copies of one chunk",
            f"{count} live copies" + (f" of {fmt_bytes(loop['chunk_size'])}" if loop else ""),
            count <= most, "" if count <= most or loop is None else f"site: {loop['site']}",
            float(most), float(count)))
    return out


def _at_most(name: str, actual: int, limit: int) -> Check:
    return Check(name, f"at most {fmt_bytes(limit)}", fmt_bytes(actual), actual <= limit, "",
                 float(limit), float(actual))


def _peak_reserved(r: DeviceReport) -> int:
    """The most reserved over the recorded window (the snapshot's when no history)."""
    if not r.reserved_known:
        raise InputError("peak_reserved: this capture records no reserved memory (a trace "
                         "or a heap capture): the budget cannot be checked")
    series = r.timeline.reserved
    return max(int(series.max()) if len(series) else 0, r.reserved_bytes)
