"""`snapana record -- COMMAND`: run the job with recording injected into each of its Python
processes, passing its exit code, stdout and stderr through untouched."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import snapana.record as record

BOOTSTRAP = Path(__file__).resolve().parent / "bootstrap"
PACKAGE_ROOT = Path(record.__file__).resolve().parents[2]  # the folder holding `snapana`


def job_environment(out_dir: Path, max_entries: int, stacks: str, dump_at_step: int | None,
                    job: str | None, base: dict[str, str] | None = None) -> dict[str, str]:
    """The job's environment plus what the injected hook reads."""
    env = dict(os.environ if base is None else base)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(BOOTSTRAP)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    env[record.ENV_DIR] = str(out_dir.resolve())
    env[record.ENV_MAX_ENTRIES] = str(max_entries)
    env[record.ENV_STACKS] = stacks
    env["SNAPANA_RECORD_PACKAGE_ROOT"] = str(PACKAGE_ROOT)
    if dump_at_step is not None:
        env[record.ENV_DUMP_AT_STEP] = str(dump_at_step)
    if job:
        env[record.ENV_JOB] = job
    return env


def run(command: list[str], env: dict[str, str]) -> int:
    """Run the job in the foreground; its exit status becomes ours (a signal N as 128+N,
    like a shell). Ctrl-C goes to the job, which decides how to stop."""
    proc = subprocess.Popen(command, env=env)
    # Ctrl-C reaches the job from the terminal itself; a scheduler's SIGTERM is passed on
    previous_int = signal.signal(signal.SIGINT, signal.SIG_IGN)
    previous_term = signal.signal(signal.SIGTERM, lambda sig, frame: proc.send_signal(sig))
    try:
        code = proc.wait()
    finally:
        signal.signal(signal.SIGINT, previous_int)
        signal.signal(signal.SIGTERM, previous_term)
    return 128 - code if code < 0 else code
