"""`snapana report` and `snapana summary` against a plain `pickle.load` of the same file.

    python benchmarks/vs_pickle.py [--entries 1000000,5000000] [--rounds 3] [--cache DIR]

For each size a snapshot is generated at run time (`snapana synth --entries N`, into a
temporary folder unless --cache names one; never committed). Then, in interleaved rounds
(pickle.load, summary, report, pickle.load, ...), each command runs in a fresh process and
its wall time, CPU time (user + system, the child processes included) and peak RSS (the
largest of the process and its children) are taken; every ratio is to the `pickle.load` of
the same round, and the median over rounds is printed. The machine is shared: read the
ratios, and the CPU ratio when other jobs make the wall clock noisy. Last, one process runs
the report's stages one by one and prints what each costs (decode, normalise, replay,
attribute, diagnose, render).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PLAIN = "import pickle, sys; pickle.load(open(sys.argv[1], 'rb'))"

_STAGES = r"""
import json, sys, time
from pathlib import Path
from snapana.sources import torch_snapshot as ts
from snapana.session import Session
from snapana.render import render
from snapana.render.views import capture_view
import polars as pl

path = Path(sys.argv[1])
out, clock = {}, [time.perf_counter(), time.process_time()]
def stage(name):
    now = [time.perf_counter(), time.process_time()]
    out[name] = [now[0] - clock[0], now[1] - clock[1]]
    clock[:] = now
got = ts._load_columns(path, None)
stage("decode (bounded child -> columns)")
cap = (ts.from_snapshot_dict(got[0], str(path), columns=got[1]) if got is not None
       else ts.from_snapshot_dict(ts.restricted_load(path, None, checked=True), str(path),
                                  consume=True))
stage("normalise (columns -> capture)")
s = Session(cap)
dr = s.replay
dr.moment_of_interest()
stage("replay")
live = dr.blocks_at(dr.moment_of_interest())
s.attributor.attribute(live.filter(pl.col("state") == "active_allocated"))
stage("attribute (live blocks)")
rep = s.report
stage("diagnose (device report)")
html = render(capture_view([rep], title=path.name), "html")
stage("render (html)")
print(json.dumps(out))
"""


def run(args: list[str]) -> tuple[float, float, int]:
    """Wall seconds, CPU seconds (with children) and peak RSS bytes of one fresh process."""
    start = time.perf_counter()
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"failed: {' '.join(args)}: {err[-500:]}")
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss * 1024


def generate(entries: int, folder: Path) -> Path:
    path = folder / f"synth-{entries}.pickle"
    if not path.exists():
        print(f"generating {path} ...", flush=True)
        subprocess.run([sys.executable, "-m", "snapana", "synth", "--entries", str(entries),
                        "-o", str(path)], check=True, stdout=subprocess.DEVNULL)
    return path


def bench(path: Path, rounds: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        html = Path(tmp) / "r.html"
        commands = {
            "pickle.load": [sys.executable, "-c", PLAIN, str(path)],
            "summary": [sys.executable, "-m", "snapana", "summary", str(path)],
            "report": [sys.executable, "-m", "snapana", "report", str(path), "-o", str(html)],
        }
        rows: dict[str, list[tuple[float, float, int]]] = {k: [] for k in commands}
        for r in range(rounds):
            for name, cmd in commands.items():
                rows[name].append(run(cmd))
            print(f"  round {r + 1}: " + ", ".join(
                f"{k} {v[-1][0]:.2f}s/{v[-1][1]:.2f}cpu/{v[-1][2] / 2**20:.0f}M"
                for k, v in rows.items()), flush=True)
        html_mb = html.stat().st_size / 1e6
    base = rows["pickle.load"]
    print(f"\n{path.name}: {path.stat().st_size / 1e6:.0f} MB, {rounds} interleaved rounds, "
          f"medians (ratio to pickle.load of the same round); HTML {html_mb:.2f} MB")
    print(f"{'':12} {'wall s':>7} {'x':>5} {'cpu s':>7} {'x':>5} {'peak RSS':>9} {'x':>5}")
    for name, vals in rows.items():
        wall = statistics.median(v[0] for v in vals)
        cpu = statistics.median(v[1] for v in vals)
        rss = statistics.median(v[2] for v in vals)
        rw = statistics.median(v[0] / b[0] for v, b in zip(vals, base, strict=True))
        rc = statistics.median(v[1] / b[1] for v, b in zip(vals, base, strict=True))
        rr = statistics.median(v[2] / b[2] for v, b in zip(vals, base, strict=True))
        print(f"{name:12} {wall:7.2f} {rw:5.2f} {cpu:7.2f} {rc:5.2f} "
              f"{rss / 2**20:8.0f}M {rr:5.2f}")


def stages(path: Path) -> None:
    res = subprocess.run([sys.executable, "-c", _STAGES, str(path)], capture_output=True,
                         text=True, check=True)
    parts = json.loads(res.stdout.strip().splitlines()[-1])
    total = sum(w for w, _ in parts.values())
    print(f"\nstages of the report on {path.name} (one process; wall s / cpu s of this "
          "process, the child's decode counted in wall only):")
    for name, (wall, cpu) in parts.items():
        print(f"  {name:36} {wall:7.2f} {cpu:7.2f}  {100 * wall / total:5.1f}%")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--entries", default="1000000,5000000",
                    help="comma-separated trace entry counts")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cache", type=Path, default=None,
                    help="keep generated snapshots here between runs")
    ap.add_argument("--no-stages", action="store_true", help="skip the stage breakdown")
    args = ap.parse_args()
    sizes = [int(s.replace("_", "")) for s in args.entries.split(",") if s]
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.cache or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        for n in sizes:
            path = generate(n, folder)
            bench(path, args.rounds)
            if not args.no_stages:
                stages(path)


if __name__ == "__main__":
    main()
