"""The recorded window at another batch or sequence length (issue 61): each request resized
as `scaling` decided, replayed through the allocator model; the peaks it reaches, whether and
where it runs out on a card, and the largest size that fits, found by bisection on the replay.

The resized job starts fresh: the blocks held before the window (the weights, the optimizer
state) are requested first, in address order, at their resized sizes, then the window's
requests and frees in their recorded order. The same run at the recorded sizes is the proof:
its peaks beside the ones the capture recorded show what starting fresh changes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

import numpy as np
import polars as pl

from snapana.analysis.allocator_replay import (
    SMALLEST_EVENTS,
    UNBOUNDED,
    Replay,
    Setting,
    Trace,
    rerun,
)
from snapana.analysis.parallel import Sharding
from snapana.analysis.scaling import (
    CHUNKS,
    LARGEST,
    SCORES,
    Growth,
    NextStep,
    Shares,
    load_rules,
    shares,
    size_knobs,
    step_knob,
)
from snapana.analysis.trace_edits import (
    Edit,
    Loop,
    apply,
    checkpoint_edit,
    chunk_loops,
    hidden_size,
    loop_sizes,
    repeat_iterations,
)

#: --fit doubles the size from the recorded one up to this many times before it says that
#: nothing it can see stops the growth.
MAX_DOUBLINGS = 20


@dataclass(frozen=True)
class ScaledRun:
    """One replay at `sizes` (knob -> size) on `capacity` bytes (None: unbounded)."""

    sizes: Mapping[str, int]
    replay: Replay
    capacity: int | None

    @property
    def fits(self) -> bool:
        return not self.replay.simulated_ooms and not self.replay.stopped


@dataclass(frozen=True)
class Change:
    """What a next-step knob does to the resized window: allocations left out (growth
    rows), families held at most at their recorded size (made in chunks of the recorded
    tokens), an allocator setting over the recorded."""

    drop_rows: frozenset[int] = frozenset()
    hold_rows: frozenset[int] = frozenset()
    setting: Setting | None = None
    #: frees moved and allocations repeated (analysis/trace_edits.py: checkpointing)
    edits: tuple[Edit, ...] = ()
    #: what dropping `drop_rows` leaves out of the knob's own memory ("": nothing)
    leaves_out: str = ""

    @property
    def caveat(self) -> str:
        """What the change's replay leaves out ("": nothing)."""
        return "; ".join([*(e.caveat for e in self.edits if e.caveat),
                          *([self.leaves_out] if self.leaves_out else [])])


@dataclass
class Window:
    """What every resized run replays: the window's `events` (action, idx, addr, size,
    stream, device_free), the `growth` of each of its blocks, the recorded allocator
    `setting`, and the device."""

    device: int
    events: pl.DataFrame
    growth: Growth
    setting: Setting
    #: each growth row's split under another parallel layout (None: the recorded layout)
    sharding: Sharding | None = None
    _rows: np.ndarray = field(init=False)  # each growth row's event position (-1: held)
    #: the chunk loops a larger seq adds chunks to (analysis/trace_edits.py)
    loops: list[Loop] = field(init=False)

    def __post_init__(self) -> None:
        seq, batch = self.growth.sizes.get("seq"), self.growth.sizes.get("batch")
        self.loops = chunk_loops(self.growth.blocks, seq.recorded if seq else None,
                                 batch.recorded if batch else None) \
            if seq or batch else []
        for loop in self.loops:
            self.growth = mark_loop(self.growth, loop)
        pos = self.events.select("idx").with_row_index("_pos")
        rows = self.growth.blocks.select("alloc_idx").with_row_index("_row").join(
            pos, left_on="alloc_idx", right_on="idx", how="left").sort("_row")
        self._rows = rows["_pos"].fill_null(-1).to_numpy().astype(np.int64)

    def trace(self, sizes: Mapping[str, int], change: Change = Change()) -> tuple[Trace,
                                                                                 frozenset[int]]:
        """The resized trace (the held blocks first, as allocations with negative trace
        indices) and the trace indices `change` leaves out."""
        new = self.growth.factor(sizes)
        if self.sharding is not None:
            new = np.clip(np.round(new * self.sharding.factor(sizes)), 0, LARGEST
                          ).astype(np.int64)
        loop_drop: frozenset[int] = frozenset()
        units = self.loop_units(sizes)
        if units:
            loop_drop, _ = loop_sizes(new, self.growth.blocks["requested"].to_numpy(),
                                      self.loops, units)
        if change.hold_rows:
            hold = np.fromiter(change.hold_rows, dtype=np.int64)
            new[hold] = np.minimum(new[hold], self.growth.blocks["requested"].to_numpy()[hold])
        size = self.events["size"].to_numpy().copy()
        in_window = self._rows >= 0
        size[self._rows[in_window]] = new[in_window]
        held = np.flatnonzero(~in_window)
        order = held[np.argsort(self.growth.blocks["address"].to_numpy()[held], kind="stable")]
        prelude_idx = -2 - np.arange(len(order))
        prelude = pl.DataFrame({
            "action": ["alloc"] * len(order), "idx": prelude_idx,
            "addr": self.growth.blocks["address"].to_numpy()[order],
            "size": new[order],
            "stream": self.growth.blocks["stream"].to_numpy()[order],
            "device_free": [None] * len(order)},
            schema={"action": pl.Utf8, "idx": pl.Int64, "addr": pl.Int64, "size": pl.Int64,
                    "stream": pl.Int64, "device_free": pl.Int64})
        window = apply(self.events.select(*Trace.COLUMNS).with_columns(
            pl.Series("size", size)), change.edits)
        if units:
            window = repeat_iterations(window, self.growth.blocks, self.loops, units)
        trace = Trace(pl.concat([prelude, window.cast(prelude.schema)]))
        idx = self.growth.blocks["alloc_idx"].to_numpy()
        prelude_of = dict(zip(order.tolist(), prelude_idx.tolist(), strict=True))
        drop = frozenset(int(idx[r]) if idx[r] >= 0 else prelude_of[r]
                         for r in change.drop_rows | loop_drop)
        return trace, drop

    def loop_units(self, sizes: Mapping[str, int]) -> list[int]:
        """Each chunk loop's units at `sizes` ([] when no loop or no batch / seq asked):
        the tokens a loop runs over grow with the batch and the sequence alike (one loop
        over the packed tokens), its chunk fixed."""
        asked = [k for k in ("batch", "seq") if k in sizes and k in self.growth.sizes]
        if not self.loops or not asked:
            return []
        ratio = float(np.prod([sizes[k] / self.growth.sizes[k].recorded for k in asked]))
        return [loop.units(ratio) for loop in self.loops]

    def run(self, sizes: Mapping[str, int], capacity: int | None,
            change: Change = Change()) -> ScaledRun:
        """One replay of the resized window on `capacity` bytes."""
        trace, drop = self.trace(sizes, change)
        setting = replace(change.setting or self.setting, capacity=capacity or UNBOUNDED,
                          drop=drop)
        return ScaledRun(dict(sizes), rerun(trace, self.device, setting, None, compare=False),
                         capacity)


@dataclass(frozen=True)
class StepKnob:
    """A next-step knob replayed one size past the largest that fits: whether that size then
    fits, and the largest size with the knob. `id` is the knob it is named by (the
    summary's, `step_knob`), `text` that knob's pack name, `step` the next step replayed."""

    id: str
    text: str
    caveat: str
    at_next: ScaledRun
    largest: int | None
    note: str = ""  # why `largest` was not sought
    step: str = ""  # the `[[next_step]]` id replayed ("": `id`)


@dataclass(frozen=True)
class Fit:
    """The largest `knob` that fits `capacity`, the run that proves it and the run one size
    past it (where it runs out), or `note` saying why there is none."""

    knob: str
    capacity: int
    largest: int | None
    proof: ScaledRun | None
    past: ScaledRun | None
    replays: int
    note: str = ""
    steps: tuple[StepKnob, ...] = ()
    withheld: str = ""  # why a largest size found is not given (`withheld`)
    #: the pack knobs whose setting `largest` is (scaling.toml [fit_size]: a smaller
    #: batch), as (id, pack name)
    knobs: tuple[tuple[str, str], ...] = ()


def _bisect(fits: Callable[[int], bool], recorded: int) -> tuple[int | None, int | None, str]:
    """The largest n with `fits(n)`, assumed monotone (a larger job never needs less): from
    the recorded size, doubling up or bisecting down; (largest, first that does not fit,
    why none)."""
    if fits(recorded):
        lo, hi = recorded, recorded * 2
        for _ in range(MAX_DOUBLINGS):
            if not fits(hi):
                break
            lo, hi = hi, hi * 2
        else:
            return None, None, (f"still fits at {lo:,} ({MAX_DOUBLINGS} doublings of the "
                                "recorded size): nothing this window holds grows enough to "
                                "stop it")
    else:
        lo, hi = 0, recorded
    while lo + 1 < hi:
        mid = (lo + hi) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid
    if lo == 0:
        return None, hi, "even a size of 1 does not fit: what does not grow fills the card"
    return lo, hi, ""


def withheld(held: float, n: int, recorded: int, knob: str, ambiguous: float = 0.0) -> str:
    """Why a largest size `n` is not given ("" when it is): the share `held` of the peak held
    at its recorded size could put the peak at `n` off by held × |r − 1| (r = n / recorded),
    and (a seq) the share `ambiguous` grown with seq² that may grow linearly by
    ambiguous × |r² − r|, together past `scaling.toml` `[confidence] max_held_error`."""
    limit = load_rules().max_held_error
    r = n / recorded
    off = held * abs(r - 1) + (ambiguous * abs(r * r - r) if knob == "seq" else 0.0)
    if off <= limit:
        return ""
    also = (f" and {ambiguous:.1%} has the bytes of score matrices and of the attention's "
            "output alike (grown with seq², it may grow linearly)"
            if ambiguous and knob == "seq" else "")
    return (f"not given: {held:.0%} of the peak is held at its recorded size (its growth is "
            f"not known){also}, and the replay's answer is far from the recorded {knob} "
            f"(×{n / recorded:.2g}), where what is held could put the peak off by up to "
            f"{off:.0%} of it (more than "
            f"{limit:.0%}); to fix: --calibrate OTHER.pickle --calibrate-size {knob}=N (a "
            f"capture of the job at another {knob} measures each block's growth), or give "
            f"the {knob} its sizes were made at")


def mark_loop(growth: Growth, loop: Loop) -> Growth:
    """`growth` with the loop's blocks said to grow by more chunks, not larger ones."""
    rows = pl.Series([r for it in loop.rows for r in it], dtype=pl.UInt32)
    mask = pl.int_range(pl.len(), dtype=pl.UInt32).is_in(rows.implode())
    cast = pl.int_range(pl.len(), dtype=pl.UInt32).is_in(
        pl.Series(loop.casts, dtype=pl.UInt32).implode())
    if loop.over == "seq":
        why = (f"one chunk of {loop.chunk:,} tokens of a loop over the sequence "
               f"({len(loop.rows)} chunks at seq {loop.seq:,}): a larger batch or seq makes "
               "more chunks of this size, the last one the rest")
    elif loop.over == "seq tokens":
        why = (f"one chunk of a loop over the batch's packed tokens ({len(loop.rows)} chunks, "
               "equal but the last, which is smaller, together of a size dividing by the "
               "seq): a larger batch or seq makes more chunks of this size, the last one "
               "the rest")
    else:
        why = (f"one chunk of a loop over the batch's tokens ({len(loop.rows)} chunks, equal "
               "but the last, which is smaller): a larger batch makes more chunks of this "
               "size, the last one the rest")
    held = ("a weight's cast made by the loop's first iteration at a chunk's call site, of "
            "a held weight's bytes over autocast's dtype ratio and kept past the loop "
            "(autocast's cached_cast): fixed")
    blocks = growth.blocks.with_columns(
        pl.when(mask | cast).then(pl.lit(CHUNKS)).otherwise(pl.col("how")).alias("how"),
        pl.when(mask).then(pl.lit(why)).when(cast).then(pl.lit(held))
        .otherwise(pl.col("why")).alias("why"))
    return replace(growth, blocks=blocks,
                   assumptions=(*growth.assumptions, "A chunk loop: " + why))


def largest_fit(window: Window, knob: str, capacity: int, steps: bool = True,
                step_largest: bool = True, held: float = 0.0,
                offered: tuple[str, ...] = (), ambiguous: float = 0.0) -> Fit:
    """The largest `knob` whose resized window runs without an OOM on `capacity` bytes, by
    bisection on the replay, with each next-step knob (`scaling.toml` `[[next_step]]`)
    replayed one size past it and, with `step_largest`, the largest size with it (a
    bisection per knob). A size where the share `held` of the peak held fixed could be
    off by too much (`withheld`) is not given, nor one for a knob whose replay leaves part
    of it out (its caveat). Each knob is named as the summary's list (`offered`, pack ids)
    names it (`step_knob`, `size_knobs`)."""
    recorded = window.growth.sizes[knob].recorded
    runs: dict[int, ScaledRun] = {}

    def fits(n: int, change: Change = Change(), memo: dict[int, ScaledRun] = runs) -> bool:
        if n not in memo:
            memo[n] = window.run({knob: n}, capacity, change)
        return memo[n].fits

    n, past, note = _bisect(fits, recorded)
    why = withheld(held, n, recorded, knob, ambiguous) if n is not None else ""
    if why:
        return Fit(knob, capacity, None, None, None, len(runs), withheld=why)
    proof = runs.get(n) if n is not None else None
    past_run = runs.get(past) if past is not None else None
    knobs: list[StepKnob] = []
    if steps and past is not None:
        for step, change in _changes(window):
            mine: dict[int, ScaledRun] = {}

            def fits_with(k: int, c: Change = change, m: dict[int, ScaledRun] = mine) -> bool:
                return fits(k, c, m)

            # a knob whose replay leaves part of its memory out (its caveat) backs no size
            caveat = step.caveat or change.caveat
            found = _bisect(fits_with, past)[0] if step_largest and not caveat else None
            at_next = mine.get(past) or window.run({knob: past}, capacity, change)
            why = "" if step_largest else (f"not sought: {window.events.height:,} events, "
                                           f"more than {SMALLEST_EVENTS:,} (a bisection per "
                                           "knob)")
            if caveat:
                why = f"not given: the replay leaves out {caveat}"
            if found is not None and withheld(held, found, recorded, knob, ambiguous):
                why = withheld(held, found, recorded, knob, ambiguous)
                found = None
            named = step_knob(step.id, offered)
            knobs.append(StepKnob(named, knob_name(named), caveat, at_next, found, why,
                                  step.id))
    return Fit(knob, capacity, n, proof, past_run, len(runs), note, tuple(knobs),
               knobs=tuple((k, knob_name(k)) for k in size_knobs(knob, offered)))


def _changes(window: Window) -> list[tuple[NextStep, Change]]:
    """The next-step knobs that act on something in this window, as changes."""
    from snapana.allocator_model import config

    blocks = window.growth.blocks
    out = []
    for step in load_rules().next_steps:
        rows: set[int] = set()
        held: set[int] = set()
        setting = None
        if step.drop_scores:
            rows |= set(np.flatnonzero(blocks["how"].to_numpy() == SCORES).tolist())
        if step.drop_families:
            rows |= set(np.flatnonzero(blocks["family"].is_in(list(step.drop_families))
                                       .to_numpy()).tolist())
        edits: tuple[Edit, ...] = ()
        leaves_out = ""
        if step.checkpoint:
            rules = load_rules()
            edit = checkpoint_edit(blocks, rules.checkpoint_saved, rules.checkpoint_backward,
                                   hidden_size(blocks), rules.checkpoint_cached)
            edits = (edit,) if edit else ()
            if not edits:  # no layers told apart: the saved activations left out, said
                rows |= set(np.flatnonzero(blocks["family"].is_in(
                    list(rules.checkpoint_without_layers)).to_numpy()).tolist())
                leaves_out = ("each checkpointed block's kept inputs and the recompute of "
                              "one block (the window's layers could not be told apart)")
        if step.hold_families:
            held |= set(np.flatnonzero(blocks["family"].is_in(list(step.hold_families))
                                       .to_numpy()).tolist())
        if step.setting:
            asked, _ = config.parse([step.setting])
            over = {name: getattr(asked, name) for name in
                    ("expandable_segments", "max_split_size", "roundup_divisions")
                    if getattr(asked, name) is not None}
            setting = replace(window.setting, **over)
            if setting == window.setting:
                continue  # already set
        if rows or held or setting is not None or edits:
            out.append((step, Change(frozenset(rows), frozenset(held), setting, edits,
                                     leaves_out)))
    return out


def knob_name(knob_id: str) -> str:
    """A knob's name, from its pack entry (the one place it is written; a step with no pack
    knob: its `text` in scaling.toml), so whatif says what the summary says."""
    from snapana.analysis.knobs import load_knobs

    named = next((k.knob for k in load_knobs() if k.id == knob_id), None)
    if named is not None:
        return named
    return next((s.text for s in load_rules().next_steps if s.id == knob_id and s.text),
                knob_id)


@dataclass(frozen=True)
class SizePrediction:
    """A device's window at other sizes: the resized run at the recorded sizes (the proof,
    beside the peaks the capture itself recorded), at the asked sizes, and the largest size
    that fits `capacity`."""

    device: int
    growth: Growth
    proof: ScaledRun
    recorded_peak_allocated: int
    recorded_peak_reserved: int
    target: ScaledRun | None
    fit: Fit | None
    capacity: int | None
    capacity_note: str
    recorded_oom: int | None = None  # trace index of the capture's own OOM
    traced: bool = True  # False: no trace, the snapshot's blocks alone are resized
    #: the recorded peak's bytes by how sure their growth is
    shares: Shares = Shares(0, {})


def memory_for_pytorch(card: int | None, implied: int | None,
                       total: int | None) -> tuple[int | None, str]:
    """What PyTorch may hold on the card a run is asked on, in words too: the card less what
    held the recorded card outside PyTorch (its `total` less the `implied` capacity the
    recorded OOM's free memory gives) when both are known; the implied one when no card is
    asked; None (unbounded) when neither is known."""
    if card is None:
        if implied is None:
            return None, "not known (no OOM recorded and no --capacity): unbounded"
        return implied, "reserved + free at the recorded OOM"
    if total is not None and implied is not None and total >= implied:
        return card - (total - implied), (f"the card asked less the {total - implied:,} bytes "
                                          "other memory held on the recorded card")
    return card, ("the whole card asked: memory outside PyTorch is not known, so none is "
                  "subtracted")


def predict_sizes(window: Window, targets: Mapping[str, int], fit_knob: str | None,
                  capacity: int | None, capacity_note: str,
                  recorded_peaks: tuple[int, int],
                  recorded_oom: int | None = None,
                  offered: tuple[str, ...] = ()) -> SizePrediction:
    """The proof run at the recorded sizes, the run at `targets` (when any), and the largest
    `fit_knob` on `capacity` (when asked), its knobs named as the summary's `offered`
    (pack ids) name them."""
    sizes = window.growth.sizes
    sure = shares(window.growth)
    layout = window.sharding.change if window.sharding is not None else None
    proof = window.run({**{k: s.recorded for k, s in sizes.items()},
                        **(layout.recorded.sizes(layout.keys) if layout else {})}, capacity)
    target = window.run(targets, capacity) if targets else None
    fit = largest_fit(window, fit_knob, capacity,
                      step_largest=window.events.height <= SMALLEST_EVENTS,
                      held=sure.share("held fixed"), offered=offered,
                      ambiguous=sure.share("ambiguous")) \
        if fit_knob is not None and capacity else None
    return SizePrediction(window.device, window.growth, proof, *recorded_peaks, target, fit,
                          capacity, capacity_note, recorded_oom, not window.events.is_empty(),
                          sure)
