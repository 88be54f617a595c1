"""One long-lived decode process for the many small files of a rank folder.

A folder of thousands of tiny rank files (a job on 4,096 GPUs dumps one each) paid an
interpreter's start-up per file for its bounded decode child: 20-50 ms, where decoding a
file of a few KB takes well under one. Where a process decodes many files (`kept`: a rank
worker, or a rank run in this process), each small file (`SERVED_BYTES`) goes instead to
one decode process that lives as long as it, started once and restarted when it goes. It
runs the very same child code (`pickle_child.CHILD`, the restricted unpickler), in a fresh
scope per file, under that file's own limits: its memory limit (RLIMIT_AS, set per file; the
hard limit is left as it is, so the next file can have its own), its alarm (SIGALRM's
default action ends the process, as it ends a child: the file is refused for its time, and
the next file gets a new process) and its peak (reset per file; where Linux cannot reset it,
the process serves one file and goes). After a file that ran out of memory, one whose peak
passed `RESTART_RSS`, or `RESTART_FILES` files, the process replies, then goes, and the next
file starts a new one. The process that asked decodes nothing first, as with a child: it
gets the same reply line and payload a child writes, on the kept process's stdout (a small
file's columns are kilobytes: no payload file needed), framed by its length. One file at a
time: a file asked for while another is decoding (another thread's) gets a child.
"""

from __future__ import annotations

import atexit
import json
import os
import selectors
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from snapana.children import DIE_WITH_PARENT, child_env
from snapana.sources.pickle_child import CHILD, Child, note_started, plan
from snapana.sources.pickle_child import start as own_child

#: Files up to this size on disk (gzip or not: a compressed one is decoded within its
#: decompressed limit all the same) are decoded by the kept process: where a child's start-up
#: is most of the cost, and below the size from which the child reads entries from the bytes
#: with numpy (`pickle_child.SCAN_ENTRIES` x 16 B, plain files only) or hands its columns
#: over in a payload file; larger files keep a child of their own.
SERVED_BYTES = 1 << 20
#: The kept process goes (after its reply) once a file's peak (what it held before, and the
#: file's decode) passes this, or it has served this many files: what a decode leaves behind
#: (fragments, a cycle) cannot build up.
RESTART_RSS = 256 << 20
RESTART_FILES = 2000

#: Run as `python -I -S -c DIE_WITH_PARENT + SERVER CHILD`: reads a request per line (the
#: child's arguments, as JSON), runs CHILD on it in a fresh scope (its `reply` raises
#: SERVED instead of ending the process), and writes `LENGTH LAST\n` then what the child
#: wrote; LAST 1: it goes after this reply. A child that raised ends it with exit code 1, as
#: a child's traceback would; its alarm ends it as it ends a child.
SERVER = r"""
import gc, io, json, os, signal, sys
code = compile(sys.argv[1], "<snapana decode>", "exec")
RESTART_RSS, RESTART_FILES = int(sys.argv[2]), int(sys.argv[3])
class Served(BaseException):
    pass
# each file's peak is its own: reset (CHILD's `reset_peak`) after the one before; where Linux
# cannot reset it, one file per process
resettable = os.access("/proc/self/clear_refs", os.W_OK)
def unlimited():
    try:
        import resource
        hard = resource.getrlimit(resource.RLIMIT_AS)[1]
        resource.setrlimit(resource.RLIMIT_AS, (hard, hard))
    except (ImportError, ValueError, OSError):
        pass
requests, replies = sys.stdin.buffer, sys.stdout.buffer
served = 0
while True:
    request = requests.readline()
    if not request:
        os._exit(0)
    sys.argv = ["-c", *json.loads(request)]
    out = io.BytesIO()
    sys.stdout = io.TextIOWrapper(out, "utf-8", write_through=True)
    scope = {"__name__": "__main__", "SERVED": Served}
    try:
        exec(code, scope)
    except Served:
        pass
    except BaseException:
        os._exit(1)
    unlimited()
    reset_peak = scope.get("reset_peak")
    scope.clear()
    gc.collect()  # within the file's alarm: what it left is its own time
    if reset_peak is not None:
        reset_peak()
    signal.alarm(0)
    served += 1
    said = out.getvalue()
    try:
        head = json.loads(said.split(b"\n", 1)[0])
    except ValueError:
        head = {}
    # its peak (from what the process held before it) says how much the process holds
    last = (not resettable or head.get("error") == "memory" or served >= RESTART_FILES
            or int(head.get("peak") or 0) > RESTART_RSS)
    replies.write(b"%d %d\n" % (len(said), last) + said)
    replies.flush()
    if last:
        os._exit(0)
"""


class _Kept:
    """The kept decode process of this process, started on first use."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen[bytes] | None = None
        #: held from a file's request to its reply: one file at a time (a second thread's
        #: file, meanwhile, gets a child of its own)
        self.busy = threading.Lock()

    def process(self) -> subprocess.Popen[bytes]:
        if self.proc is None or self.proc.poll() is not None:
            self.end()
            env = child_env({k: v for k, v in os.environ.items()
                             if k in ("PATH", "SYSTEMROOT", "LANG")})
            self.proc = subprocess.Popen(
                [sys.executable, "-I", "-S", "-c", DIE_WITH_PARENT + SERVER, CHILD,
                 str(RESTART_RSS), str(RESTART_FILES)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                env=env)
            note_started(self.proc.pid, "pool")
        return self.proc

    def send(self, args: list[str]) -> subprocess.Popen[bytes]:
        """The request written to the kept process (a new one if it has gone)."""
        line = json.dumps(args).encode() + b"\n"
        for _ in range(2):
            proc = self.process()
            try:
                assert proc.stdin is not None
                proc.stdin.write(line)
                proc.stdin.flush()
                return proc
            except (BrokenPipeError, ConnectionResetError):
                self.end()  # it went between two files: once more, with a new one
        raise OSError("the kept decode process could not be started")

    def end(self, going: bool = False) -> None:
        """End the kept process and reap it; `going`: it closed its output, and is given a
        moment to exit of itself (its exit status says why: its alarm, a crash)."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if going:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        if proc.poll() is None:
            proc.kill()
        for f in (proc.stdin, proc.stdout):
            try:
                if f is not None:
                    f.close()
            except OSError:
                pass
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass


_KEPT: _Kept | None = None


def keep() -> None:
    """From now on, small files are decoded by a kept process (for the life of this one: a
    rank worker's)."""
    global _KEPT
    if _KEPT is None:
        _KEPT = _Kept()
        atexit.register(release)


def release() -> None:
    """Small files get a child of their own again; the kept process is ended."""
    global _KEPT
    kept, _KEPT = _KEPT, None
    if kept is not None:
        kept.end()


@contextmanager
def kept() -> Iterator[None]:
    """Small files decoded by one kept process while inside (a rank run in this process)."""
    if _KEPT is not None:
        yield
        return
    keep()
    try:
        yield
    finally:
        release()


def start(path: Path, size: int, compressed: bool, columns: bool) -> Child:
    """The decode of `path` (`size` bytes on disk), as `pickle_child.start` gives it: asked
    of the kept process where there is one and the file is small, else a child of its own.
    OSError when no process can be started here."""
    args, limit, timeout = plan(path, size, compressed, columns)
    kept = _KEPT
    if kept is None or size > SERVED_BYTES or not kept.busy.acquire(blocking=False):
        return own_child(path, size, compressed, columns)
    try:
        # no forked helper (a small trace), no payload file: the columns follow the reply
        proc = kept.send([*args, str(1 << 62)])
    except BaseException:
        kept.busy.release()
        raise
    return ServedChild(kept, proc, limit, timeout)


class ServedChild(Child):
    """One file's decode by the kept process, seen as a child's: `wait` gives the exit
    status a child would have had and what it wrote."""

    def __init__(self, kept: _Kept, proc: subprocess.Popen[bytes], limit: int,
                 timeout: float) -> None:
        super().__init__(proc, limit, timeout)
        self.kept, self.holds = kept, True  # holds `kept.busy` until the reply is read

    def wait(self) -> tuple[int, bytes]:
        """(0, the reply and payload); where the kept process went before replying (its
        alarm, a crash), its exit status and nothing: the next file gets a new one.
        TimeoutExpired (the process killed) past the timeout."""
        try:
            return self._reply()
        finally:
            self._done()

    def _done(self) -> None:
        if self.holds:
            self.holds = False
            self.kept.busy.release()

    def _reply(self) -> tuple[int, bytes]:
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        got = bytearray()
        need: int | None = None
        last = 1
        deadline = time.monotonic() + self.timeout
        with selectors.DefaultSelector() as sel:
            sel.register(fd, selectors.EVENT_READ)
            while need is None or len(got) < need:
                left = deadline - time.monotonic()
                if left <= 0:
                    self.kept.end()
                    raise subprocess.TimeoutExpired(self.proc.args, self.timeout)
                if not sel.select(left):
                    continue
                data = os.read(fd, 1 << 16)
                if not data:  # it went: its status says why
                    self.kept.end(going=True)
                    return self.proc.returncode if self.proc.returncode is not None else 1, b""
                got += data
                if need is None and b"\n" in got:
                    head, _, rest = bytes(got).partition(b"\n")
                    need, last = (int(x) for x in head.split())
                    got = bytearray(rest)
        if last:
            self.kept.end()
        return 0, bytes(got)

    def kill(self) -> None:
        self.kept.end()
        self._done()
