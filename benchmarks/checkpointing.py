"""Activation checkpointing's replay against simulated checkpointed jobs (issue 70): the same
GPT training step written with and without torch.utils.checkpoint around each layer
(synth/scenarios/sized.py, from torch/utils/checkpoint.py's non-reentrant path); the step's
capture without it at (batch 2, seq 256) is replayed by `whatif`'s checkpointing next step
(analysis/trace_edits.py `checkpoint_edit`) at several sequence lengths, each beside the
checkpointed job's own peak at that length, and the plain replay beside the plain job's;
`rows(calibrate=True)` adds both calibrated (`--calibrate`) on the plain job at a third
length, neither 256 nor the one predicted (`third`); benchmarks/how_big_fits.py prints them.

    python benchmarks/checkpointing.py
"""

from __future__ import annotations

import json
import sys
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

BATCH, RECORDED = 2, 256
SEQS = (256, 512, 1024, 2048)


@dataclass(frozen=True)
class Row:
    seq: int
    plain_predicted: int
    plain_captured: int
    predicted: int
    captured: int
    plain_calibrated: int | None = None  # calibrated on the plain job at seq `third(seq)`
    calibrated: int | None = None

    @property
    def error(self) -> float:
        return self.predicted / self.captured - 1


def _job(folder: Path, seq: int, checkpointed: bool, tag: str = "") -> tuple[Path, int]:
    from snapana.synth.scenarios import write_snapshot
    from snapana.synth.scenarios.sized import sized_job

    name = f"{tag}b{BATCH}-s{seq}-{'ckpt' if checkpointed else 'plain'}.pickle"
    path, truth = write_snapshot(*sized_job(BATCH, seq, checkpointed), folder / name)
    return path, int(json.loads(truth.read_text())["peak_allocated_bytes"])


def checkpoint_change(window):  # type: ignore[no-untyped-def]
    """The checkpointing next step's change on `window`, as --fit replays it."""
    from snapana.analysis.scaled_replay import _changes

    return next(c for s, c in _changes(window) if s.id == "torch.activation_checkpointing")


def third(seq: int) -> int:
    """The plain job's length that calibrates the prediction at `seq`: neither the recorded
    one nor `seq`."""
    return next(s for s in (512, 1024) if s not in (RECORDED, seq))


def rows(seqs: tuple[int, ...] = SEQS, calibrate: bool = False) -> list[Row]:
    from snapana.analysis.scaling import parse_sizes
    from snapana.session import Session

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        path, _ = _job(folder, RECORDED, False, "recorded-")
        session, sizes = Session.open(path), parse_sizes([f"seq={RECORDED}"])
        window = session.scaling(sizes)
        change = checkpoint_change(window)
        thirds: dict[int, Session] = {}  # each third length's capture, written once
        out = []
        for seq in seqs:
            plain = _job(folder, seq, False)[1]
            ckpt = _job(folder, seq, True)[1]
            row = Row(seq, window.run({"seq": seq}, None).replay.peak_allocated, plain,
                      window.run({"seq": seq}, None, change).replay.peak_allocated, ckpt)
            if calibrate:
                n = third(seq)
                if n not in thirds:
                    thirds[n] = Session.open(_job(folder, n, False, "third-")[0])
                calibrated = session.scaling(sizes, (thirds[n], "seq", n))
                row = replace(row, plain_calibrated=calibrated.run(
                    {"seq": seq}, None).replay.peak_allocated, calibrated=calibrated.run(
                    {"seq": seq}, None, checkpoint_change(calibrated)).replay.peak_allocated)
            out.append(row)
    return out


def table(found: list[Row]) -> str:
    lines = ["| seq (from 256) | plain: predicted / simulated | checkpointed: predicted | "
             "simulated (torch.utils.checkpoint) | error |", "|---|---:|---:|---:|---:|"]
    lines += [f"| {r.seq:,} | {r.plain_predicted:,} / {r.plain_captured:,} | "
              f"{r.predicted:,} | {r.captured:,} | {r.error:+.2%} |" for r in found]
    return "\n".join(lines)


def main() -> int:
    found = rows()
    print(table(found))
    return 0 if all(abs(r.error) <= 0.10 for r in found) else 1


if __name__ == "__main__":
    sys.exit(main())
