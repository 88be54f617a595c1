"""The persistent worker: imports snapana once, then runs CLI cases sent to it one at a time.

Protocol: one JSON request per line on stdin, {"cwd": DIR, "argv": [...]}, one JSON reply per
line on the original stdout. During a case, file descriptors 1 and 2 point at `stdout.txt`
and `stderr.txt` in the case folder, so output written by native code (memray's C++
messages, a Rust panic) is captured exactly like the CLI's own. The CLI runs through
`snapana.cli.main` with `sys.argv` set, which keeps exit codes exact: SystemExit carries the
code `python -m snapana` would exit with; any other exception is what the interpreter would
print as a traceback (exit 1).

The runner sets the memory limit (RLIMIT_AS) before this starts, kills it on a timeout and
starts a new one when it dies.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback


def _status(field: str) -> int:
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _children_peak() -> int:
    """The largest peak RSS of any child process waited for so far (bytes)."""
    import resource

    return resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024


def _reset_peak() -> None:
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")  # resets VmHWM (peak RSS) to the current RSS
    except OSError:
        pass


def _exit_code(code: object) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    return 1  # sys.exit("message") prints it and exits 1


def run_case(req: dict) -> dict:
    from snapana import cli

    cwd = req["cwd"]
    os.chdir(cwd)
    out_fd = os.open(os.path.join(cwd, "stdout.txt"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    err_fd = os.open(os.path.join(cwd, "stderr.txt"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    sys.stdout.flush()
    sys.stderr.flush()
    saved_out, saved_err = os.dup(1), os.dup(2)
    os.dup2(out_fd, 1)
    os.dup2(err_fd, 2)
    os.close(out_fd)
    os.close(err_fd)
    sys.argv = ["snapana", *req["argv"]]
    exc_name = None
    _reset_peak()
    children_before = _children_peak()
    t0 = time.monotonic()
    try:
        cli.main()
        code = 0
    except SystemExit as exc:
        code = _exit_code(exc.code)
    except BaseException as exc:  # noqa: BLE001 - what the interpreter would print
        exc_name = type(exc).__name__
        try:
            traceback.print_exc()
        except BaseException:  # noqa: BLE001 - a RecursionError while formatting, say
            sys.stderr.write(f"Traceback (most recent call last):\n{exc_name}\n")
        code = 1
    seconds = time.monotonic() - t0
    try:
        sys.stdout.flush()
    except BaseException:  # noqa: BLE001
        pass
    try:
        sys.stderr.flush()
    except BaseException:  # noqa: BLE001
        pass
    os.dup2(saved_out, 1)
    os.dup2(saved_err, 2)
    os.close(saved_out)
    os.close(saved_err)
    children = _children_peak()
    return {"code": code, "exception": exc_name, "seconds": seconds,
            "peak_rss": _status("VmHWM"), "rss": _status("VmRSS"), "vm": _status("VmSize"),
            # the decode child's peak counts against the case too; ru_maxrss of children is
            # a high-water mark over all of them, so it tells only when this case raised it
            "child_peak_rss": children if children > children_before else 0}


def main() -> None:
    # requests come on a private copy of stdin, replies go to a private copy of stdout; the
    # CLI sees /dev/null as stdin and the case files as stdout and stderr
    requests = os.fdopen(os.dup(0), "r")
    replies = os.fdopen(os.dup(1), "w", buffering=1)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.environ.setdefault("COLUMNS", "200")
    import snapana.cli  # noqa: F401 - warm: every case reuses the imports
    import snapana.render.json  # noqa: F401
    import snapana.session  # noqa: F401

    replies.write(json.dumps({"ready": True, "pid": os.getpid()}) + "\n")
    for line in requests:
        if not line.strip():
            continue
        reply = run_case(json.loads(line))
        replies.write(json.dumps(reply) + "\n")


if __name__ == "__main__":
    main()
