"""The words of the knobs a log's framework lines and messages support (issue 57, 69): what
each knob is called and changes, and the knobs a framework's own message names, are data
(`framework_knobs.toml`); this module only reads them and fills in a value."""

from __future__ import annotations

from functools import lru_cache

from snapana import data_file


class KnobWords(data_file.Table, frozen=True, kw_only=True):
    """``[knob.<id>]``: a knob as written (`{value}` where its value goes), what it changes
    and what it costs."""

    knob: str
    effect: str
    caveat: str


class Hint(data_file.Table, frozen=True, kw_only=True):
    """``[hint.<id>]``: a knob a framework's own message names."""

    knob: str  # a [knob.<id>]'s id
    source: str  # where the framework prints it
    says: str  # the message's words
    value: str  # the value said where the log gives no figure
    without: str  # why there is no figure


@data_file.schema("analysis/framework_knobs.toml")
class KnobsFile(data_file.Table, frozen=True, kw_only=True):
    knob: dict[str, KnobWords]
    hint: dict[str, Hint] = {}


@lru_cache(maxsize=1)
def _table() -> KnobsFile:
    return data_file.packaged("analysis/framework_knobs.toml", KnobsFile)


def knob(kid: str, value: str, why: str) -> tuple[str, str]:
    """Knob `kid` with its value, and why the figures support it (with its cost)."""
    words = _table().knob[kid]
    return (words.knob.format(value=value), f"{words.effect} — {why} (cost: {words.caveat})")


def flag(kid: str) -> str:
    """The knob's name without its value ('--gpu-memory-utilization'): two offers of one
    knob, one with a value, are one knob."""
    return _table().knob[kid].knob.split("{", 1)[0].strip()


def named(hid: str, value: str | None = None, how: str = "") -> tuple[str, str]:
    """The knob a framework's own message names (`[hint.<hid>]`), with `value` where the
    log's figures give one (`how`: from which, and the arithmetic), else the hint's own
    direction (its message gives no figure)."""
    hint = _table().hint[hid]
    why = f"the framework's own message names it ('{hint.says}')"
    why += f"; the value: {how}" if value is not None else f"; {hint.without}"
    return knob(hint.knob, value if value is not None else hint.value, why)
