"""Helper processes die with snapana.

A decode child, a memray reader or a rank worker holds up to a GiB; if snapana is stopped
(SIGINT, SIGTERM, SIGHUP, a killed terminal), nothing may keep running. On Linux each child
asks the kernel for SIGKILL when its parent goes (prctl PR_SET_PDEATHSIG), and checks that
the parent it was started by is still there (it may have gone before the request). Children
started as `python -I -S -c CODE` cannot import snapana, so the same steps are also given as
source text (`DIE_WITH_PARENT`) to put at the top of their code.
"""

from __future__ import annotations

import os
import signal
import sys

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
    if parent.isdigit() and os.getppid() != int(parent):
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
        parent = int(given) if given.isdigit() else None
    if parent is not None and os.getppid() != parent:
        os._exit(1)
