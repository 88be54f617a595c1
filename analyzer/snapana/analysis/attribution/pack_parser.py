"""Rule files: validation and compilation to fast matchers.

Rules are data (TOML). Each file is a *pack*; the built-in packs live in ``packs/`` (one
per framework) and users add their own files. A pack holds everything about its framework:
how to detect it in a capture (``[pack] markers``), its ``[[rule]]`` and ``[[phase_rule]]``
entries, its ``[[knob]]`` entries and ``[[example]]`` stacks with the family they must get.
The schema is :mod:`.pack_schema`'s structs (``packs/README.md`` is generated from them);
this module decodes a pack into them and checks the rest: an unknown field, an unknown
family, phase or cause, a bad regular expression or a malformed value is a
:class:`RuleError` whose message is one line naming the file, the path in it, the entry and
the problem — a rule file is user input and must never produce a traceback.

Everything that can be computed ahead of matching is: regexes are compiled, literal
function names are kept as sets (so a pattern finds its candidate frames by dictionary
lookup), sizes are parsed to integers.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import msgspec

from snapana import data_file
from snapana.caching_allocator import ALLOCATOR_SETTINGS, BLOCK_STATES, normalize_state
from snapana.errors import InputError
from snapana.limits import MAX_BYTES, MAX_PACK_BYTES, toml_too_deep
from snapana.sources._io import first_line, read_small_text
from snapana.units import parse_bytes

from . import pack_schema as schema
from .facts import fact_ids
from .families import WORKLOADS, cause_ids, family_ids, phase_ids
from .pack_schema import KNOB_COSTS as KNOB_COSTS  # re-exported: the knob table reads it here
from .stack import BlockContext, NormStack, Stack, path_has_suffix

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10 needs the ``tomli`` backport
    import tomli as tomllib

PHASES: tuple[str, ...] = phase_ids()
"""Phases :func:`infer_phase` can return (the ``[[phase]]`` table of ``packs/vocabulary.toml``)."""

#: Priority a rule gets when neither it nor its pack sets one. Framework packs sit above the
#: generic PyTorch pack (which sets a lower ``default_priority``); user files default higher
#: still so that a user rule overrides a built-in without having to know its number.
DEFAULT_PRIORITY = 100
USER_DEFAULT_PRIORITY = 150


class RuleError(ValueError):
    """A rule file is invalid. The message is one line: file, path in it (with the entry's
    id), problem."""


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
class BlockConditions:
    """A rule's conditions on the block itself (None: not tested): its pool kinds, its
    stream (``default`` / ``nondefault``), its states, its size bounds in bytes, whether it
    has no frames or no Python frames, whether the trace holds its alloc event."""

    pools: frozenset[str] | None
    stream: str | None
    states: frozenset[str] | None
    min_size: int | None
    max_size: int | None
    no_python_frames: bool | None
    no_frames: bool | None
    has_alloc_event: bool | None


#: The keys of `_conditions` that are a `BlockConditions`.
_BLOCK_KEYS = tuple(f.name for f in fields(BlockConditions))


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
    block: BlockConditions
    """What the block itself must be: its pool, stream, state, size, frames, alloc event."""
    phases: frozenset[str] | None
    annotation: re.Pattern[str] | None
    phase_hints: frozenset[str] | None = None
    """``phase_hint`` condition: the phase the caller established from the timeline
    (:attr:`BlockContext.phase_hint`), as opposed to the phase inferred from the stack."""

    @property
    def identifying(self) -> int:
        """How many conditions identify a site (frames, symbols, annotation): a rule with
        none of them is a pure context rule and only a near miss when one condition fails."""
        return len(self.frames) + (self.annotation is not None)



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

#: ``pool`` of an example -> the ``segment_pool_id`` its block gets
_EXAMPLE_POOLS = {"default": (0, 0), "mempool": (0, 1), "graph": (1, 0)}
_ENTRY_KINDS = {"rule": "rule", "phase_rule": "rule", "knob": "knob"}


class _Where:
    """Names the file, the path in it and the entry's id, so every error is one line a user
    can act on: ``packs/slime.toml: rule[3].frames[0].function (rule `slime.x`): ...``."""

    def __init__(self, source: str, pack: str, data: Mapping[str, Any]) -> None:
        self.source, self.pack, self.data = source, pack, data

    def fail(self, path: str, problem: str, text: str = "") -> RuleError:
        """The error at `path`; given the file's `text`, it names the line too."""
        one_line = " ".join(str(problem).split())
        entry = self._entry(path)
        where = f"{path} ({entry})" if entry else path
        return RuleError(f"{data_file.at(self.source, text, path)}: {where or '(top level)'}: "
                         f"{one_line}")

    def _entry(self, path: str) -> str:
        m = re.match(r"(\w+)\[(\d+)\]", path)
        if m is None or m[1] not in _ENTRY_KINDS:
            return ""
        entries = self.data.get(m[1])
        raw = entries[int(m[2])] if isinstance(entries, list) and int(m[2]) < len(entries) \
            else None
        entry_id = raw.get("id") if isinstance(raw, Mapping) else None
        if not isinstance(entry_id, str):
            return ""
        if m[1] != "knob" and not entry_id.startswith(self.pack + "."):
            entry_id = f"{self.pack}.{entry_id}"
        return f"{_ENTRY_KINDS[m[1]]} `{entry_id}`"


def _schema_error(exc: msgspec.ValidationError, where: _Where, text: str) -> RuleError:
    return where.fail(*schema.explain(exc), text)


def _names(value: str | Sequence[str] | None) -> tuple[str, ...]:
    """A field that takes one name or a list of them, as a tuple (absent: empty)."""
    if value is None:
        return ()
    return (value,) if isinstance(value, str) else tuple(value)


def _known(values: tuple[str, ...], known: Sequence[str], what: str, path: str,
           where: _Where) -> tuple[str, ...]:
    bad = [v for v in values if v not in known]
    if bad:
        raise where.fail(path, f"unknown {what} {bad[0]!r} (known: {', '.join(known)})")
    return values


def _regex(value: str, path: str, where: _Where) -> re.Pattern[str]:
    try:
        return re.compile(value)
    except re.error as exc:
        raise where.fail(path, f"invalid regex {value!r}: {exc}") from None


def parse_size(value: Any, where: _Where | None = None, path: str = "size") -> int:
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
    if where is None:
        raise ValueError(f"`{path}`: {problem}")
    raise where.fail(path, problem)


def _frame_pattern(raw: schema.FrameEntry, path: str, where: _Where) -> FramePattern:
    if not (raw.file or raw.file_re is not None or raw.function is not None
            or raw.function_re is not None or raw.symbol_re is not None):
        raise where.fail(path, "needs at least one of file, file_re, function, function_re, "
                               "symbol_re")
    functions = frozenset(_names(raw.function)) if raw.function is not None else None
    globbed = sorted(f for f in functions or () if set(f) & set("*?["))
    if globbed:  # names are exact: a glob would silently never match
        raise where.fail(f"{path}.function", f"names are exact, {globbed[0]!r} is a pattern: "
                                             "use `function_re`")
    symbol_re = _regex(raw.symbol_re, f"{path}.symbol_re", where) \
        if raw.symbol_re is not None else None
    if symbol_re is not None and (raw.file or raw.file_re is not None or functions is not None
                                  or raw.function_re is not None):
        raise where.fail(path, "`symbol_re` matches C++ frames and cannot be combined with "
                               "file/function")
    within = 1 if raw.within is None and raw.where == "innermost" else raw.within
    if within is not None and symbol_re is not None:
        raise where.fail(path, "`where`/`within` count Python frames and do not apply to "
                               "`symbol_re`")
    line_rank, line_rank_to = (raw.line_rank, None) if not isinstance(raw.line_rank, list) \
        else tuple(raw.line_rank)
    if line_rank is not None and line_rank_to is not None \
            and (line_rank < 0) == (line_rank_to < 0) and line_rank > line_rank_to:
        raise where.fail(f"{path}.line_rank", f"range {raw.line_rank!r} is empty (first > last)")
    if raw.min_sites is not None and line_rank is None:
        raise where.fail(f"{path}.min_sites", "only makes sense with `line_rank`")
    if line_rank is not None and within != 1:
        raise where.fail(f"{path}.line_rank", "ranks the lines a function allocates from: it "
                                              'needs where = "innermost"')
    pat = FramePattern(
        file=raw.file.replace("\\", "/").lstrip("/") if raw.file else None,
        file_re=_regex(raw.file_re, f"{path}.file_re", where) if raw.file_re is not None
        else None,
        functions=functions,
        function_re=_regex(raw.function_re, f"{path}.function_re", where)
        if raw.function_re is not None else None,
        symbol_re=symbol_re,
        line_lt=raw.line_lt,
        line_ge=raw.line_ge,
        line_rank=line_rank,
        line_rank_to=line_rank_to,
        min_sites=raw.min_sites or 1,
        within=within,
        max_gap=raw.max_gap,
        outermost=raw.outermost,
    )
    return _with_text(pat, raw)


def _with_text(pat: FramePattern, raw: schema.FrameEntry) -> FramePattern:
    if pat.symbol_re is not None:
        text = f"C++ frame /{pat.symbol_re.pattern}/"
    else:
        if pat.functions is not None:
            fn = "|".join(sorted(pat.functions))
        elif pat.function_re is not None:
            fn = f"/{pat.function_re.pattern}/"
        else:
            fn = "*"
        place = raw.file or (f"/{raw.file_re}/" if raw.file_re is not None else None)
        text = f"`{fn}`" + (f" in `{place}`" if place else "")
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


def _choices(values: tuple[str, ...], allowed: Sequence[str], what: str, path: str,
             where: _Where) -> frozenset[str] | None:
    """A condition that names one or more values from a fixed vocabulary (None: absent)."""
    if not values:
        return None
    bad = set(values) - set(allowed)
    if bad:
        raise where.fail(path, f"unknown {what} {sorted(bad)[0]!r} (use one of {tuple(allowed)})")
    return frozenset(values)


def _conditions(raw: schema.RuleEntry | schema.PhaseRuleEntry, path: str,
                where: _Where) -> dict[str, Any]:
    out: dict[str, Any] = {
        key: tuple(_frame_pattern(f, f"{path}.{key}[{n}]", where)
                   for n, f in enumerate(getattr(raw, key)))
        for key in ("frames", "not_frames", "only_frames")}
    for n, pat in enumerate(out["only_frames"]):
        if pat.symbol_re is not None or pat.within is not None or pat.line_rank is not None \
                or pat.outermost:
            raise where.fail(f"{path}.only_frames[{n}]",
                             "`only_frames` entries name Python code by file and function only "
                             "(no symbol_re, where/within, line_rank or outermost)")
    out["pools"] = frozenset(_names(raw.pool)) if raw.pool is not None else None
    out["stream"] = raw.stream
    out["states"] = _choices(tuple(normalize_state(s) for s in _names(raw.state)), BLOCK_STATES,
                             "block state", f"{path}.state", where)
    out["phases"] = out["phase_hints"] = None  # a phase rule cannot test what it decides
    if isinstance(raw, schema.RuleEntry):
        out["phases"] = _choices(_names(raw.phase), PHASES, "phase", f"{path}.phase", where)
        out["phase_hints"] = _choices(_names(raw.phase_hint), PHASES, "phase_hint",
                                      f"{path}.phase_hint", where)
    out["annotation"] = _regex(raw.annotation, f"{path}.annotation", where) \
        if raw.annotation is not None else None
    for key in ("min_size", "max_size"):
        value = getattr(raw, key)
        out[key] = parse_size(value, where, f"{path}.{key}") if value is not None else None
    for key in ("no_python_frames", "no_frames", "has_alloc_event"):
        out[key] = getattr(raw, key)
    return out


def _grouped(cond: dict[str, Any]) -> dict[str, Any]:
    """`_conditions` as `Rule` takes them: those on the block itself as one
    `BlockConditions`."""
    block = BlockConditions(**{k: cond[k] for k in _BLOCK_KEYS})
    return {**{k: v for k, v in cond.items() if k not in _BLOCK_KEYS}, "block": block}


def _qualify(rule_id: str, pack: str) -> str:
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


def _load_toml(text: str, source: str, packaged: bool) -> dict[str, Any]:
    if not packaged and (deep := toml_too_deep(text)) is not None:
        raise RuleError(f"{source}: {deep}: not a rule pack")
    try:
        return tomllib.loads(text)
    except (tomllib.TOMLDecodeError, ValueError) as exc:  # ValueError: a 5,000-digit integer
        raise RuleError(f"{source}: TOML syntax error: {' '.join(str(exc).split())[:200]}"
                        ) from None


def parsed_packaged(files: Sequence[tuple[str, str]]) -> list[dict[str, Any]]:
    """The TOML of the packs shipped with snapana (`files`: name and text each) as data.
    tomllib, pure Python, takes ~70 ms of every run to read them; so what it read is kept
    in the user's cache as JSON (read in ~3 ms, `kept_packaged`). Kept only where JSON gives
    back exactly what tomllib gave (no dates, no non-finite numbers)."""
    from snapana import user_cache

    data = [_load_toml(text, f"packs/{name}", True) for name, text in files]
    encoded = msgspec.json.encode(data)
    if msgspec.json.decode(encoded) == data:
        user_cache.write_text(_kept_name(files), encoded.decode(), replaces="packs-*.json")
    return data


def kept_packaged(files: Sequence[tuple[str, str]]) -> list[dict[str, Any]] | None:
    """`parsed_packaged`'s data for `files` as the user's cache kept it (named by a hash of
    every name and text), or None where none is kept or it is not one dict per file. Not
    trusted: its digest only detects damage, so the caller compiles it like any pack and
    reads the TOML again where that fails (`engine.builtin_packs`)."""
    from snapana import user_cache

    cached = user_cache.read_text(_kept_name(files))
    if cached is None:
        return None
    try:
        data = msgspec.json.decode(cached, type=list[dict[str, Any]])
    except (msgspec.DecodeError, RecursionError):  # RecursionError: deep nesting
        return None
    return data if len(data) == len(files) else None


def _kept_name(files: Sequence[tuple[str, str]]) -> str:
    """The cache name of the packs `files` give: a hash of every name and text."""
    import hashlib

    digest = hashlib.sha256()
    for name, text in files:
        digest.update(f"{len(name)}:{name}{len(text)}:".encode() + text.encode())
    return f"packs-{digest.hexdigest()[:32]}.json"


def parse_pack_text(text: str, source: str, *, user: bool = False, order_start: int = 0,
                    packaged: bool = False, parsed: dict[str, Any] | None = None) -> Pack:
    """Parse and validate one pack's TOML text: header, rules, phase rules, knobs, examples.

    The schema (:mod:`.pack_schema`) checks types, required and unknown fields; this checks
    what needs the vocabulary and compiles. ``source`` names the file in error messages;
    ``order_start`` is the load order of the pack's first rule (ties between equal priorities
    go to the earlier one). ``packaged``: a file shipped with snapana, whose nesting depth the
    test suite checks once (`limits.toml_too_deep` guards input, not the package's own data).
    ``parsed``: the text's TOML already read (`parsed_packaged`).
    """
    data = parsed if parsed is not None else _load_toml(text, source, packaged)
    header = data.get("pack")
    raw_name = header.get("name") if isinstance(header, Mapping) else None
    where = _Where(source, raw_name if isinstance(raw_name, str) else Path(source).stem, data)
    try:
        spec = msgspec.convert(data, schema.PackFile)
    except msgspec.ValidationError as exc:
        raise _schema_error(exc, where, text) from None
    name = where.pack = spec.pack.name or Path(source).stem
    if not re.fullmatch(schema.NAME_PATTERN, name):
        raise where.fail("pack.name", f"must be a simple identifier, got {name!r}")
    markers = _names(spec.pack.markers)
    if not all(markers):
        raise where.fail("pack.markers", "entries must be non-empty path fragments")
    default_priority = spec.pack.default_priority
    if default_priority is None:
        default_priority = USER_DEFAULT_PRIORITY if user else DEFAULT_PRIORITY
    rules = [_family_rule(r, f"rule[{n}]", name, default_priority, where)
             for n, r in enumerate(spec.rule)]
    rules += [_phase_rule(r, f"phase_rule[{n}]", name, default_priority, where)
              for n, r in enumerate(spec.phase_rule)]
    rules = [replace(r, order=order_start + n) for n, r in enumerate(rules)]
    knobs = tuple(_knob(k, f"knob[{n}]", name, where) for n, k in enumerate(spec.knob))
    examples = tuple(_example(e, n, name, source, where) for n, e in enumerate(spec.example))
    return Pack(name, source, spec.pack.description, tuple(m.replace("\\", "/") for m in markers),
                tuple(rules), knobs, examples, spec.pack.memory)


def _family_rule(raw: schema.RuleEntry, path: str, pack: str, default_priority: int,
                 where: _Where) -> Rule:
    _known((raw.family,), family_ids(), "family", f"{path}.family", where)
    cond = _conditions(raw, path, where)
    if not any(v is not None and v != () for v in cond.values()):
        raise where.fail(path, "a rule needs at least one condition (frames, pool, state, ...)")
    return Rule(id=_qualify(raw.id, pack), kind="family", family=raw.family, label=raw.label,
                phase_out=None, priority=default_priority if raw.priority is None
                else raw.priority, order=0, source=where.source, description=raw.description,
                reason_text=raw.reason, **_grouped(cond))


def _phase_rule(raw: schema.PhaseRuleEntry, path: str, pack: str, default_priority: int,
                where: _Where) -> Rule:
    if raw.phase not in PHASES:
        raise where.fail(f"{path}.phase", f"unknown phase {raw.phase!r} (use one of {PHASES})")
    return Rule(id=_qualify(raw.id, pack), kind="phase", family=None,
                label=raw.phase if raw.label is None else raw.label, phase_out=raw.phase,
                priority=default_priority if raw.priority is None else raw.priority, order=0,
                source=where.source, description=raw.description, reason_text=raw.reason,
                **_grouped(_conditions(raw, path, where)))


def _simulated(values: tuple[str, ...], path: str, where: _Where) -> tuple[str, ...]:
    """`simulate`: allocator settings the model has rules for, as PyTorch would accept them."""
    from snapana.allocator_model import config

    if not values:
        return ()
    try:
        _, unsimulated = config.parse(values)
    except config.ConfError as exc:
        raise where.fail(path, str(exc)) from None
    if unsimulated:
        raise where.fail(path, f"the allocator model has no rule for {unsimulated[0]}")
    return values


def _knob(raw: schema.KnobEntry, path: str, pack: str, where: _Where) -> Knob:
    families = _known(_names(raw.families), family_ids(), "family", f"{path}.families", where)
    causes = _known(_names(raw.causes), cause_ids(), "cause", f"{path}.causes", where)
    if not families and not causes:
        raise where.fail(path, "a knob needs `families` or `causes` (what it acts on)")
    if raw.workload and raw.workload not in WORKLOADS:
        raise where.fail(f"{path}.workload", f"must be one of {WORKLOADS}, got {raw.workload!r}")
    facts = fact_ids()
    requires = _known(_names(raw.requires), facts, "fact", f"{path}.requires", where)
    return Knob(
        id=raw.id,
        framework=raw.framework or pack,
        knob=raw.knob,
        families=families,
        causes=causes,
        direction=raw.direction,
        effect=raw.effect,
        caveat=raw.caveat,
        phases=_known(_names(raw.phases), PHASES, "phase", f"{path}.phases", where),
        cost=raw.cost,
        workload=raw.workload,
        requires=requires,
        unless=_known(_names(raw.unless), facts, "fact", f"{path}.unless", where),
        unless_set=_known(_names(raw.unless_set), ALLOCATOR_SETTINGS, "allocator setting",
                          f"{path}.unless_set", where),
        simulate=_simulated(_names(raw.simulate), f"{path}.simulate", where),
        replay_decides=_replay_decides(raw, requires, f"{path}.replay_decides", where),
    )


def _replay_decides(raw: schema.KnobEntry, requires: tuple[str, ...], path: str,
                    where: _Where) -> tuple[str, ...]:
    """`replay_decides`: facts of the knob's own `requires`, and only with `simulate` (a
    replay needs allocator settings to run under)."""
    values = _names(raw.replay_decides)
    if values and not raw.simulate:
        raise where.fail(path, "needs `simulate` (the settings to replay)")
    outside = [v for v in values if v not in requires]
    if outside:
        raise where.fail(path, f"{outside[0]!r} is not in the knob's `requires`")
    return values


def _example_frame(raw: schema.ExampleFrame, path: str, where: _Where) -> tuple[str, str, int]:
    if raw.symbol is not None:
        if raw.file is not None or raw.function is not None:
            raise where.fail(path, "a `stack` entry is a C++ `symbol` or a Python `file` + "
                                   "`function`")
        return ("??", raw.symbol, raw.line)
    if raw.file is None or raw.function is None:
        missing = "file" if raw.file is None else "function"
        raise where.fail(f"{path}.{missing}", "missing required field (or give `symbol`)")
    if not (raw.file.endswith(".py") or raw.file.startswith("<")):
        raise where.fail(f"{path}.file", f"{raw.file!r} is not a Python frame (*.py or <...>); "
                                         "use `symbol`")
    return (raw.file, raw.function, raw.line)


def _example(raw: schema.ExampleEntry, n: int, pack: str, source: str,
             where: _Where) -> Example:
    path = f"example[{n}]"
    _known((raw.family,), family_ids(), "family", f"{path}.family", where)
    rule = raw.rule if raw.rule is None or "." in raw.rule else f"{pack}.{raw.rule}"
    for key in ("phase", "phase_hint"):
        value = getattr(raw, key)
        if value is not None and value not in PHASES:
            raise where.fail(f"{path}.{key}", f"unknown {key} {value!r} (use one of {PHASES})")
    state = normalize_state(raw.state)
    if state not in BLOCK_STATES:
        raise where.fail(f"{path}.state", f"unknown block state {state!r} "
                                          f"(use one of {BLOCK_STATES})")
    context = BlockContext(
        pool_id=_EXAMPLE_POOLS[raw.pool],
        stream=raw.stream,
        state=state,
        size=parse_size(raw.size, where, f"{path}.size"),
        has_alloc_event=raw.has_alloc_event,
        annotations=_names(raw.annotations),
        phase_hint=raw.phase_hint,
    )
    return Example(pack=pack, index=n, source=source,
                   stack=tuple(_example_frame(f, f"{path}.stack[{i}]", where)
                               for i, f in enumerate(raw.stack)),
                   context=context, family=raw.family, rule=rule, phase=raw.phase,
                   description=raw.description)


def read_pack(path: Path, *, user: bool, order_start: int) -> Pack:
    """Read and parse one pack file; unreadable files are a :class:`RuleError` too. Read as
    every input is (a regular file only: a FIFO named by `--rules` would block the read
    forever), up to MAX_PACK_BYTES."""
    try:
        text = read_small_text(Path(path), MAX_PACK_BYTES, "a rule pack")
    except InputError as exc:  # its words name the path
        raise RuleError(f"rule file {first_line(exc)}") from None
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
