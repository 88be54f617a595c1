"""Million-event snapshots: `snapana report` against the plain restricted load of the same file.

    python benchmarks/scale.py [--sizes 100000,1000000,3000000] [--cache DIR] [--repeat N]
                               [--corpus FILE]

Generates the snapshots (snapana.synth.scale, seed 0) into the cache folder when absent, then,
for each size, measures in fresh processes: the plain restricted load (the floor: decoding the
pickle and nothing else), `python -m snapana report`, and PyTorch's own
`python -m torch.cuda._memory_viz trace_plot` when torch is installed. Prints wall time and
peak RSS of each, the ratios to the load, and the report's size. Then what attribution costs:
the report stages run in one process with the built-in rules and with an empty rule set.
Machines are shared and noisy: read the ratios, not the absolute times.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _measure import measure, python  # noqa: E402

DEFAULT_SIZES = (100_000, 1_000_000, 3_000_000)
DEFAULT_CACHE = Path(tempfile.gettempdir()) / "snapana-scale"
CORPUS_FILE = (Path(__file__).resolve().parent.parent.parent
               / "shared/corpus/torch_snapshots/gpt-medium-ctx1024-train.pickle")

_ATTRIBUTION_COST = r"""
import json, sys, time
from pathlib import Path
from snapana.analysis.attribution import load_rules
from snapana.analysis.attribution.assign import Attributor
from snapana.analysis.attribution.engine import RuleSet
from snapana.analysis.diagnosis.diagnose import device_report
from snapana.analysis.replay import replay
from snapana.sources import load
import polars as pl

cap = load(Path(sys.argv[1]))
dr = replay(cap, cap.devices[0])
out = {}
for name, make in (("rules", load_rules), ("empty", lambda: RuleSet([]))):
    best = float("inf")
    for _ in range(3):
        rules = make()
        t = time.perf_counter()
        device_report(cap, dr, Attributor(cap, dr.device, rules), dr.interest)
        best = min(best, time.perf_counter() - t)
    out[name] = best
live = dr.blocks_at(dr.interest).filter(pl.col("state") == "active_allocated")
t = time.perf_counter()
Attributor(cap, dr.device, load_rules()).attribute(live)
out["attribute"] = time.perf_counter() - t
out["blocks"] = live.height
out["stacks"] = len(cap.stacks.stacks)
print(json.dumps(out))
"""


def ensure_snapshot(entries: int, cache: Path) -> Path:
    cache.mkdir(parents=True, exist_ok=True)
    path = cache / f"scale-{entries}-s0.pickle"
    if not path.exists():
        print(f"generating {path} ...", flush=True)
        subprocess.run(python(
            "from pathlib import Path; from snapana.synth.scale import write_scale_snapshot; "
            f"write_scale_snapshot({entries}, Path({str(path)!r}), seed=0)"), check=True)
    return path


def _mib(n: int) -> str:
    return f"{n / 2**20:7.0f}M"


def bench_file(path: Path, repeat: int, label: str) -> dict:
    row: dict = {"label": label, "MB": path.stat().st_size / 1e6}
    row["load_s"], row["load_rss"] = measure(python(
        "from pathlib import Path; from snapana.sources.torch_snapshot import restricted_load; "
        f"restricted_load(Path({str(path)!r}))"), repeat)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "r.html"
        row["report_s"], row["report_rss"] = measure(
            [sys.executable, "-m", "snapana", "report", str(path), "-o", str(out)], repeat)
        row["html_MB"] = out.stat().st_size / 1e6
        row["open_s"] = open_in_chromium(out)
        if importlib.util.find_spec("torch") is not None:
            viz = Path(tmp) / "viz.html"
            row["torch_s"], row["torch_rss"] = measure(
                [sys.executable, "-m", "torch.cuda._memory_viz", "trace_plot", str(path), "-o",
                 str(viz)], repeat)
            row["torch_html_MB"] = viz.stat().st_size / 1e6
    return row


def open_in_chromium(html: Path) -> float | None:
    """Seconds until headless Chromium has drawn every chart (None without a browser)."""
    import shutil
    import time

    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        return None
    if exe is None:
        return None
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=exe, args=["--no-sandbox"])
        page = browser.new_page()
        start = time.perf_counter()
        page.goto(html.resolve().as_uri())
        page.wait_for_function("document.body.dataset.rendered === 'yes'", timeout=60000)
        took = time.perf_counter() - start
        browser.close()
    return took


def print_rows(rows: list[dict]) -> None:
    print(f"\n{'snapshot':28} {'MB':>6} {'load s':>7} {'report s':>8} {'x load':>6} "
          f"{'load RSS':>9} {'rep RSS':>8} {'x load':>6} {'html MB':>7} "
          f"{'open s':>6} {'torch s':>7} {'torch RSS':>9} {'rep/torch':>9}")
    for r in rows:
        opened = f"{r['open_s']:6.2f}" if r.get("open_s") else f"{'-':>6}"
        torch = (f"{r['torch_s']:7.2f} {_mib(r['torch_rss']):>9} "
                 f"{r['report_s'] / r['torch_s']:9.2f}") if "torch_s" in r else \
            f"{'-':>7} {'-':>9} {'-':>9}"
        print(f"{r['label'][:28]:28} {r['MB']:6.1f} {r['load_s']:7.2f} {r['report_s']:8.2f} "
              f"{r['report_s'] / r['load_s']:6.2f} {_mib(r['load_rss']):>9} "
              f"{_mib(r['report_rss']):>8} {r['report_rss'] / r['load_rss']:6.2f} "
              f"{r['html_MB']:7.2f} {opened} {torch}", flush=True)


def attribution_cost(path: Path, report_s: float) -> None:
    res = subprocess.run(python(_ATTRIBUTION_COST) + [str(path)], capture_output=True,
                         text=True, check=True)
    d = json.loads(res.stdout)
    added = max(d["rules"] - d["empty"], 0.0)
    print(f"\nattribution on {path.name}: diagnosis with built-in rules {d['rules']:.3f}s, "
          f"with no rules {d['empty']:.3f}s -> attribution adds {added:.3f}s "
          f"= {100 * added / report_s:.1f}% of the report's {report_s:.2f}s; "
          f"Attributor.attribute alone {d['attribute']:.3f}s for {d['blocks']} live blocks "
          f"({d['stacks']} distinct stacks in the capture)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default=",".join(map(str, DEFAULT_SIZES)),
                    help="comma-separated trace entry counts")
    ap.add_argument("--cache", type=Path, default=DEFAULT_CACHE,
                    help="where generated snapshots are kept between runs")
    ap.add_argument("--repeat", type=int, default=1, help="runs per measurement (best time)")
    ap.add_argument("--corpus", type=Path, default=CORPUS_FILE,
                    help="a real snapshot to compare against torch's viewer too")
    args = ap.parse_args()
    sizes = [int(s.replace("_", "")) for s in args.sizes.split(",") if s]
    rows = []
    if args.corpus and args.corpus.exists():
        rows.append(bench_file(args.corpus, max(args.repeat, 3), args.corpus.name))
        print_rows(rows[-1:])
    for n in sizes:
        path = ensure_snapshot(n, args.cache)
        rows.append(bench_file(path, args.repeat, f"synth {n:,} entries"))
        print_rows(rows[-1:])
    print_rows(rows)
    small = [(n, r) for n, r in zip(sizes, rows[-len(sizes):], strict=True)] if sizes else []
    if small:
        n, r = min(small, key=lambda x: x[0])
        attribution_cost(ensure_snapshot(n, args.cache), r["report_s"])


if __name__ == "__main__":
    main()
