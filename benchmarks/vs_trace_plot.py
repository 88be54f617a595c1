"""`snapana report` against PyTorch's own viewer on the real corpus, file by file.

    python benchmarks/vs_trace_plot.py [--corpus DIR] [--torch-python PY] [--rounds 1]

For each snapshot of the corpus (default: ../shared/corpus/torch_snapshots beside the
repository, or /work/shared/corpus/torch_snapshots), in interleaved rounds, each in a fresh
process: `snapana report FILE -o r.html` (this interpreter) and
`python -m torch.cuda._memory_viz trace_plot FILE -o t.html` (an interpreter with torch,
`--torch-python`), which only wraps the pickle into its HTML viewer. One line per file: both
wall times (medians over rounds) and their ratio; then the median and the largest ratio, and
`snapana report` of the smallest file alone (its fixed start-up cost). The machine may be
shared: read the ratios, each taken within one round.

Both sides run as installed: torch's modules were byte-compiled when pip installed it, so
the snapana package is byte-compiled first (`compileall`, as pip does for a wheel; an
editable install under PYTHONDONTWRITEBYTECODE would otherwise compile ~60 modules from
source on every run). `--source` skips that, to see what it costs.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _measure import byte_compiled  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def timed(args: list[str]) -> tuple[float, int, str]:
    """Wall seconds, exit status and the last stderr line of one fresh process."""
    start = time.perf_counter()
    proc = subprocess.run(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                          check=False)
    lines = proc.stderr.strip().splitlines()
    return time.perf_counter() - start, proc.returncode, lines[-1] if lines else ""


def default_corpus() -> Path:
    for cand in (ROOT.parent / "shared" / "corpus" / "torch_snapshots",
                 Path("/work/shared/corpus/torch_snapshots")):
        if cand.is_dir():
            return cand
    sys.exit("no corpus folder found; pass --corpus DIR")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", type=Path, default=None)
    ap.add_argument("--torch-python", default="/work/venv-torch/bin/python")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--source", action="store_true",
                    help="do not byte-compile snapana first (see the module docstring)")
    args = ap.parse_args()
    if not args.source:
        print(f"byte-compiled {byte_compiled()} (as pip installs a wheel)")
    compare(args.corpus or default_corpus(), args.torch_python, args.rounds)


def compare(corpus: Path, torch_python: str, rounds: int) -> None:
    """One line per corpus file: snapana report and trace_plot wall times and their ratio;
    then the median and largest ratio and the start-up cost of the smallest file."""
    files = sorted(p for p in corpus.iterdir() if p.is_file())
    ratios: list[float] = []
    print(f"{'file':64} {'MB':>6} {'snapana s':>9} {'trace_plot s':>12} {'ratio':>6}")
    with tempfile.TemporaryDirectory() as tmp:
        ours, theirs = str(Path(tmp) / "r.html"), str(Path(tmp) / "t.html")
        for path in files:
            mine: list[float] = []
            viz: list[float] = []
            per: list[float] = []
            notes = set()
            for _ in range(rounds):
                a, code_a, err_a = timed([sys.executable, "-m", "snapana", "report", str(path),
                                          "-o", ours])
                b, code_b, err_b = timed([torch_python, "-m",
                                          "torch.cuda._memory_viz", "trace_plot", str(path),
                                          "-o", theirs])
                if code_a:
                    notes.add(f"snapana exit {code_a}: {err_a[:80]}")
                if code_b:
                    notes.add(f"trace_plot exit {code_b}: {err_b[:80]}")
                mine.append(a)
                viz.append(b)
                per.append(a / b)
            ratio = statistics.median(per)
            ratios.append(ratio)
            print(f"{path.name[:64]:64} {path.stat().st_size / 1e6:6.2f} "
                  f"{statistics.median(mine):9.2f} {statistics.median(viz):12.2f} "
                  f"{ratio:6.2f}" + ("  (" + "; ".join(sorted(notes)) + ")" if notes else ""),
                  flush=True)
        smallest = min(files, key=lambda p: p.stat().st_size)
        alone = statistics.median(timed([sys.executable, "-m", "snapana", "report",
                                         str(smallest), "-o", ours])[0]
                                   for _ in range(max(rounds, 3)))
    print(f"\n{len(ratios)} files, {rounds} round(s): ratio snapana / trace_plot median "
          f"{statistics.median(ratios):.2f}, max {max(ratios):.2f} "
          f"({sum(r > 1 for r in ratios)} above 1)")
    print(f"snapana report of the smallest file ({smallest.name}, "
          f"{smallest.stat().st_size} bytes): {alone:.2f} s (start-up cost)")


if __name__ == "__main__":
    main()
