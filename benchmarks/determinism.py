"""Are snapana's outputs the same bytes on every run? CI runs the suite twice on clean clones,
and an output that depends on a process's hash seed (set/dict order of strings) or on polars'
thread count (`group_by` without `maintain_order` returns groups in any order) makes a
landing red one run in a few.

    python benchmarks/determinism.py [--only snapshots,traces,samples,oom] [--limit N]

Runs `summary -f json --full`, `summary -f markdown --full` (and `whatif -f json` for the
sample snapshots) on every sample snapshot, every corpus torch snapshot and kineto trace and
every OOM message of the corpus (its text on stdin), in three fresh processes: each with its
own PYTHONHASHSEED, POLARS_MAX_THREADS=1 in the first and 2 in the others (--runs N: N
processes; a tie that flips one run in six needs more than three). Inside a process the
commands run through typer's CliRunner (one interpreter start per run, not per file).
Prints each output whose bytes differ between runs, with the first differing lines; exit 1
if any did.
"""

from __future__ import annotations

import argparse
import difflib
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT.parent / "shared" / "corpus"
#: PYTHONHASHSEED of each run (POLARS_MAX_THREADS 1 in the first, 2 in the others); --runs N
#: adds more
SEEDS = ("0", "1", "2718281")
#: Whatif changes replayed on the sample snapshots.
WHATIFS = (("--set", "expandable_segments:True"), ("--capacity", "80GiB"))


def jobs(only: set[str], limit: int | None, match: str = "", corpus: Path = CORPUS
         ) -> list[dict]:
    """Every (name, argv, stdin) to run, in a fixed order."""
    out: list[dict] = []

    def files(kind: str, folder: Path, pattern: str = "*") -> list[Path]:
        if kind not in only or not folder.is_dir():
            return []
        return sorted(p for p in folder.glob(pattern) if p.is_file() and match in p.name
                      )[:limit]

    for kind, paths in (("samples", files("samples", ROOT / "sample_snapshots", "*.pickle")),
                        ("snapshots", files("snapshots", corpus / "torch_snapshots")),
                        ("traces", files("traces", corpus / "kineto_traces"))):
        for p in paths:
            for fmt in ("json", "markdown"):
                out.append({"name": f"{kind}/{p.name} summary {fmt}",
                            "argv": ["summary", "-f", fmt, "--full", str(p)]})
            if kind == "samples":
                for change in WHATIFS:
                    out.append({"name": f"{kind}/{p.name} whatif {' '.join(change)}",
                                "argv": ["whatif", str(p), *change, "-f", "json"]})
    messages = corpus / "oom_messages" / "messages.jsonl"
    if "oom" in only and messages.is_file() and not match:
        for line in messages.read_text().splitlines()[:limit]:
            m = json.loads(line)
            for fmt in ("json", "markdown"):
                out.append({"name": f"oom/{m['id']} summary {fmt}",
                            "argv": ["summary", "-f", fmt, "--full", "-"], "stdin": m["text"]})
    return out


def worker(todo: Path, into: Path) -> None:
    """Run each job of `todo` in this process; write its output (stdout, then stderr and the
    exit code) to a file of `into` named by the job's number."""
    from snapana.cli import app
    from typer.testing import CliRunner

    runner = CliRunner(env={"COLUMNS": "200"})
    for i, job in enumerate(json.loads(todo.read_text())):
        r = runner.invoke(app, job["argv"], input=job.get("stdin"))
        text = (r.stdout + f"\n--- stderr\n{r.stderr}\n--- exit {r.exit_code}\n")
        if r.exception is not None and not isinstance(r.exception, SystemExit):
            text += f"--- exception {type(r.exception).__name__}: {r.exception}\n"
        (into / f"{i}.out").write_text(text)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="samples,snapshots,traces,oom")
    ap.add_argument("--limit", type=int, default=None, help="at most N files of each kind")
    ap.add_argument("--corpus", type=Path, default=CORPUS)
    ap.add_argument("--match", default="", help="only files whose name contains this")
    ap.add_argument("--runs", type=int, default=len(SEEDS), help="fresh processes (≥ 2)")
    ap.add_argument("--worker", nargs=2, metavar=("JOBS", "INTO"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        worker(Path(a.worker[0]), Path(a.worker[1]))
        return 0
    todo = jobs(set(a.only.split(",")), a.limit, a.match, a.corpus)
    runs = [(seed, "1" if n == 0 else "2") for n, seed in enumerate(
        [*SEEDS, *(str(n * 7919) for n in range(len(SEEDS), a.runs))][:max(a.runs, 2)])]
    print(f"{len(todo)} outputs x {len(runs)} runs", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        (base / "jobs.json").write_text(json.dumps(todo))
        for n, (seed, threads) in enumerate(runs):
            (base / str(n)).mkdir()
            (base / f"cache{n}").mkdir()  # a fresh user cache: nothing carried between runs
            env = dict(os.environ, PYTHONHASHSEED=seed, POLARS_MAX_THREADS=threads,
                       XDG_CACHE_HOME=str(base / f"cache{n}"),
                       PYTHONPATH=os.pathsep.join([str(ROOT / "analyzer"),
                                                   os.environ.get("PYTHONPATH", "")]))
            subprocess.run([sys.executable, __file__, "--worker", str(base / "jobs.json"),
                            str(base / str(n))], env=env, check=True)
            print(f"run {n} (PYTHONHASHSEED={seed}, POLARS_MAX_THREADS={threads}) done",
                  flush=True)
        differ = 0
        for i, job in enumerate(todo):
            texts = [(base / str(n) / f"{i}.out").read_text() for n in range(len(runs))]
            digests = {hashlib.sha256(t.encode()).hexdigest() for t in texts}
            if len(digests) == 1:
                continue
            differ += 1
            print(f"\nDIFFERS: {job['name']}")
            other = next(t for t in texts[1:] if t != texts[0])
            diff = difflib.unified_diff(texts[0].splitlines(), other.splitlines(),
                                        "run 0", "another run", n=1, lineterm="")
            print("\n".join(list(diff)[:30]))
    print(f"\n{differ} of {len(todo)} outputs differ between runs")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
