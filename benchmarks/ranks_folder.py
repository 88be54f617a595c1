"""A folder of thousands of tiny rank files (issue 66): what `snapana summary DIR` costs per
file, against the floors of the same run.

    python benchmarks/ranks_folder.py [--counts 500,4096] [--workers N] [--glob] [--source]

A job on 1,024-4,096 GPUs that dumps a snapshot per rank is what the rank table is for; each
file is tiny, so what a file costs is what snapana does per file besides decoding it (a
process started, an import, a pass over the folder). For each count N a folder of N tiny
valid snapshots is written (`CachingAllocatorSim`, a few allocations each: about 1 KB), then,
each in a fresh process: `python -c pass` (an interpreter's start-up: what a process per file
would cost), one `python` that `pickle.load`s all N files (the floor of reading them), and
`snapana summary DIR` (with `--glob`, also `snapana summary 'DIR/rank*.pickle'`). Printed:
wall seconds, seconds per file, CPU seconds (the children included), the peak of the whole
process tree's resident memory (sampled) and the decode processes snapana started
(`SNAPANA_CHILD_LOG`), with the ratios of summary's per-file wall to the start-up and to the
per-file load. The machine is shared: read the ratios, and how s/file changes with N.
"""

from __future__ import annotations

import argparse
import os
import pickle
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _measure import byte_compiled  # noqa: E402
from vs_pickle import run, snapana_command  # noqa: E402

MiB, GiB = 1 << 20, 1 << 30
STACK = [("/job/model.py", 54, "forward"), ("/job/train.py", 30, "main")]
LOAD_ALL = "import pickle, sys\nfor p in sys.argv[1:]:\n    pickle.load(open(p, 'rb'))"


def tiny_rank(rank: int) -> dict[str, object]:
    """A small valid snapshot: three allocations whose sizes differ with the rank."""
    from snapana.synth import CachingAllocatorSim

    sim = CachingAllocatorSim(capacity=4 * GiB, time_origin_us=1_700_000_000_000_000)
    for _ in range(3):
        sim.malloc((rank % 7 + 1) * MiB, STACK, family="activations")
    return sim.snapshot()


def write_folder(folder: Path, n: int) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = [folder / f"rank{r}.pickle" for r in range(n)]
    for r, p in enumerate(paths):
        p.write_bytes(pickle.dumps(tiny_rank(r), protocol=4))
    return paths


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--counts", default="500,4096")
    ap.add_argument("--workers", type=int, default=None, help="snapana's --workers")
    ap.add_argument("--glob", action="store_true", help="also the glob form 'DIR/rank*'")
    ap.add_argument("--source", action="store_true", help="do not byte-compile snapana")
    args = ap.parse_args()
    if not args.source:
        byte_compiled()
    snapana = snapana_command()
    more = ["--workers", str(args.workers)] if args.workers else []
    print(f"{'':26} {'files':>5} {'wall s':>7} {'s/file':>7} {'cpu s':>6} {'tree RSS':>9} "
          f"{'decoders':>8}")
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "children.log"
        os.environ["SNAPANA_CHILD_LOG"] = str(log)
        for n in (int(c) for c in args.counts.split(",")):
            folder = Path(tmp) / f"job{n}"
            paths = write_folder(folder, n)
            rows = {"python -c pass": ([sys.executable, "-c", "pass"], 1),
                    "pickle.load x N (one proc)": ([sys.executable, "-c", LOAD_ALL,
                                                    *map(str, paths)], n),
                    "snapana summary DIR": ([*snapana, "summary", str(folder), *more], n)}
            if args.glob:
                rows["snapana summary 'DIR/rank*'"] = (
                    [*snapana, "summary", str(folder / "rank*.pickle"), *more], n)
            per_file: dict[str, float] = {}
            for name, (cmd, files) in rows.items():
                log.unlink(missing_ok=True)
                wall, cpu, _, tree = run(cmd)
                started = len(log.read_text().splitlines()) if log.exists() else 0
                per_file[name] = wall / files
                print(f"{name:26} {n:5d} {wall:7.2f} {wall / files:7.4f} {cpu:6.1f} "
                      f"{tree / MiB:8.0f}M {started:8d}", flush=True)
            each = per_file["snapana summary DIR"]
            print(f"  summary per file: {each / per_file['python -c pass']:.2f}x a start-up, "
                  f"{each / per_file['pickle.load x N (one proc)']:.0f}x a file's load\n")


if __name__ == "__main__":
    main()
