"""Run cases in persistent worker processes and classify each outcome.

Classes (`CLASSES`): `refused` (exit 2, exactly one stderr line `snapana: error: ...`), `ok`
(exit 0 and, for `summary -f json`, every invariant holds) are fine; the rest are findings:
`traceback` (a Python traceback or an exit code other than 0/2/3), `internal` (exit 3: an
unexpected error the CLI's guard caught), `multiline` (exit 2 with more or less than one
line), `invariant` (exit 0 with inconsistent figures), `crash` (killed by a signal), `hang`
(over the per-case timeout), `memory` (the memory limit hit, a MemoryError, or a peak RSS over
the RSS limit, the decode child's included), `overwrite` (an input file changed, or a FIFO,
device or socket setup node replaced), `real-refused` (an unmutated real capture, re-encoded
at most, refused: the worst failure there is), `executed` (a module planted beside the
inputs ran: it writes a `CANARY-*` file), `orphan` (a process snapana started outlived it by
more than a second). Raw control characters in text output (not JSON) are an `invariant`
finding. Exit 4 in one line is a refusal when the case makes the output fail (a full disk,
a closed or ASCII standard output, a name the file system cannot hold); a partial output or
a temporary file left behind then is an `invariant` finding.

Cases with `process` settings run as a process of their own (environment.py), the way a
user starts `snapana`: its standard output on /dev/full or closed, a file-size limit, a
signal sent to it while it works.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import resource
import select
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

from .cases import Case
from .invariants import markdown_violations, summary_violations
from .process import run_process

ROOT = Path(__file__).resolve().parents[2]
GOOD = ("refused", "ok")
CLASSES = ("refused", "ok", "traceback", "internal", "multiline", "invariant", "crash", "hang",
           "memory", "overwrite", "real-refused", "executed", "orphan")
OUTPUT_ERROR = 4
#: What `check` and `diff --fail-on` exit with when a limit is breached (not a failure).
OVER_BUDGET = 1
SOME_INPUTS_FAILED = 5  # snapana.errors: a folder or glob with unreadable inputs
#: Raw control characters text output must never hold (tab and newline are layout); an
#: input's escape sequence reaching a terminal (screen clear, OSC 52 clipboard writes).
_RAW_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")
GIB = 1 << 30
_FRAME = re.compile(r'File "([^"]*snapana[^"]*)", line (\d+), in (\S+)')


@dataclass
class Outcome:
    cls: str
    detail: str = ""
    code: int | None = None
    seconds: float = 0.0
    stderr: str = ""
    stdout: str = ""
    peak_rss: int = 0
    note: str = ""  # more detail on an invariant finding

    @property
    def signature(self) -> tuple[str, str]:
        """What a reduction must keep: the class and, for tracebacks, the failing site."""
        return (self.cls, self.detail if self.cls in ("traceback", "internal", "invariant")
                else "")

    @property
    def failed(self) -> bool:
        return self.cls not in GOOD


def _before_snapana(stderr: str) -> bool:
    """A KeyboardInterrupt raised while Python itself starts, before `__main__.run` (which
    turns Ctrl-C into exit 130) runs: runpy compiling snapana's `__main__`, the package's
    own module code. Python's to print; any frame inside snapana's functions is not."""
    if not stderr.rstrip().endswith("KeyboardInterrupt"):
        return False
    frames = _FRAME.findall(stderr)
    return all(func == "<module>" and path.endswith(("snapana/__init__.py",
                                                     "snapana/__main__.py"))
               for path, _, func in frames)


def traceback_site(stderr: str) -> str:
    """`ExcType at snapana/file.py:line` of the innermost snapana frame of a traceback."""
    frames = _FRAME.findall(stderr)
    lines = stderr.splitlines()
    last = max((i for i, ln in enumerate(lines) if ln.lstrip().startswith("File \"")),
               default=-1)
    after = [ln for ln in lines[last + 1:] if ln.strip() and not ln.startswith((" ", "\t"))]
    exc = after[0].split(":")[0].strip() if after else "?"
    if frames:
        f, line, func = frames[-1]
        short = f.split("analyzer/")[-1] if "analyzer/" in f else f.split("site-packages/")[-1]
        return f"{exc} at {short}:{line} ({func})"
    return exc


class Worker:
    """One persistent worker process; restarted by the runner when it dies or hangs."""

    def __init__(self, memory_limit: int, snapana_path: str | None = None) -> None:
        self.memory_limit = memory_limit
        self.snapana_path = snapana_path
        self.proc: subprocess.Popen | None = None
        self.cases = 0

    def start(self) -> None:
        limit = self.memory_limit

        def limits() -> None:
            if limit:
                resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

        env = dict(os.environ)
        env.setdefault("POLARS_MAX_THREADS", "2")
        # another snapana tree (e.g. an older commit) goes first on the path
        env["PYTHONPATH"] = os.pathsep.join(p for p in (self.snapana_path, str(ROOT),
                                                        env.get("PYTHONPATH")) if p)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.fuzz.worker"], cwd=ROOT, env=env,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            preexec_fn=limits, start_new_session=True, text=True, bufsize=1)
        line = self._readline(120)
        if line is None or not json.loads(line).get("ready"):
            self.kill()
            raise RuntimeError("fuzz worker did not start (is snapana importable?)")
        self.cases = 0

    def _readline(self, timeout: float) -> str | None:
        assert self.proc is not None and self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not ready:
            return None
        line = self.proc.stdout.readline()
        return line or None

    def kill(self) -> None:
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            pass
        self.proc = None

    def run(self, cwd: Path, argv: list[str], timeout: float) -> tuple[dict | None, str]:
        """The worker's reply, or None and why ('hang' or 'died:<signal or code>')."""
        if self.proc is None or self.proc.poll() is not None:
            self.start()
        assert self.proc is not None and self.proc.stdin is not None
        self.cases += 1
        try:
            self.proc.stdin.write(json.dumps({"cwd": str(cwd), "argv": argv}) + "\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            self.kill()
            return None, "died:pipe"
        line = self._readline(timeout)
        if line is None:
            rc = self.proc.poll()
            if rc is None:
                self.kill()
                return None, "hang"
            self.proc = None
            return None, f"died:{rc}"
        return json.loads(line), ""


class Runner:
    """Runs cases one after another in a worker (use one Runner per parallel job)."""

    def __init__(self, timeout: float = 60.0, memory_limit: int = 3 * GIB,
                 rss_limit: int = 2 * GIB, recycle: int = 300,
                 snapana_path: str | None = None) -> None:
        self.timeout = timeout
        self.rss_limit = rss_limit
        self.recycle = recycle
        self.worker = Worker(memory_limit, snapana_path)
        self.base = Path(tempfile.mkdtemp(prefix="snapana-fuzz-"))
        self.n = 0

    def close(self) -> None:
        self.worker.kill()
        shutil.rmtree(self.base, ignore_errors=True)

    def __enter__(self) -> Runner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def run(self, case: Case) -> Outcome:
        """The case's outcome. A failure seen in a worker that ran other cases before is
        run again in a fresh one, and that outcome counts: a real `snapana` runs one input
        per process, so what earlier cases left behind (address space kept by thread pools,
        a heap after a MemoryError) is not this input's fault."""
        fresh = self.worker.proc is None or self.worker.cases == 0
        outcome = self._run_once(case)
        if outcome.failed and not fresh:
            self.worker.kill()
            outcome = self._run_once(case)
        return outcome

    def _run_once(self, case: Case) -> Outcome:
        self.n += 1
        folder = self.base / f"case-{self.n}"
        folder.mkdir()
        try:
            hashes = case.materialize(folder)
            nodes = case.nodes(folder)
            if case.process is not None:
                reply, why = run_process(case, folder, self.timeout, self.worker.memory_limit,
                                         self.worker.snapana_path)
            else:
                reply, why = self.worker.run(folder, case.command(), self.timeout)
            out = self._read(folder / "stdout.txt")
            err = self._read(folder / "stderr.txt")
            outcome = self._environment(case, folder, reply, out, err) or self._classify(
                case, folder, reply, why, out, err)
            outcome = self._expected(case, folder, outcome)
            if outcome.cls in GOOD and self._changed(folder, hashes):
                outcome = Outcome("overwrite", "an input file was modified", outcome.code,
                                  outcome.seconds, err, out)
            after = case.nodes(folder)
            if outcome.cls in GOOD and any(after.get(k) != v for k, v in nodes.items()):
                outcome = Outcome("overwrite", "a FIFO, device or socket was replaced",
                                  outcome.code, outcome.seconds, err, out)
            if outcome.cls == "refused" and case.real:
                outcome = Outcome("real-refused", outcome.detail, outcome.code,
                                  outcome.seconds, err, out)
            if reply is not None and case.process is None and (
                    self.worker.cases >= self.recycle or outcome.failed
                                      or reply.get("rss", 0) > self.rss_limit // 2
                                      or reply.get("vm", 0) > self.worker.memory_limit * 3 // 4):
                self.worker.kill()  # a fresh worker now and then: no state carried over
            return outcome
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    @staticmethod
    def _environment(case: Case, folder: Path, reply: dict | None, out: str, err: str
                     ) -> Outcome | None:
        """What the environment classes decide before the usual rules: a planted module
        ran, a child outlived snapana, a signal ended it (cleanly: no traceback), an
        expected output failure left a partial file behind."""
        if list(folder.glob("CANARY-*")):
            return Outcome("executed", "a module planted in the working directory ran",
                           stderr=err, stdout=out)
        if reply is None:
            return None
        code, seconds = reply.get("code"), reply.get("seconds", 0.0)
        base = dict(code=code, seconds=seconds, stderr=err, stdout=out,
                    peak_rss=reply.get("peak_rss", 0))
        if reply.get("orphans"):
            return Outcome("orphan", f"{len(reply['orphans'])} processes outlived snapana",
                           **base)
        sent = reply.get("signal_sent")
        if sent:
            number = int(getattr(signal, sent))
            if "Traceback (most recent call last)" in err and not _before_snapana(err):
                return Outcome("traceback", traceback_site(err), **base)
            if code in (0, 2, 130, -number, 128 + number):
                return Outcome("ok", f"stopped by {sent}", **base)
            return Outcome("crash", f"exit {code} after {sent}", **base)
        if case.output_may_fail and code == OUTPUT_ERROR:
            left = [p.name for p in folder.rglob(".*.tmp")]
            if left:
                return Outcome("invariant", "a temporary output was left behind",
                               note=f"left: {left[0][:60]}", **base)
        return None

    @staticmethod
    def _expected(case: Case, folder: Path, outcome: Outcome) -> Outcome:
        """What `case.expect` demands of a good outcome (an `invariant` finding otherwise):
        a value refused, an input read, markdown without live links, planted text absent."""
        want = case.expect
        if not want or outcome.cls not in GOOD:
            return outcome

        def finding(detail: str, note: str) -> Outcome:
            return replace(outcome, cls="invariant", detail=detail, note=note)

        if "refuse" in want and outcome.cls == "ok":
            return finding("accepted a value it must refuse", f"accepted: {want['refuse']!r}")
        if want.get("read") and outcome.cls == "refused":
            return finding("refused an input it must read", f"refused: {outcome.detail}")
        if outcome.cls != "ok":
            return outcome
        given = set(case.files) | {step[1] for step in case.setup}
        made = [p for p in folder.rglob("*") if p.is_file() and not p.is_symlink()
                and p.relative_to(folder).as_posix() not in given
                and p.name not in ("stdout.txt", "stderr.txt")]
        if want.get("markdown"):
            texts = [outcome.stdout] + [Runner._read(p) for p in made if p.suffix == ".md"]
            bad = [v for t in texts for v in markdown_violations(t)]
            if bad:
                return finding(f"markdown: live {bad[0].split(':')[0]}", "; ".join(bad[:2]))
        for text in want.get("absent") or ():
            where = [p.name for p in made if text in Runner._read(p)]
            if text in outcome.stdout or where:
                return finding("planted text reached the output",
                               f"planted: {text[:40]!r} in {(where or ['stdout'])[0]}")
        return outcome

    @staticmethod
    def _read(path: Path, limit: int = 256 << 20) -> str:
        try:
            with path.open("rb") as fh:
                return fh.read(limit).decode("utf-8", "replace")
        except OSError:
            return ""

    @staticmethod
    def _changed(folder: Path, hashes: dict[str, str]) -> bool:
        for rel, digest in hashes.items():
            p = folder / rel
            try:
                if hashlib.sha256(p.read_bytes()).hexdigest() != digest:
                    return True
            except (OSError, IsADirectoryError):
                return True
        return False

    def _classify(self, case: Case, folder: Path, reply: dict | None, why: str, out: str,
                  err: str) -> Outcome:
        if reply is None:
            if why == "hang":
                return Outcome("hang", f"over {self.timeout:g} s", None, self.timeout, err, out)
            detail = why.split(":", 1)[1]
            memoryish = any(s in err for s in ("memory allocation of", "bad_alloc",
                                               "MemoryError", "Cannot allocate memory"))
            try:
                sig = -int(detail)
            except ValueError:
                sig = 0
            if memoryish or sig == signal.SIGKILL:
                return Outcome("memory", f"died ({detail})", None, 0, err, out)
            name = signal.Signals(sig).name if sig > 0 else f"exit {detail}"
            return Outcome("crash", name, None, 0, err, out)
        code, seconds = reply["code"], reply["seconds"]
        if isinstance(code, int) and code < 0:  # a process case killed by a signal
            return self._classify(case, folder, None, f"died:{code}", out, err)
        peak = max(reply.get("peak_rss", 0), reply.get("child_peak_rss", 0))
        base = dict(code=code, seconds=seconds, stderr=err, stdout=out, peak_rss=peak)
        if reply.get("exception") == "MemoryError" or "MemoryError" in err:
            return Outcome("memory", "MemoryError", **base)
        if peak > self.rss_limit:
            return Outcome("memory", f"peak RSS {peak >> 20} MiB", **base)
        if "Traceback (most recent call last)" in err or reply.get("exception"):
            return Outcome("traceback", traceback_site(err), **base)
        if code in (2, 3) and _RAW_CONTROL.search(err):
            return Outcome("invariant", "raw control character in text output",
                           note=f"control: {_RAW_CONTROL.search(err).group()!r}", **base)
        if code == 2 or (code == OUTPUT_ERROR and case.output_may_fail):
            lines = [ln for ln in err.splitlines() if ln.strip()]
            if len(lines) == 1 and lines[0].startswith("snapana: error: "):
                return Outcome("refused", lines[0][16:96], **base)
            return Outcome("multiline", f"{len(lines)} lines", **base)
        if code == SOME_INPUTS_FAILED:  # several inputs, some unreadable: each listed, exit 5
            return Outcome("refused", "some inputs could not be read", **base)
        if code == 3:
            return Outcome("internal", err.strip().splitlines()[-1][:160] if err.strip()
                           else "", **base)
        cmd = case.command()
        gate = (any(a == "--fail-on" or a.startswith("--fail-on=") for a in cmd)
                or cmd[:1] == ["check"])  # the value glued on too (cliargs.value_case)
        if code != 0 and not (code == OVER_BUDGET and gate):  # 1: a breached budget
            return Outcome("traceback", f"exit {code}", **base)
        raw = _RAW_CONTROL.search(err) or (None if "json" in cmd else _RAW_CONTROL.search(out))
        if raw:
            return Outcome("invariant", "raw control character in text output",
                           note=f"control: {raw.group()!r}", **base)
        if cmd[:1] == ["summary"] and "json" in cmd:
            bad = summary_violations(out)
            if bad and bad[0].startswith("rank-internal: "):
                return Outcome("internal", bad[0].split(": ", 1)[1], **base)
            if bad:
                return Outcome("invariant", bad[0].split(":")[0], note="; ".join(bad[:3]),
                               **base)
            return Outcome("ok", "", **base)
        if cmd[:1] == ["report"] and "-o" in cmd:
            target = folder / cmd[cmd.index("-o") + 1]
            if target.is_dir():  # named after the input, or `snapana-report.html` (ranks)
                pages = sorted(target.glob("*.html"))
                target = pages[0] if pages else target / (
                    Path(case.input).name.split(".")[0] + ".html")
            if not target.is_file() or target.stat().st_size == 0:
                return Outcome("invariant", "report: exit 0 without the report file", **base)
        return Outcome("ok", "", **base)
