"""What the report's explorer costs: the size of the report with every allocation packed in,
the time to pack them, and (with --browser) the page's own timers in headless Chromium.

    python benchmarks/explorer.py [--entries 100000 1000000] [--cache DIR] [--browser]

Generates snapshots of `--entries` trace events (snapana.synth.scale, seed 0; cached),
renders each report, and prints its size, the explorer's share and the time to build it.
The issue's budget: the report at most 3 MB at 100k entries and 5 MB at 1M; the exit status
is 1 when a report is over. With --browser (playwright and chromium installed) it opens each
report and prints the explorer's first draw, a moment change and a bands zoom, as the page
measures them (printed, never a pass/fail: this machine is shared and noisy).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from scale import DEFAULT_CACHE, ensure_snapshot  # noqa: E402
from snapana.render import render  # noqa: E402
from snapana.render.views import capture_view  # noqa: E402
from snapana.session import analyse  # noqa: E402
from snapana.sources import load  # noqa: E402

MB = 1_000_000
BUDGET = {100_000: 3 * MB, 1_000_000: 5 * MB}  # the issue's, by trace entries

_TIMERS = """(() => { const b = document.querySelector('.explore'),
  c = document.querySelector('.explore-bands');
  return [b.dataset.firstDrawMs, b.dataset.changeMs, c ? c.dataset.drawMs : null]; })()"""


def _browser(page_file: Path) -> str:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=shutil.which("chromium") or "chromium",
                              args=["--no-sandbox", "--disable-gpu"])
        page = b.new_page(viewport={"width": 1280, "height": 900})
        start = time.perf_counter()
        page.goto(page_file.resolve().as_uri())
        page.wait_for_function("document.body.dataset.rendered === 'yes'", timeout=180000)
        whole = time.perf_counter() - start
        first, _, bands = page.evaluate(_TIMERS)
        page.evaluate("(() => { const s = document.querySelector('.explore-slider');"
                      " s.value = Math.floor(s.max / 2); s.dispatchEvent(new Event('input'));"
                      " })()")
        _, change, _ = page.evaluate(_TIMERS)
        b.close()
    return (f"page rendered in {whole:.1f} s (plotly and every figure); explorer first draw "
            f"{first} ms, moment change {change} ms, bands (whole trace) {bands} ms")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--entries", type=int, nargs="+", default=[100_000, 1_000_000])
    ap.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
    ap.add_argument("--browser", action="store_true")
    args = ap.parse_args()
    ok = True
    for entries in args.entries:
        path = ensure_snapshot(entries, args.cache)
        view = capture_view(analyse(load(path)), title=path.name)
        d = view.devices[0]
        start = time.perf_counter()
        data = d.explorer
        pack_s = time.perf_counter() - start
        page = render(view, "html")
        size = len(page.encode())
        budget = BUDGET.get(entries)
        packed = len(data["packed"]) if data else 0
        print(f"{path.name}: {d.report.n_events:,} events; report {size / MB:.2f} MB "
              f"(budget {budget / MB if budget else float('nan'):.0f} MB), explorer's packed "
              f"allocations {packed / MB:.2f} MB built in {pack_s:.2f} s")
        ok &= budget is None or size <= budget
        if args.browser:
            with tempfile.TemporaryDirectory() as tmp:
                out = Path(tmp) / "report.html"
                out.write_text(page)
                print("  " + _browser(out))
    print("within budget" if ok else "OVER budget")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
