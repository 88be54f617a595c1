"""Running a scenario script on the simulator, calibrating it, and reading back ground truth."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from snapana.allocator_model.frames import Frame
from snapana.allocator_model.rules import MiB, round_size
from snapana.allocator_model.simulator import CachingAllocatorSim, SimulatedOOM

from ..recording import start_late

# An 80 GB A800/A100 as torch reports it: "total capacity of 79.25 GiB".
A800_CAPACITY = 81156 * MiB

Facts = dict[str, object]
Script = Callable[[CachingAllocatorSim, Facts], None]


class _RequestFitted(Exception):
    """The scenario's failing request fitted: only happens while calibrating."""


@dataclass
class Outcome:
    """A finished run: the simulator (state frozen at the OOM or at the snapshot point), the
    OOM if one was raised, and scenario facts (chunk counts...) for the truth file."""

    sim: CachingAllocatorSim
    oom: SimulatedOOM | None
    facts: Facts = field(default_factory=dict)
    probe: dict[str, int] | None = None  # state just before a failing request that fitted


def failing_request(
    sim: CachingAllocatorSim, size: int, stack: tuple[Frame, ...], family: str,
    stream: int = 0,
) -> None:
    """The allocation the incident died on. Records where it stood so calibration can solve
    for the memory outside PyTorch; raises SimulatedOOM once calibrated."""
    sim.probe = {  # type: ignore[attr-defined]
        "reserved": sim.reserved - sim.releasable_bytes(), "allocated": sim.allocated}
    sim.malloc(size, stack, stream=stream, family=family)
    raise _RequestFitted


def run(script: Script, capacity: int, outside: int, expandable: bool = False) -> Outcome:
    """Run ``script``; an OOM ends it, like the real job, which dumped its snapshot there."""
    sim = CachingAllocatorSim(capacity, outside, expandable_segments=expandable)
    facts: Facts = {}
    try:
        script(sim, facts)
    except SimulatedOOM as oom:
        return Outcome(sim, oom, facts)
    except _RequestFitted:
        return Outcome(sim, None, facts, probe=sim.probe)  # type: ignore[attr-defined]
    return Outcome(sim, None, facts)


def calibrate_outside(
    script: Script, capacity: int, free_target: int, request: int,
    expandable: bool = False, tries: int = 8,
) -> Outcome:
    """Find the bytes held outside PyTorch that leave exactly ``free_target`` free when
    ``request`` fails.

    The incident documents give "N MiB free" at the failure; memory outside the allocator
    (CUDA context, NCCL, other processes) is the one quantity a snapshot cannot see, so it is
    the knob to solve for. Earlier cudaMallocs may then release cached segments, which moves
    the state a little, so refine until the number is exact.
    """
    outside = 0
    for _ in range(tries):
        out = run(script, capacity, outside, expandable)
        if out.probe is not None:
            outside = capacity - out.probe["reserved"] - free_target
            continue
        if out.oom is None or out.oom.requested != round_size(request):
            raise RuntimeError(f"scenario failed elsewhere: {out.oom}")
        if out.oom.device_free == free_target:
            return out
        outside += out.oom.device_free - free_target
    raise RuntimeError("could not calibrate memory outside PyTorch")


def truth(name: str, out: Outcome) -> dict[str, object]:
    """Ground truth from the simulator's own bookkeeping (never from an analysis)."""
    sim = out.sim
    allocated = sim.allocated
    facts = dict(out.facts)
    chunks = facts.pop("chunks", {})
    return {
        "scenario": name,
        "device": 0,
        "capacity_bytes": sim.capacity,
        "outside_pytorch_bytes": sim.outside_pytorch,
        "oom": None if out.oom is None else {
            "requested_bytes": out.oom.requested,
            "alloc_size_bytes": out.oom.alloc_size,
            "device_free_bytes": out.oom.device_free,
        },
        "reserved_bytes": sim.reserved,
        "allocated_bytes": allocated,
        "cached_unallocated_bytes": sim.reserved - allocated - sim.pending_free,
        "peak_allocated_bytes": sim.peak_allocated,
        "blocks": [
            {"address": b.address, "size": b.size, "family": b.family,
             "state": "active_allocated" if b.allocated else "active_pending_free"}
            for b in sim.live_blocks()
        ],
        "chunks": chunks,
        "facts": facts,
    }


def drop_together(sim: CachingAllocatorSim, *held: Iterable[int]) -> None:
    """A forward's output dropped a while after it ends: everything it held (the cache, the
    kept activations, autocast's copies) freed together, so a capture shows one lifetime."""
    sim.advance(10_000)
    for group in held:
        for address in group:
            sim.free(address)


def run_recorded_late(name: str, script: Script, start: list[int]
                      ) -> tuple[dict[str, object], dict[str, object]]:
    """(snapshot, truth) of `script` on an A800, recording begun at trace entry `start[0]`
    (the script appends it once the weights exist): their blocks carry no frames."""
    out = run(script, A800_CAPACITY, 0)
    return start_late(out.sim.snapshot(), start[0]), truth(name, out)
