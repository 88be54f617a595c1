"""Apply a RuleSet to a table of blocks: one decision per distinct (stack, context), mapped
back onto every block as columns (family, label, rule_id, phase, reason, site)."""

from __future__ import annotations

import bisect
from typing import Any

import polars as pl

from snapana.attribution.engine import Decision, RuleSet
from snapana.attribution.sites import site_of
from snapana.attribution.stack import BlockContext
from snapana.model import Capture


def parse_pool(pool: str) -> tuple[int, int]:
    a, _, b = (pool or "0,0").partition(",")
    return (int(a or 0), int(b or 0))


class AnnotationWindows:
    """Which external_annotations (record_function ranges) were open at a given time."""

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
            windows.extend((s, 2**62, name) for s in starts)
        self.windows = sorted(windows)
        self._starts = [w[0] for w in self.windows]

    def at(self, time_us: int | None) -> tuple[str, ...]:
        if time_us is None or not self.windows:
            return ()
        hi = bisect.bisect_right(self._starts, time_us)
        return tuple(sorted({n for s, e, n in self.windows[:hi] if s <= time_us <= e}))


class Attributor:
    """Decisions for the blocks of one device of one capture, memoised by stack id."""

    def __init__(self, capture: Capture, device: int, rules: RuleSet) -> None:
        self.capture = capture
        self.stacks = capture.stacks
        stack_ids = set(capture.blocks["stack_id"].to_list()) | set(
            capture.events.filter(pl.col("action") == "alloc")["stack_id"].to_list()
        )
        self.rules = rules.with_sites(self.stacks.stack(s) for s in stack_ids)
        self.windows = AnnotationWindows(capture, device)
        ev = capture.device_events(device)
        self._times = ev["time_us"].to_list() if capture.has_time else []
        self._memo: dict[tuple[Any, ...], Decision] = {}
        self._sites: dict[int, str] = {}

    def context(self, stack_id: int, pool: str, stream: int, state: str, size: int,
                alloc_idx: int) -> BlockContext:
        has_event = (alloc_idx >= 0) if self.capture.has_trace else None
        t = self._times[alloc_idx] if 0 <= alloc_idx < len(self._times) else None
        return BlockContext(pool_id=parse_pool(pool), stream=int(stream or 0), state=state,
                            size=int(size), has_alloc_event=has_event,
                            annotations=self.windows.at(t))

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
        """Add family, label, rule_id, phase, reason and site columns to `blocks`, which has
        stack_id, pool, stream, state, size and alloc_idx (as DeviceReplay.blocks_at gives)."""
        cols: dict[str, list[Any]] = {k: [] for k in ("family", "label", "rule_id", "phase",
                                                     "reason", "site")}
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
        return blocks.with_columns(
            [pl.Series(k, v, dtype=pl.Utf8) for k, v in cols.items()]
        )
