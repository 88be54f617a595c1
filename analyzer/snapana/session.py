"""The one wiring of the pipeline: a capture, a device, a moment, rules and a capacity go in;
the replay, the attribution, the diagnosis and explanations come out, each computed once.

Every face and driver (the CLI, the Jupyter API, `snapana export`, `explain`, the rank runner)
goes through a Session; none of them calls replay, the attributor or diagnosis directly.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from functools import cached_property
from pathlib import Path
from typing import Literal, TypeAlias

import numpy as np
import polars as pl

from snapana.allocator_model import config as alloc_conf
from snapana.analysis.allocator_replay import (
    Before,
    Prediction,
    Setting,
    family_allocations,
    predict,
    window_start,
)
from snapana.analysis.attribution import RuleError, load_rules
from snapana.analysis.attribution.assign import Attributor
from snapana.analysis.attribution.engine import RuleSet
from snapana.analysis.attribution.lifetimes import attribute_lifetimes
from snapana.analysis.diagnosis.diagnose import device_report
from snapana.analysis.diagnosis.findings import DeviceReport
from snapana.analysis.explain import ExplainedSite, explain
from snapana.analysis.parallel import (
    LayoutChange,
    LayoutError,
    parse_layout,
    shard_rows,
    zero_from_frames,
)
from snapana.analysis.ranks.aggregate import RankSummary
from snapana.analysis.replay import NEVER, DeviceReplay, Moment, replay_or_final
from snapana.analysis.scaled_replay import (
    SizePrediction,
    Window,
    memory_for_pytorch,
    predict_sizes,
)
from snapana.analysis.scaling import ScaleError, Size, call_paths, decide, window_blocks
from snapana.analysis.scaling import calibrate as measure
from snapana.capture_kinds import CaptureKind
from snapana.errors import InputError, SnapanaError
from snapana.inputs import Input
from snapana.limits import MAX_DEVICES, SET_DECISION_MOMENTS
from snapana.model import Capture, ReadProgress, is_python_frame
from snapana.units import parse_capacity

#: Rules as a caller may give them: a loaded RuleSet, extra pack files, or None (built-ins).
RulesLike: TypeAlias = RuleSet | Iterable[str | Path] | None


def resolve_rules(rules: RulesLike) -> RuleSet:
    """The built-in packs plus any extra pack files, or a RuleSet as given."""
    if isinstance(rules, RuleSet):
        return rules
    try:
        return load_rules(list(rules or ()))
    except RuleError as exc:  # a bad rule file is the input's fault: one line, exit 2
        raise InputError(str(exc)) from None


def resolve_capacity(capacity: int | str | None) -> int | None:
    """A device capacity from bytes or a size string ('80GiB'); InputError when implausible."""
    if capacity is None:
        return None
    try:
        return parse_capacity(capacity)
    except ValueError as exc:
        raise InputError(f"capacity: {exc}") from None


def find_sidecar(path: str | Path) -> Path | None:
    """The sidecar `snapana record` wrote beside a capture file, if there is one."""
    from snapana.sources import sidecar

    return sidecar.find(Path(path)) if Path(path).is_file() else None


def open_capture(path: str | Path, progress: ReadProgress | None = None, *,
                 sidecar_path: Path | None | Literal["find"] = "find",
                 kind: CaptureKind | None = None) -> Capture:
    """Read any supported artefact into the common model (format detected by content),
    with the sidecar `snapana record` wrote beside it (`sidecar_path`: the one a caller
    already found, None for none; by default looked up here). `kind`: the one a caller
    already told (`inputs.resolve`)."""
    from snapana import sources
    from snapana.sources import sidecar

    capture = sources.load(Path(path), progress, kind)
    found = find_sidecar(path) if sidecar_path == "find" else sidecar_path
    if found is not None:
        sidecar.apply(capture, sidecar.read(found), found)
    return capture


def open_input(inp: Input, progress: ReadProgress | None = None) -> Capture:
    """An input as `inputs.resolve` told it: its kind and its sidecar, found there once (or
    the one line that refuses it)."""
    if inp.path is None:
        raise InputError("standard input is read as a log, not as a capture")
    return open_capture(inp.path, progress, sidecar_path=inp.sidecar, kind=inp.known_kind())


def device_order(capture: Capture, peak: Callable[[int], int] | None = None) -> list[int]:
    """The capture's devices in the order every report lists them: the devices whose trace
    records an OOM first (the earliest OOM first when the traces share a clock, else by
    index), then the rest in capture order. Without any OOM, of two GPUs or more the one with
    the largest peak of allocated bytes leads (`peak(device)`; by replay when not given); the
    host (a profiler's device -1) never does.
    """
    devices = list(capture.devices)
    if len(devices) < 2:
        return devices
    ooms = (capture.events.filter(pl.col("action") == "oom")
            .group_by("device").agg(pl.col("time_us").min().alias("t")))
    failed = {int(d): t for d, t in ooms.iter_rows() if d in devices}
    gpus = [d for d in devices if d >= 0]
    if failed:
        on_clock = all(t is not None for t in failed.values())
        lead = sorted(failed, key=lambda d: ((failed[d] if on_clock else 0), d))
    elif len(gpus) > 1:
        peaks = {d: (peak(d) if peak is not None
                     else replay_or_final(capture, d).peak_allocated_bytes) for d in gpus}
        lead = [max(gpus, key=lambda d: (peaks[d], -d))]
    else:
        lead = []
    return lead + [d for d in devices if d not in lead]


def default_device(capture: Capture) -> int:
    """The device a person opening a crashed job's snapshot wants to see: the first to run
    out of memory, else the one with the largest peak (`device_order`)."""
    return device_order(capture)[0]


class Session:
    """One device of one capture, at one moment, under one rule set and capacity."""

    def __init__(self, capture: Capture, device: int | None = None, *,
                 rules: RulesLike = None, capacity: int | str | None = None,
                 at: str | None = None) -> None:
        if device is not None and device not in capture.devices:
            raise InputError(f"{capture.path}: no device {device} (devices: {capture.devices})")
        self.capture = capture
        self.device: int = default_device(capture) if device is None else device
        self.rules: RuleSet = resolve_rules(rules)
        self.capacity: int | None = resolve_capacity(capacity)
        self.at = at

    @classmethod
    def open(cls, path: str | Path, device: int | None = None, *, rules: RulesLike = None,
             capacity: int | str | None = None, at: str | None = None,
             progress: ReadProgress | None = None) -> Session:
        return cls(open_capture(path, progress), device, rules=rules, capacity=capacity, at=at)

    def for_device(self, device: int) -> Session:
        """The same capture, rules, capacity and moment on another device."""
        return Session(self.capture, device, rules=self.rules, capacity=self.capacity,
                       at=self.at)

    def devices(self) -> list[Session]:
        """One session per device of the capture, in report order (`device_order`: the
        failing device first), this one reused."""
        by_device = {self.device: self}
        for d in self.capture.devices:
            by_device.setdefault(d, self.for_device(d))
        order = device_order(self.capture, lambda d: by_device[d].replay.peak_allocated_bytes)
        return [by_device[d] for d in order]

    # ----- the pipeline, once each ------------------------------------------------------------
    @cached_property
    def replay(self) -> DeviceReplay:
        return replay_or_final(self.capture, self.device)

    @cached_property
    def attributor(self) -> Attributor:
        # the replay's capture: without the trace when it was not replayed (`replay_or_final`)
        attributor = Attributor(self.replay.capture, self.device, self.rules)
        if self.replay.n_events:
            attributor.decide_sets_at(self._set_moments)
        return attributor

    def _set_moments(self) -> list[pl.DataFrame]:
        """The blocks live at the moments the families named among blocks held together are
        decided at, once for the window (`Attributor.decide_sets_at`): the moment of
        interest, the peak, then `SET_DECISION_MOMENTS` events spread evenly over the trace
        (a crowd of same-size blocks that hides a set at one moment is gone at another), and
        the forward's end (`_forward_end`).
        None depends on the moment asked for, so every moment shows the same decisions."""
        dr = self.replay
        n = dr.n_events
        spread = [dr.event(int(k * (n - 1) / max(SET_DECISION_MOMENTS - 1, 1)))
                  for k in range(SET_DECISION_MOMENTS)]
        picked: dict[int, Moment] = {}
        forward = _forward_end(dr, self.replay.capture)
        for m in (dr.interest, dr.peak, *spread, *([forward] if forward else [])):
            picked.setdefault(m.idx, m)
        return [dr.blocks_at(m) for m in picked.values()]

    @property
    def device_capacity(self) -> int | None:
        """The capacity given, else the one the capture itself records for this device."""
        if self.capacity is not None:
            return self.capacity
        return self.capture.capacity_bytes.get(self.device)

    @cached_property
    def moment(self) -> Moment:
        """This session's moment, the replay's answer to `at` (None: the moment of
        interest); the diagnosis receives it, never recomputes it."""
        return self.replay.resolve(self.at)

    @cached_property
    def report(self) -> DeviceReport:
        """Everything the renderers show for this device at this session's moment."""
        return device_report(self.replay.capture, self.replay, self.attributor, self.moment,
                             self.device_capacity, self.at)

    def attributed_blocks(self, moment: Moment) -> pl.DataFrame:
        """Blocks live at `moment` (allocated and pending-free), each with its family."""
        return self.attributor.attribute(self.replay.blocks_at(moment))

    def whatif(self, *settings: str, capacity: int | str | None = None,
               smallest: bool | None = None, drop: Sequence[str] = (),
               free_before_forward: Sequence[str] = (),
               empty_cache_before_forward: bool = False) -> Prediction:
        """This device's recorded window re-run through the allocator model under the
        recorded settings (the proof) and under `settings` (PYTORCH_CUDA_ALLOC_CONF items,
        e.g. "expandable_segments:True", "max_split_size_mb:512") and `capacity` (a card,
        e.g. "141GiB"); a setting the model has no rule for is refused, never ignored.
        `smallest`: seek the least memory the window fits in under the change (None: when
        the trace is short enough for its dozen replays to be quick). `drop`: families whose
        allocations in the window are left out with their frees (blocks held before the
        window stay, and so does a failed request: does it fit without them?).
        `free_before_forward`: families whose live blocks are freed where each forward phase
        starts (its first allocation, as the phases are inferred);
        `empty_cache_before_forward`: torch.cuda.empty_cache() there."""
        try:
            asked, not_simulated = alloc_conf.parse(settings)
        except alloc_conf.ConfError as exc:
            raise InputError(f"setting {exc}") from None
        if not_simulated:
            raise InputError("not simulated: " + "; ".join(not_simulated))
        card = resolve_capacity(capacity) if isinstance(capacity, str) else capacity
        conf = alloc_conf.recorded(self.capture.allocator_settings)
        events = self.replay.capture.device_events(self.device)
        pad = self.replay.request_pad
        changed = replace(Setting.of(conf, asked, card, pad), drop=self._allocations_of(drop))
        if free_before_forward or empty_cache_before_forward:
            starts = self._forward_starts()
            allocs, held = self._blocks_of(free_before_forward)
            changed = replace(changed, free_at=starts if free_before_forward else frozenset(),
                              free_allocs=allocs, free_held=held,
                              empty_at=starts if empty_cache_before_forward else frozenset())
        prediction = predict(events, self.device, Setting.of(conf, request_pad=pad), changed,
                             self.window_start, self.capture.capacity_bytes.get(self.device),
                             smallest)
        # as recorded, the peak is the capture's own, the one every command prints: the
        # model's run proves its segment events, and may place a block elsewhere in them
        dr = self.replay
        shown = dr.peak_allocated_bytes if dr.has_history else dr.allocated_at(dr.final)
        return replace(prediction, recorded=replace(prediction.recorded, peak_allocated=shown))

    @cached_property
    def window_blocks(self) -> pl.DataFrame:
        """The blocks a resized replay resizes, attributed once per session: `--scale`
        with a layout reads their frames, and each size asked resizes them."""
        return window_blocks(self.attributor, self.replay, self.moment)

    def scaling(self, sizes: Mapping[str, Size],
                calibrate: tuple[Session, str, int] | None = None) -> Window:
        """This device's window ready to be replayed at other sizes (`--scale`): each block's
        growth decided from its family, site and size, and, given `calibrate` (a session of
        the same job, the knob in which it differs and its size there), measured against
        that capture."""
        blocks = self.window_blocks
        growth = decide(blocks, self.capture.stacks, sizes)
        if calibrate is not None:
            other, knob, size = calibrate
            theirs = other.window_blocks
            try:
                growth = measure(growth, call_paths(blocks, self.capture.stacks),
                                 call_paths(theirs, other.capture.stacks), knob, size)
            except ScaleError as exc:
                raise InputError(f"--calibrate: {exc}") from None
        conf = alloc_conf.recorded(self.capture.allocator_settings)
        return Window(self.device, self.replay.capture.device_events(self.device), growth,
                      Setting.of(conf))

    def resize(self, sizes: Mapping[str, Size], card: int | str | None = None,
               fit: str | None = None,
               calibrate: tuple[Session, str, int] | None = None,
               layout: LayoutChange | None = None) -> SizePrediction:
        """This device's window replayed at the asked sizes (`sizes`' targets) and parallel
        `layout` on `card` (None: the card the recorded OOM implies), and the largest `fit`
        knob that fits it, its knobs named as this session's summary names them."""
        window = self.scaling(sizes, calibrate)
        if layout is not None:
            window = self._sharded(window, layout)
        o = self.replay.oom
        implied = int(self.replay.reserved[o.idx]) + o.device_free_bytes \
            if o is not None and o.device_free_bytes is not None else None
        capacity, note = memory_for_pytorch(
            resolve_capacity(card) if isinstance(card, str) else card, implied,
            self.capture.capacity_bytes.get(self.device))
        if fit is not None and capacity is None:
            raise InputError("--fit needs a card: give --capacity SIZE (no OOM is recorded "
                             "to imply one)")
        targets = {k: s.target for k, s in sizes.items() if s.target is not None}
        if layout is not None:
            targets.update(layout.target.sizes(layout.keys))
        offered = tuple(k.id for k in self.report.diagnosis.knobs) if fit is not None else ()
        return predict_sizes(window, targets, fit, capacity, note, self._recorded_peaks(),
                             o.idx if o is not None else None, offered)

    def parallel_layout(self, items: Sequence[str], zero: str | None) -> LayoutChange | None:
        """The layout change `--scale tp= / dp= / pp= / sp=` and `--zero` ask for, the
        recorded ZeRO stage read from the window's frames where --zero does not state it."""
        stack_ids = self.window_blocks["stack_id"]
        read = zero_from_frames(self.capture.stacks, stack_ids.unique().to_list())
        try:
            return parse_layout(items, zero, read)
        except LayoutError as exc:
            raise InputError(str(exc)) from None

    def _sharded(self, window: Window, layout: LayoutChange) -> Window:
        """`window` with each block's split under `layout`, and what it rests on said."""
        growth = window.growth
        sharding = shard_rows(growth.blocks, self.capture.stacks, layout)
        said = sharding.words(growth.blocks["requested"].to_numpy())
        return Window(window.device, window.events,
                      replace(growth, assumptions=(*growth.assumptions, *said)),
                      window.setting, sharding)

    def _recorded_peaks(self) -> tuple[int, int]:
        """Peak allocated and reserved as the capture records them, to set beside a resized
        run at the recorded size; with no trace, the snapshot's (its blocks awaiting a free
        counted, as the model holds them)."""
        dr = self.replay
        if dr.has_history:
            return dr.peak_allocated_bytes, int(dr.reserved.max(initial=0))
        live = dr.blocks_at(dr.final)
        return int(live["size"].sum()), dr.reserved_at(dr.final)

    def _forward_starts(self) -> frozenset[int]:
        """Trace indices where a forward phase starts: its first allocation."""
        lifetimes = attribute_lifetimes(self.attributor, self.replay).filter(
            pl.col("alloc_idx") >= 0).sort("alloc_idx")
        phase = lifetimes["phase"]
        starts = lifetimes.filter((phase == "forward") & (phase.shift(1) != "forward")
                                  | (phase == "forward") & phase.shift(1).is_null())
        if starts.is_empty():
            raise InputError("no forward phase is marked in this window (the phases are "
                             "inferred from the frames and annotations): nothing to free "
                             "before it")
        return frozenset(starts["alloc_idx"].to_list())

    def _blocks_of(self, families: Sequence[str]) -> tuple[frozenset[int], frozenset[int]]:
        """The allocations of `families` in the window (trace indices) and their blocks
        held from before it (addresses)."""
        if not families:
            return frozenset(), frozenset()
        lifetimes = self._family_lifetimes(families)
        return (frozenset(lifetimes.filter(pl.col("alloc_idx") >= 0)["alloc_idx"].to_list()),
                frozenset(lifetimes.filter(pl.col("alloc_idx") < 0)["address"].to_list()))

    def _family_lifetimes(self, families: Sequence[str]) -> pl.DataFrame:
        lifetimes = attribute_lifetimes(self.attributor, self.replay)
        present = set(lifetimes["family"].unique().to_list())
        missing = [f for f in families if f not in present]
        if missing:
            raise InputError(f"{missing[0][:60]!r}: no allocation of that family in this "
                             f"window (families: {', '.join(sorted(present - {''}))})")
        return lifetimes.filter(pl.col("family").is_in(list(families)))

    def _allocations_of(self, families: Sequence[str]) -> frozenset[int]:
        """Trace indices of the window's allocations of `families` (as attributed)."""
        if not families:
            return frozenset()
        return family_allocations(self._family_lifetimes(families), families)

    @cached_property
    def window_start(self) -> Before:
        """The allocator's state before the recorded window, as the model starts from it."""
        return window_start(self.replay.capture, self.replay)

    def explain(self, *, block: int | None = None, family: str | None = None,
                site: str | None = None, limit: int = 10) -> list[ExplainedSite]:
        """Why the selected blocks at this session's moment got their families."""
        when = f"at event {self.moment.idx}" if self.at else "at the moment of interest"
        return explain(self.replay.capture, self.attributor,
                       self.attributed_blocks(self.moment), when, block=block, family=family,
                       site=site, limit=limit)


def sessions(capture: Capture, device: int | None = None, *, rules: RulesLike = None,
             capacity: int | str | None = None, at: str | None = None) -> list[Session]:
    """A session per device of the capture (or just the one asked for), sharing one rule set,
    in report order: the failing device first, or the largest peak (`device_order`)."""
    ruleset = resolve_rules(rules)
    if device is None and len(capture.devices) > MAX_DEVICES:  # every source, one bound
        raise InputError(f"{capture.path}: {len(capture.devices):,} devices hold data (at most "
                         f"{MAX_DEVICES}; one process sees one node's devices); pass --device "
                         "to analyse one")
    devices = capture.devices if device is None else [device]
    made = {d: Session(capture, d, rules=ruleset, capacity=capacity, at=at) for d in devices}
    if device is not None:
        return list(made.values())
    order = device_order(capture, lambda d: made[d].replay.peak_allocated_bytes)
    return [made[d] for d in order]


def analyse(capture: Capture, device: int | None = None, *, rules: RulesLike = None,
            capacity: int | str | None = None, at: str | None = None) -> list[DeviceReport]:
    """The DeviceReport of each device (or of the one asked for)."""
    return [s.report for s in sessions(capture, device, rules=rules, capacity=capacity, at=at)]


def summarize(inp: Input, rules: RulesLike = None, capacity: int | None = None
              ) -> tuple[RankSummary, DeviceReport | None]:
    """One input of a rank run reduced to its RankSummary (small, picklable: the rank
    runner's worker processes return it), and the full report of the device it summarises
    (None when the input could not be analysed). Given to `ranks.runner.run_many` by the
    caller, so the runner below this layer never imports it."""
    summary = RankSummary(file=str(inp.path), rank=inp.rank)
    try:
        capture = open_input(inp)
        reports = analyse(capture, rules=rules or (), capacity=capacity)
    except (SnapanaError, RuleError) as exc:
        summary.error = str(exc)
        return summary, None
    except Exception as exc:  # a worker must report, not die: one bad rank is not the job
        summary.error = f"{inp.path}: could not analyse: {type(exc).__name__}: {exc}"
        return summary, None
    r = next((r for r in reports if r.oom is not None), reports[0])
    summary.device = r.device
    summary.devices = list(capture.devices)
    summary.reserved_bytes = r.reserved_bytes
    summary.allocated_bytes = r.allocated_bytes
    summary.peak_allocated_bytes = r.peak_allocated_bytes
    summary.families = {g.name: g.bytes for g in r.groups}
    summary.top_family = r.groups[0].name if r.groups else None
    summary.findings = _without_series(r)
    summary.moment = r.moment.kind
    summary.history, summary.oom_named = r.diagnosis.history, r.diagnosis.oom_named
    if r.oom is not None:
        summary.oom = {"requested_bytes": r.oom.requested_bytes,
                       "device_free_bytes": r.oom.device_free_bytes,
                       "event_index": r.oom.event_index, "time_us": r.moment.time_us}
    settings = capture.allocator_settings or {}
    summary.settings = str(settings.get("PYTORCH_CUDA_ALLOC_CONF", "")) + (
        " expandable" if settings.get("expandable_segments") else "")
    return summary, r


def _without_series(r: DeviceReport) -> DeviceReport:
    """A report's findings without what grows with the trace or the blocks (the per-event
    series, the segments and the live blocks): kilobytes, enough to word it."""
    import numpy as np

    empty = np.zeros(0, dtype=np.int64)
    timeline = replace(r.timeline, allocated=empty, reserved=empty, times_us=None, bands=(),
                       families=None, stacks=None)
    return replace(r, timeline=timeline, segments=r.segments.clear(),
                   live_blocks=r.live_blocks.clear())


def summarize_many(paths: Sequence[str | Path], workers: int | None = None,
                   rule_files: list[str] | None = None, capacity: int | None = None,
                   engine: str = "local", findings: bool = False) -> list[RankSummary]:
    """Each path a rank (`inputs.resolve`), summarised by the rank runner with this
    session's worker; order follows `paths`. `findings`: each summary keeps its device's
    findings (else None: the rank table needs none)."""
    from snapana.analysis.ranks.runner import run_many
    from snapana.inputs import resolve

    ins = resolve(list(paths), texts=False, every_rank=True)
    return run_many(ins.ranks, summarize, workers, rule_files, capacity, engine,
                    findings=findings).summaries


def _forward_end(dr: DeviceReplay, capture: Capture) -> Moment | None:
    """The event after which the window's allocations made with Python frames hold the most
    bytes (None: none has frames): the forward's end, where all it keeps lives together (a
    backward's allocations, on the autograd thread, have none). A training step's peak and
    the evenly spread moments may all fall after the backward freed autocast's weight
    copies, whose sizes beside the weights name them only while they are held together."""
    lt = dr.lifetimes.filter(pl.col("alloc_idx") >= 0)
    if lt.is_empty():
        return None
    framed = {int(s) for s in lt["stack_id"].unique().to_list()
              if any(is_python_frame(f) for f in capture.stacks.stack(int(s)))}
    lt = lt.filter(pl.col("stack_id").is_in(list(framed)))
    if lt.is_empty():
        return None
    size = lt["size"].to_numpy().astype(np.int64)
    t = np.concatenate([lt["alloc_idx"].to_numpy(),
                        lt["free_done_idx"].fill_null(NEVER).to_numpy()])
    delta = np.concatenate([size, -size])
    order = np.lexsort((delta, t))  # at one index, a free before an allocation
    return dr.event(int(t[order][int(np.argmax(np.cumsum(delta[order])))]))
