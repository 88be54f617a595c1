"""The rules engine: one family (and a phase) per (stack, context), with an explanation.

Matching is first-match by priority (highest first; load order breaks ties, and every other
rule of the winning priority that also matched is reported in ``Decision.ties``). File order
never decides precedence between packs. Decisions are memoised by (stack, context key): the
key keeps only what a rule can tell apart — pool kind, default stream or not, state, whether
an alloc event exists, open annotations, phase hint and the size *band* between the size
thresholds rules use — so all blocks of one allocation site share one decision.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cached_property, lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from snapana.analysis.sites import short_path
from snapana.caching_allocator import normalize_state

from .families import UNKNOWN, VOCABULARY_FILE, family_label
from .pack_parser import (
    PHASES,
    Example,
    FramePattern,
    Knob,
    Pack,
    Rule,
    RuleError,
    check_unique,
    kept_packaged,
    parse_pack_text,
    parsed_packaged,
    read_pack,
)
from .stack import (
    BlockContext,
    NormStack,
    Stack,
    cpp_symbol,
    normalize_stack,
)

__all__ = [
    "Decision",
    "Explanation",
    "NearMiss",
    "RuleSet",
    "SiteIndex",
    "builtin_pack_names",
    "builtin_packs",
    "infer_phase",
    "load_rules",
]


@dataclass(frozen=True)
class Decision:
    """The family a block belongs to and why.

    ``matched_frames`` are indices into the stack (innermost first) of the frames the rule
    matched; ``ties`` are other rules of the same priority that matched too (a pack author
    should make one more specific); ``near_misses`` are rules of at least the winner's
    priority whose site conditions held but that failed on another condition
    (``"rule_id: failed condition"``), which is what a user needs to fix a rule.
    """

    family: str
    label: str
    rule_id: str | None
    matched_frames: tuple[int, ...]
    reason: str
    phase: str
    ties: tuple[str, ...] = ()
    near_misses: tuple[str, ...] = ()


@dataclass(frozen=True)
class NearMiss:
    """A rule where some conditions held and some failed."""

    rule_id: str
    outcome: str
    """The family (family rules) or phase (phase rules) the rule would have given."""
    priority: int
    held: tuple[str, ...]
    failed: tuple[str, ...]

    def __str__(self) -> str:
        return f"{self.rule_id}: failed {'; '.join(self.failed)}"


@dataclass(frozen=True)
class Explanation:
    """:meth:`RuleSet.explain`'s answer: the decision plus every nearly-matching rule."""

    decision: Decision
    phase_rule_id: str | None
    """The phase rule that set ``decision.phase`` (None: phase hint or nothing matched)."""
    near_misses: tuple[NearMiss, ...]
    phase_near_misses: tuple[NearMiss, ...]

    def __str__(self) -> str:
        lines = [
            f"family: {self.decision.family} ({self.decision.label})",
            f"phase: {self.decision.phase}"
            + (f" (rule `{self.phase_rule_id}`)" if self.phase_rule_id else ""),
            f"reason: {self.decision.reason}",
        ]
        if self.decision.ties:
            lines.append("ties: " + ", ".join(self.decision.ties))
        for nm in self.near_misses:
            lines.append(
                f"near miss `{nm.rule_id}` -> {nm.outcome} (priority {nm.priority}): "
                f"held {', '.join(nm.held) or '-'}; failed {', '.join(nm.failed)}"
            )
        return "\n".join(lines)


class SiteIndex:
    """Distinct source lines seen per (file, function) across a snapshot's stacks.

    ``line_rank`` rules need it: line numbers move between framework versions, but the
    *order* of two allocations inside one function does not (Megatron's buffer
    ``__init__`` allocates ``param_data`` before ``grad_data``), so a rule says "the earlier
    of the lines seen for this function" instead of naming a line number.

    Only *allocating* lines are recorded — lines where the function is the innermost Python
    frame — so a line that merely calls a helper does not shift the ranks.
    """

    def __init__(self, lines: dict[tuple[str, str], tuple[int, ...]]) -> None:
        self._lines = lines

    @classmethod
    def from_stacks(cls, stacks: Iterable[Stack]) -> SiteIndex:
        acc: dict[tuple[str, str], set[int]] = {}
        for stack in stacks:
            ns = _norm(stack)
            if ns.python:
                f = ns.frames[ns.python[0]]
                acc.setdefault((f.path, f.name), set()).add(f.line)
        return cls({k: tuple(sorted(v)) for k, v in acc.items()})

    def lines(self, path: str, name: str) -> tuple[int, ...]:
        return self._lines.get((path, name), ())


@lru_cache(maxsize=65536)
def _norm(stack: Stack) -> NormStack:
    return normalize_stack(stack)


_STDLIB_RE = re.compile(r"/lib/python3\.\d+/(?!site-packages/|dist-packages/)")


def _is_library_frame(path: str) -> bool:
    return (
        path.startswith("torch/")
        or "/torch/" in path
        or path.startswith("<")
        or _STDLIB_RE.search(path) is not None
    )


def innermost_user_frame(ns: NormStack) -> str | None:
    """``file:line name`` of the innermost Python frame outside torch and the standard
    library (falling back to the innermost Python frame); None without Python frames."""
    if not ns.python:
        return None
    pick = next((i for i in ns.python if not _is_library_frame(ns.frames[i].path)), ns.python[0])
    f = ns.frames[pick]
    return f"{short_path(f.path)}:{f.line} {f.name}"


_Check = tuple[str, bool, bool]  # (description, held, identifying)


def _tf(value: bool) -> str:
    return "true" if value else "false"


class RuleSet:
    """Compiled rules and phase rules, with memoised :meth:`classify`.

    Build it with :func:`load_rules`. :meth:`with_sites` returns a copy that knows the
    snapshot's lines per function (needed by ``line_rank`` rules). Not thread-safe: the memo
    and a per-stack candidate cache are plain dicts; use one RuleSet per thread.

    ``contents`` are the loaded packs themselves: their knobs, detection markers and
    examples (:attr:`knobs`, :attr:`markers`, :attr:`examples`) travel with the rules, so a
    user pack's knobs apply wherever its rules do.
    """

    def __init__(
        self,
        rules: Sequence[Rule],
        sites: SiteIndex | None = None,
        packs: Sequence[str] = (),
        *,
        contents: Sequence[Pack] = (),
        memory: str = "device",
    ) -> None:
        self.contents: tuple[Pack, ...] = tuple(contents)
        #: the memory the blocks classified are in ("device" or "host"): only the family
        #: rules of packs describing it (or any memory) decide (see `for_memory`)
        self.memory = memory
        self._all_rules = tuple(rules)
        pack_memory = {r.id: p.memory for p in self.contents for r in p.rules}
        key = lambda r: (-r.priority, r.order)  # noqa: E731 - tiny sort key
        self.rules: tuple[Rule, ...] = tuple(
            sorted((r for r in rules if r.kind == "family"
                    and pack_memory.get(r.id, "device") in (memory, "any")), key=key)
        )
        self.phase_rules: tuple[Rule, ...] = tuple(
            sorted((r for r in rules if r.kind == "phase"), key=key)
        )
        self.packs: tuple[str, ...] = tuple(packs)
        self.sites = sites
        thresholds: set[int] = set()
        for r in (*self.rules, *self.phase_rules):
            if r.block.min_size is not None:
                thresholds.add(r.block.min_size)
            if r.block.max_size is not None:
                thresholds.add(r.block.max_size + 1)
        self._size_thresholds = tuple(sorted(thresholds))
        self._memo: dict[tuple[Stack, tuple[object, ...]], Decision] = {}
        self._phase_memo: dict[tuple[Stack, tuple[object, ...]], tuple[str, str | None]] = {}
        self._annotation_memo: dict[tuple[str, ...], tuple[str | None, ...]] = {}
        # (stack being matched, id(pattern) -> candidates); patterns live as long as self
        self._cand_cache: list = [None, {}]

    # -- construction helpers ---------------------------------------------------------

    def with_sites(self, stacks: Iterable[Stack]) -> RuleSet:
        """A copy of this rule set that resolves ``line_rank`` against ``stacks``."""
        return RuleSet(
            self._all_rules,
            SiteIndex.from_stacks(stacks),
            self.packs,
            contents=self.contents,
            memory=self.memory,
        )

    def for_memory(self, memory: str) -> RuleSet:
        """This rule set for blocks in ``memory`` ("device": a GPU allocator's blocks, the
        default; "host": a process's heap): its family rules are those of the packs that
        describe that memory (``[pack] memory``) or any; phase rules, knobs and markers are
        kept (a stack's phase reads the same on either side)."""
        if memory == self.memory:
            return self
        return RuleSet(self._all_rules, self.sites, self.packs, contents=self.contents,
                       memory=memory)

    @cached_property
    def _name_index(self) -> dict[str, tuple[dict[str, frozenset[int]], frozenset[int]]]:
        """For the family rules and the phase rules ("family", "phase"): which rules a
        stack's Python function names make worth trying (name -> positions in the rule
        list) and the rules always tried. A rule whose every frame pattern names its
        functions (no symbol, no path alone) and that looks at no annotation can neither
        hold nor nearly hold (`_near_miss`'s cheap exit) on a stack with none of those
        names; each stack then tries a few dozen rules, not all of them."""
        out = {}
        for kind, rules in (("family", self.rules), ("phase", self.phase_rules)):
            index: dict[str, set[int]] = {}
            always: set[int] = set()
            for k, r in enumerate(rules):
                if (r.frames and r.annotation is None
                        and all(p.functions and p.symbol_re is None for p in r.frames)):
                    for p in r.frames:
                        for name in p.functions or ():
                            index.setdefault(name, set()).add(k)
                else:
                    always.add(k)
            out[kind] = ({n: frozenset(ks) for n, ks in index.items()}, frozenset(always))
        return out

    def _worth_trying(self, kind: str, ns: NormStack) -> set[int]:
        """Positions of the rules (of `kind`) that can hold or nearly hold on `ns`."""
        index, always = self._name_index[kind]
        live = set(always)
        for name in ns.by_name:
            hit = index.get(name)
            if hit is not None:
                live |= hit
        return live

    @cached_property
    def knobs(self) -> tuple[Knob, ...]:
        """Every pack's ``[[knob]]`` entries, in load order."""
        return tuple(k for p in self.contents for k in p.knobs)

    @cached_property
    def markers(self) -> dict[str, tuple[str, ...]]:
        """Framework (pack name) -> the path fragments that show it in use."""
        return markers_of(self.contents)

    @cached_property
    def examples(self) -> tuple[Example, ...]:
        """Every pack's ``[[example]]`` entries, in load order."""
        return tuple(e for p in self.contents for e in p.examples)

    def run_example(self, example: Example) -> Decision:
        """The decision for an example's stack and context, with the sites of its own stack
        indexed (as the Attributor indexes a snapshot's)."""
        memory = next((p.memory for p in self.contents if example in p.examples), "device")
        return (self.for_memory(memory).with_sites([example.stack])
                .classify(example.stack, example.context))

    def check_examples(self) -> list[str]:
        """One line per example whose stack does not get the family (rule, phase) it
        declares; empty when every example holds."""
        failures = []
        for ex in self.examples:
            d = self.run_example(ex)
            want = (ex.family, ex.rule or d.rule_id, ex.phase or d.phase)
            got = (d.family, d.rule_id, d.phase)
            if got != want:
                failures.append(
                    f"{ex.source}: example `{ex.name}`: expected {_outcome(*want)}, "
                    f"got {_outcome(*got)} ({d.reason})"
                )
        return failures

    def rule(self, rule_id: str) -> Rule:
        for r in (*self.rules, *self.phase_rules):
            if r.id == rule_id:
                return r
        raise KeyError(rule_id)

    @property
    def cache_size(self) -> int:
        return len(self._memo)

    # -- public API -------------------------------------------------------------------

    def context_key(self, ctx: BlockContext) -> tuple[object, ...]:
        """What of ``ctx`` can change a decision; the memo key besides the stack."""
        return (
            ctx.pool_kind,
            ctx.stream == 0,
            normalize_state(ctx.state),
            ctx.has_alloc_event,
            self.annotation_key(ctx.annotations),
            ctx.phase_hint,
            bisect_right(self._size_thresholds, ctx.size),
        )

    @cached_property
    def _annotation_patterns(self) -> tuple[re.Pattern[str], ...]:
        found: dict[str, re.Pattern[str]] = {}
        for r in (*self.rules, *self.phase_rules):
            if r.annotation is not None:
                found.setdefault(r.annotation.pattern, r.annotation)
        return tuple(found.values())

    def annotation_key(self, annotations: tuple[str, ...]) -> tuple[str | None, ...]:
        """What of the open annotations a decision can see: for each annotation pattern of
        the rules, the first open annotation it finds (rules test and quote no more). A
        thousand distinct `ProfilerStep#N` windows are then one key when no rule looks."""
        if not annotations:
            return ()
        hit = self._annotation_memo.get(annotations)
        if hit is None:
            hit = tuple(next((a for a in annotations if p.search(a)), None)
                        for p in self._annotation_patterns)
            self._annotation_memo[annotations] = hit
        return hit

    def size_bands(self, sizes: np.ndarray) -> np.ndarray:
        """The size band of each size (what ``context_key`` keeps of a size), vectorised."""
        return np.searchsorted(np.asarray(self._size_thresholds, dtype=np.int64), sizes,
                               side="right")

    def infer_phase(self, stack: Stack, ctx: BlockContext) -> str:
        """The phase of the allocation (one of :data:`PHASES`)."""
        return self._phase(stack, _norm(stack), ctx)[0]

    def classify(self, stack: Stack, ctx: BlockContext) -> Decision:
        """Exactly one family for (``stack``, ``ctx``); memoised."""
        key = (stack, self.context_key(ctx))
        hit = self._memo.get(key)
        if hit is None:
            hit = self._classify(stack, ctx)
            self._memo[key] = hit
        return hit

    def explain(self, stack: Stack, ctx: BlockContext) -> Explanation:
        """The decision plus every rule that nearly matched and which condition failed."""
        ns = _norm(stack)
        decision = self.classify(stack, ctx)
        phase, phase_rule = self._phase(stack, ns, ctx)
        near = tuple(
            nm
            for r in self.rules
            if r.id != decision.rule_id
            for nm in [self._near_miss(r, ns, ctx, phase)]
            if nm is not None
        )
        phase_near = tuple(
            nm
            for r in self.phase_rules
            if r.id != phase_rule
            for nm in [self._near_miss(r, ns, ctx, phase)]
            if nm is not None
        )
        return Explanation(decision, phase_rule, near, phase_near)

    # -- internals --------------------------------------------------------------------

    def _phase(self, stack: Stack, ns: NormStack, ctx: BlockContext) -> tuple[str, str | None]:
        if ctx.phase_hint in PHASES and ctx.phase_hint != "unknown":
            return ctx.phase_hint, None
        key = (stack, self.context_key(ctx))
        hit = self._phase_memo.get(key)
        if hit is None:
            hit = ("unknown", None)
            live = self._worth_trying("phase", ns)
            for k, r in enumerate(self.phase_rules):
                if k in live and self._matches(r, ns, ctx, "unknown") is not None:
                    hit = (r.phase_out or "unknown", r.id)
                    break
            self._phase_memo[key] = hit
        return hit

    def _classify(self, stack: Stack, ctx: BlockContext) -> Decision:
        ns = _norm(stack)
        phase, _ = self._phase(stack, ns, ctx)
        winner: Rule | None = None
        matched: tuple[int, ...] = ()
        ties: list[str] = []
        near: list[str] = []
        live = self._worth_trying("family", ns)
        for k, r in enumerate(self.rules):
            if winner is not None and r.priority < winner.priority:
                break
            if k not in live:
                continue
            m = self._matches(r, ns, ctx, phase)
            if m is None:
                nm = self._near_miss(r, ns, ctx, phase)
                if nm is not None:
                    near.append(str(nm))
                continue
            if winner is None:
                winner, matched = r, m
            else:
                ties.append(r.id)
        if winner is None:
            return self._no_match(ns, ctx, phase, tuple(near))
        return Decision(
            family=winner.family or UNKNOWN,
            label=winner.label,
            rule_id=winner.id,
            matched_frames=tuple(sorted(matched)),
            reason=self._reason(winner, ns, ctx, matched),
            phase=phase,
            ties=tuple(ties),
            near_misses=tuple(near),
        )

    def _no_match(
        self, ns: NormStack, ctx: BlockContext, phase: str, near: tuple[str, ...]
    ) -> Decision:
        user = innermost_user_frame(ns)
        if user is not None:
            why = f"no rule matched (innermost user frame: {user})"
        elif ns.frames:
            why = (
                "no rule matched (no Python frames; innermost C++ frame: "
                f"{cpp_symbol(ns.frames[0].name)})"
            )
        elif ctx.has_alloc_event is None:
            why = "no frames: no allocation history was recorded, so its origin is unknown"
        else:
            why = "no rule matched (no frames)"
        return Decision(
            family=UNKNOWN,
            label=f"{family_label(UNKNOWN)}: {why}",
            rule_id=None,
            matched_frames=(),
            reason=why,
            phase=phase,
            near_misses=near,
        )

    # matching -------------------------------------------------------------------------

    def _ctx_checks(
        self, r: Rule, ns: NormStack, ctx: BlockContext, phase: str, full: bool
    ) -> list[_Check] | None:
        """Context conditions, cheapest first. With ``full=False`` returns None on the first
        failure (the fast path); with ``full=True`` returns every check for explanations."""
        checks: list[_Check] = []
        b = r.block

        def add(desc: str, ok: bool, ident: bool = False) -> bool:
            checks.append((desc, ok, ident))
            return ok or full

        if b.no_frames is not None:
            ok = ns.empty == b.no_frames
            if not add(f"no_frames = {_tf(b.no_frames)} (block: {len(ns.frames)} frames)", ok):
                return None
        if b.no_python_frames is not None:
            ok = (not ns.has_python) == b.no_python_frames
            desc = f"no_python_frames = {_tf(b.no_python_frames)} (block: {len(ns.python)} Python)"
            if not add(desc, ok):
                return None
        if b.has_alloc_event is not None:
            ok = ctx.has_alloc_event is b.has_alloc_event
            have = "no trace" if ctx.has_alloc_event is None else _tf(ctx.has_alloc_event)
            if not add(f"has_alloc_event = {_tf(b.has_alloc_event)} (block: {have})", ok):
                return None
        if b.pools is not None:
            kind = ctx.pool_kind
            ok = kind in b.pools or ("private" in b.pools and kind != "default")
            if not add(f"pool is {'/'.join(sorted(b.pools))} (block: {kind} {ctx.pool_id})", ok):
                return None
        if b.stream is not None:
            ok = (ctx.stream == 0) == (b.stream == "default")
            if not add(f"{b.stream} stream (block: stream {ctx.stream})", ok):
                return None
        if b.states is not None:
            ok = normalize_state(ctx.state) in b.states
            if not add(f"state {'/'.join(sorted(b.states))} (block: {ctx.state})", ok):
                return None
        if b.min_size is not None:
            if not add(f"size >= {b.min_size} (block: {ctx.size})", ctx.size >= b.min_size):
                return None
        if b.max_size is not None:
            if not add(f"size <= {b.max_size} (block: {ctx.size})", ctx.size <= b.max_size):
                return None
        if r.phases is not None:
            if not add(f"phase {'/'.join(sorted(r.phases))} (block: {phase})", phase in r.phases):
                return None
        if r.phase_hints is not None:
            ok = ctx.phase_hint in r.phase_hints
            want = "/".join(sorted(r.phase_hints))
            desc = f"phase_hint {want} (block: {ctx.phase_hint or 'none'})"
            if not add(desc, ok):
                return None
        if r.annotation is not None:
            ok = any(r.annotation.search(a) for a in ctx.annotations)
            if not add(f"annotation /{r.annotation.pattern}/ open", ok, True):
                return None
        return checks

    def _candidates(self, p: FramePattern, ns: NormStack) -> tuple[list[int], str | None]:
        """Candidates for ``p`` including the line-rank filter; the second item says why
        candidates were dropped by the rank filter (for explanations). Cached for the stack
        being classified: matching and near-miss reporting ask for the same patterns."""
        cache = self._cand_cache
        if cache[0] is not ns:
            cache[0] = ns
            cache[1].clear()
        hit = cache[1].get(id(p))
        if hit is None:
            hit = cache[1][id(p)] = self._candidates_uncached(p, ns)
        return hit

    def _candidates_uncached(self, p: FramePattern, ns: NormStack) -> tuple[list[int], str | None]:
        cands = p.candidates(ns)
        if p.line_rank is None or not cands:
            return cands, None
        if self.sites is None:
            return [], "line_rank needs the snapshot's sites (RuleSet.with_sites)"
        out = []
        why = None
        for i in cands:
            f = ns.frames[i]
            lines = self.sites.lines(f.path, f.name) or (f.line,)
            lo = p.line_rank if p.line_rank >= 0 else len(lines) + p.line_rank
            hi = lo if p.line_rank_to is None else (
                p.line_rank_to if p.line_rank_to >= 0 else len(lines) + p.line_rank_to)
            have = lines.index(f.line) if f.line in lines else None
            if len(lines) < p.min_sites:
                why = f"only {len(lines)} line(s) seen in `{f.name}`, rule needs {p.min_sites}"
            elif have is not None and lo <= have <= hi:
                out.append(i)
            elif have is None:
                why = f"line {f.line} is not among the lines seen for `{f.name}`"
            else:
                why = f"line {f.line} is rank {have} of {len(lines)} in `{f.name}`"
        return out, why

    def _sequence(
        self, pats: tuple[FramePattern, ...], cands: list[list[int]], ns: NormStack
    ) -> tuple[int, ...] | None:
        """Indices for patterns listed caller -> callee: each caller strictly outside
        (a larger index than) its callee, within ``max_gap`` Python frames when set."""
        m = len(pats)

        def gap_ok(callee_i: int, caller_i: int, p: FramePattern) -> bool:
            if p.max_gap is None:
                return True
            a, b = ns.frames[callee_i], ns.frames[caller_i]
            if not (a.is_python and b.is_python):
                return True
            return b.py_rank - a.py_rank - 1 <= p.max_gap

        def search(k: int, inner: int) -> list[int] | None:
            # place pattern k (an outer one) given that pattern k+1 sits at ``inner``
            if k < 0:
                return []
            for c in cands[k]:
                if c <= inner:
                    continue
                if not gap_ok(inner, c, pats[k + 1]):
                    # candidates ascend, the gap only grows
                    if ns.frames[c].is_python and ns.frames[inner].is_python:
                        break
                    continue
                rest = search(k - 1, c)
                if rest is not None:
                    return [c, *rest]
            return None

        for c in cands[m - 1]:
            rest = search(m - 2, c)
            if rest is not None:
                return (c, *rest)
        return None

    def _matches(
        self, r: Rule, ns: NormStack, ctx: BlockContext, phase: str
    ) -> tuple[int, ...] | None:
        """Matched frame indices if every condition of ``r`` holds, else None (fast path)."""
        if self._ctx_checks(r, ns, ctx, phase, full=False) is None:
            return None
        for p in r.not_frames:
            if self._candidates(p, ns)[0]:
                return None
        if r.only_frames and not self._only(r, ns):
            return None
        if not r.frames:
            return ()
        cands = []
        for p in r.frames:
            c = self._candidates(p, ns)[0]
            if not c:
                return None
            cands.append(c)
        return self._sequence(r.frames, cands, ns)

    def _covered(self, r: Rule, ns: NormStack) -> set[int]:
        """The Python frames of ``ns`` that one of ``r.only_frames`` names."""
        return {i for p in r.only_frames for i in self._candidates(p, ns)[0]}

    def _only(self, r: Rule, ns: NormStack) -> bool:
        """Whether the stack has Python frames and ``r.only_frames`` name every one."""
        return bool(ns.python) and self._covered(r, ns) >= set(ns.python)

    def _near_miss(self, r: Rule, ns: NormStack, ctx: BlockContext, phase: str) -> NearMiss | None:
        if r.identifying and not (
            any(self._candidates(p, ns)[0] for p in r.frames)
            or (r.annotation is not None and any(r.annotation.search(a) for a in ctx.annotations))
        ):
            return None  # cheap exit before any text is built: nothing of the site is here
        checks = self._ctx_checks(r, ns, ctx, phase, full=True) or []
        for p in r.not_frames:
            present = bool(self._candidates(p, ns)[0])
            checks.append((f"no {p.text}", not present, False))
        if r.only_frames:
            others = len(set(ns.python) - self._covered(r, ns))
            desc = "only " + " / ".join(p.text for p in r.only_frames)
            checks.append((f"{desc} (block: {others} other Python frames)",
                           bool(ns.python) and not others, False))
        cands = []
        for p in r.frames:
            c, why = self._candidates(p, ns)
            cands.append(c)
            desc = f"frame {p.text}" + (f" [{why}]" if why and not c else "")
            checks.append((desc, bool(c), True))
        if len(r.frames) > 1 and all(cands):
            ok = self._sequence(r.frames, cands, ns) is not None
            checks.append(("frames in caller -> callee order (and within max_gap)", ok, False))
        held = tuple(d for d, ok, _ in checks if ok)
        failed = tuple(d for d, ok, _ in checks if not ok)
        if not failed:
            return None
        ident_held = any(ok for _, ok, ident in checks if ident)
        if r.identifying:
            if not ident_held:
                return None
        elif len(failed) != 1 or not held:
            return None
        return NearMiss(r.id, r.family or r.phase_out or "", r.priority, held, failed)

    def _reason(self, r: Rule, ns: NormStack, ctx: BlockContext, matched: tuple[int, ...]) -> str:
        parts: list[str] = []
        if matched:
            # the innermost matched frame always belongs to the rule's last (callee) pattern
            ordered = sorted(matched)
            inner = ns.frames[ordered[0]]
            pat = r.frames[-1]
            if inner.is_python:
                where = pat.file or short_path(inner.path)
                desc = f"frame `{inner.name}` in `{where}`"
            else:
                desc = f"C++ frame `{cpp_symbol(inner.name)}`"
            callers = [ns.frames[i] for i in ordered[1:]]
            if callers:
                desc += " under " + " under ".join(
                    f"`{f.name}`" if f.is_python else f"`{cpp_symbol(f.name)}`" for f in callers
                )
            parts.append(desc)
        if r.annotation is not None:
            ann = next((a for a in ctx.annotations if r.annotation.search(a)), None)
            if ann:
                parts.append(f"inside annotation `{ann}`")
        if r.block.pools is not None:
            parts.append(f"in a {ctx.pool_kind} pool")
        if r.block.stream == "nondefault":
            parts.append("on a non-default stream")
        if r.block.no_python_frames:
            parts.append("no Python frames")
        text = ", ".join(parts)
        if r.reason_text:
            text = r.reason_text + (f" ({text})" if text else "")
        return f"matched rule `{r.id}`: {text or r.label}"


# --------------------------------------------------------------------------------------
# loading


def markers_of(packs: Iterable[Pack]) -> dict[str, tuple[str, ...]]:
    """Framework (pack name) -> the detection markers of ``packs`` (merged when two packs
    share a name)."""
    out: dict[str, tuple[str, ...]] = {}
    for p in packs:
        if p.markers:
            out[p.name] = tuple(dict.fromkeys((*out.get(p.name, ()), *p.markers)))
    return out


def _outcome(family: str, rule_id: str | None, phase: str) -> str:
    return f"family {family} (rule {rule_id or '-'}, phase {phase})"


def _builtin_files() -> list[tuple[str, str]]:
    """``(file name, text)`` of every built-in pack: each ``packs/*.toml`` but the
    vocabulary file."""
    root = resources.files(__package__) / "packs"
    out = []
    for entry in root.iterdir():
        name = entry.name
        if name.endswith(".toml") and name != VOCABULARY_FILE:
            out.append((name, entry.read_text(encoding="utf-8")))
    return sorted(out)


@lru_cache(maxsize=1)
def builtin_packs() -> tuple[Pack, ...]:
    """The built-in packs, parsed once, in load order (sorted by file name). Their TOML as
    the user's cache kept it is used where it compiles; one that does not (edited or
    damaged, its digest recomputed) is never an error blamed on an intact packs/*.toml:
    the TOML is read again, and only its own errors are raised."""
    files = _builtin_files()
    kept = kept_packaged(files)
    if kept is not None:
        try:
            return _compiled_builtin(files, kept)
        except Exception:  # whatever a kept entry provokes: the TOML's read decides
            pass
    return _compiled_builtin(files, parsed_packaged(files))


def _compiled_builtin(files: list[tuple[str, str]], parsed: list[dict[str, Any]]
                      ) -> tuple[Pack, ...]:
    """The built-in packs compiled from their TOML's data `parsed`, in load order."""
    packs: list[Pack] = []
    order = 0
    for (name, text), data in zip(files, parsed, strict=True):
        pack = parse_pack_text(text, f"packs/{name}", order_start=order, packaged=True,
                               parsed=data)
        order += len(pack.rules)
        packs.append(pack)
    return tuple(packs)


def builtin_pack_names() -> tuple[str, ...]:
    """Names of the built-in packs, in load order."""
    return tuple(p.name for p in builtin_packs())


def load_rules(extra_files: Sequence[Path | str] = ()) -> RuleSet:
    """Every built-in pack plus ``extra_files`` (user packs), compiled into a new
    :class:`RuleSet` (with its own empty memo). Raises :class:`RuleError` on a bad file."""
    packs = list(builtin_packs())
    order = sum(len(p.rules) for p in packs)
    for path in extra_files:
        pack = read_pack(Path(path), user=True, order_start=order)
        order += len(pack.rules)
        packs.append(pack)
    rules = [r for p in packs for r in p.rules]
    check_unique(rules, packs)
    return RuleSet(rules, packs=[p.name for p in packs], contents=packs)


@lru_cache(maxsize=1)
def _default_ruleset() -> RuleSet:
    return load_rules()


def infer_phase(stack: Stack, ctx: BlockContext, rules: RuleSet | None = None) -> str:
    """Phase of an allocation from its stack and context, driven by the ``[[phase_rule]]``
    entries of the packs (``packs/phases.toml`` and the framework packs)."""
    return (rules or _default_ruleset()).infer_phase(stack, ctx)


__all__ += ["RuleError"]
