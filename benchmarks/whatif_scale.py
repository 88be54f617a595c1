"""The replay under one changed setting (`snapana whatif`) against the report of the same
capture, at 100k and 1M trace entries (issue 45).

    python benchmarks/whatif_scale.py [--sizes 100000,1000000] [--cache DIR] [--repeat N]

The captures are written by the allocator model itself (a training loop: weights, then
steps of activations whose sizes vary with the batch, freed in reverse, and gradients), so
the model reproduces them and the what-if runs both of its passes (the recorded settings,
compared event for event, then expandable segments on). The synth --entries generator is
not used: its simpler allocator would make the model part from it at once. Fresh processes,
best of N; read the ratio, not the seconds (shared, noisy machines).
"""

from __future__ import annotations

import argparse
import pickle
import random
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _measure import measure  # noqa: E402
from snapana.allocator_model.rules import GiB, MiB  # noqa: E402
from snapana.allocator_model.simulator import CachingAllocatorSim  # noqa: E402

DEFAULT_SIZES = (100_000, 1_000_000)
DEFAULT_CACHE = Path(tempfile.gettempdir()) / "snapana-whatif-scale"


def generate(entries: int, path: Path, seed: int = 0) -> None:
    """A training run of about `entries` trace entries on an 80 GiB card."""
    r = random.Random(seed)
    sim = CachingAllocatorSim(80 * GiB)
    layers = 48
    for _ in range(layers):
        sim.malloc(r.choice((8, 16, 32)) * MiB)
        sim.malloc(r.randrange(1, 64) * 1024)
    grads: list[int] = []
    while len(sim.trace) < entries:
        batch = r.randrange(6, 9)
        acts = [sim.malloc(batch * r.choice((3, 5, 12)) * MiB + r.randrange(0, 4096))
                for _ in range(layers)]
        acts += [sim.malloc(r.randrange(512, 900_000)) for _ in range(layers)]
        for a in reversed(acts):
            sim.free(a)
            if r.random() < 0.5:
                grads.append(sim.malloc(r.choice((8, 16, 32)) * MiB))
        for g in grads:
            sim.free(g)
        grads.clear()
    snap = sim.snapshot()
    snap["device_traces"] = [snap["device_traces"][0][:entries]]  # type: ignore[index]
    path.write_bytes(pickle.dumps(snap, protocol=4))


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default=",".join(map(str, DEFAULT_SIZES)))
    ap.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args(argv)
    args.cache.mkdir(parents=True, exist_ok=True)
    snapana = [sys.executable, "-m", "snapana"]
    print("entries | report s | whatif s | whatif / report | report RSS MB | whatif RSS MB")
    for n in (int(s) for s in args.sizes.split(",")):
        path = args.cache / f"whatif-{n}.pickle"
        if not path.exists():
            generate(n, path)
        out = args.cache / f"whatif-{n}.html"
        report = measure([*snapana, "report", str(path), "-o", str(out)], args.repeat)
        whatif = measure([*snapana, "whatif", str(path), "--set", "expandable_segments:True",
                          "-f", "json"], args.repeat)
        print(f"{n:,} | {report[0]:.1f} | {whatif[0]:.1f} | {whatif[0] / report[0]:.2f} | "
              f"{report[1] >> 20} | {whatif[1] >> 20}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
