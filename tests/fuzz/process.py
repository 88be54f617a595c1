"""Run a case as a process of its own, the way a user starts snapana (issue 43): `python -P
-m snapana ARGV` in the case folder (-P: the folder is not on Python's own path, as with the
console script), in a session of its own so that every process it starts can be found
afterwards, with what the case does to it (`Case.process`):

- `stdout`: "file" (stdout.txt), "full" (/dev/full: every write fails with ENOSPC) or
  "closed" (descriptor 1 closed before it starts);
- `encoding`: PYTHONIOENCODING (an ASCII or latin-1 terminal);
- `fsize`: RLIMIT_FSIZE in bytes with SIGXFSZ ignored (a disk that fills: writes past it
  fail with EFBIG);
- `signal` and `delay`: the signal sent to snapana (not its children) once `delay` seconds
  have passed, or once it has a child (`delay` "child").

The reply has the worker's shape (code, seconds, peak_rss: snapana's own, sampled every
10 ms; its children's are bounded by their own limits) plus `signal_sent` and `orphans`:
the processes of its session still alive a second after it ended (each killed then)."""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from .cases import Case

ROOT = Path(__file__).resolve().parents[2]
#: How long a process snapana started may outlive it.
GRACE = 1.0
#: How long a signal case waits for snapana to start a child before signalling anyway.
CHILD_WAIT = 30.0


def _stat(pid: str) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name (state first), or None."""
    try:
        return (Path("/proc") / pid / "stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _session(sid: int) -> list[int]:
    """Live (not zombie) processes of session `sid`."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != sid:
            fields = _stat(entry)
            if fields and fields[0] != "Z" and int(fields[3]) == sid:
                out.append(int(entry))
    return out


def _has_child(pid: int) -> bool:
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = _stat(entry)
            if fields and int(fields[1]) == pid and fields[0] != "Z":
                return True
    return False


def _prepare(settings: dict[str, Any], memory_limit: int) -> Any:
    stdout, fsize = settings.get("stdout", "file"), settings.get("fsize")

    def prepare() -> None:
        # as a terminal's foreground job has it: a campaign or a CI run started in the
        # background inherits SIGINT ignored, and Python then raises no KeyboardInterrupt
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        if memory_limit:
            resource.setrlimit(resource.RLIMIT_AS, (memory_limit, memory_limit))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        if fsize:
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # kept across exec: writes fail
            resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
        if stdout == "closed":
            os.close(1)

    return prepare


def _signal_when_due(pid: int, settings: dict[str, Any]) -> tuple[str | None, Any]:
    """Send the case's signal when its moment comes: (the signal's name or None, and the
    (status, rusage) of snapana when it ended before that, else None)."""
    name, delay = settings.get("signal"), settings.get("delay", 0.0)
    if not name:
        return None, None
    start = time.monotonic()
    while True:
        ended = _reap(pid)
        if ended is not None:
            return None, ended
        waited = time.monotonic() - start
        if (delay == "child" and (_has_child(pid) or waited > CHILD_WAIT)) or (
                delay != "child" and waited >= float(delay)):
            os.kill(pid, getattr(signal, name))
            return name, None
        time.sleep(0.01)


def _peak_rss(pid: int) -> int:
    """The process's peak RSS so far (VmHWM, bytes). Not the rusage a wait returns: that
    starts from the RSS of the process that forked it (this one), kept across the exec."""
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def _reap(pid: int) -> tuple[int, Any] | None:
    """(wait status, resource usage) of `pid` once it has ended, else None."""
    got, status, usage = os.wait4(pid, os.WNOHANG)
    return (status, usage) if got else None


def run_process(case: Case, folder: Path, timeout: float, memory_limit: int,
                snapana_path: str | None = None) -> tuple[dict | None, str]:
    """Run the case; (reply, "") or (None, "hang") as the worker would answer."""
    settings = case.process or {}
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONSAFEPATH", "PYTHONIOENCODING", "PYTHONPATH")}
    env["PYTHONPATH"] = snapana_path or str(ROOT / "analyzer")
    env.setdefault("COLUMNS", "200")
    env.setdefault("POLARS_MAX_THREADS", "2")
    if settings.get("encoding"):
        env["PYTHONIOENCODING"] = settings["encoding"]
    for key, value in settings.get("env", {}).items():  # e.g. $GITHUB_STEP_SUMMARY
        if value is None:
            env.pop(key, None)  # unset (HOME=. means nothing while XDG_CACHE_HOME is set)
        else:
            env[key] = value
    stdout_path = "/dev/full" if settings.get("stdout") == "full" else folder / "stdout.txt"
    start = time.monotonic()
    with open(stdout_path, "wb") as out, open(folder / "stderr.txt", "wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-P", "-m", "snapana", *case.command()], cwd=folder, env=env,
            stdin=subprocess.DEVNULL, stdout=out, stderr=err,
            preexec_fn=_prepare(settings, memory_limit), start_new_session=True)
    sent, ended = _signal_when_due(proc.pid, settings)
    peak = 0
    while ended is None and time.monotonic() - start < timeout:
        peak = max(peak, _peak_rss(proc.pid))
        ended = _reap(proc.pid)
        time.sleep(0.01)
    if ended is None:
        os.killpg(proc.pid, signal.SIGKILL)
        os.waitpid(proc.pid, 0)
        proc.returncode = -9
        return None, "hang"
    status, _ = ended
    proc.returncode = os.waitstatus_to_exitcode(status)
    seconds = time.monotonic() - start
    orphans = _session(proc.pid)
    gone = time.monotonic() + GRACE
    while orphans and time.monotonic() < gone:
        time.sleep(0.02)
        orphans = _session(proc.pid)
    for pid in orphans:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return {"code": proc.returncode, "exception": None, "seconds": seconds,
            "peak_rss": peak, "signal_sent": sent,
            "orphans": orphans}, ""
