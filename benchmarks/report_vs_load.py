"""`snapana report` against the floor for the format: a plain restricted load of the same file.

    python benchmarks/report_vs_load.py [FILE ...]

Without arguments it uses the largest snapshot in ../shared/corpus/torch_snapshots.
Prints wall time and peak RSS of each, and their ratios.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _measure import measure, python  # noqa: E402

CORPUS = Path(__file__).resolve().parent.parent.parent / "shared/corpus/torch_snapshots"


def main(files: list[Path]) -> None:
    print(f"{'file':44} {'MB':>6} {'load s':>7} {'report s':>8} {'x':>5} "
          f"{'load RSS':>9} {'report RSS':>10} {'x':>5}")
    for f in files:
        load_t, load_rss = measure(python(
            "import sys; from snapana.sources.torch_snapshot import restricted_load; "
            f"restricted_load(__import__('pathlib').Path({str(f)!r}))"))
        with tempfile.TemporaryDirectory() as tmp:
            rep_t, rep_rss = measure([sys.executable, "-m", "snapana", "report", str(f), "-o",
                                      str(Path(tmp) / "r.html")])
        print(f"{f.name[:44]:44} {f.stat().st_size / 1e6:6.1f} {load_t:7.2f} {rep_t:8.2f} "
              f"{rep_t / load_t:5.1f} {load_rss / 2**20:8.0f}M {rep_rss / 2**20:9.0f}M "
              f"{rep_rss / load_rss:5.1f}")


if __name__ == "__main__":
    args = [Path(a) for a in sys.argv[1:]]
    if not args:
        if not CORPUS.is_dir():
            sys.exit("no corpus: pass snapshot files as arguments")
        args = [max(CORPUS.glob("*.pickle"), key=lambda p: p.stat().st_size)]
    main(args)
