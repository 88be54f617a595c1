"""Apply a RuleSet to a table of blocks: one decision per distinct (stack, context), mapped
back onto every block as columns (family, label, rule_id, phase, reason, site).

Blocks with no frames at all but an ``alloc`` event were allocated by a thread without a
Python stack — with Python-only stacks, the autograd device thread running built-in backward
ops. The stack cannot say *when* that was, but the trace can: :class:`TracePhases` infers the
phase of every allocation that has frames and places each frameless one between its
neighbours. One allocated while backward was running (a neighbour inferred ``backward``, or
after the step's last forward allocation and before the optimizer step) gets
``phase_hint="backward"``, which the pytorch pack turns into ``gradients``; otherwise no hint
is given and the block stays ``unknown`` with its reason.
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from functools import cached_property
from typing import Any

import numpy as np
import polars as pl

from snapana.analysis.attribution import (
    hand_state,
    inference,
    kept_outputs,
    kv_pairs,
    weight_copies,
)
from snapana.analysis.attribution.carry import CARRIED, SetDecisions, set_methods
from snapana.analysis.attribution.distinct import distinct, distinct_rows
from snapana.analysis.attribution.engine import Decision, RuleSet
from snapana.analysis.attribution.facts import is_library
from snapana.analysis.attribution.families import (
    family_label,
    parameter_mirrors,
    parameter_witnesses,
    refinements,
    role_families,
)
from snapana.analysis.attribution.stack import BlockContext, Stack
from snapana.analysis.sites import site_of
from snapana.caching_allocator import ACTIVE_ALLOCATED
from snapana.model import EMPTY_STACK, Capture, is_python_file


def parse_pool(pool: str) -> tuple[int, int]:
    a, _, b = (pool or "0,0").partition(",")
    return (int(a or 0), int(b or 0))


class AnnotationWindows:
    """Which external_annotations (record_function ranges) were open at a given time."""

    OPEN_END = 2**62  # the end of a window that was never closed

    def __init__(self, capture: Capture, device: int) -> None:
        windows: list[tuple[int, int, str]] = []
        open_: dict[str, list[int]] = {}
        for a in capture.annotations:
            if int(a.get("device", device) or 0) != device or a.get("time_us") is None:
                continue
            name = str(a.get("name", ""))
            if a.get("stage") == "START":
                open_.setdefault(name, []).append(int(a["time_us"]))
            elif a.get("stage") == "END" and open_.get(name):
                windows.append((open_[name].pop(), int(a["time_us"]), name))
        for name, starts in open_.items():  # never closed: open until the end
            windows.extend((s, self.OPEN_END, name) for s in starts)
        self.windows = sorted(windows)

    @cached_property
    def _sweep(self) -> tuple[list[int], list[int], list[tuple[str, ...]]]:
        """The open set only changes where a window starts or one past where it ends: those
        boundaries in order, the open set's index after each, and the distinct open sets
        (0: none), from one sweep over the windows (sorted start and end events)."""
        edges = sorted([(s, 1, n) for s, _, n in self.windows]
                       + [(e + 1, -1, n) for _, e, n in self.windows])
        count: dict[str, int] = {}
        index: dict[tuple[str, ...], int] = {(): 0}
        bounds: list[int] = []
        ids: list[int] = []
        for k, (at, step, name) in enumerate(edges):
            count[name] = count.get(name, 0) + step
            if not count[name]:
                del count[name]
            if k + 1 < len(edges) and edges[k + 1][0] == at:
                continue  # the set after every change at this boundary is what counts
            bounds.append(at)
            ids.append(index.setdefault(tuple(sorted(count)), len(index)))
        return bounds, ids, list(index)

    def at(self, time_us: int | None) -> tuple[str, ...]:
        if time_us is None or not self.windows:
            return ()
        bounds, ids, sets = self._sweep
        k = bisect.bisect_right(bounds, time_us) - 1
        return sets[ids[k]] if k >= 0 else ()

    def at_many(self, times_us: np.ndarray) -> tuple[np.ndarray, list[tuple[str, ...]]]:
        """`at` for many times at once: an index per time into the returned list of open
        sets (0 is no window)."""
        if not self.windows or len(times_us) == 0:
            return np.zeros(len(times_us), dtype=np.int64), [()]
        bounds, ids, sets = self._sweep
        k = np.searchsorted(np.asarray(bounds, dtype=np.int64), times_us, side="right") - 1
        return np.where(k >= 0, np.asarray(ids, dtype=np.int64)[np.maximum(k, 0)], 0), sets


class TracePhases:
    """The phase of frameless allocations, told from the allocations around them.

    Every ``alloc`` event with frames gets the phase its stack infers (with the annotations
    open at its time); ``record_function`` windows whose name alone infers a phase (an
    ``Optimizer.step#...`` window) mark their start and end too, so an optimizer step that
    allocates nothing still bounds backward. A frameless allocation is in ``backward`` when
    the nearest marked neighbour on either side is ``backward``, or when it comes after a
    ``forward`` one and before an ``optimizer`` one or the end of the trace (the autograd
    thread runs between the last forward allocation and the optimizer step). Anything else
    (between two forwards, after the optimizer, no marks at all) is left undecided.
    """

    def __init__(self, capture: Capture, device: int, rules: RuleSet,
                 windows: AnnotationWindows) -> None:
        ev = capture.device_events(device)
        sids = ev["stack_id"].fill_null(EMPTY_STACK).to_numpy().astype(np.int64)
        rows = np.flatnonzero((ev["action"] == "alloc").to_numpy() & (sids != EMPTY_STACK))
        ann = np.zeros(rows.size, dtype=np.int64)
        names: list[tuple[str, ...]] = [()]
        times = timed = None
        if capture.has_time:
            t = ev["time_us"]
            times, timed = t.fill_null(-1).to_numpy(), t.is_not_null().to_numpy()
            if windows.windows and rows.size:
                ann, names = windows.at_many(times[rows])
                ann = np.where(timed[rows], ann, 0)
        # each allocation with frames: the phase its stack infers with the annotations open
        # at its time, decided once per distinct (stack, open annotations)
        first, which = distinct_rows((sids[rows], ann))
        phases = [self._infer(rules, capture.stacks.stack(int(sids[rows[k]])), names[ann[k]])
                  for k in first.tolist()]
        pos: list[np.ndarray] = [rows.astype(np.float64)]
        phase: list[list[str]] = [phases]
        code: list[np.ndarray] = [which]
        if times is not None and timed is not None and windows.windows:
            # a window opens just before the first event at/after its start and closes just
            # after the last event at/before its end
            at = np.flatnonzero(timed)
            tpos = times[at]
            for start, end, name in windows.windows:
                ph = rules.infer_phase((), BlockContext(annotations=(name,)))
                if ph == "unknown":
                    continue
                j = int(np.searchsorted(tpos, start, side="left"))
                marks = [(at[j] if j < at.size else len(times)) - 0.5]
                if end < 2**62:
                    j = int(np.searchsorted(tpos, end, side="right"))
                    marks.append((at[j - 1] if j > 0 else -1) + 0.5)
                pos.append(np.asarray(marks, dtype=np.float64))
                code.append(np.full(len(marks), sum(map(len, phase)), dtype=np.int64))
                phase.append([ph])
        # the marks' phases as codes into their names in sorted order, so that sorting by
        # (position, code) orders the marks as sorting (position, phase name) pairs would
        names_seen = [p for group in phase for p in group]
        self._kinds = sorted(set(names_seen) - {"unknown"})
        remap = np.asarray([self._kinds.index(p) if p != "unknown" else -1
                            for p in names_seen], dtype=np.int64)
        all_code = remap[np.concatenate(code)] if names_seen else np.empty(0, np.int64)
        all_pos = np.concatenate(pos)[all_code >= 0]
        all_code = all_code[all_code >= 0]
        order = np.lexsort((all_code, all_pos))
        self._pos = all_pos[order]
        self._code = all_code[order]
        self._memo: dict[int, str | None] = {}
        self._marks: dict[tuple[str, ...], np.ndarray] = {}
        self._others: dict[str, np.ndarray] = {}  # phase -> the marks of other phases

    def _marks_of(self, *phases: str) -> np.ndarray:
        """Which marks are of one of `phases` (memoised: every decision moment's working
        sets ask again; read-only)."""
        hit = self._marks.get(phases)
        if hit is None:
            wanted = [k for k, p in enumerate(self._kinds) if p in phases]
            hit = self._marks[phases] = np.isin(self._code, wanted)
            hit.flags.writeable = False
        return hit

    @staticmethod
    def _infer(rules: RuleSet, stack: Stack, annotations: tuple[str, ...]) -> str:
        if not stack:
            return "unknown"
        return rules.infer_phase(stack, BlockContext(has_alloc_event=True,
                                                     annotations=annotations))

    @cached_property
    def _neighbour_code(self) -> np.ndarray:
        """Each mark as `in_backward` reads it (1 backward, 2 forward, 3 optimizer, 4 other),
        and a 0 past the end: no mark on that side."""
        code = np.zeros(self._code.size + 1, dtype=np.int8)
        code[:-1] = 4
        for name, c in (("backward", 1), ("forward", 2), ("optimizer", 3)):
            code[:-1][self._marks_of(name)] = c
        return code

    def in_backward(self, alloc_idx: np.ndarray) -> np.ndarray:
        """`at` over an array of event indices: True where it would say ``"backward"``."""
        code = self._neighbour_code
        x = np.asarray(alloc_idx, dtype=np.float64)
        j = np.searchsorted(self._pos, x, side="left")
        left = np.where(j > 0, code[np.maximum(j - 1, 0)], 0)  # 0: no mark on that side
        right = code[np.searchsorted(self._pos, x, side="right")]
        return (left == 1) | (right == 1) | ((left == 2) & ((right == 0) | (right == 3)))

    def within(self, phase: str, alloc_idx: np.ndarray, free_idx: np.ndarray) -> np.ndarray:
        """True where no allocation or annotation mark of another phase lies between each
        allocation and its free: both happened in the same run of `phase`."""
        other = self._others.get(phase)
        if other is None:
            other = self._others[phase] = self._pos[~self._marks_of(phase)]
        lo = np.searchsorted(other, np.asarray(alloc_idx, dtype=np.float64), side="right")
        hi = np.searchsorted(other, np.asarray(free_idx, dtype=np.float64), side="left")
        return hi <= lo

    def has_phase(self, *phases: str) -> bool:
        """Whether any allocation or annotation window of the trace infers one of
        `phases`."""
        return bool(self._marks_of(*phases).any())

    def at(self, alloc_idx: int) -> str | None:
        """``"backward"`` when the frameless allocation at event ``alloc_idx`` happened while
        backward was running; None when the trace cannot tell."""
        if alloc_idx not in self._memo:
            self._memo[alloc_idx] = "backward" if self.in_backward(
                np.array([alloc_idx]))[0] else None
        return self._memo[alloc_idx]


class Attributor:
    """Decisions for the blocks of one device of one capture, memoised by stack id."""

    def __init__(self, capture: Capture, device: int, rules: RuleSet) -> None:
        self.capture = capture
        self.device = device
        self.stacks = capture.stacks
        # allocating lines: every alloc, and the request that ran out of memory (its line
        # allocates too; without it the line before it would look like the function's last)
        stack_ids = set(capture.blocks["stack_id"].unique().to_list()) | set(
            capture.events.filter(pl.col("action").is_in(["alloc", "oom"]))["stack_id"]
            .unique().to_list()
        )
        # a source that measures a process's heap (memray's row): host packs decide there
        memory = "host" if capture.source.row.host_heap else "device"
        self.rules = rules.for_memory(memory).with_sites(self.stacks.stack(s) for s in stack_ids)
        self.windows = AnnotationWindows(capture, device)
        ev = capture.device_events(device)
        # a Series, not a list: only the few live blocks' times are ever read
        self._times = ev["time_us"] if capture.has_time else pl.Series([], dtype=pl.Int64)
        self._memo: dict[tuple[Any, ...], Decision] = {}
        self._sites: dict[int, str] = {}
        self._trace_phases: TracePhases | None = None
        self._moments: Callable[[], Sequence[pl.DataFrame]] | None = None
        self._set_decisions: SetDecisions | None = None
        self._window = False  # the set methods are decided for the window (decide_sets_at)
        # memoised trace reads by size (`_events_of_sizes`, `_sized_history`)
        self._size_rows: dict[int, np.ndarray] = {}
        self._history: dict[frozenset[int], tuple[list[tuple[int, str]], int,
                                                  list[tuple[int, int, int]]]] = {}
        self._roots: dict[frozenset[int], tuple[dict[int, int], frozenset[int]]] = {}
        self._update_cache: dict[frozenset[int], list[hand_state.Update]] = {}
        self._cast_frames: dict[int, tuple[bool, bool]] = {}  # `_weight_copies`
        self._code_sites: dict[int, tuple[str, int]] = {}  # `_code_site`: site, path id
        self._code_paths: dict[tuple[Any, ...], int] = {}  # code frames -> path id
        self._next_allocs: tuple[np.ndarray, np.ndarray] | None = None  # `_op_follows`
        self._module_calls: dict[int, kept_outputs.Call | None] = {}  # `_kept_outputs`

    def decide_sets_at(self, moments: Callable[[], Sequence[pl.DataFrame]]) -> None:
        """Decide the families named among blocks held together (`carry.set_methods`) once
        for the window, at the blocks `moments` gives (read on first use), so that every
        later `attribute` gives an allocation the same one (`carry`)."""
        self._moments = moments
        self._set_decisions = None
        self._window = True

    def set_decisions(self) -> SetDecisions | None:
        """The window's set decisions (`decide_sets_at`; None: none given or none named)."""
        if self._moments is not None:
            moments, self._moments = self._moments, None
            self._set_decisions = SetDecisions.of(
                [self._attribute(b, sets=True) for b in moments()], set_methods())
        return self._set_decisions

    def trace_phases(self) -> TracePhases:
        """The phases the trace shows around frameless allocations (built on first use)."""
        if self._trace_phases is None:
            self._trace_phases = TracePhases(self.capture, self.device, self.rules, self.windows)
        return self._trace_phases

    def trace_phase(self, alloc_idx: int) -> str | None:
        """The phase the trace shows for the frameless allocation at event ``alloc_idx``."""
        if alloc_idx < 0 or not self.capture.has_trace:
            return None
        return self.trace_phases().at(alloc_idx)

    def event_times(self) -> tuple[np.ndarray, np.ndarray] | None:
        """Each event's trace time and whether it has one; None without a clock."""
        if not self.capture.has_time:
            return None
        return self._times.fill_null(-1).to_numpy(), self._times.is_not_null().to_numpy()

    def context(self, stack_id: int, pool: str, stream: int, state: str, size: int,
                alloc_idx: int) -> BlockContext:
        has_event = (alloc_idx >= 0) if self.capture.has_trace else None
        t = self._times[alloc_idx] if 0 <= alloc_idx < len(self._times) else None
        hint = None
        if has_event and not self.stacks.stack(stack_id):
            hint = self.trace_phase(alloc_idx)
        return BlockContext(pool_id=parse_pool(pool), stream=int(stream or 0), state=state,
                            size=int(size), has_alloc_event=has_event,
                            annotations=self.windows.at(t), phase_hint=hint)

    def decide(self, stack_id: int, ctx: BlockContext) -> Decision:
        key = (stack_id, self.rules.context_key(ctx))
        hit = self._memo.get(key)
        if hit is None:
            hit = self.rules.classify(self.stacks.stack(stack_id), ctx)
            self._memo[key] = hit
        return hit

    def decide_rows(self, stack_ids: np.ndarray, sizes: np.ndarray, event_idx: np.ndarray,
                    streams: np.ndarray | None = None) -> tuple[np.ndarray, list[Decision]]:
        """`decide(sid, context(sid, "0,0", stream, ACTIVE_ALLOCATED, size, idx))` for many
        rows at once (default pool; `streams` None: the default stream): each row's index
        into the returned decisions, one per distinct (stack, stream, size band, open
        annotations, backward hint), so a window of a million allocations costs what its
        distinct keys do, not a context per row."""
        n = len(stack_ids)
        sids = np.asarray(stack_ids, dtype=np.int64)
        idx = np.asarray(event_idx, dtype=np.int64)
        sizes = np.asarray(sizes, dtype=np.int64)
        default = np.ones(n, dtype=bool) if streams is None else np.asarray(streams) == 0
        ann = np.zeros(n, dtype=np.int64)
        names: list[tuple[str, ...]] = [()]
        clock = self.event_times()
        inside = (idx >= 0) & (idx < (len(clock[0]) if clock is not None else 0))
        if clock is not None and self.windows.windows and inside.any():
            times, timed = clock
            at = np.where(inside, idx, 0)
            ann, names = self.windows.at_many(times[at])
            ann = np.where(inside & timed[at], ann, 0)
        has_event = self.capture.has_trace
        ids, _, code = distinct(sids)
        framed = np.asarray([bool(self.stacks.stack(int(i))) for i in ids], dtype=bool)
        hint = np.zeros(n, dtype=bool)
        ask = (idx >= 0) & ~framed[code] if has_event else np.zeros(n, dtype=bool)
        if ask.any():
            hint[ask] = self.trace_phases().in_backward(idx[ask])
        first, which = distinct_rows((code, default, self.rules.size_bands(sizes), ann, hint,
                                      idx >= 0))
        decisions = [self.decide(int(sids[r]), BlockContext(
            pool_id=(0, 0), stream=0 if default[r] else 1, state=ACTIVE_ALLOCATED,
            size=int(sizes[r]), has_alloc_event=bool(idx[r] >= 0) if has_event else None,
            annotations=names[ann[r]], phase_hint="backward" if hint[r] else None))
            for r in first.tolist()]
        return which, decisions

    def site(self, stack_id: int) -> str:
        s = self._sites.get(stack_id)
        if s is None:
            s = self._sites[stack_id] = site_of(self.stacks.stack(stack_id))
        return s

    def attribute(self, blocks: pl.DataFrame) -> pl.DataFrame:
        """Add family, label, rule_id, phase, reason, site, evidence and method columns to
        `blocks`, which has stack_id, pool, stream, state, size and alloc_idx (as
        DeviceReplay.blocks_at gives).

        `evidence` says how the family was decided: "inventory" (the recording named the
        tensor), "frames" (a rule matched the stack),
        "inferred" (no frames: a rule on the pool or the trace's timeline, or the inference
        stage; `method` names which) or "unknown" (the reason says why). The families named
        among blocks held together come from the window's decisions where it has them
        (`decide_sets_at`), so an allocation has one wherever it is shown."""
        return self._attribute(blocks, sets=not self._windowed(blocks))

    def _windowed(self, blocks: pl.DataFrame) -> bool:
        """Whether the window's set decisions say which of `blocks` the set methods name."""
        return self._window and {"alloc_idx", "address", "requested_size"} <= set(blocks.columns)

    def _attribute(self, blocks: pl.DataFrame, *, sets: bool) -> pl.DataFrame:
        """`attribute`, the set methods run on `blocks` themselves (`sets`) or taken from
        the window's decisions."""
        names = ("family", "label", "rule_id", "phase", "reason", "site", "evidence", "method")
        cols: dict[str, list[Any]] = {k: [] for k in names}
        stream_col = "segment_stream" if "segment_stream" in blocks.columns else "stream"
        for sid, pool, stream, state, size, alloc_idx in blocks.select(
            "stack_id", "pool", stream_col, "state", "size", "alloc_idx"
        ).iter_rows():
            d = self.decide(sid, self.context(sid, pool, stream, state, size, alloc_idx))
            cols["family"].append(d.family)
            cols["label"].append(d.label)
            cols["rule_id"].append(d.rule_id or "")
            cols["phase"].append(d.phase)
            cols["reason"].append(d.reason)
            cols["site"].append(self.site(sid))
            framed = bool(self.stacks.stack(sid))
            cols["evidence"].append("unknown" if d.family == "unknown" else
                                    "frames" if framed else "inferred")
            cols["method"].append("" if d.family == "unknown" or framed else (d.rule_id or ""))
        self._working_sets(blocks, cols)
        self._infer(blocks, cols)
        if sets:
            self._hand_state(blocks, cols)
            self._weight_copies(blocks, cols)
            self._kv_pairs(blocks, cols)
            self._kept_outputs(blocks, cols)
        else:
            self._take_sets(blocks, cols)
        self._state_updates(blocks, cols)
        self._inventory(blocks, cols)
        return blocks.with_columns(
            [pl.Series(k, v, dtype=pl.Utf8) for k, v in cols.items()]
        )

    def _take_sets(self, blocks: pl.DataFrame, cols: dict[str, list[Any]]) -> None:
        """The window's set decisions on `blocks`: each block they name takes that family
        with its reason; the rest keep what the rules and the inference stage said."""
        window = self.set_decisions()
        if window is None or blocks.is_empty():
            return
        got = window.carried(blocks.select("alloc_idx", "address", "stack_id", "size",
                                           "requested_size"))
        for i, values in enumerate(zip(*(got[f"_carried_{c}"] for c in CARRIED),
                                       strict=True)):
            if values[0] is None:
                continue
            for c, v in zip(CARRIED, values, strict=True):
                cols[c][i] = v
            cols["rule_id"][i] = ""
            cols["evidence"][i] = "inferred"

    def transient(self, family: np.ndarray, names: Sequence[str | None],
                  alloc_idx: np.ndarray, free_idx: np.ndarray,
                  ) -> list[tuple[np.ndarray, inference.Transient]]:
        """(rows, the rule that applies) for the rows whose family (`family`: each row's
        index into `names`) a phase only uses while it runs (`inference.transient_rules`):
        allocated and freed in the window, in the same run of that phase, by a stack of that
        phase."""
        rules = {t.family: t for t in inference.transient_rules()}
        if not rules or not self.capture.has_trace:
            return []
        n = self.capture.device_events(self.device).height
        alloc_idx, free_idx = np.asarray(alloc_idx), np.asarray(free_idx)
        in_window = (alloc_idx >= 0) & (free_idx > alloc_idx) & (free_idx < n)
        out: list[tuple[np.ndarray, inference.Transient]] = []
        for name, t in rules.items():
            codes = [k for k, f in enumerate(names) if f == name]
            if not codes:
                continue
            rows = np.flatnonzero(np.isin(family, codes) & in_window)
            if not rows.size:
                continue
            rows = rows[self.trace_phases().within(t.phase, alloc_idx[rows], free_idx[rows])]
            rows = rows[self.free_phases(free_idx[rows]) == t.phase]
            if rows.size:
                out.append((rows, t))
        return out

    def free_phases(self, free_idx: np.ndarray) -> np.ndarray:
        """The phase of the stack that freed each block at the events `free_idx` (None: no
        frames): a step's temporary is freed inside the step, state by whoever drops it
        later."""
        if not free_idx.size:
            return np.empty(0, dtype=object)
        ev = self.capture.device_events(self.device)
        at = pl.Series(free_idx, dtype=pl.Int64)
        sids = ev["stack_id"].gather(at).fill_null(EMPTY_STACK).to_numpy().astype(np.int64)
        sizes = ev["size"].gather(at).fill_null(0).to_numpy().astype(np.int64)
        which, decisions = self.decide_rows(sids, sizes, free_idx)
        phases = np.asarray([d.phase for d in decisions], dtype=object)
        out = phases[which]
        out[~self._framed(sids)] = None
        return out

    def _framed(self, stack_ids: np.ndarray) -> np.ndarray:
        """Whether each stack id has frames (each distinct id looked up once)."""
        ids, _, code = distinct(stack_ids)
        return np.asarray([bool(self.stacks.stack(int(i))) for i in ids], dtype=bool)[code]

    def _working_sets(self, blocks: pl.DataFrame, cols: dict[str, list[Any]]) -> None:
        """Blocks of a state family that the same run of their phase freed: its working
        set (see `transient`)."""
        if "free_req_idx" not in blocks.columns:
            return
        born, freed = blocks["alloc_idx"].to_numpy(), blocks["free_req_idx"].to_numpy()
        working = self.transient(np.arange(len(cols["family"])), cols["family"], born, freed)
        for i, t in ((int(i), t) for rows, t in working for i in rows):
            why = t.why.format(lived=int(freed[i] - born[i]))
            cols["label"][i] = f"{family_label(t.becomes)} ({t.label})"
            cols["reason"][i] = f"{cols['reason'][i]}; {why}" if cols["reason"][i] else why
            cols["family"][i] = t.becomes

    def _infer(self, blocks: pl.DataFrame, cols: dict[str, list[Any]]) -> None:
        """The inference stage, on the blocks the rules left unknown for lack of frames;
        those it cannot name get a label saying what is known about them."""
        rows = [i for i, (fam, sid) in enumerate(zip(cols["family"], blocks["stack_id"],
                                                     strict=True))
                if fam == "unknown" and not self.stacks.stack(sid)]
        if not rows or "requested_size" not in blocks.columns:
            return
        candidates = blocks[rows]
        framed = [i for i, sid in enumerate(blocks["stack_id"]) if self.stacks.stack(sid)]
        live = [(int(blocks["requested_size"][i] or blocks["size"][i]), cols["family"][i],
                 cols["phase"][i], int(blocks["stack_id"][i])) for i in framed]
        # what the other blocks at the moment already are, by size: the parameters and
        # state that frames name leave the frameless blocks of their sizes to be the rest
        unknown_rows, mirrors = set(rows), parameter_mirrors()
        named = Counter((int(size or full), fam) for i, (size, full, fam) in enumerate(zip(
            blocks["requested_size"], blocks["size"], cols["family"], strict=True))
            if i not in unknown_rows and fam in mirrors)
        state_stacks: dict[int, set[int]] = {}
        for size, fam, _, sid in live:
            if fam == "optimizer_state":
                state_stacks.setdefault(size, set()).add(sid)
        evidence = replace(self._evidence(candidates, live), named=named,
                           state_stacks={s: len(v) for s, v in state_stacks.items()},
                           replaced_state=self._replaced_state)
        found = inference.infer(candidates, evidence, self._freed(candidates),
                                label=self.capture.has_trace)
        for i, address in zip(rows, candidates["address"], strict=True):
            hit = found.get(int(address))
            if hit is None:
                continue
            cols["reason"][i] = hit.why
            if hit.family == "unknown":  # a label: what is known, no family
                cols["label"][i] = f"{family_label('unknown')}: {hit.why}"
                continue
            cols["family"][i] = hit.family
            cols["label"][i] = f"{family_label(hit.family)} (inferred: {hit.method})"
            cols["rule_id"][i] = ""
            cols["evidence"][i] = "inferred"
            cols["method"][i] = hit.method

    def _hand_state(self, blocks: pl.DataFrame, cols: dict[str, list[Any]]) -> None:
        """The program's own blocks that mirror the window's gradients (`hand_state`): the
        parameters of modules it wrote, the state of an optimizer it wrote, parameters its
        step re-binds."""
        if not self.capture.has_trace or not {"requested_size", "free_req_idx"} <= set(
                blocks.columns):
            return
        spec = hand_state.spec()
        mine = [i for i, (f, r) in enumerate(zip(cols["family"], cols["rule_id"], strict=True))
                if f in spec.from_families or r in spec.rebound_rules]
        born_at = blocks["alloc_idx"].to_list()
        # `hand_state.find` names only blocks allocated in the window: none, nothing to ask
        if not any(born_at[i] is not None and born_at[i] >= 0 for i in mine):
            return
        skip = set(mine)
        req, full, sids = (blocks[c].to_list() for c in ("requested_size", "size", "stack_id"))
        live = [(int(req[i] or full[i]), cols["family"][i], cols["phase"][i], int(sids[i]))
                for i in range(blocks.height) if i not in skip]
        most, first = self._gradients(
            frozenset(int(req[i]) for i in mine if req[i] is not None), live)
        gradients = Counter(most)
        roots, replaced = self._rebound_roots(frozenset(gradients))
        n = self.capture.device_events(self.device).height
        rows = [hand_state.Row(int(r or size), fam, -1 if born is None else int(born),
                               freed is None or freed >= n, rule or "",
                               None if born is None else roots.get(int(born)),
                               born is not None and int(born) in replaced)
                for r, size, fam, born, freed, rule in zip(
                    req, full, cols["family"], born_at, blocks["free_req_idx"].to_list(),
                    cols["rule_id"], strict=True)]
        for i, hit in hand_state.find(rows, gradients, first).items():
            cols["family"][i] = hit.family
            cols["label"][i] = f"{family_label(hit.family)} (inferred: {hit.method})"
            cols["reason"][i] = hit.why
            cols["rule_id"][i] = ""
            cols["evidence"][i] = "inferred"
            cols["method"][i] = hit.method

    def _state_updates(self, blocks: pl.DataFrame, cols: dict[str, list[Any]]) -> None:
        """The program's own blocks an out-of-place state update made (`hand_state.
        state_updates`): each decided by its own allocation in the window's trace, so every
        moment and the timeline say the same of it."""
        if not self.capture.has_trace or not {"requested_size", "free_req_idx"} <= set(
                blocks.columns):
            return
        req, full = blocks["requested_size"].to_list(), blocks["size"].to_list()
        sizes = [int(r or f) for r, f in zip(req, full, strict=True)]
        params = Counter(n for n, fam in zip(sizes, cols["family"], strict=True)
                         if fam == "parameters")
        spec = hand_state.spec()
        born_at = blocks["alloc_idx"].to_list()
        # only the program's own blocks made in the window are named: none of a parameter's
        # size, nothing to ask the trace
        if len(params) < spec.min_sizes or not any(
                fam in spec.from_families and born is not None and born >= 0 and n in params
                for n, fam, born in zip(sizes, cols["family"], born_at, strict=True)):
            return
        updates = self._updates(frozenset(params))
        if not updates:
            return
        n = self.capture.device_events(self.device).height
        rows = [hand_state.Row(size, fam, -1 if born is None else int(born),
                               freed is None or freed >= n)
                for size, fam, born, freed in zip(sizes, cols["family"], born_at,
                                                  blocks["free_req_idx"].to_list(), strict=True)]
        for i, hit in hand_state.update_roles(rows, updates, params).items():
            if hit.family != cols["family"][i]:
                cols["family"][i] = hit.family
                cols["label"][i] = f"{family_label(hit.family)} (inferred: {hit.method})"
                cols["rule_id"][i] = ""
                cols["evidence"][i] = "inferred"
            cols["phase"][i] = spec.update_phase
            cols["reason"][i] = hit.why
            cols["method"][i] = hit.method

    def _updates(self, sizes: frozenset[int]) -> list[hand_state.Update]:
        """`hand_state.state_updates` over this device's allocations and frees of `sizes`
        (the parameters'), once per set of sizes."""
        if sizes in self._update_cache:
            return self._update_cache[sizes]
        same = self._events_of_sizes(sizes)
        stacks: dict[int, tuple[tuple[str, str] | None, frozenset[tuple[str, str]], bool]] = {}
        events = []
        for action, address, size, pos, sid in same.select(
                "action", "addr", "size", "pos", pl.col("stack_id").fill_null(EMPTY_STACK)
        ).iter_rows():
            if sid not in stacks:
                py = [(f[0], f[1]) for f in self.stacks.stack(int(sid)) if is_python_file(f[0])]
                stacks[sid] = (py[0] if py else None, frozenset(py),
                               bool(py) and not is_library(py[0][0].replace("\\", "/")))
            function, calls, own = stacks[sid]
            events.append(hand_state.Made(int(pos), action == "alloc", int(address), int(size),
                                          False, function, calls, own))
        self._update_cache[sizes] = hand_state.state_updates(events)
        return self._update_cache[sizes]

    def _rebound_roots(self, sizes: frozenset[int]) -> tuple[dict[int, int], frozenset[int]]:
        """`hand_state.rebound_roots` over this device's allocations and frees of `sizes`
        (the gradients'): which allocations replaced a same-size block in one step."""
        if not sizes:
            return {}, frozenset()
        if sizes in self._roots:  # the decision moments mostly ask the same sizes
            return self._roots[sizes]
        same = self._events_of_sizes(sizes)
        made = same.filter(pl.col("action") == "alloc")
        which, decisions = self.decide_rows(
            made["stack_id"].fill_null(EMPTY_STACK).to_numpy(), made["size"].to_numpy(),
            made["pos"].to_numpy(), made["stream"].fill_null(0).to_numpy())
        witnesses = parameter_witnesses()
        gradient = iter(np.asarray([d.family in witnesses for d in decisions],
                                   dtype=bool)[which].tolist())
        functions: dict[int, tuple[str, str] | None] = {}
        events = []
        for action, address, size, pos, sid in same.select(
                "action", "addr", "size", "pos", pl.col("stack_id").fill_null(EMPTY_STACK)
        ).iter_rows():
            if sid not in functions:
                functions[sid] = next(((f[0], f[1]) for f in self.stacks.stack(int(sid))
                                       if is_python_file(f[0])), None)
            alloc = action == "alloc"
            events.append(hand_state.Event(int(pos), alloc, int(address), int(size),
                                           next(gradient) if alloc else False,
                                           functions[sid]))
        self._roots[sizes] = hand_state.rebound_roots(events)
        return self._roots[sizes]

    def _weight_copies(self, blocks: pl.DataFrame, cols: dict[str, list[Any]]) -> None:
        """Blocks of a forward sized like the parameters held with them over autocast's dtype
        ratio, one per weight (`weight_copies`): autocast's cached casts, not activations.
        After the inference stage, which names the frameless parameters they are sized by."""
        if "requested_size" not in blocks.columns:
            return
        cast = weight_copies.spec().cast_symbol
        frames = self._cast_frames  # per stack, kept: every decision moment asks again
        for sid in set(blocks["stack_id"].to_list()) - frames.keys():
            stack = self.stacks.stack(int(sid))
            cpp = [f[1] for f in stack if not is_python_file(f[0])]
            frames[int(sid)] = (bool(cpp), any(cast in name for name in cpp))
        follows = self._op_follows(blocks["stack_id"], blocks["alloc_idx"])
        casts = self.capture.metadata.get("op_casts", {}).get(self.device, {})
        rows = [weight_copies.Row(int(req or size), fam, phase, idx is not None and idx >= 0,
                                  *frames[int(sid)], after,
                                  casts.get(int(idx)) if idx is not None else None)
                for req, size, fam, phase, idx, sid, after in zip(
                    blocks["requested_size"], blocks["size"], cols["family"], cols["phase"],
                    blocks["alloc_idx"], blocks["stack_id"], follows, strict=True)]
        spec = weight_copies.spec()
        _name_inferred(cols, weight_copies.find(rows), spec.family, spec.method,
                       f"{family_label(spec.family)} (inferred: {spec.method})")

    def _kv_pairs(self, blocks: pl.DataFrame, cols: dict[str, list[Any]]) -> None:
        """Blocks two sites of a forward keep one per layer, alternately, of one size, held
        and freed together (`kv_pairs`): the key / value states a causal LM returns as
        past_key_values, not saved activations; or, with no such pair, one fused
        query/key/value projection output per layer whose views it returns."""
        if "requested_size" not in blocks.columns:
            return
        freed = blocks["free_req_idx"] if "free_req_idx" in blocks.columns \
            else pl.Series([None] * blocks.height)
        sites = {int(sid): self._code_site(int(sid)) for sid in set(blocks["stack_id"])}
        n = self.capture.device_events(self.device).height
        rows = [kv_pairs.Row(int(req or size), fam, phase, sites[int(sid)][0],
                             -1 if idx is None else int(idx),
                             int(f) if f is not None and 0 <= f < n else -1,
                             sites[int(sid)][1])
                for req, size, fam, phase, sid, idx, f in zip(
                    blocks["requested_size"], blocks["size"], cols["family"], cols["phase"],
                    blocks["stack_id"], blocks["alloc_idx"], freed, strict=True)]
        spec = kv_pairs.spec()
        found = kv_pairs.find(rows, self._allocs_between)
        method, label = spec.method, spec.label
        if not found:  # no K / V pair: views of one fused projection output per layer?
            found = kv_pairs.find_fused(rows, self._allocs_between, self._sizes_between)
            method, label = spec.fused.method, spec.fused.label
        _name_inferred(cols, found, spec.family, method,
                       f"{family_label(spec.family)} {label} (inferred: {method})")

    def _kept_outputs(self, blocks: pl.DataFrame, cols: dict[str, list[Any]]) -> None:
        """Blocks of nested modules that the forwards of one call path keep from one or two
        sites only (`kept_outputs`): outputs the program holds with no graph, not
        activations saved for a backward. After `_kv_pairs`, which names a returned cache."""
        calls = self._module_calls  # per stack, kept: every decision moment asks again
        for sid in set(blocks["stack_id"].to_list()) - calls.keys():
            calls[int(sid)] = kept_outputs.module_call(self.stacks.stack(int(sid)))
        rows = [kept_outputs.Row(fam, phase, site, calls[int(sid)])
                for fam, phase, site, sid in zip(cols["family"], cols["phase"], cols["site"],
                                                 blocks["stack_id"], strict=True)]
        spec = kept_outputs.spec()
        _name_inferred(cols, kept_outputs.find(rows), spec.family, spec.method,
                       f"{family_label(spec.family)}: {spec.label} (inferred: {spec.method})")

    def _code_site(self, sid: int) -> tuple[str, int]:
        """A stack's code site ('' when it records no code frame) and the id of its code
        frames, kept per stack: every decision moment asks again. The code's own frames only:
        a profiler's op and module-instance pseudo-frames (`<op>`, `<python>`) name the op or
        the layer, not the line that made it."""
        if sid not in self._code_sites:
            code = tuple(f for f in self.stacks.stack(sid) if f[0].endswith(".py"))
            self._code_sites[sid] = (site_of(code) if code else "",
                                     self._code_paths.setdefault(code, len(self._code_paths)))
        return self._code_sites[sid]

    def _op_follows(self, stack_ids: pl.Series, alloc_idx: pl.Series) -> list[bool]:
        """Per block: whether the device's next allocation after the block's own (its event
        `alloc_idx`, stack `stack_ids`) was made at the same code frames, some recorded: where
        autocast's cast of an op's argument is followed by the op's output (`weight_copies`).
        False for a block not made in the window."""
        if self._next_allocs is None:
            ev = self.capture.device_events(self.device)
            at = np.flatnonzero((ev["action"] == "alloc").to_numpy())
            self._next_allocs = (at, ev["stack_id"].fill_null(EMPTY_STACK).to_numpy()[at])
        at, stacks = self._next_allocs
        idx = alloc_idx.fill_null(-1).to_numpy()
        nxt = np.searchsorted(at, idx, side="right")
        out = []
        for sid, i, j in zip(stack_ids.to_list(), idx.tolist(), nxt.tolist(), strict=True):
            site, path = self._code_site(int(sid))
            out.append(i >= 0 and j < len(at) and bool(site)
                       and self._code_site(int(stacks[j]))[1] == path)
        return out

    def _allocs_between(self, lo: int, hi: int) -> int:
        """How many allocations this device's trace records strictly between two of its
        events (positions in its trace, as `alloc_idx` / `free_req_idx` count them)."""
        ev = self.capture.device_events(self.device)
        return int((ev["action"].slice(lo + 1, max(hi - lo - 1, 0)) == "alloc").sum())

    def _sizes_between(self, lo: int, hi: int) -> set[int]:
        """The sizes this device's trace allocated strictly between two of its events."""
        ev = self.capture.device_events(self.device).slice(lo + 1, max(hi - lo - 1, 0))
        return set(ev.filter(pl.col("action") == "alloc")["size"].to_list())

    def _inventory(self, blocks: pl.DataFrame, cols: dict[str, list[Any]]) -> None:
        """Named tensors from the recording's sidecar: a block holding one gets its family
        (evidence "inventory"), ranked above every rule; a rule's more specific family of
        the same kind (a Megatron param buffer for a parameter) is kept, with the name."""
        tensors = self.capture.metadata.get("inventory", {}).get(self.device)
        if not tensors:
            return
        role_family, refined = role_families(), refinements()
        named = sorted((t for t in tensors if t.get("role") in role_family),
                       key=lambda t: int(t["ptr"]))
        ptrs = [int(t["ptr"]) for t in named]
        for i, (address, size) in enumerate(blocks.select("address", "size").iter_rows()):
            lo = bisect.bisect_left(ptrs, int(address))
            hi = bisect.bisect_left(ptrs, int(address) + int(size))
            if lo == hi:
                continue
            t = max(named[lo:hi], key=lambda t: int(t["nbytes"]))
            family = role_family[t["role"]]
            if cols["family"][i] in refined.get(family, ()):
                family = cols["family"][i]
            what = f"{t.get('name') or 'a ' + t['role']} {tuple(t.get('shape') or ())} " \
                   f"{t.get('dtype', '')}".strip()
            more = f" and {hi - lo - 1} more tensor(s)" if hi - lo > 1 else ""
            cols["family"][i] = family
            cols["label"][i] = f"{family_label(family)}: {what}{more}"
            cols["reason"][i] = f"the recording's tensor inventory: {what}{more} lives here"
            cols["evidence"][i] = "inventory"
            cols["method"][i] = t["role"]

    def _freed(self, candidates: pl.DataFrame) -> dict[int, inference.Freed]:
        """For candidates that the window frees: the phase, the function names and the site
        of the stack that freed them."""
        if "free_req_idx" not in candidates.columns:
            return {}
        n = self.capture.device_events(self.device).height
        freed = candidates.filter(
            (pl.col("free_req_idx") >= 0) & (pl.col("free_req_idx") < n)
        ).select("address", "free_req_idx", "size")
        how = self.freeing_at(freed["free_req_idx"].to_numpy(), freed["size"].to_numpy())
        return {int(address): h for address, h in zip(freed["address"].to_list(), how,
                                                       strict=True) if h is not None}

    def freeing_at(self, free_idx: np.ndarray, sizes: np.ndarray
                   ) -> list[inference.Freed | None]:
        """How the frees at the events `free_idx` (all in the trace) freed their blocks:
        the freeing stack's phase, function names and site (None: no frames)."""
        ev = self.capture.device_events(self.device)
        at = pl.Series(np.asarray(free_idx), dtype=pl.Int64)
        return self._freeing(ev["stack_id"].gather(at).fill_null(EMPTY_STACK).to_numpy(),
                             np.asarray(sizes), at.to_numpy())

    def _freeing(self, stack_ids: np.ndarray, sizes: np.ndarray, free_idx: np.ndarray
                 ) -> list[inference.Freed | None]:
        """The phase, function names and site of each stack that freed a block at the events
        `free_idx` (None: no frames); the phases decided at once (`decide_rows`)."""
        sids = np.asarray(stack_ids, dtype=np.int64)
        which, decisions = self.decide_rows(sids, sizes, free_idx)
        names: dict[int, tuple[frozenset[str], str] | None] = {}
        out: list[inference.Freed | None] = []
        for sid, k in zip(sids.tolist(), which.tolist(), strict=True):
            if sid not in names:
                stack = self.stacks.stack(sid)
                names[sid] = (frozenset(f[1] for f in stack), self.site(sid)) if stack else None
            hit = names[sid]
            out.append(None if hit is None else inference.Freed(decisions[k].phase, *hit))
        return out

    @cached_property
    def _replaced_state(self) -> Counter[int]:
        """Requested sizes of the blocks held since before recording that the window frees
        as optimizer state (the lifetime method the freeing stack calls for): all of them,
        whatever the moment (`inference.Evidence.replaced_state`)."""
        ev = self.capture.device_events(self.device).with_row_index("pos")
        first = ev.filter(pl.col("action").is_in(["alloc", "free_requested", "free_completed",
                                                  "free"])
                          ).group_by("addr", maintain_order=True).first()
        freed = first.filter(pl.col("action") != "alloc")
        sizes = freed["size"].fill_null(0).to_numpy().astype(np.int64)
        how = self._freeing(freed["stack_id"].fill_null(EMPTY_STACK).to_numpy(), sizes,
                            freed["pos"].to_numpy())
        out: Counter[int] = Counter()
        for size, h in zip(sizes.tolist(), how, strict=True):
            method = None if h is None else inference.freed_as(h, window=False)
            if method is not None and method.family == "optimizer_state":
                out[int(size)] += 1
        return out

    def _evidence(self, candidates: pl.DataFrame,
                  live: Sequence[tuple[int, str, str, int]] = ()) -> inference.Evidence:
        """What the recorded allocations of this device say about the candidates' sizes:
        only allocations of those sizes are decided (memoised), so it stays cheap. Gradients
        are counted as the most alive at once per size (one step's worth), not summed over
        the steps of the window. `live` are the blocks at the moment that have frames
        (size, family, phase, stack): allocations of the window too, even when their
        event fell out of the trace."""
        sizes = frozenset(int(x) for x in candidates["requested_size"].to_list()
                          if x is not None)
        _, allocs, allocated, freed, alloc_stacks = self._trace_totals
        most, first_gradient = self._gradients(sizes, live)
        others: list[tuple[int, str]] = [(s, f) for s, f, _, _ in live if s in sizes]
        history = self._sized_history(sizes)
        others += history[0]
        freed_inside = frozenset(s for s, _, _ in history[2]) - most.keys()
        backward = any(p in ("backward", "optimizer") for _, _, p, _ in live) or (
            self.capture.has_trace and self.trace_phases().has_phase("backward", "optimizer"))
        no_grad = "" if backward else self._no_grad_site(
            {sid for _, _, _, sid in live} | alloc_stacks)
        state_in_window = any(f == "optimizer_state" for _, f, _, _ in live)
        ev_out = inference.gather(most, others, allocs.height,
                                  freed / allocated if allocated else 0.0, backward, no_grad,
                                  state_in_window)
        return replace(ev_out, engine=self._engine, first_gradient=first_gradient,
                       held_as_total=self.capture.source.row.held_before_as_total,
                       freed_gradient_sizes=freed_inside)

    def _gradients(self, sizes: frozenset[int], live: Sequence[tuple[int, str, str, int]]
                   ) -> tuple[dict[int, int], int]:
        """The most weight gradients of each of `sizes` alive at once in the window, and the
        event of its first gradient (-1: none): what `_evidence` (the blocks held from
        before recording) and `hand_state` count parameters by. Only the gradients a backward
        keeps past its end count, as AccumulateGrad (torch/csrc/autograd/functions/
        accumulate_grad.h) keeps the incoming gradient as a parameter's `.grad` until the
        step or `zero_grad`; what the engine allocates and frees inside one run of the
        backward (the gradient of an activation, a grad_output: the logits' [tokens, vocab]
        has an embedding's bytes where tokens = hidden; an incoming gradient added in place
        to a `.grad` that exists) mirrors no parameter the window can see."""
        _, first_gradient, lifetimes = self._sized_history(sizes)
        most = self._kept_gradients(lifetimes)
        # gradients held now whose allocations fell out of the trace (a ring buffer that
        # wrapped) are gradients of the window all the same: as many of a size at once
        witnesses = parameter_witnesses()
        held_grads = Counter(s for s, f, _, _ in live if f in witnesses and s in sizes)
        for size, n in held_grads.items():
            most[size] = max(most.get(size, 0), n)
        return most, first_gradient

    def _kept_gradients(self, lifetimes: Sequence[tuple[int, int, int]]) -> dict[int, int]:
        """The most gradients of each size alive at once among `lifetimes` ((size,
        allocation event, free event or -1)), leaving out those freed in the same run of the
        backward that made them (`TracePhases.within`)."""
        freed = [(a, f) for _, a, f in lifetimes if f >= 0]
        inside = iter(self.trace_phases().within(
            "backward", np.asarray([a for a, _ in freed], dtype=np.int64),
            np.asarray([f for _, f in freed], dtype=np.int64)).tolist() if freed else [])
        steps: list[tuple[int, int, int]] = []  # (event, +1 / -1, size)
        for size, alloc, free in lifetimes:
            if free >= 0 and next(inside):
                continue
            steps.append((alloc, 1, size))
            if free >= 0:
                steps.append((free, -1, size))
        alive: Counter[int] = Counter()
        most: dict[int, int] = {}
        for _, step, size in sorted(steps):
            alive[size] += step
            most[size] = max(most.get(size, 0), alive[size])
        return most

    def _sized_history(self, sizes: frozenset[int]) -> tuple[
            list[tuple[int, str]], int, list[tuple[int, int, int]]]:
        """What the trace says of its allocations of `sizes`, for `_evidence`: the (size,
        family) of the allocations that are no gradient, the event of the first gradient
        (-1: none) and each gradient's (size, allocation event, free event or -1), which
        `_kept_gradients` counts. It depends on the sizes alone, so the decision moments,
        which mostly ask the same sizes, scan the trace once."""
        hit = self._history.get(sizes)
        if hit is not None:
            return hit
        same = self._events_of_sizes(sizes)
        grad_at: dict[int, int] = {}  # address -> its lifetime's index, for gradients alive now
        lifetimes: list[tuple[int, int, int]] = []  # (size, allocation event, free event)
        others: list[tuple[int, str]] = []
        witnesses = parameter_witnesses()
        made = same.filter(pl.col("action") == "alloc")
        which, decisions = self.decide_rows(
            made["stack_id"].fill_null(EMPTY_STACK).to_numpy(), made["size"].to_numpy(),
            made["pos"].to_numpy(), made["stream"].fill_null(0).to_numpy())
        families = iter(np.asarray([d.family for d in decisions], dtype=object)[which].tolist())
        first_gradient = -1
        for action, address, size, pos in same.select("action", "addr", "size",
                                                      "pos").iter_rows():
            if action == "free_requested":
                # the size the gradient was allocated with: a free naming another size (a
                # trace at odds with itself, warned by the replay) frees that one
                held = grad_at.pop(int(address), None)
                if held is not None:
                    size_of, born, _ = lifetimes[held]
                    lifetimes[held] = (size_of, born, int(pos))
                continue
            family = next(families)
            if family in witnesses:
                if first_gradient < 0:
                    first_gradient = int(pos)
                grad_at[int(address)] = len(lifetimes)
                lifetimes.append((int(size), int(pos), -1))
            else:
                others.append((int(size), family))
        self._history[sizes] = (others, first_gradient, lifetimes)
        return others, first_gradient, lifetimes

    def _events_of_sizes(self, sizes: Iterable[int]) -> pl.DataFrame:
        """This device's allocations and frees of `sizes` (its events with `pos`), in trace
        order. Each size's rows are found once (one pass over the trace for the sizes not
        asked before), since every decision moment's evidence (`_evidence`, `_gradients`,
        `_rebound_roots`) asks for a few sizes, mostly the same ones."""
        ev = self._events
        want = {int(x) for x in sizes}
        new = want - self._size_rows.keys()
        if new:
            hit = ev.filter(pl.col("size").is_in(list(new))
                            & pl.col("action").is_in(["alloc", "free_requested"]))
            pos, got = hit["pos"].to_numpy(), hit["size"].to_numpy()
            for size in new:
                self._size_rows[size] = pos[got == size]
        picked = [self._size_rows[x] for x in want if self._size_rows[x].size]
        if not picked:
            return ev.clear()
        return ev[np.sort(np.concatenate(picked))]

    @cached_property
    def _events(self) -> pl.DataFrame:
        """This device's events with their positions."""
        return self.capture.device_events(self.device).with_row_index("pos")

    @cached_property
    def _trace_totals(self) -> tuple[pl.DataFrame, pl.DataFrame, int, int, set[int]]:
        """This device's events with their positions, its allocations, the bytes allocated
        and freed, and the allocating stacks: read once, since every moment's evidence
        (`_evidence`) reads them and the window's set decisions ask at several moments."""
        ev = self._events
        allocs = ev.filter(pl.col("action") == "alloc")
        freed = int(ev.filter(pl.col("action") == "free_requested")["size"].sum())
        return (ev, allocs, int(allocs["size"].sum()), freed,
                set(allocs["stack_id"].drop_nulls().unique().to_list()))

    @cached_property
    def _engine(self) -> str:
        """The serving engine whose pack's markers the capture's frames carry ("" none)."""
        paths = {f[0].replace("\\", "/") for f in self.stacks.frames}
        markers = self.rules.markers
        return next((name for pack, name in inference.engines().items()
                     if any(part in p for p in paths for part in markers.get(pack, ()))), "")

    def _no_grad_site(self, stack_ids: set[int]) -> str:
        """The site of the first of `stack_ids` (in id order) with a frame that shows it
        runs without autograd (inference.no_grad_markers), or ""."""
        markers = inference.no_grad_markers()
        for sid in sorted(stack_ids):
            for path, name, _ in self.stacks.stack(int(sid)):
                if any(name == f and path.endswith(p) for p, f in markers):
                    return f"`{name}` in {self.site(int(sid))}"
        return ""


def _name_inferred(cols: dict[str, list[Any]], found: dict[int, str], family: str,
                   method: str, label: str) -> None:
    """Give the rows a set method `found` (row -> its reason) that method's family: the
    one way a block named among blocks held together is written into the columns."""
    for i, why in found.items():
        cols["family"][i] = family
        cols["label"][i] = label
        cols["reason"][i] = why
        cols["rule_id"][i] = ""
        cols["evidence"][i] = "inferred"
        cols["method"][i] = method
