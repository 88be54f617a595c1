"""Helper processes die with snapana.

A decode child, a memray reader or a rank worker holds up to a GiB; if snapana is stopped
(SIGINT, SIGTERM, SIGHUP, a killed terminal), nothing may keep running. On Linux each child
asks the kernel for SIGKILL when its parent goes (prctl PR_SET_PDEATHSIG), and checks that
the parent it was started by is still there (it may have gone before the request). Children
started as `python -I -S -c CODE` cannot import snapana, so the same steps are also given as
source text (`DIE_WITH_PARENT`) to put at the top of their code.

A child still starting when its parent vanishes (a rank worker reading what multiprocessing
sends it) has not made that request yet and prints a traceback of its own; so on SIGTERM and
SIGHUP snapana ends its children itself before it dies of the signal (`end_children_on`).
"""

from __future__ import annotations

import os
import signal
import sys

from snapana.units import ascii_int

#: The environment variable that tells a child its parent's pid.
PARENT_ENV = "SNAPANA_PARENT_PID"
_PR_SET_PDEATHSIG = 1

#: The same as `die_with_parent`, as the first lines of a child's `-c` code.
DIE_WITH_PARENT = r"""
def _die_with_parent():
    import os, sys
    if sys.platform.startswith("linux"):
        try:
            import ctypes
            ctypes.CDLL(None, use_errno=True).prctl(1, 9)
        except Exception:
            pass
    parent = os.environ.get("SNAPANA_PARENT_PID", "")
    if parent.isascii() and parent.isdigit() and os.getppid() != int(parent):
        os._exit(1)
_die_with_parent()
"""


def child_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment for a child: `base` (default: this process's) with this process's
    pid, so the child can tell its parent is gone."""
    return {**(os.environ if base is None else base), PARENT_ENV: str(os.getpid())}


def die_with_parent(parent: int | None = None) -> None:
    """In a child: be killed when its parent (`parent`, default: the pid `child_env` gave)
    goes, and go now if it already has."""
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        except (OSError, AttributeError):  # no libc prctl: the parent check still holds
            pass
    if parent is None:
        given = os.environ.get(PARENT_ENV, "")
        parent = ascii_int(given)
    if parent is not None and os.getppid() != parent:
        os._exit(1)


def _own_children() -> list[int]:
    """The pids of this process's live children (from /proc; [] where there is none)."""
    me = os.getpid()
    found: list[int] = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return found
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                fields = fh.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == me and fields[0] != b"Z":
            found.append(int(entry))
    return found


def _tracker() -> int | None:
    """The pid of multiprocessing's resource tracker, if this process started one: it is
    spared, since it removes the semaphores the workers leave when they are killed."""
    module = sys.modules.get("multiprocessing.resource_tracker")
    return getattr(getattr(module, "_resource_tracker", None), "_pid", None)


def _end_children_and_die(signum: int, frame: object) -> None:
    spared = _tracker()
    for pid in _own_children():
        if pid != spared:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)  # the exit status says which signal ended snapana


def end_children_on(*signals: int) -> None:
    """Install, in snapana's own process (the command line: never in a notebook's, whose
    other children are not snapana's): on each of `signals`, kill every child at once, then
    die of the signal as its default action would. (SIGINT keeps Python's KeyboardInterrupt:
    the code that started a child stops it, `ranks.runner._stop`.)"""
    for sig in signals:
        try:
            signal.signal(sig, _end_children_and_die)
        except (OSError, ValueError):  # not the main thread, or not a signal here
            pass
