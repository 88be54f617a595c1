"""`snapana record`: the capture side, the only part of snapana that runs inside a job.

It arms PyTorch's memory-history recording and out-of-memory observer and writes, on OOM, at
step N and at exit, a snapshot pickle plus a sidecar JSON (device capacity, rank, versions,
tensor inventory). From the command line it needs no change to the job:

    snapana record -o out -- torchrun --nproc-per-node 8 train.py ...

and from code:

    import snapana.record
    snapana.record.start(dir="out")          # or: with snapana.record.recording(dir="out"):
    ...
    snapana.record.step()                     # optional: count steps yourself

Only the standard library and torch are imported here; the analyzer never imports this.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from snapana.record.recorder import Options, Recorder
from snapana.record.sidecar import env_count

__all__ = ["Options", "Recorder", "active", "recording", "start", "start_from_env", "step",
           "stop"]

_active: Recorder | None = None

#: Environment variables `snapana record` sets for the processes of the job.
ENV_DIR = "SNAPANA_RECORD_DIR"
ENV_MAX_ENTRIES = "SNAPANA_RECORD_MAX_ENTRIES"
ENV_STACKS = "SNAPANA_RECORD_STACKS"
ENV_DUMP_AT_STEP = "SNAPANA_RECORD_DUMP_AT_STEP"
ENV_JOB = "SNAPANA_RECORD_JOB"


def start(dir: str | Path = "snapana-record", *, max_entries: int = 100_000,
          stacks: str = "python", dump_at_step: int | None = None, job: str | None = None,
          inventory: bool = True) -> Recorder | None:
    """Start recording in this process (once); None when CUDA is not available."""
    global _active
    if _active is not None:
        return _active
    if stacks not in ("python", "all"):
        raise ValueError(f"stacks must be 'python' or 'all', got {stacks!r}")
    rec = Recorder(Options(Path(dir), max_entries, stacks, dump_at_step, job, inventory))
    if rec.start():
        _active = rec
    return _active


def start_from_env() -> Recorder | None:
    """What the injected hook calls when the job imports torch."""
    return start(os.environ.get(ENV_DIR, "snapana-record"),
                 max_entries=env_count(os.environ.get(ENV_MAX_ENTRIES)) or 100_000,
                 stacks=os.environ.get(ENV_STACKS, "python"),
                 dump_at_step=env_count(os.environ.get(ENV_DUMP_AT_STEP)) or None,
                 job=os.environ.get(ENV_JOB) or None)


def active() -> Recorder | None:
    return _active


def step() -> None:
    """Mark the end of a training step (for --dump-at-step) when optimizer.step is not it."""
    if _active is not None:
        _active.step()


def stop() -> None:
    """Stop this process's recorder: no more step or exit dumps (PyTorch's history stays
    armed; the OOM observer cannot be detached and does nothing once stopped)."""
    global _active
    if _active is not None:
        _active.close()
    _active = None


@contextmanager
def recording(dir: str | Path = "snapana-record", **options: object) -> Iterator[
        Recorder | None]:
    """`with snapana.record.recording(dir=...):` the same files as `start`."""
    rec = start(dir, **options)  # type: ignore[arg-type]
    try:
        yield rec
    finally:
        if rec is not None:
            rec.on_exit()
            stop()
