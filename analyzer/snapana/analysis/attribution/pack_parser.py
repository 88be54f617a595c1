"""Rule files: schema, validation and compilation to fast matchers.

Rules are data (TOML). Each file is a *pack*; the built-in packs live in ``packs/`` (one
per framework) and users add their own files. A pack holds everything about its framework:
how to detect it in a capture (``[pack] markers``), its ``[[rule]]`` and ``[[phase_rule]]``
entries, its ``[[knob]]`` entries and ``[[example]]`` stacks with the family they must get.
The schema is documented in this package's ``__init__.py``; this module enforces
it: an unknown field, an unknown family, phase or cause, a bad regular expression or a
malformed value is a :class:`RuleError` whose message is one line naming the file, the entry
and the problem — a rule file is user input and must never produce a traceback.

Everything that can be computed ahead of matching is: regexes are compiled, literal
function names are kept as sets (so a pattern finds its candidate frames by dictionary
lookup), sizes are parsed to integers.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from snapana.caching_allocator import ALLOCATOR_SETTINGS, BLOCK_STATES, normalize_state
from snapana.limits import MAX_BYTES, toml_too_deep
from snapana.units import parse_bytes

from .facts import fact_ids
from .families import WORKLOADS, cause_ids, family_ids, phase_ids
from .stack import BlockContext, NormStack, Stack, path_has_suffix

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10 needs the ``tomli`` backport
    import tomli as tomllib

PHASES: tuple[str, ...] = phase_ids()
"""Phases :func:`infer_phase` can return (the ``[[phase]]`` table of ``packs/vocabulary.toml``)."""

POOL_KINDS = ("default", "mempool", "graph", "private")
"""``private`` means any non-default pool (``mempool`` or ``graph``)."""

STREAM_KINDS = ("default", "nondefault")

#: Priority a rule gets when neither it nor its pack sets one. Framework packs sit above the
#: generic PyTorch pack (which sets a lower ``default_priority``); user files default higher
#: still so that a user rule overrides a built-in without having to know its number.
DEFAULT_PRIORITY = 100
USER_DEFAULT_PRIORITY = 150


class RuleError(ValueError):
    """A rule file is invalid. The message is one line: file, rule id, problem."""


# --------------------------------------------------------------------------------------
# compiled forms


@dataclass(frozen=True)
class FramePattern:
    """One frame a rule looks for.

    Python-frame patterns use ``file`` (path suffix on whole components), ``file_re``
    (regex searched in the normalised path), ``function`` (exact names) and ``function_re``
    (regex that must match the *whole* name — never a substring, so a driver called
    ``run_forward_backward_step`` is not a ``forward`` frame). C++-frame patterns use
    ``symbol_re`` (regex searched in the demangled symbol, e.g.
    ``torch::autograd::Engine::thread_main``).
    """

    file: str | None = None
    file_re: re.Pattern[str] | None = None
    functions: frozenset[str] | None = None
    function_re: re.Pattern[str] | None = None
    symbol_re: re.Pattern[str] | None = None
    line_lt: int | None = None
    line_ge: int | None = None
    line_rank: int | None = None
    line_rank_to: int | None = None
    """With ``line_rank``: the last rank of an inclusive range (``line_rank = [0, -2]``: any
    allocating line of the function but its last one)."""
    min_sites: int = 1
    within: int | None = None
    """When set: the frame must be among the first ``within`` Python frames (C++ frames are
    not counted). ``where = "innermost"`` sets it to 1 unless given."""
    max_gap: int | None = None
    """At most this many Python frames between this frame and the previous pattern's
    (its caller's) frame."""
    outermost: bool = False
    """Only the outermost frame of the stack that matches ``file``/``function`` (or
    ``symbol_re``) is a candidate — ``forward`` of the top-level model rather than of a layer
    inside it; ``within`` and the line bounds then apply to that one frame."""
    text: str = ""
    """Human description, used in reasons and near-miss reports."""
    memo: dict[object, bool] = field(default_factory=dict, compare=False, hash=False, repr=False)
    """(path, name) or C++ symbol -> whether the line-independent checks hold. Paths and
    symbols repeat across a snapshot's stacks, so each regex runs once per distinct one."""

    def _static_ok(self, path: str, name: str) -> bool:
        if self.function_re is not None and not self.function_re.fullmatch(name):
            return False
        if self.file is not None and not path_has_suffix(path, self.file):
            return False
        return self.file_re is None or self.file_re.search(path) is not None

    def candidates(self, ns: NormStack) -> list[int]:
        """Indices (ascending = innermost first) of frames matching everything but the
        line rank and the sequence constraints."""
        frames = ns.frames
        memo = self.memo
        out: list[int] = []
        if self.symbol_re is not None:
            rx = self.symbol_re
            for i in ns.cpp:
                name = frames[i].name
                ok = memo.get(name)
                if ok is None:
                    ok = memo[name] = rx.search(name) is not None
                if ok:
                    out.append(i)
            return out[-1:] if self.outermost else out
        if self.functions is not None:
            idx: list[int] = []
            for name in self.functions:
                idx.extend(ns.by_name.get(name, ()))
            if len(self.functions) > 1:
                idx.sort()
        else:
            # path-only pattern: test each distinct (path, name) once, keep its frames
            idx = []
            for key, where in ns.by_key.items():
                ok = memo.get(key)
                if ok is None:
                    ok = memo[key] = self._static_ok(*key)
                if ok:
                    idx.extend(where)
            idx.sort()
        if self.outermost:
            # the outermost frame that matches file/function; within and line bounds then
            # apply to that frame alone
            for i in reversed(idx):
                f = frames[i]
                key = (f.path, f.name)
                ok = memo.get(key)
                if ok is None:
                    ok = memo[key] = self._static_ok(f.path, f.name)
                if ok:
                    idx = [i]
                    break
            else:
                return out
        for i in idx:
            f = frames[i]
            if self.within is not None and f.py_rank >= self.within:
                continue
            key = (f.path, f.name)
            ok = memo.get(key)
            if ok is None:
                ok = memo[key] = self._static_ok(f.path, f.name)
            if not ok:
                continue
            if self.line_lt is not None and not f.line < self.line_lt:
                continue
            if self.line_ge is not None and not f.line >= self.line_ge:
                continue
            out.append(i)
        return out


@dataclass(frozen=True)
class Rule:
    """A compiled rule (``kind == "family"``) or phase rule (``kind == "phase"``)."""

    id: str
    kind: str
    family: str | None
    label: str
    phase_out: str | None
    priority: int
    order: int
    source: str
    description: str
    reason_text: str | None
    frames: tuple[FramePattern, ...]
    not_frames: tuple[FramePattern, ...]
    only_frames: tuple[FramePattern, ...]
    """When non-empty: every Python frame of the stack matches one of these (and the stack
    has Python frames) — a stack made of nothing but the named code."""
    pools: frozenset[str] | None
    stream: str | None
    states: frozenset[str] | None
    phases: frozenset[str] | None
    annotation: re.Pattern[str] | None
    min_size: int | None
    max_size: int | None
    no_python_frames: bool | None
    no_frames: bool | None
    has_alloc_event: bool | None
    phase_hints: frozenset[str] | None = None
    """``phase_hint`` condition: the phase the caller established from the timeline
    (:attr:`BlockContext.phase_hint`), as opposed to the phase inferred from the stack."""

    @property
    def identifying(self) -> int:
        """How many conditions identify a site (frames, symbols, annotation): a rule with
        none of them is a pure context rule and only a near miss when one condition fails."""
        return len(self.frames) + (self.annotation is not None)


KNOB_DIRECTIONS = ("lowers", "raises", "bounds", "releases")
"""What a knob does to the families / causes it names: ``releases`` moves model state off
the GPU (offload), ``bounds`` caps a size without lowering the typical case."""

KNOB_COSTS = ("free", "compute", "communication", "quality")
"""What turning a knob costs: nothing that matters, extra compute (recompute, more or smaller
micro-batches, slower kernels or engines), extra communication (collectives, host <-> device
transfers), or it may change training quality / results (truncation, lower precision)."""


@dataclass(frozen=True)
class Knob:
    """A setting that changes a tensor family or an OOM cause (a pack's ``[[knob]]``)."""

    id: str
    framework: str
    """The framework whose use makes the knob apply: the pack's name unless the entry says
    otherwise; ``pytorch`` and ``any`` always apply."""
    knob: str
    families: tuple[str, ...]
    causes: tuple[str, ...]
    direction: str
    effect: str
    caveat: str
    phases: tuple[str, ...]
    """Only suggested when the OOM happened in one of these (empty: in any phase)."""
    cost: str
    """One of :data:`KNOB_COSTS`."""
    workload: str = ""
    """``training`` / ``inference``: only offered for a capture that does that (see
    `attribution.families.WORKLOADS`); empty: for either."""
    requires: tuple[str, ...] = ()
    """Facts (``attribution/evidence.toml`` ids, or `facts.COMPUTED_FACTS`) that must all hold
    in the capture for the knob to be offered: an optimizer of that kind, a process group."""
    unless: tuple[str, ...] = ()
    """Facts any of which means the knob would not act or would break the job."""
    unless_set: tuple[str, ...] = ()
    """Allocator settings (``allocator_settings`` keys) the knob turns on: not offered where
    the capture records them already on."""
    simulate: tuple[str, ...] = ()
    """PYTORCH_CUDA_ALLOC_CONF items (``expandable_segments:True``) that are this knob, for
    the allocator model to replay the recorded window under (`analysis.allocator_replay`):
    a knob with them is predicted, not only argued."""
    replay_decides: tuple[str, ...] = ()
    """Facts of `requires` that only argue what replaying `simulate` shows (free cache
    stranded in used segments, for expandable segments): where the recorded window is
    replayed to an OOM, the replay decides in their place, both ways."""


@dataclass(frozen=True)
class Example:
    """A stack with the family the rules must give it (a pack's ``[[example]]``), run by the
    test suite (and by :meth:`~snapana.analysis.attribution.RuleSet.check_examples` for user
    packs)."""

    pack: str
    index: int
    """Position among the pack's examples (0-based)."""
    source: str
    stack: Stack
    """Innermost first, as a snapshot stores it."""
    context: BlockContext
    family: str
    rule: str | None
    """When set, the id of the rule that must decide."""
    phase: str | None
    """When set, the phase that must be inferred."""
    description: str = ""

    @property
    def name(self) -> str:
        return f"{self.pack}[{self.index}]"


@dataclass(frozen=True)
class Pack:
    """Everything one pack file holds, compiled."""

    name: str
    source: str
    description: str
    markers: tuple[str, ...]
    """Path fragments that show the framework in use: a capture whose frames' paths contain
    one of them (``"slime/"``) gets this pack's knobs suggested."""
    rules: tuple[Rule, ...]
    knobs: tuple[Knob, ...]
    examples: tuple[Example, ...]
    memory: str = "device"
    """``[pack] memory``: the memory its family rules describe (one of MEMORY_KINDS); a
    host pack's rules never decide a GPU block, nor a GPU pack's a heap allocation."""


# --------------------------------------------------------------------------------------
# parsing

_PACK_KEYS = {"name", "description", "default_priority", "versions", "notes", "markers",
              "memory"}
#: What memory a pack's family rules describe: a GPU caching allocator's blocks ("device",
#: the default), a process's heap as memray records it ("host"), or both ("any").
MEMORY_KINDS = ("device", "host", "any")
_TOP_KEYS = {"pack", "rule", "phase_rule", "knob", "example"}
_KNOB_KEYS = {
    "id",
    "framework",
    "knob",
    "families",
    "causes",
    "direction",
    "effect",
    "caveat",
    "phases",
    "cost",
    "workload",
    "requires",
    "unless",
    "unless_set",
    "simulate",
    "replay_decides",
}
_EXAMPLE_KEYS = {
    "description",
    "family",
    "rule",
    "phase",
    "stack",
    "pool",
    "stream",
    "state",
    "size",
    "has_alloc_event",
    "annotations",
    "phase_hint",
}
_EXAMPLE_FRAME_KEYS = {"file", "function", "line", "symbol"}
#: ``pool`` of an example -> the ``segment_pool_id`` its block gets
_EXAMPLE_POOLS = {"default": (0, 0), "mempool": (0, 1), "graph": (1, 0)}
_COND_KEYS = {
    "frames",
    "not_frames",
    "only_frames",
    "pool",
    "stream",
    "state",
    "phase",
    "annotation",
    "min_size",
    "max_size",
    "no_python_frames",
    "no_frames",
    "has_alloc_event",
    "phase_hint",
}
_RULE_KEYS = {"id", "family", "label", "priority", "description", "reason"} | _COND_KEYS
# phase rules cannot test the phase they decide
# (nor the caller's phase_hint, which overrides every phase rule)
_PHASE_RULE_KEYS = {"id", "phase", "priority", "description", "reason", "label"} | (
    _COND_KEYS - {"phase", "phase_hint"}
)
_FRAME_KEYS = {
    "file",
    "file_re",
    "function",
    "function_re",
    "symbol_re",
    "line_lt",
    "line_ge",
    "line_rank",
    "min_sites",
    "where",
    "within",
    "max_gap",
    "outermost",
}

class _Ctx:
    """Carries file and entry (rule id, knob id, example) so every error message names both."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.what = "rule"
        self.rule = "<pack>"

    def fail(self, problem: str) -> RuleError:
        one_line = " ".join(str(problem).split())
        return RuleError(f"{self.source}: {self.what} `{self.rule}`: {one_line}")


def _as_list(value: Any, ctx: _Ctx, key: str, kind: type = str) -> list[Any]:
    items = value if isinstance(value, list) else [value]
    for v in items:
        if not isinstance(v, kind):
            raise ctx.fail(f"`{key}` must be a {kind.__name__} or a list of them, got {v!r}")
    if not items:
        raise ctx.fail(f"`{key}` is an empty list")
    return items


def _int(value: Any, ctx: _Ctx, key: str, minimum: int | None = None) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise ctx.fail(f"`{key}` must be an integer, got {value!r}")
    if minimum is not None and value < minimum:
        raise ctx.fail(f"`{key}` must be >= {minimum}, got {value}")
    return value


def _bool(value: Any, ctx: _Ctx, key: str) -> bool:
    if not isinstance(value, bool):
        raise ctx.fail(f"`{key}` must be true or false, got {value!r}")
    return value


def _regex(value: Any, ctx: _Ctx, key: str) -> re.Pattern[str]:
    if not isinstance(value, str):
        raise ctx.fail(f"`{key}` must be a string (a regular expression), got {value!r}")
    try:
        return re.compile(value)
    except re.error as exc:
        raise ctx.fail(f"invalid regex in `{key}` {value!r}: {exc}") from None


def parse_size(value: Any, ctx: _Ctx | None = None, key: str = "size") -> int:
    """Bytes from an integer byte count or a size string with a unit (``"512MiB"``,
    ``"1.5 GiB"``, ``"80GB"``), read by the product's one size parser."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < MAX_BYTES:
        return value
    problem = f'a byte count or a size like "512MiB", got {value!r}'
    if isinstance(value, str):
        try:
            return parse_bytes(value)
        except ValueError as exc:
            problem = str(exc)
    msg = f"`{key}`: {problem}"
    if ctx is None:
        raise ValueError(msg)
    raise ctx.fail(msg)


def _unknown_keys(table: Mapping[str, Any], allowed: set[str], ctx: _Ctx, what: str) -> None:
    extra = sorted(set(table) - allowed)
    if extra:
        raise ctx.fail(
            f"unknown field{'s' if len(extra) > 1 else ''} {', '.join(map(repr, extra))} in {what}"
            f" (allowed: {', '.join(sorted(allowed))})"
        )


def _choices(raw: Mapping[str, Any], key: str, allowed: Sequence[str], ctx: _Ctx, what: str,
             normalize: Any = None) -> frozenset[str] | None:
    """A condition that names one or more values from a fixed vocabulary (None: absent)."""
    if key not in raw:
        return None
    values = frozenset((normalize or str)(v) for v in _as_list(raw[key], ctx, key))
    bad = values - set(allowed)
    if bad:
        raise ctx.fail(f"unknown {what} {sorted(bad)[0]!r} (use one of {tuple(allowed)})")
    return values


def _frame_pattern(raw: Any, ctx: _Ctx, key: str) -> FramePattern:
    if not isinstance(raw, Mapping):
        raise ctx.fail(f"each entry of `{key}` must be a table, got {raw!r}")
    _unknown_keys(raw, _FRAME_KEYS, ctx, f"a `{key}` entry")
    if not {"file", "file_re", "function", "function_re", "symbol_re"} & set(raw):
        raise ctx.fail(
            f"a `{key}` entry needs at least one of file, file_re, function, function_re, symbol_re"
        )
    file = raw.get("file")
    if file is not None:
        if not isinstance(file, str) or not file:
            raise ctx.fail(f"`file` must be a non-empty path suffix, got {file!r}")
        file = file.replace("\\", "/").lstrip("/")
    functions = None
    if "function" in raw:
        functions = frozenset(_as_list(raw["function"], ctx, "function"))
        globbed = sorted(f for f in functions if set(f) & set("*?["))
        if globbed:  # names are exact: a glob would silently never match
            raise ctx.fail(f"`function` names are exact, {globbed[0]!r} is a pattern: use "
                           "`function_re`")
    symbol_re = _regex(raw["symbol_re"], ctx, "symbol_re") if "symbol_re" in raw else None
    if symbol_re is not None and {"file", "file_re", "function", "function_re"} & set(raw):
        raise ctx.fail("`symbol_re` matches C++ frames and cannot be combined with file/function")
    where = raw.get("where", "anywhere")
    if where not in ("anywhere", "innermost"):
        raise ctx.fail(f'`where` must be "anywhere" or "innermost", got {where!r}')
    within = _int(raw["within"], ctx, "within", 1) if "within" in raw else None
    if where == "innermost" and within is None:
        within = 1
    if within is not None and symbol_re is not None:
        raise ctx.fail("`where`/`within` count Python frames and do not apply to `symbol_re`")
    line_rank = line_rank_to = None
    if "line_rank" in raw:
        lr = raw["line_rank"]
        if isinstance(lr, list):
            if len(lr) != 2:
                raise ctx.fail(f"`line_rank` must be an integer or a [first, last] pair: {lr!r}")
            line_rank = _int(lr[0], ctx, "line_rank")
            line_rank_to = _int(lr[1], ctx, "line_rank")
            if (line_rank < 0) == (line_rank_to < 0) and line_rank > line_rank_to:
                raise ctx.fail(f"`line_rank` range {lr!r} is empty (first > last)")
        else:
            line_rank = _int(lr, ctx, "line_rank")
    min_sites = _int(raw.get("min_sites", 1), ctx, "min_sites", 1)
    if "min_sites" in raw and line_rank is None:
        raise ctx.fail("`min_sites` only makes sense with `line_rank`")
    if line_rank is not None and within != 1:
        raise ctx.fail(
            '`line_rank` ranks the lines a function allocates from: it needs where = "innermost"'
        )
    pat = FramePattern(
        file=file,
        file_re=_regex(raw["file_re"], ctx, "file_re") if "file_re" in raw else None,
        functions=functions,
        function_re=(
            _regex(raw["function_re"], ctx, "function_re") if "function_re" in raw else None
        ),
        symbol_re=symbol_re,
        line_lt=_int(raw["line_lt"], ctx, "line_lt") if "line_lt" in raw else None,
        line_ge=_int(raw["line_ge"], ctx, "line_ge") if "line_ge" in raw else None,
        line_rank=line_rank,
        line_rank_to=line_rank_to,
        min_sites=min_sites,
        within=within,
        max_gap=_int(raw["max_gap"], ctx, "max_gap", 0) if "max_gap" in raw else None,
        outermost=_bool(raw["outermost"], ctx, "outermost") if "outermost" in raw else False,
    )
    return _with_text(pat, raw)


def _with_text(pat: FramePattern, raw: Mapping[str, Any]) -> FramePattern:
    if pat.symbol_re is not None:
        text = f"C++ frame /{pat.symbol_re.pattern}/"
    else:
        if pat.functions is not None:
            fn = "|".join(sorted(pat.functions))
        elif pat.function_re is not None:
            fn = f"/{pat.function_re.pattern}/"
        else:
            fn = "*"
        where = raw.get("file") or (f"/{raw['file_re']}/" if "file_re" in raw else None)
        text = f"`{fn}`" + (f" in `{where}`" if where else "")
        if pat.within is not None:
            text += f" (within innermost {pat.within} Python frame{'s' if pat.within > 1 else ''})"
        if pat.line_rank is not None:
            if pat.line_rank_to is not None:
                text += f" (line rank {pat.line_rank}..{pat.line_rank_to})"
            else:
                text += f" (line rank {pat.line_rank})"
    if pat.outermost:
        text += " (outermost such frame)"
    object.__setattr__(pat, "text", text)
    return pat


def _conditions(raw: Mapping[str, Any], ctx: _Ctx, allow_phase: bool) -> dict[str, Any]:
    out: dict[str, Any] = {}
    frames = raw.get("frames", [])
    if not isinstance(frames, list):
        raise ctx.fail("`frames` must be an array of tables ([[rule.frames]] or frames = [{...}])")
    out["frames"] = tuple(_frame_pattern(f, ctx, "frames") for f in frames)
    not_frames = raw.get("not_frames", [])
    if not isinstance(not_frames, list):
        raise ctx.fail("`not_frames` must be an array of tables")
    out["not_frames"] = tuple(_frame_pattern(f, ctx, "not_frames") for f in not_frames)
    only = raw.get("only_frames", [])
    if not isinstance(only, list):
        raise ctx.fail("`only_frames` must be an array of tables")
    out["only_frames"] = tuple(_frame_pattern(f, ctx, "only_frames") for f in only)
    for pat in out["only_frames"]:
        if pat.symbol_re is not None or pat.within is not None or pat.line_rank is not None \
                or pat.outermost:
            raise ctx.fail("`only_frames` entries name Python code by file and function only "
                           "(no symbol_re, where/within, line_rank or outermost)")
    out["pools"] = _choices(raw, "pool", POOL_KINDS, ctx, "pool kind")
    stream = raw.get("stream")
    if stream is not None and stream not in STREAM_KINDS:
        raise ctx.fail(f"`stream` must be one of {STREAM_KINDS}, got {stream!r}")
    out["stream"] = stream
    out["states"] = _choices(raw, "state", BLOCK_STATES, ctx, "block state",
                             normalize=normalize_state)
    out["phases"] = _choices(raw, "phase", PHASES, ctx, "phase") if allow_phase else None
    out["phase_hints"] = _choices(raw, "phase_hint", PHASES, ctx, "phase_hint")
    out["annotation"] = (
        _regex(raw["annotation"], ctx, "annotation") if "annotation" in raw else None
    )
    out["min_size"] = parse_size(raw["min_size"], ctx, "min_size") if "min_size" in raw else None
    out["max_size"] = parse_size(raw["max_size"], ctx, "max_size") if "max_size" in raw else None
    for key in ("no_python_frames", "no_frames", "has_alloc_event"):
        out[key] = _bool(raw[key], ctx, key) if key in raw else None
    return out


_ID_RE = r"[A-Za-z0-9_][A-Za-z0-9_.\-]*"


def _qualify(rule_id: Any, pack: str, ctx: _Ctx) -> str:
    if not isinstance(rule_id, str) or not re.fullmatch(_ID_RE, rule_id):
        raise ctx.fail(f'`id` must be a dotted name like "{pack}.my_rule", got {rule_id!r}')
    return rule_id if rule_id.startswith(pack + ".") else f"{pack}.{rule_id}"


def parse_pack(
    text: str, source: str, *, user: bool = False, order_start: int = 0
) -> tuple[str, list[Rule]]:
    """Parse one pack's TOML text into compiled rules (family rules and phase rules).

    ``source`` names the file in error messages. Returns ``(pack_name, rules)``; the whole
    pack (markers, knobs, examples too) is :func:`parse_pack_text`'s.
    """
    pack = parse_pack_text(text, source, user=user, order_start=order_start)
    return pack.name, list(pack.rules)


def parse_pack_text(text: str, source: str, *, user: bool = False, order_start: int = 0) -> Pack:
    """Parse and validate one pack's TOML text: header, rules, phase rules, knobs, examples.

    ``source`` names the file in error messages; ``order_start`` is the load order of the
    pack's first rule (ties between equal priorities go to the earlier one).
    """
    ctx = _Ctx(source)
    if (deep := toml_too_deep(text)) is not None:
        raise RuleError(f"{source}: {deep}: not a rule pack")
    try:
        data = tomllib.loads(text)
    except (tomllib.TOMLDecodeError, ValueError) as exc:  # ValueError: a 5,000-digit integer
        raise RuleError(f"{source}: TOML syntax error: {' '.join(str(exc).split())[:200]}"
                        ) from None
    _unknown_keys(data, _TOP_KEYS, ctx, "the file (top level)")
    pack_raw = data.get("pack", {})
    if not isinstance(pack_raw, Mapping):
        raise ctx.fail("`pack` must be a table")
    _unknown_keys(pack_raw, _PACK_KEYS, ctx, "[pack]")
    name = pack_raw.get("name", Path(source).stem)
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_\-]+", name):
        raise ctx.fail(f"pack `name` must be a simple identifier, got {name!r}")
    description = pack_raw.get("description", "")
    if not isinstance(description, str):
        raise ctx.fail("`description` must be a string")
    markers: tuple[str, ...] = ()
    if "markers" in pack_raw:
        markers = tuple(_as_list(pack_raw["markers"], ctx, "markers"))
        if not all(markers):
            raise ctx.fail("`markers` entries must be non-empty path fragments")
        markers = tuple(m.replace("\\", "/") for m in markers)
    memory = pack_raw.get("memory", "device")
    if memory not in MEMORY_KINDS:
        raise ctx.fail(f"`memory` must be one of {MEMORY_KINDS}, got {memory!r}")
    default_priority = _int(
        pack_raw.get("default_priority", USER_DEFAULT_PRIORITY if user else DEFAULT_PRIORITY),
        ctx,
        "default_priority",
    )
    known_families = set(family_ids())
    rules: list[Rule] = []
    for kind, table_key in (("family", "rule"), ("phase", "phase_rule")):
        entries = data.get(table_key, [])
        if not isinstance(entries, list):
            raise ctx.fail(f"`{table_key}` must be an array of tables ([[{table_key}]])")
        for n, raw in enumerate(entries):
            ctx.rule = f"{table_key}[{n}]"
            if not isinstance(raw, Mapping):
                raise ctx.fail(f"[[{table_key}]] entries must be tables")
            if "id" in raw and isinstance(raw["id"], str):
                ctx.rule = raw["id"]
            if "id" not in raw:
                raise ctx.fail("missing required field `id`")
            rule_id = _qualify(raw["id"], name, ctx)
            ctx.rule = rule_id
            if kind == "family":
                _unknown_keys(raw, _RULE_KEYS, ctx, "[[rule]]")
                for req in ("family", "label"):
                    if req not in raw:
                        raise ctx.fail(f"missing required field `{req}`")
                family = raw["family"]
                if family not in known_families:
                    raise ctx.fail(
                        f"unknown family {family!r} (known: {', '.join(sorted(known_families))})"
                    )
                phase_out = None
            else:
                _unknown_keys(raw, _PHASE_RULE_KEYS, ctx, "[[phase_rule]]")
                if "phase" not in raw:
                    raise ctx.fail("missing required field `phase`")
                phase_out = raw["phase"]
                if phase_out not in PHASES:
                    raise ctx.fail(f"unknown phase {phase_out!r} (use one of {PHASES})")
                family = None
            label = raw.get("label", phase_out or "")
            for key in ("label", "description", "reason"):
                if key in raw and not isinstance(raw[key], str):
                    raise ctx.fail(f"`{key}` must be a string")
            priority = _int(raw.get("priority", default_priority), ctx, "priority")
            cond = _conditions(raw, ctx, allow_phase=(kind == "family"))
            if kind == "family" and not any(cond[k] is not None and cond[k] != () for k in cond):
                raise ctx.fail("a rule needs at least one condition (frames, pool, state, ...)")
            rules.append(
                Rule(
                    id=rule_id,
                    kind=kind,
                    family=family,
                    label=label,
                    phase_out=phase_out,
                    priority=priority,
                    order=order_start + len(rules),
                    source=source,
                    description=raw.get("description", ""),
                    reason_text=raw.get("reason"),
                    **cond,
                )
            )
    knobs = tuple(_knobs(data, name, ctx))
    examples = tuple(_examples(data, name, source, ctx))
    return Pack(name, source, description, markers, tuple(rules), knobs, examples, memory)


def _entries(data: Mapping[str, Any], key: str, ctx: _Ctx) -> list[Mapping[str, Any]]:
    entries = data.get(key, [])
    if not isinstance(entries, list):
        raise ctx.fail(f"`{key}` must be an array of tables ([[{key}]])")
    for raw in entries:
        if not isinstance(raw, Mapping):
            raise ctx.fail(f"[[{key}]] entries must be tables")
    return entries


def _string(raw: Mapping[str, Any], key: str, ctx: _Ctx, default: str | None = None) -> str:
    if key not in raw:
        if default is None:
            raise ctx.fail(f"missing required field `{key}`")
        return default
    value = raw[key]
    if not isinstance(value, str):
        raise ctx.fail(f"`{key}` must be a string, got {value!r}")
    return value


def _ids(raw: Mapping[str, Any], key: str, known: Sequence[str], what: str, ctx: _Ctx) -> tuple:
    if key not in raw:
        return ()
    values = _as_list(raw[key], ctx, key)
    bad = [v for v in values if v not in known]
    if bad:
        raise ctx.fail(f"unknown {what} {bad[0]!r} (known: {', '.join(known)})")
    return tuple(values)


def _simulated(raw: Mapping[str, Any], ctx: _Ctx) -> tuple[str, ...]:
    """`simulate`: allocator settings the model has rules for, as PyTorch would accept them."""
    from snapana.allocator_model import config

    if "simulate" not in raw:
        return ()
    values = tuple(str(v) for v in _as_list(raw["simulate"], ctx, "simulate"))
    try:
        _, unsimulated = config.parse(values)
    except config.ConfError as exc:
        raise ctx.fail(f"`simulate`: {exc}") from None
    if unsimulated:
        raise ctx.fail(f"`simulate`: the allocator model has no rule for {unsimulated[0]}")
    return values


def _knobs(data: Mapping[str, Any], pack: str, ctx: _Ctx) -> list[Knob]:
    out: list[Knob] = []
    ctx.what = "knob"
    for n, raw in enumerate(_entries(data, "knob", ctx)):
        ctx.rule = raw["id"] if isinstance(raw.get("id"), str) else f"knob[{n}]"
        _unknown_keys(raw, _KNOB_KEYS, ctx, "[[knob]]")
        knob_id = _string(raw, "id", ctx)
        if not re.fullmatch(_ID_RE, knob_id):
            raise ctx.fail(f'`id` must be a dotted name like "{pack}.my_knob", got {knob_id!r}')
        framework = _string(raw, "framework", ctx, pack)
        if not re.fullmatch(r"[A-Za-z0-9_\-]+", framework):
            raise ctx.fail(f"`framework` must be a simple identifier, got {framework!r}")
        families = _ids(raw, "families", family_ids(), "family", ctx)
        causes = _ids(raw, "causes", cause_ids(), "cause", ctx)
        if not families and not causes:
            raise ctx.fail("a knob needs `families` or `causes` (what it acts on)")
        direction = _string(raw, "direction", ctx)
        if direction not in KNOB_DIRECTIONS:
            raise ctx.fail(f"`direction` must be one of {KNOB_DIRECTIONS}, got {direction!r}")
        cost = _string(raw, "cost", ctx)
        if cost not in KNOB_COSTS:
            raise ctx.fail(f"`cost` must be one of {KNOB_COSTS}, got {cost!r}")
        workload = _string(raw, "workload", ctx, "")
        if workload and workload not in WORKLOADS:
            raise ctx.fail(f"`workload` must be one of {WORKLOADS}, got {workload!r}")
        out.append(
            Knob(
                id=knob_id,
                framework=framework,
                knob=_string(raw, "knob", ctx),
                families=families,
                causes=causes,
                direction=direction,
                effect=_string(raw, "effect", ctx),
                caveat=_string(raw, "caveat", ctx, ""),
                phases=_ids(raw, "phases", PHASES, "phase", ctx),
                cost=cost,
                workload=workload,
                requires=_ids(raw, "requires", fact_ids(), "fact", ctx),
                unless=_ids(raw, "unless", fact_ids(), "fact", ctx),
                unless_set=_ids(raw, "unless_set", ALLOCATOR_SETTINGS, "allocator setting",
                                ctx),
                simulate=_simulated(raw, ctx),
                replay_decides=_replay_decides(raw, ctx),
            )
        )
    return out


def _replay_decides(raw: Mapping[str, Any], ctx: _Ctx) -> tuple[str, ...]:
    """`replay_decides`: facts of the knob's own `requires`, and only with `simulate` (a
    replay needs allocator settings to run under)."""
    values = _ids(raw, "replay_decides", fact_ids(), "fact", ctx)
    if values and "simulate" not in raw:
        raise ctx.fail("`replay_decides` needs `simulate` (the settings to replay)")
    requires = _as_list(raw["requires"], ctx, "requires") if "requires" in raw else []
    outside = [v for v in values if v not in requires]
    if outside:
        raise ctx.fail(f"`replay_decides`: {outside[0]!r} is not in the knob's `requires`")
    return values


def _example_frame(raw: Any, ctx: _Ctx) -> tuple[str, str, int]:
    if not isinstance(raw, Mapping):
        raise ctx.fail(f"each entry of `stack` must be a table, got {raw!r}")
    _unknown_keys(raw, _EXAMPLE_FRAME_KEYS, ctx, "a `stack` entry")
    line = _int(raw.get("line", 0), ctx, "line", 0)
    if "symbol" in raw:
        if {"file", "function"} & set(raw):
            raise ctx.fail("a `stack` entry is a C++ `symbol` or a Python `file` + `function`")
        return ("??", _string(raw, "symbol", ctx), line)
    file = _string(raw, "file", ctx)
    if not (file.endswith(".py") or file.startswith("<")):
        raise ctx.fail(f"`file` {file!r} is not a Python frame (*.py or <...>); use `symbol`")
    return (file, _string(raw, "function", ctx), line)


def _examples(data: Mapping[str, Any], pack: str, source: str, ctx: _Ctx) -> list[Example]:
    out: list[Example] = []
    ctx.what = "example"
    for n, raw in enumerate(_entries(data, "example", ctx)):
        ctx.rule = f"{pack}[{n}]"
        _unknown_keys(raw, _EXAMPLE_KEYS, ctx, "[[example]]")
        family = _string(raw, "family", ctx)
        if family not in family_ids():
            raise ctx.fail(f"unknown family {family!r} (known: {', '.join(family_ids())})")
        rule = None
        if "rule" in raw:
            rule = raw["rule"]
            if not isinstance(rule, str) or not re.fullmatch(_ID_RE, rule):
                raise ctx.fail(f'`rule` must be a rule id like "{pack}.my_rule", got {rule!r}')
            if "." not in rule:
                rule = f"{pack}.{rule}"
        phase = _string(raw, "phase", ctx) if "phase" in raw else None
        if phase is not None and phase not in PHASES:
            raise ctx.fail(f"unknown phase {phase!r} (use one of {PHASES})")
        stack_raw = raw.get("stack", [])
        if not isinstance(stack_raw, list):
            raise ctx.fail("`stack` must be an array of frames, innermost first")
        stack = tuple(_example_frame(f, ctx) for f in stack_raw)
        pool = _string(raw, "pool", ctx, "default")
        if pool not in _EXAMPLE_POOLS:
            raise ctx.fail(f"`pool` must be one of {tuple(_EXAMPLE_POOLS)}, got {pool!r}")
        state = normalize_state(_string(raw, "state", ctx, BLOCK_STATES[0]))
        if state not in BLOCK_STATES:
            raise ctx.fail(f"unknown block state {state!r} (use one of {BLOCK_STATES})")
        phase_hint = _string(raw, "phase_hint", ctx) if "phase_hint" in raw else None
        if phase_hint is not None and phase_hint not in PHASES:
            raise ctx.fail(f"unknown phase_hint {phase_hint!r} (use one of {PHASES})")
        has_alloc = raw.get("has_alloc_event", True)
        if has_alloc is not None:
            has_alloc = _bool(has_alloc, ctx, "has_alloc_event")
        context = BlockContext(
            pool_id=_EXAMPLE_POOLS[pool],
            stream=_int(raw.get("stream", 0), ctx, "stream", 0),
            state=state,
            size=parse_size(raw.get("size", "64MiB"), ctx, "size"),
            has_alloc_event=has_alloc,
            annotations=(
                tuple(_as_list(raw["annotations"], ctx, "annotations"))
                if "annotations" in raw
                else ()
            ),
            phase_hint=phase_hint,
        )
        out.append(
            Example(
                pack=pack,
                index=n,
                source=source,
                stack=stack,
                context=context,
                family=family,
                rule=rule,
                phase=phase,
                description=_string(raw, "description", ctx, ""),
            )
        )
    return out


def read_pack(path: Path, *, user: bool, order_start: int) -> Pack:
    """Read and parse one pack file; unreadable files are a :class:`RuleError` too."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise RuleError(f"{path}: cannot read rule file: {exc}") from None
    return parse_pack_text(text, str(path), user=user, order_start=order_start)


def check_unique(rules: Sequence[Rule], packs: Sequence[Pack] = ()) -> None:
    """Rule ids are unique across all loaded packs (explanations rely on it); so are knob
    ids (reports name a knob by its id)."""
    seen: dict[str, str] = {}
    for r in rules:
        key = f"{r.kind}:{r.id}"
        if key in seen:
            raise RuleError(
                f"{r.source}: rule `{r.id}`: duplicate rule id (already defined in {seen[key]})"
            )
        seen[key] = r.source
    for p in packs:
        for k in p.knobs:
            key = f"knob:{k.id}"
            if key in seen:
                raise RuleError(
                    f"{p.source}: knob `{k.id}`: duplicate knob id (already defined in {seen[key]})"
                )
            seen[key] = p.source
