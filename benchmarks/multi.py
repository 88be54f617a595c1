"""Many inputs: peak memory stays flat as inputs grow, wall time scales with workers.

    python benchmarks/multi.py [--entries 200000] [--counts 8,16,32,64] [--workers 1,2]

Builds one synthetic snapshot (snapana synth --entries), links it N times into a folder as
rank files, and runs `snapana summary FOLDER --format json` on each. Peak RSS is the largest
single process (parent or worker): bounded memory means it does not grow with N.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _measure import measure  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--entries", type=int, default=200_000)
    ap.add_argument("--counts", default="8,16,32,64")
    ap.add_argument("--workers", default="1,2")
    args = ap.parse_args()
    counts = [int(c) for c in args.counts.split(",")]
    workers = [int(w) for w in args.workers.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "base.pickle"
        from snapana.synth.scale import write_scale_snapshot

        write_scale_snapshot(args.entries, base)
        print(f"one input: {base.stat().st_size / 1e6:.1f} MB, {args.entries:,} entries")
        print(f"{'inputs':>6} {'workers':>7} {'wall s':>7} {'s/input':>8} {'peak RSS':>9}")
        for n in counts:
            folder = Path(tmp) / f"job{n}"
            folder.mkdir()
            for rank in range(n):
                os.link(base, folder / f"snapshot_oom_rank-{rank}.pickle")
            for w in workers:
                wall, rss = measure([sys.executable, "-m", "snapana", "summary", str(folder),
                                     "--format", "json", "--workers", str(w)], repeat=1)
                print(f"{n:6d} {w:7d} {wall:7.1f} {wall / n:8.2f} {rss / 2**20:8.0f}M")


if __name__ == "__main__":
    main()
