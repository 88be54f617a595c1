"""Run a command in a fresh process and report its wall time and peak RSS (ratios matter:
these machines are shared and noisy, so always compare against a baseline in the same run)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path


def measure(args: list[str], repeat: int = 3) -> tuple[float, int]:
    """Best wall seconds and the peak RSS in bytes over `repeat` runs of `args`."""
    best, rss = float("inf"), 0
    for _ in range(repeat):
        start = time.perf_counter()
        proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        if os.waitstatus_to_exitcode(status) != 0:
            sys.exit(f"failed: {' '.join(args)}: {proc.stderr.read().decode()[-500:]}")
        best = min(best, wall)
        rss = max(rss, usage.ru_maxrss * 1024)
    return best, rss


def python(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def byte_compiled() -> Path:
    """Byte-compile the snapana package that the commands run, as pip does when it installs a
    wheel, and return its folder: an editable install under PYTHONDONTWRITEBYTECODE (CI's
    and this machine's setting) would otherwise compile every module it imports from source
    on every run (~0.15 s of CPU), which no installed user pays."""
    import compileall

    import snapana

    folder = Path(snapana.__file__).parent
    compileall.compile_dir(folder, quiet=1)
    return folder
