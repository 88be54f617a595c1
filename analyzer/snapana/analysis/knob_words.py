"""The words of the knobs a log's framework lines and messages support (issue 57, 69): what
each knob is called and changes, and the knobs a framework's own message names, are data
(`framework_knobs.toml`); this module only reads them and fills in a value."""

from __future__ import annotations

import sys
from functools import lru_cache
from importlib import resources
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10 needs the ``tomli`` backport
    import tomli as tomllib


@lru_cache(maxsize=1)
def _table() -> dict[str, Any]:
    text = (resources.files(__package__) / "framework_knobs.toml").read_text(encoding="utf-8")
    return tomllib.loads(text)


def knob(kid: str, value: str, why: str) -> tuple[str, str]:
    """Knob `kid` with its value, and why the figures support it (with its cost)."""
    words = _table()["knob"][kid]
    return (words["knob"].format(value=value),
            f"{words['effect']} — {why} (cost: {words['caveat']})")


def flag(kid: str) -> str:
    """The knob's name without its value ('--gpu-memory-utilization'): two offers of one
    knob, one with a value, are one knob."""
    return str(_table()["knob"][kid]["knob"]).split("{", 1)[0].strip()


def named(hid: str, value: str | None = None, how: str = "") -> tuple[str, str]:
    """The knob a framework's own message names (`[hint.<hid>]`), with `value` where the
    log's figures give one (`how`: from which, and the arithmetic), else the hint's own
    direction (its message gives no figure)."""
    hint = _table()["hint"][hid]
    why = f"the framework's own message names it ('{hint['says']}')"
    why += f"; the value: {how}" if value is not None else f"; {hint['without']}"
    return knob(hint["knob"], value if value is not None else hint["value"], why)
