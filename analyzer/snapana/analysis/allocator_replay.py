"""A capture's recorded requests re-run through the model of PyTorch's caching allocator
(issue 45): first under the settings the capture records, to prove the model on this very
trace (its `cudaMalloc` / `cudaFree` / map / unmap must come out as PyTorch recorded them,
size for size and in order, and an OOM must fail at the recorded request), then under a
changed setting or capacity, to say whether the job would still have died and what its peak
would have been.

The model is the simulator that writes the samples (`allocator_model.simulator`: best fit over the
(stream, size, address) order, splitting and coalescing, release-and-retry, expandable
segments mapped by pages), driven by the trace:

- `alloc` is a request of its recorded size on its stream; `free_completed` gives the block
  back (a free that waited on another stream completes there, as in the allocator);
- `oom` is a request that must fail: the model is given the device's capacity that makes the
  recorded free memory true at that moment (what cudaMemGetInfo saw: other processes, the
  CUDA context and non-PyTorch allocations included);
- a recorded `segment_free` / `segment_unmap` that the model has not made itself is the job
  releasing its cache (`torch.cuda.empty_cache()`, or a retry after a failed cudaMalloc):
  the model releases its own cache there, and which segments it gives back is compared.

- a request's pool (the trace names none) is that of the segment its recorded address lies
  in: private pools (CUDA graphs, MemPool) are known from the segments held before the
  window and those the snapshot ends with.

What the model cannot know is said, and nothing is predicted from it: a free of a block
allocated before the recorded window (the ring buffer dropped its start), expandable
segments mapped before the window; wherever its run parts from the recorded one.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import polars as pl

from snapana.allocator_model.config import AllocConf
from snapana.allocator_model.simulator import CachingAllocatorSim, SimulatedOOM
from snapana.analysis.replay import Moment
from snapana.units import ascii_int

if TYPE_CHECKING:
    from snapana.analysis.attribution import Knob
    from snapana.analysis.replay import DeviceReplay
    from snapana.model import Capture

#: Segment actions compared between the recorded trace and the model's.
SEGMENT_ACTIONS = ("segment_alloc", "segment_free", "segment_map", "segment_unmap")
#: What the model writes in its own trace during a replay (the rest is not read back).
MODEL_ACTIONS = frozenset(SEGMENT_ACTIONS) | {"oom"}
#: Capacity when the capture gives none: no OOM but the recorded ones (1 TiB: more than any
#: device; the expandable ranges of 1 1/8 of it still fit the simulated address space).
UNBOUNDED = 1 << 40


@dataclass(frozen=True)
class Setting:
    """The allocator a replay runs: expandable segments on or off, max_split_size_mb (in
    bytes; None: unlimited), roundup_power2_divisions (per power-of-two interval from 1 MiB;
    (): plain 512-byte rounding), and the device's capacity."""

    expandable_segments: bool
    capacity: int | None = None  # None: the one that makes the recorded OOM's free true
    max_split_size: int | None = None
    roundup_divisions: tuple[int, ...] = ()
    #: bytes the capture's allocator adds to each request before rounding (torch_npu: 32;
    #: `DeviceReplay.request_pad`, learned from the final blocks)
    request_pad: int = 0
    #: trace indices of `alloc` events left out, with their frees (a family dropped)
    drop: frozenset[int] = frozenset()
    #: phase boundaries (trace indices: the first event of each forward) where the blocks
    #: below are freed, and where the cache is emptied (torch.cuda.empty_cache())
    free_at: frozenset[int] = frozenset()
    #: blocks freed at `free_at`: by the trace index of their allocation, and, for blocks
    #: held before the window, by address
    free_allocs: frozenset[int] = frozenset()
    free_held: frozenset[int] = frozenset()
    empty_at: frozenset[int] = frozenset()

    @classmethod
    def of(cls, conf: AllocConf, over: AllocConf | None = None,
           capacity: int | None = None, request_pad: int = 0) -> Setting:
        """`conf` (what the capture records) with what `over` sets put over it, on an
        allocator that pads each request by `request_pad` bytes."""
        over = over or AllocConf()

        def pick(name: str) -> Any:
            mine = getattr(over, name)
            return mine if mine is not None else getattr(conf, name)

        return cls(bool(pick("expandable_segments")), capacity, pick("max_split_size"),
                   pick("roundup_divisions") or (), request_pad)


@dataclass(frozen=True)
class Before:
    """The allocator's state before the recorded window, as the analysis's replay
    reconstructs it: each segment as `CachingAllocatorSim.adopt` takes it (address, size,
    stream, small, blocks of (address, size, requested, allocated)); `unsupported` says why
    the model cannot start from it ("" when it can)."""

    segments: tuple[tuple[int, int, int, bool, tuple[tuple[int, int, int, bool], ...]], ...]
    unsupported: str = ""
    #: the pool of each held segment (by position) and of each request of the window that
    #: went to a private pool (by trace index): see `request_pools`
    segment_pools: tuple[tuple[int, int], ...] = ()
    pools: Mapping[int, tuple[int, int]] = field(default_factory=dict)

    @property
    def reserved(self) -> int:
        return sum(s[1] for s in self.segments)


@dataclass
class Replay:
    """One device's trace re-run: the segment events on both sides, where they first part,
    the OOMs, the peaks, and why the model stopped (if it did)."""

    device: int
    setting: Setting
    recorded: list[tuple[str, int]] = field(default_factory=list)
    recorded_at: list[int] = field(default_factory=list)  # their trace indices
    simulated: list[tuple[str, int]] = field(default_factory=list)
    #: (position in the segment events, trace index, why) of the first difference
    divergence: tuple[int, int, str] | None = None
    recorded_ooms: list[int] = field(default_factory=list)  # trace indices
    #: trace index and request of each OOM the model raised
    simulated_ooms: list[tuple[int, int]] = field(default_factory=list)
    peak_allocated: int = 0
    peak_reserved: int = 0
    stopped: str = ""  # why the model could not go on ("" : the whole window was run)
    stopped_at: int | None = None
    final_segments: list[int] = field(default_factory=list)  # sizes, sorted
    compared: int = 0  # segment events checked so far
    #: the trace index where a proof run was cut once it had parted from the recorded segment
    #: events (`rerun(..., until_divergence=True)`): its peaks and model events stop there
    cut_at: int | None = None

    @property
    def exact(self) -> bool:
        """Every segment event reproduced, in order, and nothing stopped the model."""
        return not self.stopped and self.divergence is None and \
            len(self.recorded) == len(self.simulated)

    @property
    def oom_reproduced(self) -> bool | None:
        if not self.recorded_ooms:
            return None
        return [i for i, _ in self.simulated_ooms] == self.recorded_ooms


class Trace:
    """A device's trace as columns (action, idx, addr, size, stream, device_free): what
    the model reads, without a dict per event (a million-event window would hold a GiB of
    them)."""

    COLUMNS = ("action", "idx", "addr", "size", "stream", "device_free")

    def __init__(self, events: pl.DataFrame | list[dict[str, Any]]) -> None:
        if isinstance(events, pl.DataFrame):
            self.columns = tuple(events[c].to_list() for c in self.COLUMNS)
            self.frame: pl.DataFrame | None = events
        else:
            self.columns = tuple([e.get(c) for e in events] for c in self.COLUMNS)
            self.frame = None

    def __len__(self) -> int:
        return len(self.columns[0])

    def rows(self) -> Iterator[tuple[Any, ...]]:
        return zip(*self.columns, strict=True)


Events = Trace | pl.DataFrame | list[dict[str, Any]]


def as_trace(events: Events) -> Trace:
    return events if isinstance(events, Trace) else Trace(events)


def _capacity_for(events: Events, held: int = 0) -> int | None:
    """The capacity that makes the last OOM's recorded free memory true: what was reserved
    before the window (`held`) and by the recorded segment events until then, plus
    device_free."""
    trace = as_trace(events)
    if trace.frame is not None:  # the same sums as columns
        f = trace.frame
        change = (pl.when(pl.col("action").is_in(["segment_alloc", "segment_map"]))
                  .then(pl.col("size")).when(pl.col("action").is_in(
                      ["segment_free", "segment_unmap"])).then(-pl.col("size"))
                  .otherwise(0).fill_null(0).cast(pl.Int64))
        known = f.select(change.cum_sum().alias("reserved"), "action", "device_free").filter(
            (pl.col("action") == "oom") & pl.col("device_free").is_not_null())
        if known.is_empty():
            return None
        return held + int(known["reserved"][-1]) + int(known["device_free"][-1])
    reserved = held
    capacity = None
    for a, _, _, size, _, device_free in trace.rows():
        if a in ("segment_alloc", "segment_map"):
            reserved += size
        elif a in ("segment_free", "segment_unmap"):
            reserved -= size
        elif a == "oom" and device_free is not None:
            capacity = reserved + int(device_free)
    return capacity


def rerun(events: Events, device: int, setting: Setting,
          before: Before | None = None, compare: bool = True,
          until_divergence: bool = False) -> Replay:
    """Re-run one device's `events` (action, addr, size, stream, device_free, idx, in trace
    order) under `setting`, from the state `before` the window (None: empty). `compare`:
    check the model's segment events against the recorded ones (under the recorded
    settings); a what-if only runs. `until_divergence`: a proof that only decides whether a
    prediction is made stops simulating where the model parts from the recording (nothing
    after it is used); the recorded segment events are still all counted."""
    events = as_trace(events)
    out = Replay(device, setting)
    held = before.reserved if before is not None else 0
    capacity = setting.capacity or _capacity_for(events, held) or UNBOUNDED
    addresses: list[int] = []  # of the recorded segment events, in order
    sim, made = _model(setting, capacity, out, addresses)
    blocks: dict[int, int] = {}  # recorded address -> the model's
    dropped: set[int] = set()  # recorded addresses of live blocks left out
    allocated_at: dict[int, int] = {}  # recorded address -> trace index of its allocation
    if before is not None:
        if before.unsupported:
            out.stopped, out.stopped_at = before.unsupported, -1
            return out
        _adopt(sim, before, blocks)
    pools = before.pools if before is not None else {}
    last = -1
    free_at, empty_at = setting.free_at, setting.empty_at
    trace = sim.trace  # the model's segment events (and OOMs) as it makes them
    for action, idx, at, size, stream, _ in events.rows():
        last = idx
        if free_at and idx in free_at:
            _free_early(sim, setting, blocks, allocated_at, dropped)
        if empty_at and idx in empty_at:
            sim.release_cached(sim.table.empty)
        if action in SEGMENT_ACTIONS:
            out.recorded.append((action, size))
            out.recorded_at.append(idx)
            addresses.append(at)
            if action in ("segment_free", "segment_unmap") and \
                    len(made.events()) < len(out.recorded):
                sim.release_cached(sim.table.empty)  # the job released its cache here
        elif action == "alloc" and idx in setting.drop:
            dropped.add(at)
        elif action == "alloc":
            try:
                blocks[at] = sim.malloc(size, stream=stream, pool=pools.get(idx, (0, 0)))
                allocated_at[at] = idx
            except SimulatedOOM as oom:
                out.simulated_ooms.append((idx, oom.requested))
                out.stopped, out.stopped_at = ("the model ran out of memory here, where the "
                                               "job did not: what followed is not simulated",
                                               idx)
                break
        elif action == "free_completed" and at in dropped:
            dropped.discard(at)
        elif action == "free_completed":
            addr = blocks.pop(at, None)
            if addr is None:
                out.stopped, out.stopped_at = ("a block allocated before the recorded window is "
                                               "freed here: the model does not hold it", idx)
                break
            sim.free(addr)
        elif action == "oom":
            out.recorded_ooms.append(idx)
            try:
                addr = sim.malloc(size, stream=stream, pool=pools.get(idx, (0, 0)))
            except SimulatedOOM as oom:
                out.simulated_ooms.append((idx, oom.requested))
            else:  # the model found room: the request fits here, and is counted held
                out.peak_allocated = max(out.peak_allocated, sim.allocated)
                sim.free(addr)
        if sim.allocated > out.peak_allocated:
            out.peak_allocated = sim.allocated
        if sim.reserved > out.peak_reserved:
            out.peak_reserved = sim.reserved
        # only a new segment event on either side can part the two sequences
        if compare and (len(trace) != made.seen or len(out.recorded) > out.compared):
            _compare(out, made.events(), idx)
            if until_divergence and out.divergence is not None:
                out.cut_at = idx
                _count_recorded(out, events, idx)
                break
    _finish(out, made, sim, compare, last)
    return out


def _model(setting: Setting, capacity: int, out: Replay, addresses: list[int]
           ) -> tuple[CachingAllocatorSim, _Made]:
    """The allocator model for `setting`, and what it has made so far. While its segment
    events agree with the recorded ones (`out.recorded`, at `addresses`), each new segment
    takes the address the job's own cudaMalloc (or first map) returned."""
    made: _Made

    def recorded_address(action: str, size: int) -> int | None:
        """The address the job's own cudaMalloc (or first map) returned for the segment
        event the model is about to make, while the two sequences agree there."""
        k = len(made.events())
        if k >= len(addresses) or out.recorded[k][0] != action or \
                (action == "segment_alloc" and out.recorded[k][1] != size):
            return None
        return addresses[k]

    sim = CachingAllocatorSim(capacity, expandable_segments=setting.expandable_segments,
                              addresses=recorded_address, trace_actions=MODEL_ACTIONS,
                              max_split_size=setting.max_split_size,
                              roundup_divisions=setting.roundup_divisions,
                              request_pad=setting.request_pad)
    made = _Made(sim)
    return sim, made


def _adopt(sim: CachingAllocatorSim, before: Before, blocks: dict[int, int]) -> None:
    """The state before the window taken into the model: its segments, each in its pool,
    and their live blocks (at their own addresses) into `blocks`."""
    for i, seg in enumerate(before.segments):
        pool = before.segment_pools[i] if i < len(before.segment_pools) else (0, 0)
        sim.adopt(*seg, pool=pool)
        blocks.update({b[0]: b[0] for b in seg[4] if b[3]})


def _finish(out: Replay, made: _Made, sim: CachingAllocatorSim, compare: bool,
            last: int) -> None:
    """What the model made, its final segments, and (comparing) a divergence in the number
    of segment events where none was found before `last`, the last trace index run."""
    out.simulated = list(made.events())
    out.final_segments = sim.segment_sizes()
    if compare and out.divergence is None and len(out.simulated) != len(out.recorded):
        k = min(len(out.simulated), len(out.recorded))
        out.divergence = (k, max(last, 0),
                          "the model made more segment events than the trace records"
                          if len(out.simulated) > len(out.recorded) else
                          "the trace records segment events the model did not make")


def _count_recorded(out: Replay, events: Trace, after: int) -> None:
    """The recorded segment events after trace index `after`, not simulated."""
    for action, idx, _, size, _, _ in events.rows():
        if idx > after and action in SEGMENT_ACTIONS:
            out.recorded.append((action, size))
            out.recorded_at.append(idx)


def _free_early(sim: CachingAllocatorSim, setting: Setting, blocks: dict[int, int],
                allocated_at: dict[int, int], dropped: set[int]) -> None:
    """Free, at a phase boundary, the live blocks `setting` names; their recorded frees
    later on are then skipped."""
    for at in [a for a in blocks if allocated_at.get(a, -1) in setting.free_allocs
               or a not in allocated_at and a in setting.free_held]:
        sim.free(blocks.pop(at))
        allocated_at.pop(at, None)
        dropped.add(at)


class _Made:
    """The model's segment events so far, read from its trace as it grows."""

    def __init__(self, sim: CachingAllocatorSim) -> None:
        self.sim = sim
        self.seen = 0
        self.made: list[tuple[str, int]] = []

    def events(self) -> list[tuple[str, int]]:
        trace = self.sim.trace
        for t in trace[self.seen:]:
            if t["action"] in SEGMENT_ACTIONS:
                self.made.append((str(t["action"]), int(t["size"])))  # type: ignore[call-overload]
        self.seen = len(trace)
        return self.made


def _compare(out: Replay, made: list[tuple[str, int]], idx: int) -> None:
    """The first position where the model's segment events and the recorded ones differ
    (checked as both grow: only the new positions): the recorded event's trace index, and
    the event by which the model had made its own."""
    if out.divergence is not None:
        return
    start = out.compared
    end = min(len(made), len(out.recorded))
    for k in range(start, end):
        if made[k] != out.recorded[k]:
            rec, got = out.recorded[k], made[k]
            out.divergence = (k, out.recorded_at[k], f"recorded {rec[0]} of {rec[1]:,} "
                                                     f"bytes, the model made {got[0]} of "
                                                     f"{got[1]:,} bytes (by event {idx})")
            return
    out.compared = end


def _pool(text: object) -> tuple[int, int]:
    """A pool id as the analysis writes it ("0,1") as the allocator's (0, 1)."""
    a, b = (ascii_int(p) for p in str(text).partition(",")[::2])
    return (a, b) if a is not None and b is not None else (0, 0)


def request_pools(events: Events, held: Iterable[tuple[int, int, tuple[int, int]]],
                  final: Iterable[tuple[int, int, tuple[int, int]]]
                  ) -> dict[int, tuple[int, int]]:
    """The private pool of each request of the window, which the trace does not name: the
    pool of the segment its recorded address lies in. A segment's pool is known when it
    was held before the window (`held`: address, size, pool) or is still in the snapshot
    at the end (`final`); one made and freed inside the window is taken as the default
    pool, and the model's proof run shows whether that holds."""
    at_end = {(a, n): p for a, n, p in final}
    live: dict[int, tuple[int, tuple[int, int]]] = {a: (n, p) for a, n, p in held}
    if all(p == (0, 0) for p in at_end.values()) and all(p == (0, 0) for _, p in live.values()):
        return {}  # no segment of a private pool: every request is the default pool's
    starts = sorted(live)
    out: dict[int, tuple[int, int]] = {}
    for action, idx, at, size, _, _ in as_trace(events).rows():
        if action == "segment_alloc":
            live[at] = (size, at_end.get((at, size), (0, 0)))
            bisect.insort(starts, at)
        elif action == "segment_free" and at in live:
            del live[at]
            starts.remove(at)
        elif action in ("alloc", "oom") and starts and at is not None:
            i = bisect.bisect_right(starts, at) - 1
            if i >= 0:
                n, pool = live[starts[i]]
                if starts[i] <= at < starts[i] + n and pool != (0, 0):
                    out[idx] = pool
    return out


def before_window(segments: list[dict[str, Any]], blocks: list[dict[str, Any]],
                  final: Iterable[dict[str, Any]] = (), events: Events | None = None
                  ) -> Before:
    """`Before` from the analysis's reconstruction of the state before the first event
    (`DeviceReplay.segments_at` / `blocks_at` at index -1): rows of segments (address,
    total_size, stream, pool, segment_type, expandable) and live blocks (address, size,
    requested_size, segment_address). A block pending a free is held until its recorded
    free completes, as an allocated one. `final`: the snapshot's own segments (address,
    total_size, pool) and `events` the window, from which each request's private pool is
    inferred (`request_pools`)."""
    if any(s["expandable"] for s in segments):
        return Before((), "expandable segments were mapped before the window: the model "
                          "does not know their reserved ranges")
    held: dict[int, list[tuple[int, int, int, bool]]] = {}
    for b in blocks:
        if b["segment_address"] is None:
            return Before((), "a block held before the window lies in no segment")
        held.setdefault(int(b["segment_address"]), []).append(
            (int(b["address"]), int(b["size"]),
             int(b["requested_size"] if b["requested_size"] is not None else b["size"]),
             True))
    pools = tuple(_pool(s["pool"]) for s in segments)
    pooled = request_pools(
        events if events is not None else [],
        [(int(s["address"]), int(s["total_size"]), p) for s, p in zip(segments, pools,
                                                                       strict=True)],
        [(int(f["address"]), int(f["total_size"]), _pool(f["pool"])) for f in final])
    return Before(tuple((int(s["address"]), int(s["total_size"]), int(s["stream"]),
                         s["segment_type"] == "small",
                         tuple(held.get(int(s["address"]), ()))) for s in segments),
                  segment_pools=pools, pools=pooled)


@dataclass(frozen=True)
class Prediction:
    """A changed setting's run beside the recorded one: `recorded` proves the model on this
    trace (under the settings the capture records); `changed` is None when it does not (a
    divergence, or what stopped the model), since a model that does not reproduce the job
    predicts nothing about it."""

    device: int
    recorded: Replay
    changed: Replay | None
    #: the capacity of the changed run (the asked one, else the recorded run's) and of the
    #: recorded run (the one the recorded OOM's free memory implies); None: no OOM and none
    #: asked, so the model runs out of nothing
    capacity: int | None
    recorded_capacity: int | None
    #: what else held the recorded card (its total less `recorded_capacity`), subtracted
    #: from a changed card; None when the capture does not record the card's total
    outside: int | None = None
    #: the least memory PyTorch could hold in which the changed run has no OOM (to
    #: SMALLEST_STEP), and why it is None when it is
    smallest: int | None = None
    smallest_note: str = ""

    @property
    def trusted(self) -> bool:
        return self.recorded.exact and self.recorded.oom_reproduced in (None, True)


#: Bisection step of the smallest capacity: one large-pool page (kLargeBuffer).
SMALLEST_STEP = 20 << 20
#: Above this many events the smallest capacity (a dozen replays) is not sought by default.
SMALLEST_EVENTS = 50_000


def smallest_capacity(events: Events, device: int, setting: Setting,
                      before: Before | None) -> tuple[int | None, str]:
    """The least capacity (to SMALLEST_STEP) in which the window runs without an OOM under
    `setting`, by bisection between the peak allocated and the peak reserved of a run on an
    unbounded device; why not, when it cannot be found."""
    events = as_trace(events)
    free_run = rerun(events, device, replace(setting, capacity=UNBOUNDED), before,
                     compare=False)
    if free_run.stopped:
        return None, f"the model cannot run the window: {free_run.stopped}"
    held = before.reserved if before is not None else 0
    lo = max(free_run.peak_allocated, held) // SMALLEST_STEP  # in steps: fails below
    hi = -(-free_run.peak_reserved // SMALLEST_STEP)  # fits: it never needed more
    while lo + 1 < hi:
        mid = (lo + hi) // 2
        r = rerun(events, device, replace(setting, capacity=mid * SMALLEST_STEP), before,
                  compare=False)
        if r.simulated_ooms or r.stopped:
            lo = mid
        else:
            hi = mid
    return hi * SMALLEST_STEP, ""


def predict(events: Events, device: int, recorded: Setting, changed: Setting,
            before: Before | None, card: int | None = None,
            smallest: bool | None = None, proof: Replay | None = None) -> Prediction:
    """Re-run the window under the recorded settings (compared) and, where the model
    reproduces it, under `changed`. Capacities are what PyTorch could hold: the recorded
    OOM's implies it (reserved + device free); a changed card keeps what else held the
    recorded one (`card`, the recorded card's total, less that) when it is known. `proof`:
    the recorded run, when several changes share it."""
    events = as_trace(events)
    first = proof if proof is not None else rerun(events, device, recorded, before,
                                                  until_divergence=True)
    held = before.reserved if before is not None else 0
    implied = _capacity_for(events, held)
    capacity = changed.capacity or implied
    outside = card - implied if card and implied and card >= implied else None
    if changed.capacity and outside is not None:
        capacity = changed.capacity - outside  # the same memory outside PyTorch
    ok = first.exact and first.oom_reproduced in (None, True)
    second = rerun(events, device, replace(changed, capacity=capacity), before,
                   compare=False) if ok else None
    least, note = None, "the model does not reproduce the window"
    if ok and (smallest or smallest is None and len(events) <= SMALLEST_EVENTS):
        least, note = smallest_capacity(events, device, changed, before)
    elif ok:
        note = (f"not sought: {len(events):,} events, more than {SMALLEST_EVENTS:,} (a dozen "
                "replays); ask for it with --smallest")
    return Prediction(device, first, second, capacity, implied, outside, least, note)


#: A report replays its knobs' settings over windows of up to this many events (two runs of
#: the model each); beyond, `snapana whatif` runs them on request.
REPLAY_EVENTS = 100_000


@dataclass(frozen=True)
class KnobReplay:
    """A knob's allocator settings replayed over the recorded window, or why they were not
    (`note`)."""

    settings: tuple[str, ...]
    prediction: Prediction | None
    note: str = ""

    @property
    def oom_gone(self) -> bool | None:
        """Whether the recorded OOM goes away (None: no OOM recorded, or no prediction)."""
        p = self.prediction
        if p is None or p.changed is None or not p.recorded.recorded_ooms:
            return None
        return not p.changed.simulated_ooms

    @property
    def helps(self) -> bool | None:
        """Whether the replay bears the knob out: the recorded OOM goes away or, with no
        OOM recorded, peak reserved falls (None: no prediction)."""
        p = self.prediction
        if p is None or p.changed is None:
            return None
        if p.recorded.recorded_ooms:
            return self.oom_gone
        return p.changed.peak_reserved < p.recorded.peak_reserved


def window_start(capture: Capture, dr: DeviceReplay) -> Before:
    """The allocator's state before a device's recorded window, as the model starts from
    it (what the analysis's replay reconstructs there, and the pools the snapshot ends
    with)."""
    start = Moment("event", -1)
    final = capture.segments.filter(pl.col("device") == dr.device)
    return before_window(dr.segments_at(start).to_dicts(), dr.blocks_at(start).to_dicts(),
                         final.to_dicts(), capture.device_events(dr.device))


def replay_knobs(capture: Capture, dr: DeviceReplay,
                 knobs: Iterable[Knob]) -> dict[str, KnobReplay]:
    """Each knob with allocator settings (`Knob.simulate`) replayed over the window: the
    capture's own settings first (the proof), then with the knob's put over them."""
    from snapana.allocator_model import config

    simulated = [k for k in knobs if k.simulate]
    if not simulated:
        return {}
    frame = capture.device_events(dr.device)
    if frame.height > REPLAY_EVENTS:
        return {k.id: KnobReplay(k.simulate, None, f"not replayed: {frame.height:,} events, "
                                 f"more than {REPLAY_EVENTS:,}; snapana whatif runs it")
                for k in simulated}
    conf = config.recorded(capture.allocator_settings)
    before = window_start(capture, dr)
    events = Trace(frame)
    out = {}
    for k in simulated:
        asked, _ = config.parse(k.simulate)
        pad = dr.request_pad
        p = predict(events, dr.device, Setting.of(conf, request_pad=pad),
                    Setting.of(conf, asked, request_pad=pad), before,
                    capture.capacity_bytes.get(dr.device), smallest=False)
        note = "" if p.changed is not None else (
            f"not predicted: {p.recorded.stopped}" if p.recorded.stopped else
            "not predicted: the model does not reproduce this window")
        out[k.id] = KnobReplay(k.simulate, p if p.changed is not None else None, note)
    return out


def by_replay(knobs: tuple[Knob, ...], replays: Mapping[str, KnobReplay]) -> tuple[Knob, ...]:
    """Knobs the replay shows to remove the recorded OOM first, those it shows not to help
    (the OOM stays; with no OOM, peak reserved does not fall) last, the rest (argued, not
    simulated) between, each group in its given order."""
    def rank(k: Knob) -> int:
        gone = replays[k.id].oom_gone if k.id in replays else None
        helps = replays[k.id].helps if k.id in replays else None
        return 0 if gone is True else 2 if helps is False else 1

    return tuple(sorted(knobs, key=rank))


def offered_by_replay(knobs: tuple[Knob, ...], lead: Iterable[Knob], decided: Iterable[Knob],
                      replays: Mapping[str, KnobReplay]) -> tuple[Knob, ...]:
    """The knobs to offer at a recorded OOM, the replay having run: never one whose replay
    shows the OOM stays (it does not fit); each `decided` knob (offered on the replay alone,
    `knobs.replay_candidates`) whose replay shows the OOM goes away, after the knobs the
    verdict names (`lead`) and those the replay bears out; the rest as `by_replay` orders
    them."""
    kept = by_replay(tuple(k for k in knobs if k.id not in replays
                           or replays[k.id].oom_gone is not False), replays)
    proven = [k for k in decided if k not in kept and k.id in replays
              and replays[k.id].oom_gone is True]
    first = set(lead)
    at = 0
    while at < len(kept) and (kept[at] in first or kept[at].id in replays
                              and replays[kept[at].id].oom_gone is True):
        at += 1
    return (*kept[:at], *proven, *kept[at:])


def family_allocations(lifetimes: pl.DataFrame, families: Iterable[str]) -> frozenset[int]:
    """Trace indices of the window's allocations of `families` (`attribute_lifetimes`).
    A failed request is kept whatever its family: the question is whether it fits without
    the others."""
    rows = lifetimes.filter(pl.col("family").is_in(list(families)) & (pl.col("alloc_idx") >= 0))
    return frozenset(rows["alloc_idx"].to_list())


def replay_without(capture: Capture, dr: DeviceReplay, lifetimes: pl.DataFrame,
                   families: Iterable[str]) -> dict[str, Prediction]:
    """The recorded window replayed without each family's allocations (the what-if table's
    question asked of the whole window, not only of the failed request); {} when the window
    is longer than REPLAY_EVENTS or the model does not reproduce it."""
    from snapana.allocator_model import config

    frame = capture.device_events(dr.device)
    if frame.height > REPLAY_EVENTS or frame.is_empty():
        return {}
    events, before = Trace(frame), window_start(capture, dr)
    recorded = Setting.of(config.recorded(capture.allocator_settings),
                          request_pad=dr.request_pad)
    proof = rerun(events, dr.device, recorded, before, until_divergence=True)
    if not proof.exact or proof.oom_reproduced is False:
        return {}
    card = capture.capacity_bytes.get(dr.device)
    out = {}
    for family in families:
        drop = family_allocations(lifetimes, [family])
        if drop:
            out[family] = predict(events, dr.device, recorded, replace(recorded, drop=drop),
                                  before, card, smallest=False, proof=proof)
    return out
