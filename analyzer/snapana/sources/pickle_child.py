"""The bounded child that decodes a snapshot pickle, and starting it early.

A snapshot pickle is decoded in a child process (`CHILD`, the code in `child_decode` and
`child_columns`: the restricted unpickler, under a time limit and a memory limit
proportional to the file; see `torch_snapshot`), which hands the traces back as flat
columns; from `SCAN_ENTRIES` entries on, it reads the trace entries
from the file's bytes with numpy (`pickle_scan`) and has the unpickler decode only the rest.
This module starts that child and waits for it; it imports nothing heavy (no polars, no
numpy), so the command line can start decoding the one file it was given before it imports the
pipeline (`start_early`), and the decode runs while the parent imports. `torch_snapshot`
then takes the child already running for the same file, mode and limits (`take`), or starts
one. A child no one takes is ended when the process exits.
"""

from __future__ import annotations

import atexit
import mmap
import os
import selectors
import subprocess
import sys
import threading
import time
import zlib
from pathlib import Path

from snapana.children import DIE_WITH_PARENT, child_env
from snapana.limits import decode_memory, decode_seconds
from snapana.sources._io import GZIP_MAGIC, decompressed_limit
from snapana.sources.child_decode import CHILD

#: From how many trace entries on the child makes the traces' numbers (addresses, sizes,
#: streams, times) in a process it forks while it makes the rest (`child_columns`, `split`):
#: below that, the fork and its copied pages cost more than the half it saves.
#: SNAPANA_SPLIT_ENTRIES sets it (0: always, as the fuzzer can; a number past every trace:
#: never, where the pages the two processes copy matter more than the time).
SPLIT_ENTRIES = 100_000


def _entries_from_env(var: str, default: int) -> int:
    """The environment variable `var` where it is a whole number, else `default`."""
    raw = os.environ.get(var, "").strip()
    try:
        return int(raw) if raw.isascii() and raw.isdigit() else default
    except ValueError:  # more digits than int() takes
        return default


def split_entries() -> int:
    """SNAPANA_SPLIT_ENTRIES where it is a whole number, else SPLIT_ENTRIES."""
    return _entries_from_env("SNAPANA_SPLIT_ENTRIES", SPLIT_ENTRIES)


#: From how many trace entries on the child reads a file's entries from its bytes
#: (`pickle_scan`) rather than having the unpickler make a dict of each: below that, the
#: numpy it imports for that costs more than the dicts. SNAPANA_SCAN_ENTRIES sets it (0:
#: always, as the fuzzer can; a number past every trace: never).
SCAN_ENTRIES = 100_000


def scan_entries() -> int:
    """SNAPANA_SCAN_ENTRIES where it is a whole number, else SCAN_ENTRIES."""
    return _entries_from_env("SNAPANA_SCAN_ENTRIES", SCAN_ENTRIES)


def _scan_env() -> dict[str, str]:
    """What the child needs to read entries from the bytes: `pickle_scan`'s file, the
    directory numpy is imported from and from how many entries on (its `-I -S` leaves
    site-packages out), with numpy's math libraries on one thread; empty where numpy is
    not found."""
    import importlib.util

    try:
        spec = importlib.util.find_spec("numpy")
    except (ImportError, ValueError):
        return {}
    places = list(spec.submodule_search_locations or []) if spec is not None else []
    if not places:
        return {}
    return {"SNAPANA_CHILD_SCAN": str(Path(__file__).with_name("pickle_scan.py")),
            "SNAPANA_CHILD_NUMPY": os.path.dirname(places[0]),
            "SNAPANA_CHILD_SCAN_MIN": str(scan_entries()),
            "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


class Child:
    """A running decode child: its process, the limit of decompressed bytes it was given,
    the timeout its parent waits for it with and, in columns mode, the anonymous file it
    writes its payload to (`payload_file`), which `wait` maps as `payload` and closes."""

    def __init__(self, proc: subprocess.Popen[bytes], limit: int, timeout: float,
                 fd: int | None = None) -> None:
        self.proc, self.limit, self.timeout, self.fd = proc, limit, timeout, fd
        self.to_file = fd is not None
        self.payload: mmap.mmap | None = None

    def wait(self) -> tuple[int, bytes]:
        """(exit status, stdout); TimeoutExpired (the child killed) past the timeout. A
        child with a payload file that closed its output after a whole reply line (written
        after the payload), and is still exiting, counts as exited 0: what it wrote is
        complete; its exit is reaped later. When the child had a payload file and wrote to
        it, `payload` is that file, mapped (the map holds its own descriptor until the
        columns made from it are dropped)."""
        try:
            if os.name != "posix":
                out, _ = self.proc.communicate(timeout=self.timeout)
                status = self.proc.returncode
            else:
                deadline = time.monotonic() + self.timeout
                out = self._read_to_end(deadline)
                status = self.proc.poll()
                if status is None and not (self.to_file and out.endswith(b"\n")):
                    status = self.proc.wait(max(deadline - time.monotonic(), 0.0))
        except subprocess.TimeoutExpired:
            self.kill()
            raise
        if self.fd is not None:
            try:
                size = os.fstat(self.fd).st_size
                self.payload = _map(self.fd, size) if size else None
            except (OSError, ValueError):
                self.payload = None  # the caller finds the payload missing: decodes itself
            finally:
                self._close()
        if status is None:  # reaped when its exit comes, off this thread
            threading.Thread(target=self.proc.wait, daemon=True).start()
            status = 0
        return status, out

    def _read_to_end(self, deadline: float) -> bytes:
        """The child's stdout and stderr read until both end (stderr's bytes dropped: read
        only so the child never blocks on it), by `deadline`; then both are closed."""
        pipes = [f for f in (self.proc.stdout, self.proc.stderr) if f is not None]
        chunks: list[bytes] = []
        with selectors.DefaultSelector() as sel:
            for f in pipes:
                sel.register(f, selectors.EVENT_READ)
            while sel.get_map():
                left = deadline - time.monotonic()
                if left <= 0:
                    raise subprocess.TimeoutExpired(self.proc.args, self.timeout)
                for key, _ in sel.select(left):
                    data = os.read(key.fd, 1 << 16)
                    if not data:
                        sel.unregister(key.fileobj)
                    elif key.fileobj is self.proc.stdout:
                        chunks.append(data)
        for f in pipes:
            f.close()
        return b"".join(chunks)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        try:
            self.proc.communicate(timeout=30)
        except (subprocess.TimeoutExpired, ValueError, OSError):
            pass
        self._close()

    def _close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def _map(fd: int, size: int) -> mmap.mmap:
    """The payload file mapped read-only, its pages mapped in one call where the system can
    (MAP_POPULATE): the parent reads all of it, and a page fault per 4 KB page costs 4 µs on
    some machines (40 ms for a million entries' columns)."""
    populate = getattr(mmap, "MAP_POPULATE", 0)
    if populate and hasattr(mmap, "MAP_SHARED") and hasattr(mmap, "PROT_READ"):
        try:
            return mmap.mmap(fd, size, flags=mmap.MAP_SHARED | populate, prot=mmap.PROT_READ)
        except OSError:
            pass
    return mmap.mmap(fd, size, access=mmap.ACCESS_READ)


def payload_file() -> int | None:
    """A file descriptor of an anonymous file for the child's columns, or None where none
    can be made and passed (then they come on its stdout). The parent maps what the child
    wrote there, where a pipe costs 3.5 ms per MB here and even reading the file 1 ms
    (a million entries are 45 MB of columns)."""
    if os.name != "posix":
        return None
    try:
        if hasattr(os, "memfd_create"):
            return os.memfd_create("snapana-columns", os.MFD_CLOEXEC)
        import tempfile

        with tempfile.TemporaryFile() as f:  # already unlinked: no name to clean up
            return os.dup(f.fileno())
    except OSError:
        return None


def plan(path: Path, size: int, compressed: bool, columns: bool
         ) -> tuple[list[str], int, float]:
    """What decoding `path` (`size` bytes on disk) is given: the child's arguments (its file,
    the limit of decompressed bytes, its memory and time limits, its mode), that limit, and
    how long its parent waits for it."""
    limit = decompressed_limit(size)[0] if compressed else size
    base = decode_memory(0)
    factor = decode_memory(1) - base
    seconds = decode_seconds(0)
    per_byte = decode_seconds(1 << 20) - seconds
    args = [str(path), str(limit), str(base), str(factor), repr(seconds),
            repr(per_byte / (1 << 20)), "columns" if columns else "check"]
    budget = seconds + per_byte / (1 << 20) * limit
    return args, limit, budget * (2 if columns else 1) + 30 + limit / (20 << 20)


def start(path: Path, size: int, compressed: bool, columns: bool) -> Child:
    """Start the child on `path` (`size` bytes on disk); OSError when no process can be
    started here."""
    args, limit, timeout = plan(path, size, compressed, columns)
    cmd = [sys.executable, "-I", "-S", "-c", DIE_WITH_PARENT + CHILD, *args,
           str(split_entries())]
    env = child_env({k: v for k, v in os.environ.items()
                     if k in ("PATH", "SYSTEMROOT", "LANG")})
    if columns:
        env.update(_scan_env())
    fd = payload_file() if columns else None
    if fd is not None:
        cmd.append(str(fd))
    try:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, env=env,
                                pass_fds=() if fd is None else (fd,))
    except BaseException:
        if fd is not None:
            os.close(fd)
        raise
    note_started(proc.pid, "child")
    return Child(proc, limit, timeout, fd)


def note_started(pid: int, what: str) -> None:
    """Where SNAPANA_CHILD_LOG names a file, a line appended to it for each decode process
    started (its pid, and `child` for a one-file child or `pool` for a long-lived one): how
    tests and benchmarks count them across worker processes."""
    log = os.environ.get("SNAPANA_CHILD_LOG")
    if log:
        try:
            with open(log, "a", encoding="utf-8") as fh:
                fh.write(f"{pid} {what}\n")
        except OSError:
            pass


#: Children started early, by what identifies their file and mode.
_EARLY: dict[tuple[object, ...], Child] = {}


def _key(path: Path, st: os.stat_result, columns: bool) -> tuple[object, ...]:
    return (os.path.abspath(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, columns,
            os.environ.get("SNAPANA_DECODE_SECONDS"), os.environ.get("SNAPANA_DECODE_MEMORY"),
            os.environ.get("SNAPANA_MAX_RATIO"), os.environ.get("SNAPANA_MAX_DECOMPRESSED"),
            split_entries(), scan_entries())


def _looks_like_pickle(path: Path) -> tuple[os.stat_result, bool] | None:
    """(stat, gzip?) of a regular file that starts like a snapshot pickle (protocol 2-5,
    plain or gzip), else None. Opened non-blocking: never waits on a FIFO."""
    import stat

    try:
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode):
            return None
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        try:
            head = os.read(fd, 2)
            if head == GZIP_MAGIC:
                import gzip
                import io

                os.lseek(fd, 0, os.SEEK_SET)
                try:
                    with gzip.GzipFile(fileobj=io.BytesIO(os.read(fd, 1 << 16))) as gz:
                        inner = gz.read(2)
                except (OSError, EOFError, zlib.error):  # corrupt: the reader says so
                    return None
                return (st, True) if inner[:1] == b"\x80" and inner[1:2] in (
                    b"\x02", b"\x03", b"\x04", b"\x05") else None
        finally:
            os.close(fd)
    except OSError:
        return None
    ok = head[:1] == b"\x80" and head[1:2] in (b"\x02", b"\x03", b"\x04", b"\x05")
    return (st, False) if ok else None


def start_early(path: Path) -> None:
    """Start decoding `path` now, in columns, when it is a regular file that starts like a
    snapshot pickle; `take` hands the child to the reader. Anything odd: nothing started
    (the reader then checks the file and says what is wrong)."""
    found = _looks_like_pickle(path)
    if found is None:
        return
    st, compressed = found
    key = _key(path, st, True)
    if key in _EARLY:
        return
    try:
        _EARLY[key] = start(path, st.st_size, compressed, True)
    except OSError:
        return
    if len(_EARLY) == 1:
        atexit.register(_end_untaken)


def take(path: Path, st: os.stat_result, columns: bool) -> Child | None:
    """The child `start_early` started on this very file (same device, inode, size and
    modification time, same mode and limits), handed over once; else None."""
    if not _EARLY:
        return None
    return _EARLY.pop(_key(path, st, columns), None)


def _end_untaken() -> None:
    """A child started early but never taken (the command failed first): ended, not left
    running."""
    while _EARLY:
        _EARLY.popitem()[1].kill()
