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
from collections.abc import Sequence
from dataclasses import replace
from functools import cached_property
from typing import Any

import numpy as np
import polars as pl

from snapana.analysis.attribution import inference
from snapana.analysis.attribution.engine import Decision, RuleSet
from snapana.analysis.attribution.families import family_label
from snapana.analysis.attribution.sites import site_of
from snapana.analysis.attribution.stack import BlockContext
from snapana.caching_allocator import ACTIVE_ALLOCATED
from snapana.io.sidecar_reader import ROLE_FAMILY
from snapana.model import EMPTY_STACK, Capture


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
        actions = ev["action"].to_list()
        stack_ids = ev["stack_id"].to_list()
        times = ev["time_us"].to_list() if capture.has_time else [None] * len(actions)
        memo: dict[tuple[int, tuple[str, ...]], str] = {}
        marks: list[tuple[float, str]] = []
        for i, (act, sid, t) in enumerate(zip(actions, stack_ids, times, strict=True)):
            if act != "alloc" or sid is None or sid == EMPTY_STACK:
                continue
            ann = windows.at(t)
            phase = memo.get((sid, ann))
            if phase is None:
                stack = capture.stacks.stack(sid)
                phase = memo[(sid, ann)] = rules.infer_phase(
                    stack, BlockContext(has_alloc_event=True, annotations=ann)
                ) if stack else "unknown"
            if phase != "unknown":
                marks.append((float(i), phase))
        if capture.has_time and windows.windows:
            # a window opens just before the first event at/after its start and closes just
            # after the last event at/before its end
            timed = [(t, k) for k, t in enumerate(times) if t is not None]
            tpos = [t for t, _ in timed]
            for start, end, name in windows.windows:
                phase = rules.infer_phase((), BlockContext(annotations=(name,)))
                if phase == "unknown":
                    continue
                j = bisect.bisect_left(tpos, start)
                marks.append(((timed[j][1] if j < len(timed) else len(times)) - 0.5, phase))
                if end < 2**62:
                    j = bisect.bisect_right(tpos, end)
                    marks.append(((timed[j - 1][1] if j > 0 else -1) + 0.5, phase))
        marks.sort()
        self._pos = [m[0] for m in marks]
        self._phase = [m[1] for m in marks]
        self._memo: dict[int, str | None] = {}

    def in_backward(self, alloc_idx: np.ndarray) -> np.ndarray:
        """`at` over an array of event indices: True where it would say ``"backward"``."""
        codes = {"backward": 1, "forward": 2, "optimizer": 3}
        phase = np.array([codes.get(p, 4) for p in self._phase] + [0], dtype=np.int8)
        pos = np.asarray(self._pos, dtype=np.float64)
        x = np.asarray(alloc_idx, dtype=np.float64)
        j = np.searchsorted(pos, x, side="left")
        left = np.where(j > 0, phase[np.maximum(j - 1, 0)], 0)  # 0: no mark on that side
        right = phase[np.searchsorted(pos, x, side="right")]  # the sentinel past the end
        return (left == 1) | (right == 1) | ((left == 2) & ((right == 0) | (right == 3)))

    def within(self, phase: str, alloc_idx: np.ndarray, free_idx: np.ndarray) -> np.ndarray:
        """True where no allocation or annotation mark of another phase lies between each
        allocation and its free: both happened in the same run of `phase`."""
        other = np.asarray([p for p, ph in zip(self._pos, self._phase, strict=True)
                            if ph != phase and ph != "unknown"], dtype=np.float64)
        lo = np.searchsorted(other, np.asarray(alloc_idx, dtype=np.float64), side="right")
        hi = np.searchsorted(other, np.asarray(free_idx, dtype=np.float64), side="left")
        return hi <= lo

    def has_phase(self, *phases: str) -> bool:
        """Whether any allocation or annotation window of the trace infers one of
        `phases`."""
        return any(p in phases for p in self._phase)

    def at(self, alloc_idx: int) -> str | None:
        """``"backward"`` when the frameless allocation at event ``alloc_idx`` happened while
        backward was running; None when the trace cannot tell."""
        if alloc_idx not in self._memo:
            self._memo[alloc_idx] = "backward" if self.in_backward(
                np.array([alloc_idx]))[0] else None
        return self._memo[alloc_idx]


#: Rule families that say more than an inventory role of the same kind.
SAME_KIND = {"parameters": ("param_buffer", "main_params_fp32"),
             "gradients": ("grad_buffer",)}


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
        # a source that measures a process's heap (memray) says so: host packs decide there
        memory = str(capture.metadata.get("memory", "device"))
        self.rules = rules.for_memory(memory).with_sites(self.stacks.stack(s) for s in stack_ids)
        self.windows = AnnotationWindows(capture, device)
        ev = capture.device_events(device)
        # a Series, not a list: only the few live blocks' times are ever read
        self._times = ev["time_us"] if capture.has_time else pl.Series([], dtype=pl.Int64)
        self._memo: dict[tuple[Any, ...], Decision] = {}
        self._sites: dict[int, str] = {}
        self._trace_phases: TracePhases | None = None

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
        stage; `method` names which) or "unknown" (the reason says why)."""
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
        self._inventory(blocks, cols)
        return blocks.with_columns(
            [pl.Series(k, v, dtype=pl.Utf8) for k, v in cols.items()]
        )

    def transient(self, families: Sequence[str | None], alloc_idx: np.ndarray,
                  free_idx: np.ndarray) -> list[tuple[int, inference.Transient]]:
        """(row, the rule that applies) for the rows whose family a phase only uses while it runs
        (`inference.transient_rules`): allocated and freed in the window, in the same run of
        that phase."""
        rules = {t.family: t for t in inference.transient_rules()}
        if not rules or not self.capture.has_trace:
            return []
        n = self.capture.device_events(self.device).height
        alloc_idx, free_idx = np.asarray(alloc_idx), np.asarray(free_idx)
        out: list[tuple[int, inference.Transient]] = []
        for family, t in rules.items():
            rows = np.flatnonzero(np.asarray([f == family for f in families], dtype=bool)
                                  & (alloc_idx >= 0) & (free_idx > alloc_idx) & (free_idx < n))
            if not rows.size:
                continue
            same = self.trace_phases().within(t.phase, alloc_idx[rows], free_idx[rows])
            out += [(int(r), t) for r in rows[same]
                    if self._free_phase(int(free_idx[r])) == t.phase]
        return out

    def _free_phase(self, free_idx: int) -> str | None:
        """The phase of the stack that freed a block at event `free_idx` (None: no frames):
        a step's temporary is freed inside the step, state by whoever drops it later."""
        ev = self.capture.device_events(self.device)
        sid = ev["stack_id"][free_idx]
        if sid is None or not self.stacks.stack(int(sid)):
            return None
        size = int(ev["size"][free_idx] or 0)
        return self.decide(int(sid), self.context(int(sid), "0,0", 0, ACTIVE_ALLOCATED, size,
                                                  free_idx)).phase

    def _working_sets(self, blocks: pl.DataFrame, cols: dict[str, list[Any]]) -> None:
        """Blocks of a state family that the same run of their phase freed: its working
        set (see `transient`)."""
        if "free_req_idx" not in blocks.columns:
            return
        born, freed = blocks["alloc_idx"].to_numpy(), blocks["free_req_idx"].to_numpy()
        for i, t in self.transient(cols["family"], born, freed):
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
        unknown_rows = set(rows)
        named = Counter((int(size or full), fam) for i, (size, full, fam) in enumerate(zip(
            blocks["requested_size"], blocks["size"], cols["family"], strict=True))
            if i not in unknown_rows and fam in inference.MIRRORED)
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

    def _inventory(self, blocks: pl.DataFrame, cols: dict[str, list[Any]]) -> None:
        """Named tensors from the recording's sidecar: a block holding one gets its family
        (evidence "inventory"), ranked above every rule; a rule's more specific family of
        the same kind (a Megatron param buffer for a parameter) is kept, with the name."""
        tensors = self.capture.metadata.get("inventory", {}).get(self.device)
        if not tensors:
            return
        named = sorted((t for t in tensors if t.get("role") in ROLE_FAMILY),
                       key=lambda t: int(t["ptr"]))
        ptrs = [int(t["ptr"]) for t in named]
        for i, (address, size) in enumerate(blocks.select("address", "size").iter_rows()):
            lo = bisect.bisect_left(ptrs, int(address))
            hi = bisect.bisect_left(ptrs, int(address) + int(size))
            if lo == hi:
                continue
            t = max(named[lo:hi], key=lambda t: int(t["nbytes"]))
            family = ROLE_FAMILY[t["role"]]
            if cols["family"][i] in SAME_KIND.get(family, ()):
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
        ev = self.capture.device_events(self.device)
        out = {}
        for address, free_idx, size in candidates.filter(
            (pl.col("free_req_idx") >= 0) & (pl.col("free_req_idx") < ev.height)
        ).select("address", "free_req_idx", "size").iter_rows():
            how = self._freeing(int(ev["stack_id"][int(free_idx)]), size, int(free_idx))
            if how is not None:
                out[int(address)] = how
        return out

    def _freeing(self, sid: int, size: int, free_idx: int) -> inference.Freed | None:
        """The phase, function names and site of the stack `sid` that freed a block at event
        `free_idx` (None: no frames)."""
        stack = self.stacks.stack(sid)
        if not stack:
            return None
        phase = self.decide(sid, self.context(sid, "0,0", 0, ACTIVE_ALLOCATED, size,
                                              free_idx)).phase
        return inference.Freed(phase, frozenset(f[1] for f in stack), self.site(sid))

    @cached_property
    def _replaced_state(self) -> Counter[int]:
        """Requested sizes of the blocks held since before recording that the window frees
        as optimizer state (the lifetime method the freeing stack calls for): all of them,
        whatever the moment (`inference.Evidence.replaced_state`)."""
        ev = self.capture.device_events(self.device).with_row_index("pos")
        first = ev.filter(pl.col("action").is_in(["alloc", "free_requested", "free_completed",
                                                  "free"])
                          ).group_by("addr", maintain_order=True).first()
        out: Counter[int] = Counter()
        for pos, sid, size in first.filter(pl.col("action") != "alloc").select(
                "pos", "stack_id", "size").iter_rows():
            how = None if sid is None else self._freeing(int(sid), int(size or 0), int(pos))
            method = None if how is None else inference.freed_as(how, window=False)
            if method is not None and method.family == "optimizer_state":
                out[int(size or 0)] += 1
        return out

    def _evidence(self, candidates: pl.DataFrame,
                  live: Sequence[tuple[int, str, str, int]] = ()) -> inference.Evidence:
        """What the recorded allocations of this device say about the candidates' sizes:
        only allocations of those sizes are decided (memoised), so it stays cheap. Gradients
        are counted as the most alive at once per size (one step's worth), not summed over
        the steps of the window. `live` are the blocks at the moment that have frames
        (size, family, phase, stack): allocations of the window too, even when their
        event fell out of the trace."""
        sizes = set(candidates["requested_size"].to_list())
        ev = self.capture.device_events(self.device).with_row_index("pos")
        allocs = ev.filter(pl.col("action") == "alloc")
        same = ev.filter(pl.col("action").is_in(["alloc", "free_requested"])
                         & pl.col("size").is_in(list(sizes)))
        live_n: dict[int, int] = {}  # size -> gradients of that size alive now
        grad_at: dict[int, int] = {}  # address -> size, for gradients alive now
        most: dict[int, int] = {}
        others: list[tuple[int, str]] = [(s, f) for s, f, _, _ in live if s in sizes]
        for action, address, sid, stream, size, pos in same.select(
                "action", "addr", "stack_id", "stream", "size", "pos").iter_rows():
            if action == "free_requested":
                # the size the gradient was allocated with: a free naming another size (a
                # trace at odds with itself, warned by the replay) frees that one
                held = grad_at.pop(int(address), None)
                if held is not None:
                    live_n[held] -= 1
                continue
            family = self.decide(sid, self.context(sid, "0,0", stream or 0, ACTIVE_ALLOCATED,
                                                   size, int(pos))).family
            if family in inference.MIRROR_FAMILIES:
                grad_at[int(address)] = int(size)
                live_n[int(size)] = live_n.get(int(size), 0) + 1
                most[int(size)] = max(most.get(int(size), 0), live_n[int(size)])
            else:
                others.append((int(size), family))
        # gradients held now whose allocations fell out of the trace (a ring buffer that
        # wrapped) are gradients of the window all the same: as many of a size at once
        held_grads = Counter(s for s, f, _, _ in live
                             if f in inference.MIRROR_FAMILIES and s in sizes)
        for size, n in held_grads.items():
            most[size] = max(most.get(size, 0), n)
        allocated = int(allocs["size"].sum())
        freed = int(ev.filter(pl.col("action") == "free_requested")["size"].sum())
        backward = any(p in ("backward", "optimizer") for _, _, p, _ in live) or (
            self.capture.has_trace and self.trace_phases().has_phase("backward", "optimizer"))
        no_grad = "" if backward else self._no_grad_site(
            {sid for _, _, _, sid in live} | set(allocs["stack_id"].drop_nulls().to_list()))
        state_in_window = any(f == "optimizer_state" for _, f, _, _ in live)
        ev_out = inference.gather(most, others, allocs.height,
                                  freed / allocated if allocated else 0.0, backward, no_grad,
                                  state_in_window)
        return replace(ev_out, engine=self._engine)

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
