"""The words of the knobs a log's framework lines and messages support (issue 57, 69): what
each knob is called and changes, and the knobs a framework's own message names, are data
(`framework_knobs.toml`); this module only reads them and fills in a value."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import replace
from functools import lru_cache
from typing import Literal

from snapana import data_file
from snapana.log_model import Setting
from snapana.units import fmt_bytes


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


# ----- the settings a log prints (issue 69) ------------------------------------------------

class _SettingKnob(data_file.Table, frozen=True, kw_only=True):
    knobs: list[str] = []
    scales: Literal["request"] | None = None
    unset_is: str | None = None
    yields_to: str | None = None
    spent: list[str] = []
    when: dict[str, str] = {}  # other setting id -> the value (as shown) it must have
    alone: str | None = None  # a [knob.<id>] of framework_knobs.toml
    alone_yields_to: str | None = None  # a setting whose `alone` knob is offered instead


@data_file.schema("analysis/setting_knobs.toml")
class _SettingKnobs(data_file.Table, frozen=True, kw_only=True):
    setting: dict[str, _SettingKnob]


@lru_cache(maxsize=1)
def _setting_knobs() -> dict[str, _SettingKnob]:
    return data_file.packaged("analysis/setting_knobs.toml", _SettingKnobs).setting


#: A knob's value the figures did not give: its direction in words.
_PLACEHOLDER = re.compile(r"<([^<>]{1,60})>")
#: A knob's value as a step from the one set ('+0.05 or more').
_STEP = re.compile(r"\+([0-9]{1,3}\.[0-9]{1,4}) or more")
_DOWN = ("lower", "smaller", "fewer")


def _shown(v: int | float | bool | str) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


def _shows(s: Setting | None, value: str) -> bool:
    """Whether the log printed setting `s` with `value` (as shown)."""
    return s is not None and s.value is not None and _shown(s.value) == value


def _setting_for(knob: str, settings: Sequence[Setting]) -> tuple[Setting, _SettingKnob] | None:
    """The setting `knob` is the value of, with a value (one printed None takes its
    `unset_is` setting's, named as its own)."""
    table = _setting_knobs()
    by_id = {s.id: s for s in settings}
    for s in settings:
        words = table.get(s.id)
        if words is None or not any(knob.startswith(k) for k in words.knobs):
            continue
        if not all(_shows(by_id.get(o), v) for o, v in words.when.items()):
            continue
        if s.value is None and words.unset_is is not None:
            other = by_id.get(words.unset_is)
            if other is None or other.value is None:
                continue
            s = replace(s, value=other.value,
                        printed=f"None, so {other.name}'s {other.printed}")
        if s.value is not None:
            return s, words
    return None


def with_settings(knobs: Sequence[tuple[str, str]], settings: Sequence[Setting],
                  request: int | None = None, free: int | None = None
                  ) -> tuple[tuple[tuple[str, str], ...], tuple[tuple[str, str], ...]]:
    """`knobs` with the value the log's settings give each (`setting_knobs.toml`): what it
    was set to when the job failed, and the value to try where that and the failing
    request's figures give one (a setting the request grows in proportion to: current ×
    free / request); a knob whose change the settings show already made goes last and says
    so. Returns the knobs, and (knob text, setting id) for each one a setting changed."""
    out: list[tuple[str, str]] = []
    spent: list[tuple[str, str]] = []
    changed: list[tuple[str, str]] = []
    found = [_setting_for(knob, settings) for knob, _ in knobs]
    valued = [knob for (knob, _), f in zip(knobs, found, strict=True) if f is not None]
    for (knob, why), f in zip(knobs, found, strict=True):
        if f is None:
            out.append((knob, why))
            continue
        s, words = f
        assert s.value is not None
        now = _shown(s.value)
        where = f"{s.name} = {s.printed} in the log's settings (line {s.line}, {s.format})"
        if now in words.spent:
            # as the log printed it where the value read is not in it (an older key's value,
            # read as the setting it stands for: DeepSpeed's cpu_offload true)
            said = now if now.lower() in s.printed.lower() else s.printed
            text = f"{knob} (already set: {s.name}={said})"
            spent.append((text, f"{why}; {where}: this change was already made when it "
                                "failed"))
            changed.append((text, s.id))
            continue
        sized = words.yields_to is None or not any(k.startswith(words.yields_to)
                                                   for k in valued)
        text, how = _valued(knob, s, words, request if sized else None, free)
        out.append((text, f"{why}; {where}" + (f": {how}" if how else "")))
        changed.append((text, s.id))
    return tuple(out + spent), tuple(changed)


def share_knobs(settings: Sequence[Setting], request: int | None, free: int | None,
          capacity: int | None) -> tuple[tuple[str, str], ...]:
    """The budget knobs a log's settings alone support (`alone` in setting_knobs.toml), for
    a log whose other evidence gives no knob: an engine's share of the card (vLLM's
    gpu_memory_utilization, SGLang's mem_fraction_static, slime's
    --sglang-mem-fraction-static for its rollout engines) sizes the pool it keeps
    whatever it runs, so lowering the share by the failing request's shortfall over the
    card's capacity (rounded up to 0.01) leaves that many more bytes free. Without those
    three figures, or where the share cannot go that low, the knob is a bound below the
    value set. `with_settings` then adds the value set to each."""
    table = _setting_knobs()
    read = {s.id for s in settings if isinstance(s.value, float)}
    out: list[tuple[str, str]] = []
    for s in settings:
        words = table.get(s.id)
        if words is None or words.alone is None or not isinstance(s.value, float) \
                or words.alone_yields_to in read:
            continue
        why = (f"{s.name} = {s.printed} sizes the engine's pool on the card whatever it runs, "
               "and nothing else in the log names a knob")
        cond = ("if this engine shares the card that ran out and the OOM came after its pool "
                "was allocated (not in its start-up profiling run)")
        value = "<lower>"
        if request and free is not None and capacity and request > free:
            step = math.ceil((request - free) * 100 / capacity) / 100
            if s.value - step >= 0.05:
                value = f"{s.value - step:.2f}"
                why += (f": the request lacked {fmt_bytes(request - free)}, which is "
                        f"{step:.2f} of the {fmt_bytes(capacity)} card rounded up, so "
                        f"{s.value:g} − {step:.2f} = {value} leaves that much free")
        out.append(knob(words.alone, value, f"{why} — {cond}"))
    return tuple(out)


def _valued(knob: str, s: Setting, words: _SettingKnob, request: int | None,
            free: int | None) -> tuple[str, str]:
    """The knob's text with the setting's value in it, and the arithmetic of a value to try."""
    now = _shown(s.value)  # type: ignore[arg-type]
    cur = s.value
    if (words.scales == "request" and isinstance(cur, int) and not isinstance(cur, bool)
            and request and free is not None and request > free):
        to = cur * free // request
        if 1 <= to < cur:
            how = (f"the failing request ({fmt_bytes(request)}) grows with it: {cur:,} × "
                   f"{fmt_bytes(free)} free / {fmt_bytes(request)} = {to:,} (rounded down) "
                   "makes it fit what was free, if that micro-batch filled the setting")
            if knob.startswith("--") and " " not in knob:
                return f"{knob} {to} (now {now})", how
            return f"{knob} ({s.name} {to}, now {now})", how
    place = _PLACEHOLDER.search(knob)
    if place is not None:
        word = place.group(1)
        sign = ">" if word.startswith("higher") else "<" if word in _DOWN else None
        if sign is not None:
            return knob[:place.start()] + f"{sign} {now}" + knob[place.end():], ""
    step = _STEP.search(knob)
    if step is not None and isinstance(cur, float):
        at = f"{cur + float(step.group(1)):.2f} or more"
        return (knob[:step.start()] + at + knob[step.end():] + f" (now {now})",
                f"{now} + {step.group(1)}")
    return f"{knob} (now {_now(knob, s)})", ""


def _now(knob: str, s: Setting) -> str:
    """The value set, named where the knob's text does not start with that setting (a knob
    over several settings, "smaller max_completion_length / num_generations", or one the log
    printed under another name, vLLM's max_seq_len for --max-model-len)."""
    now = _shown(s.value)  # type: ignore[arg-type]
    name = s.name.rpartition(".")[2]
    own = knob.startswith((name, "--" + name.replace("_", "-")))
    return now if own else f"{s.name}={now}"
