"""A fuzzing campaign: generate cases, run them in parallel workers, count the classes,
minimise each distinct finding and (optionally) save it into tests/fuzz/findings/."""

from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from .cases import Case, load_saved
from .minimize import minimize
from .mutators import FORMATS, generate
from .runner import CLASSES, Outcome, Runner

FINDINGS_DIR = Path(__file__).resolve().parent / "findings"
#: Saved regression files stay small.
MAX_SAVED_BYTES = 64 << 10


@dataclass
class Finding:
    case: Case
    outcome: Outcome
    index: int
    count: int = 1


@dataclass
class Result:
    counts: Counter = field(default_factory=Counter)
    by_format: dict[str, Counter] = field(default_factory=dict)
    findings: dict[tuple[str, str], Finding] = field(default_factory=dict)
    notes: Counter = field(default_factory=Counter)
    cases: int = 0
    seconds: float = 0.0
    #: the slowest case and the largest peak RSS (bytes) seen, with the case's name
    slowest: tuple[float, str] = (0.0, "")
    largest: tuple[int, str] = (0, "")
    #: the most seconds per input file of a case of many files (`Case.expect["units"]`)
    per_file: tuple[float, str] = (0.0, "")

    def record(self, index: int, case: Case, out: Outcome) -> None:
        self.cases += 1
        self.slowest = max(self.slowest, (out.seconds, f"{case.fmt}: {case.name[:60]}"))
        self.largest = max(self.largest, (out.peak_rss, f"{case.fmt}: {case.name[:60]}"))
        units = case.expect.get("units", 0)
        if units and out.cls in ("ok", "refused"):
            self.per_file = max(self.per_file, (out.seconds / units,
                                                f"{case.fmt}: {case.name[:60]}"))
        self.counts[out.cls] += 1
        self.by_format.setdefault(case.fmt, Counter())[out.cls] += 1
        if out.note:
            self.notes[out.note.split(":")[0]] += 1
        if out.failed:
            sig = (case.fmt, *out.signature) if out.cls != "hang" else (case.fmt, "hang", "")
            key = (sig[1], f"{sig[0]}|{sig[2]}")
            if key in self.findings:
                self.findings[key].count += 1
            else:
                self.findings[key] = Finding(case, out, index)

    def table(self) -> str:
        lines = [f"{self.cases} cases in {self.seconds:.0f} s"]
        lines.append("  ".join(f"{c}={self.counts.get(c, 0)}" for c in CLASSES))
        for fmt, cnt in sorted(self.by_format.items()):
            lines.append(f"  {fmt:9s} " + " ".join(f"{c}={n}" for c, n in cnt.most_common()))
        if self.notes:
            lines.append("  notes: " + ", ".join(f"{k} x{n}" for k, n in self.notes.items()))
        lines.append(f"  slowest case {self.slowest[0]:.1f} s [{self.slowest[1]}]; largest peak "
                     f"RSS {self.largest[0] >> 20} MiB [{self.largest[1]}]")
        if self.per_file[1]:
            lines.append(f"  slowest per input file {self.per_file[0] * 1000:.0f} ms "
                         f"[{self.per_file[1]}]")
        return "\n".join(lines)


def run_cases(cases: list[Case] | None, *, count: int | None = None, seed: int = 0,
              minutes: float | None = None, jobs: int = 2, timeout: float = 10.0,
              formats: tuple[str, ...] = tuple(FORMATS), corpus: bool = True,
              progress: bool = False, snapana_path: str | None = None) -> Result:
    """Run given cases, or generated ones (`count` of them, or for `minutes`)."""
    result = Result()
    lock = threading.Lock()
    start = time.monotonic()
    deadline = start + minutes * 60 if minutes else None
    counter = iter(range(10**12))

    def next_case() -> tuple[int, Case] | None:
        with lock:
            i = next(counter)
        if cases is not None:
            return (i, cases[i]) if i < len(cases) else None
        if count is not None and i >= count:
            return None
        if deadline is not None and time.monotonic() > deadline:
            return None
        try:
            return i, generate(i, seed, formats, corpus)
        except Exception as exc:  # noqa: BLE001 - a mutator bug must not stop the campaign
            import traceback

            where = traceback.extract_tb(exc.__traceback__)[-1]
            print(f"[{i}] generator error: {type(exc).__name__}: {exc} at "
                  f"{Path(where.filename).name}:{where.lineno}", flush=True)
            return i, generate(i + 10**9, seed, formats, corpus)

    def work() -> None:
        with Runner(timeout=timeout, snapana_path=snapana_path) as runner:
            while True:
                item = next_case()
                if item is None:
                    return
                i, case = item
                out = runner.run(case)
                with lock:
                    result.record(i, case, out)
                    if progress and out.failed:
                        print(f"[{i}] {out.cls}: {out.detail} ({case.fmt}: {case.name[:80]})",
                              flush=True)
                    if progress and result.cases % 100 == 0:
                        print(f"... {result.cases} cases, {dict(result.counts)}", flush=True)

    threads = [threading.Thread(target=work, daemon=True) for _ in range(max(1, jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    result.seconds = time.monotonic() - start
    return result


def minimise_and_save(result: Result, save: bool, timeout: float = 10.0,
                      max_findings: int = 60, log: bool = True,
                      snapana_path: str | None = None
                      ) -> list[tuple[Finding, Path | None]]:
    """Reduce each distinct finding; write it into the corpus folder when `save`.

    With `snapana_path` (the campaign ran another snapana tree, e.g. the commit before a
    fix), a reduced finding is saved only when this tree handles it (refused or ok): the
    corpus holds regressions that must pass, and the others are printed as still open."""
    saved: list[tuple[Finding, Path | None]] = []
    with Runner(timeout=timeout, snapana_path=snapana_path) as runner, \
            Runner(timeout=timeout) as here:
        for _, finding in list(sorted(result.findings.items()))[:max_findings]:
            try:
                case, out = minimize(runner, finding.case, finding.outcome)
            except Exception as exc:  # noqa: BLE001 - keep the case as found
                print(f"(not minimised: {type(exc).__name__}: {exc})", flush=True)
                case, out = finding.case, finding.outcome
            finding.case, finding.outcome = case, out
            path = None
            now = here.run(case) if snapana_path else out
            still = now.failed
            if save and case.size <= MAX_SAVED_BYTES and not (snapana_path and still):
                path = _next_path(out.cls, case)
                path = case.save(path)
            if log:
                where = path.name if path else (
                    f"still {now.cls} here: {now.detail[:60]}" if snapana_path and still
                    else f"not saved ({case.size} bytes)")
                print(f"{out.cls:10s} x{finding.count:<4d} {out.detail[:90]} [{case.fmt}: "
                      f"{case.name[:60]}] -> {where}", flush=True)
            saved.append((finding, path))
    return saved


def _next_path(cls: str, case: Case) -> Path:
    FINDINGS_DIR.mkdir(exist_ok=True)
    n = 1
    while any(FINDINGS_DIR.glob(f"{cls}-{n}.*")):
        n += 1
    return FINDINGS_DIR / f"{cls}-{n}"


def corpus_cases() -> list[Case]:
    """Every saved regression case."""
    if not FINDINGS_DIR.is_dir():
        return []
    return [load_saved(p) for p in sorted(FINDINGS_DIR.iterdir())
            if p.is_file() and not p.name.startswith((".", "README"))]
