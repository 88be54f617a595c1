"""`snapana report` of one snapshot with 0, 10, 1,000 and 10,000 annotation bands.

    python benchmarks/annotation_bands.py [BANDS ...] [--entries 50000] [--repeat N]

The snapshot is a synthetic training job (snapana.synth.scale, seed 0, ~3 MB like the real
one of issue 14), written again with N record_function ranges in its
``external_annotations``: steps ``ProfilerStep#k`` spread evenly over the trace's clock, each
holding ``## forward ##`` (with ``attention`` and ``mlp`` inside) and ``## backward ##``, so
the ranges nest three deep as record_function ranges do. Measures the report in fresh
processes and prints each time with its ratio to the same snapshot without annotations.
Exits 1 when 1,000 bands take more than twice as long as none (issue 14's bar).
Machines are shared and noisy: read the ratios, not the absolute times.
"""

from __future__ import annotations

import argparse
import pickle
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from _measure import measure  # noqa: E402

DEFAULT_BANDS = (0, 10, 1_000, 10_000)
DEFAULT_ENTRIES = 50_000
LIMIT_BANDS, LIMIT_RATIO = 1_000, 2.0
#: One step's ranges: (name, start, end) as fractions of the step's span.
STEP = (("ProfilerStep#{k}", 0.0, 1.0), ("## forward ##", 0.02, 0.45),
        ("attention", 0.05, 0.2), ("mlp", 0.25, 0.4), ("## backward ##", 0.5, 0.95))


def annotations(n: int, t0: int, t1: int) -> list[dict[str, Any]]:
    """`n` closed ranges (START/END pairs) nested as in `STEP`, spread evenly over t0..t1."""
    steps = -(-n // len(STEP))
    span = (t1 - t0) / max(steps, 1)
    out: list[dict[str, Any]] = []
    for i in range(n):
        k, j = divmod(i, len(STEP))
        name, a, b = STEP[j][0].format(k=k), STEP[j][1], STEP[j][2]
        start, end = t0 + int((k + a) * span), t0 + int((k + b) * span)
        out.append({"name": name, "stage": "START", "time_us": start, "device": 0})
        out.append({"name": name, "stage": "END", "time_us": max(end, start + 1), "device": 0})
    return sorted(out, key=lambda a: a["time_us"])  # as PyTorch records them


def write_snapshots(bands: list[int], entries: int, folder: Path) -> dict[int, Path]:
    """The synthetic snapshot once per band count, in `folder` (a second or so in all)."""
    from snapana.synth.scale import scale_snapshot

    paths = {n: folder / f"scale-{entries}-bands-{n}.pickle" for n in bands}
    data = scale_snapshot(entries, seed=0)
    times = [e["time_us"] for e in data["device_traces"][0]]
    for n, path in paths.items():
        data["external_annotations"] = annotations(n, min(times), max(times))
        with path.open("wb") as fh:
            pickle.dump(data, fh, protocol=pickle.DEFAULT_PROTOCOL)
    return paths


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bands", nargs="*", type=int, default=DEFAULT_BANDS,
                    help=f"annotation band counts (0 is always measured; default {DEFAULT_BANDS})")
    ap.add_argument("--entries", type=int, default=DEFAULT_ENTRIES, help="trace entries")
    ap.add_argument("--repeat", type=int, default=3, help="runs per measurement (best time)")
    args = ap.parse_args()
    counts = sorted({0, *args.bands})
    print(f"{'bands':>7} {'MB':>5} {'report s':>8} {'x none':>6} {'RSS':>6} {'html MB':>7}")
    times: dict[int, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        paths = write_snapshots(counts, args.entries, Path(tmp))
        out = Path(tmp) / "r.html"
        for n in counts:
            times[n], rss = measure([sys.executable, "-m", "snapana", "report", str(paths[n]),
                                     "-o", str(out)], args.repeat)
            print(f"{n:7,} {paths[n].stat().st_size / 1e6:5.1f} {times[n]:8.2f} "
                  f"{times[n] / times[0]:6.2f} {rss / 2**20:5.0f}M "
                  f"{out.stat().st_size / 1e6:7.2f}", flush=True)
    if LIMIT_BANDS in times and times[LIMIT_BANDS] > LIMIT_RATIO * times[0]:
        sys.exit(f"{LIMIT_BANDS:,} bands take {times[LIMIT_BANDS] / times[0]:.2f}x the report "
                 f"without annotations (at most {LIMIT_RATIO}x)")


if __name__ == "__main__":
    main()
