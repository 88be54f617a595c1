"""What the allocations around the moment cost: building their view and figure, and the bytes
they add to the HTML report.

    python benchmarks/allocation_bands.py [--entries 1000000] [--cache DIR] [--file SNAPSHOT]

Generates a snapshot of `--entries` trace events (snapana.synth.scale, seed 0; cached), loads
it once, then times (best of 3, in this process) the view (`DeviceView.allocations`) and the
figure, and renders the report with and without the figure. The issue's budget: the view well
under a second, at most ~100 KB more HTML; the exit status is 1 when the view takes over
1 s or the page grows by over 100 KB.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from scale import DEFAULT_CACHE, ensure_snapshot  # noqa: E402
from snapana.render import figures, html, render  # noqa: E402
from snapana.render.views import capture_view  # noqa: E402
from snapana.session import analyse  # noqa: E402
from snapana.sources import load  # noqa: E402

VIEW_BUDGET_S, HTML_BUDGET_B = 1.0, 100_000


def _best(make, repeat: int = 3) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        make()
        best = min(best, time.perf_counter() - start)
    return best


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--entries", type=int, default=1_000_000)
    ap.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
    ap.add_argument("--file", type=Path, help="a snapshot to use instead of a generated one")
    args = ap.parse_args()
    path = args.file or ensure_snapshot(args.entries, args.cache)
    view = capture_view(analyse(load(path)), title=path.name)
    d = view.devices[0]
    figures.families_over_time(d)  # warm-up: a first figure pays one-off costs
    view_s = _best(lambda: replace(d).allocations)
    fig_s = _best(lambda: figures.allocations(d))
    a = d.allocations
    with_fig = len(render(view, "html").encode())
    shown = html.PAGE_FIGURES
    html.PAGE_FIGURES = tuple(n for n in shown if n != "allocations")
    try:
        without = len(render(view, "html").encode())
    finally:
        html.PAGE_FIGURES = shown
    added = with_fig - without
    print(f"{path.name}: {d.report.n_events:,} events")
    if a is not None:
        print(f"window {a.start:,}..{a.end:,}: {len(a.bands)} bands, {a.allocations:,} "
              f"allocations, {a.points():,} points, {len(a.stacks)} stacks")
    print(f"view {view_s * 1000:.0f} ms, figure {fig_s * 1000:.0f} ms (best of 3); "
          f"HTML {without:,} -> {with_fig:,} bytes (+{added:,})")
    ok = view_s <= VIEW_BUDGET_S and added <= HTML_BUDGET_B
    print("within budget" if ok else "OVER budget")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
