"""What the views over time cost: `snapana report` with and without them, side by side.

    python benchmarks/family_timeline.py [--entries 1000000] [--cache DIR] [--repeat N]
                                         [--file SNAPSHOT]

Generates a snapshot of `--entries` trace events (snapana.synth.scale, seed 0; cached), then
measures in fresh processes the report as shipped and the same report with the family
timeline stage replaced by "no history per family" (`diagnosis._families` returning nothing,
so none of what it feeds is made: the family areas, the growth lines and the allocations
around the moment). Prints wall time, peak RSS and
the HTML size of both, and their ratios. The issue's budget is 10% on a 1M-event snapshot;
the exit status is 1 when the time or size ratio is over it (peak RSS is printed too).
Machines are shared and noisy: the ratio is what counts, each the best of `--repeat` runs.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _measure import measure, python  # noqa: E402
from scale import DEFAULT_CACHE, ensure_snapshot  # noqa: E402

BUDGET = 1.10

_REPORT = r"""
import sys
from snapana import cli
sys.argv = ["snapana", "report", sys.argv[1], "-o", sys.argv[2]]
cli.main()
"""

_WITHOUT = r"""
import sys
from snapana import cli
from snapana.analysis.diagnosis import diagnose as diagnosis
diagnosis._families = lambda *args: (None, (), {})
sys.argv = ["snapana", "report", sys.argv[1], "-o", sys.argv[2]]
cli.main()
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--entries", type=int, default=1_000_000)
    ap.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--file", type=Path, help="a snapshot to use instead of a generated one")
    args = ap.parse_args()
    path = args.file or ensure_snapshot(args.entries, args.cache)
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        for label, code in (("without", _WITHOUT), ("with", _REPORT)):
            out = Path(tmp) / f"{label}.html"
            wall, rss = measure(python(code) + [str(path), str(out)], args.repeat)
            rows[label] = (wall, rss, out.stat().st_size)
    print(f"{path.name}: report with and without the family timeline and allocations views "
          f"(best of {args.repeat})")
    print(f"{'':10} {'wall s':>8} {'peak RSS MiB':>13} {'HTML MB':>9}")
    for label, (wall, rss, size) in rows.items():
        print(f"{label:10} {wall:8.2f} {rss / 2**20:13.0f} {size / 1e6:9.2f}")
    ratios = [rows["with"][k] / rows["without"][k] for k in range(3)]
    ok = ratios[0] <= BUDGET and ratios[2] <= BUDGET  # the budget is time and HTML size
    print(f"{'ratio':10} {ratios[0]:8.3f} {ratios[1]:13.3f} {ratios[2]:9.3f}"
          f"   (time and HTML budget {BUDGET:.2f}: {'within' if ok else 'OVER'})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
