"""`snapana report`, `summary` and `whatif` against a plain `pickle.load` of the same file:
the one speed table (issue 55), and CI's guard.

    python benchmarks/vs_pickle.py [--entries 1000000,5000000] [--lists 1000000] [--rounds 3]
                                   [--cache DIR] [--guard 3] [--trace-plot-python PY] [--source]

`--guard X` exits 1 when `report`'s median wall ratio on the first size passes X (CI's second
phase runs the 1M file with X = 3: loose enough that a shared machine's noise cannot trip it,
tight enough to catch a per-row Python loop over a million rows). `--trace-plot-python PY`
(an interpreter with torch) adds the real corpus, `report` against PyTorch's own
`trace_plot` file by file (`vs_trace_plot.py`). The start-up row is `snapana summary` of the
smallest bundled sample against `python -c "import pickle"`: what a small capture costs.
snapana runs as installed: its package is byte-compiled first, as pip does for a wheel
(`_measure.byte_compiled`; `--source` skips it, to see what compiling costs).

For each size a snapshot is generated at run time (`snapana synth --entries N`, into a
temporary folder unless --cache names one; never committed); for each `--lists` size, one
written as PyTorch writes its pickle, a new frame list per entry (`--list-per-entry`: four
times the bytes, and what real captures hold). Then, in interleaved rounds
(pickle.load, summary, report, pickle.load, ...), each command runs in a fresh process (snapana
as users run it: the `snapana` script beside this interpreter, else `python -m snapana`) and
its wall time, CPU time (user + system, the child processes included) and peak RSS (the
largest of the process and its children) are taken; every ratio is to the `pickle.load` of
the same round, and the median over rounds is printed; `(gc off)` is the same load with the
garbage collector off, the floor of decoding alone. The machine is shared: read the
ratios, and the CPU ratio when other jobs make the wall clock noisy. Peak RSS is the
largest single process (what `wait4` reports); tree RSS the largest sum over the process and
its children at one moment (sampled), since the decode child runs beside the parent; and
tree PSS the same with each page shared between processes counted once (one more run of
each command: the decode child forks a process that shares its decoded objects, so the sum
of resident sets counts them twice, though they are in memory once). Last,
one process runs the report's stages one by one and prints what each costs (decode,
normalise, replay, attribute, diagnose, render), the bounded child's decode and column
making taken from its own reply.
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

sys.path.insert(0, str(Path(__file__).parent))
from _measure import byte_compiled  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
PLAIN = "import pickle, sys; pickle.load(open(sys.argv[1], 'rb'))"
#: The same load with the garbage collector off, as the decode child runs: not a baseline the
#: targets are set against, but the floor of any reader that builds the trace's dicts (the
#: collector's passes over a million new dicts are half of a plain load's time).
PLAIN_NO_GC = "import gc, pickle, sys; gc.disable(); pickle.load(open(sys.argv[1], 'rb'))"

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
from snapana.sources import pickle_child
child = pickle_child.start(path, path.stat().st_size, False, True)
reply = json.loads(child.wait()[1].split(b"\n", 1)[0])
how = "entries read from the bytes" if reply.get("scanned") else "unpickler"
out[f"  of which: child decode ({how}, cpu)"] = [reply["cpu_decode"], reply["cpu_decode"]]
out["  of which: child columns (cpu)"] = [reply["cpu_columns"], reply["cpu_columns"]]
stage("(the child alone, once more)")
got = ts._load_columns(path, None)
stage("decode (bounded child -> columns)")
cap = (ts.from_snapshot_dict(got[0], str(path), columns=got[1]) if got is not None
       else ts.from_snapshot_dict(ts.restricted_load(path, None, checked=True), str(path),
                                  consume=True))
stage("normalise (columns -> capture)")
s = Session(cap)
dr = s.replay
dr.interest
stage("replay")
live = dr.blocks_at(dr.interest)
s.attributor.attribute(live.filter(pl.col("state") == "active_allocated"))
stage("attribute (live blocks)")
rep = s.report
stage("diagnose (device report)")
html = render(capture_view([rep], title=path.name), "html")
stage("render (html)")
print(json.dumps(out))
"""


def _tree_memory(pid: int, proportional: bool) -> int:
    """Bytes of a process and all its descendants now (from /proc; 0 when gone): their
    resident sets summed, or with `proportional` their proportional sets (Pss, each shared
    page divided among the processes that map it: the decode child's forked process shares
    the decoded objects, which a sum of resident sets would count twice)."""
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        try:
            source, field = ((f"/proc/{p}/smaps_rollup", "Pss:") if proportional
                             else (f"/proc/{p}/status", "VmRSS:"))
            with open(source) as fh:
                for line in fh:
                    if line.startswith(field):
                        total += int(line.split()[1]) * 1024
                        break
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as fh:
                    todo += [int(c) for c in fh.read().split()]
        except (OSError, ValueError):
            continue
    return total


def run(args: list[str], proportional: bool = False) -> tuple[float, float, int, int]:
    """Wall seconds, CPU seconds (with children), peak RSS bytes (the largest single process:
    the process's own or its largest child's, as the kernel counts it) and the peak of the
    whole tree's memory (`_tree_memory`, sampled every 10 ms, 25 ms for the proportional
    sets, whose reading costs the kernel a walk of each process's pages) of one fresh
    process."""
    start = time.perf_counter()
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    tree = 0
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        tree = max(tree, _tree_memory(proc.pid, proportional))
        time.sleep(0.025 if proportional else 0.01)
    wall = time.perf_counter() - start
    err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"failed: {' '.join(args)}: {err[-500:]}")
    peak = usage.ru_maxrss * 1024
    return wall, usage.ru_utime + usage.ru_stime, peak, tree if proportional else max(tree, peak)


def generate(entries: int, folder: Path, list_per_entry: bool = False) -> Path:
    path = folder / f"synth-{entries}{'-lists' if list_per_entry else ''}.pickle"
    if not path.exists():
        print(f"generating {path} ...", flush=True)
        subprocess.run([sys.executable, "-m", "snapana", "synth", "--entries", str(entries),
                        *(["--list-per-entry"] if list_per_entry else []), "-o", str(path)],
                       check=True, stdout=subprocess.DEVNULL)
    return path


def snapana_command() -> list[str]:
    """snapana as a user runs it: the `snapana` script installed beside this interpreter,
    else `python -m snapana`."""
    script = Path(sys.executable).with_name("snapana")
    if script.is_file() and os.access(script, os.X_OK):
        return [str(script)]
    return [sys.executable, "-m", "snapana"]


def bench(path: Path, rounds: int) -> dict[str, list[float]]:
    """The interleaved rounds of one file; each command's median ratios to pickle.load
    (wall, cpu, peak RSS, tree RSS), also printed."""
    snapana = snapana_command()
    with tempfile.TemporaryDirectory() as tmp:
        html = Path(tmp) / "r.html"
        commands = {
            "pickle.load": [sys.executable, "-c", PLAIN, str(path)],
            "(gc off)": [sys.executable, "-c", PLAIN_NO_GC, str(path)],
            "summary": [*snapana, "summary", str(path)],
            "report": [*snapana, "report", str(path), "-o", str(html)],
            "whatif": [*snapana, "whatif", str(path), "--set", "expandable_segments:True"],
        }
        rows: dict[str, list[tuple[float, float, int, int]]] = {k: [] for k in commands}
        for r in range(rounds):
            for name, cmd in commands.items():
                rows[name].append(run(cmd))
            print(f"  round {r + 1}: " + ", ".join(
                f"{k} {v[-1][0]:.2f}s/{v[-1][1]:.2f}cpu/{v[-1][2] / 2**20:.0f}M"
                for k, v in rows.items()), flush=True)
        # one more run each, its tree's proportional memory sampled (not in the timed rounds:
        # reading it costs the kernel a walk of the pages, and this machine has two cores)
        pss = {name: run(cmd, proportional=True)[3] for name, cmd in commands.items()}
        html_mb = html.stat().st_size / 1e6
    base = rows["pickle.load"]
    print(f"\n{path.name}: {path.stat().st_size / 1e6:.0f} MB, {rounds} interleaved rounds, "
          f"medians (ratio to pickle.load of the same round); HTML {html_mb:.2f} MB")
    print(f"{'':12} {'wall s':>7} {'x':>5} {'cpu s':>7} {'x':>5} {'peak RSS':>9} {'x':>5} "
          f"{'tree RSS':>9} {'x':>5} {'tree PSS':>9} {'x':>5}")
    ratios = {}
    for name, vals in rows.items():
        med = [statistics.median(v[k] for v in vals) for k in range(4)]
        ratio = [statistics.median(v[k] / b[k] for v, b in zip(vals, base, strict=True))
                 for k in range(4)]
        print(f"{name:12} {med[0]:7.2f} {ratio[0]:5.2f} {med[1]:7.2f} {ratio[1]:5.2f} "
              f"{med[2] / 2**20:8.0f}M {ratio[2]:5.2f} {med[3] / 2**20:8.0f}M {ratio[3]:5.2f} "
              f"{pss[name] / 2**20:8.0f}M {pss[name] / pss['pickle.load']:5.2f}")
        ratios[name] = ratio
    return ratios


def startup(rounds: int) -> float:
    """`snapana summary` of the smallest bundled sample against `python -c "import pickle"`,
    interleaved: the median ratio of wall times (printed)."""
    small = min((ROOT / "sample_snapshots").glob("*.pickle"), key=lambda p: p.stat().st_size)
    per = []
    for _ in range(rounds):
        base = run([sys.executable, "-c", "import pickle"])[0]
        per.append(run([*snapana_command(), "summary", str(small)])[0] / base)
    ratio = statistics.median(per)
    print(f"\nstart-up: snapana summary {small.name} ({small.stat().st_size / 1e6:.1f} MB) "
          f"/ python -c 'import pickle': {ratio:.1f}x wall (median of {rounds})")
    return ratio


def table(results: dict[str, dict[str, list[float]]]) -> None:
    """Every file's ratios in one table: wall, cpu and peak RSS of each command over the
    same round's pickle.load."""
    print(f"\n{'file':28} {'command':9} {'wall x':>7} {'cpu x':>6} {'RSS x':>6}")
    for name, ratios in results.items():
        for cmd in ("summary", "report", "whatif"):
            w, c, m, _ = ratios[cmd]
            print(f"{name[:28]:28} {cmd:9} {w:7.2f} {c:6.2f} {m:6.2f}")


def stages(path: Path) -> None:
    res = subprocess.run([sys.executable, "-c", _STAGES, str(path)], capture_output=True,
                         text=True, check=True)
    parts = json.loads(res.stdout.strip().splitlines()[-1])
    total = sum(w for k, (w, _) in parts.items() if not k.startswith(("  ", "(")))
    print(f"\nstages of the report on {path.name} (one process; wall s / cpu s of this "
          "process, the child's decode counted in wall only):")
    for name, (wall, cpu) in parts.items():
        print(f"  {name:36} {wall:7.2f} {cpu:7.2f}  {100 * wall / total:5.1f}%")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--entries", default="1000000,5000000",
                    help="comma-separated trace entry counts")
    ap.add_argument("--lists", default="1000000",
                    help="comma-separated entry counts of files written as PyTorch writes them, "
                    "a new frame list per entry (`synth --list-per-entry`); '' for none")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cache", type=Path, default=None,
                    help="keep generated snapshots here between runs")
    ap.add_argument("--no-stages", action="store_true", help="skip the stage breakdown")
    ap.add_argument("--guard", type=float, default=None,
                    help="exit 1 when report's median wall ratio on the first size passes this")
    ap.add_argument("--trace-plot-python", default=None,
                    help="an interpreter with torch: add the real corpus against trace_plot")
    ap.add_argument("--source", action="store_true",
                    help="do not byte-compile snapana first (`_measure.byte_compiled`)")
    args = ap.parse_args()
    if not args.source:
        print(f"byte-compiled {byte_compiled()} (as pip installs a wheel)")
    sizes = [(int(s.replace("_", "")), False) for s in args.entries.split(",") if s]
    sizes += [(int(s.replace("_", "")), True) for s in args.lists.split(",") if s]
    results: dict[str, dict[str, list[float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.cache or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        for n, list_per_entry in sizes:
            path = generate(n, folder, list_per_entry)
            results[path.name] = bench(path, args.rounds)
            if not args.no_stages:
                stages(path)
    startup(args.rounds)
    table(results)
    if args.trace_plot_python:
        from vs_trace_plot import compare, default_corpus

        compare(default_corpus(), args.trace_plot_python, 1)
    if args.guard is not None and results:
        first, ratios = next(iter(results.items()))
        wall = ratios["report"][0]
        verdict = "passes" if wall > args.guard else "within"
        print(f"\nguard: report / pickle.load wall on {first} = {wall:.2f}x, {verdict} "
              f"{args.guard:g}x")
        if wall > args.guard:
            sys.exit(1)


if __name__ == "__main__":
    main()
