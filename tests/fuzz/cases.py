"""A fuzz case: files to lay out in a fresh folder, a command line, optional setup steps.

Cases are saved into `tests/fuzz/findings/` either as the raw input file (`<class>-<n>.<ext>`,
replayed with `summary FILE -f json`) or, when a case needs more than one file, a special
setup or another command, as `<class>-<n>.case.json` (files base64-encoded).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import socket
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: The input path every single-file case uses, by format (detection is by content anyway).
INPUT = "input"
SUMMARY = ["summary", "{input}", "-f", "json"]


@dataclass
class Case:
    fmt: str
    name: str
    files: dict[str, bytes]
    argv: list[str] = field(default_factory=lambda: list(SUMMARY))
    #: the path {input} stands for, relative to the case folder
    input: str = INPUT
    #: ('fifo', relpath) | ('symlink', relpath, target) | ('dir', relpath) | ('file', relpath,
    #: text): a regular file that is no input (a CI summary appended to) | ('chardev',
    #: relpath): a copy of /dev/null (a link to it where mknod is not allowed) | ('bytes',
    #: relpath, base64): a file that is no input, which the run may replace |
    #: ('socket', relpath): a bound Unix socket. Every node must be the same after the run.
    setup: list[tuple[str, ...]] = field(default_factory=list)
    #: an unmutated real capture (re-encoded at most): refusing it is a finding
    real: bool = False
    #: for structure-aware minimisation: the mutated tree and how to turn it into files
    tree: Any = None
    encode: Callable[[Any], dict[str, bytes]] | None = None
    ext: str = ""
    #: run as a process of its own (`snapana` as a user starts it), not in the worker, with
    #: what the case does to it (environment.py): {"stdout": "full" | "closed" | "file",
    #: "encoding": "ascii", "fsize": bytes, "signal": "SIGTERM", "delay": seconds,
    #: "env": {"GITHUB_STEP_SUMMARY": "ci.out"}}
    process: dict[str, Any] | None = None
    #: an output the environment cannot take is expected: exit 4 in one line is a refusal
    output_may_fail: bool = False
    #: what the case demands beyond the classes (runner.py `_expected`): {"refuse": value}
    #: (exit 2, never 0), {"read": True} (never refused), {"markdown": True} (no live link,
    #: image or zero-width character in markdown output), {"absent": [text]} (no output
    #: holds it), {"units": n} (input files, for the time per file)
    expect: dict[str, Any] = field(default_factory=dict)

    def command(self) -> list[str]:
        return [a.replace("{input}", self.input) for a in self.argv]

    def materialize(self, folder: Path) -> dict[str, str]:
        """Write the case into `folder` (empty); return the hashes of the input files."""
        hashes = {}
        for rel, data in self.files.items():
            p = folder / rel
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(data)
            hashes[rel] = hashlib.sha256(data).hexdigest()
        for step in self.setup:
            p = folder / step[1]
            p.parent.mkdir(parents=True, exist_ok=True)
            if step[0] == "fifo":
                os.mkfifo(p)
            elif step[0] == "symlink":
                os.symlink(step[2], p)
            elif step[0] == "dir":
                p.mkdir(exist_ok=True)
            elif step[0] == "file":  # a regular file an output may append to (not an input)
                p.write_text(step[2] if len(step) > 2 else "")
            elif step[0] == "bytes":  # a file snapana may replace (a kept cache entry)
                p.write_bytes(base64.b64decode(step[2]))
            elif step[0] == "chardev":
                try:
                    os.mknod(p, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
                except (PermissionError, AttributeError):
                    os.symlink(os.devnull, p)
            elif step[0] == "socket":
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                try:
                    sock.bind(str(p))
                finally:
                    sock.close()  # the socket file stays
        return hashes

    def nodes(self, folder: Path) -> dict[str, tuple[int, str]]:
        """The kind (and a link's target) of each setup node that is or leads to a FIFO, a
        device or a socket: the run must leave them as they were (an output onto one must
        be refused, never replace it)."""
        out = {}
        for step in self.setup:
            p = folder / step[1]
            try:
                st, lst = os.stat(p), os.lstat(p)
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode):
                continue
            target = os.readlink(p) if stat.S_ISLNK(lst.st_mode) else ""
            out[step[1]] = (stat.S_IFMT(lst.st_mode), target)
        return out

    @property
    def size(self) -> int:
        return sum(len(v) for v in self.files.values())

    def is_plain(self) -> bool:
        """One input file run with the default command: saved as the raw file."""
        return (list(self.files) == [self.input] and not self.setup
                and self.argv == SUMMARY and self.process is None and not self.output_may_fail
                and not self.expect)

    def save(self, path_stem: Path) -> Path:
        if self.is_plain():
            path = path_stem.with_name(path_stem.name + (self.ext or ".bin"))
            path.write_bytes(self.files[self.input])
            return path
        path = path_stem.with_name(path_stem.name + ".case.json")
        doc = {"fmt": self.fmt, "name": self.name, "argv": self.argv, "input": self.input,
               "setup": [list(s) for s in self.setup], "real": self.real,
               "process": self.process, "output_may_fail": self.output_may_fail,
               "expect": self.expect,
               "files": {k: base64.b64encode(v).decode("ascii")
                         for k, v in sorted(self.files.items())}}
        path.write_text(json.dumps(doc, indent=1) + "\n")
        return path


def load_saved(path: Path) -> Case:
    """A case saved by `Case.save` (a raw input file or a .case.json)."""
    if path.name.endswith(".case.json"):
        doc = json.loads(path.read_text())
        return Case(fmt=doc["fmt"], name=doc.get("name", path.name),
                    files={k: base64.b64decode(v) for k, v in doc["files"].items()},
                    argv=list(doc["argv"]), input=doc.get("input", INPUT),
                    setup=[tuple(s) for s in doc.get("setup", [])],
                    real=bool(doc.get("real", False)), process=doc.get("process"),
                    output_may_fail=bool(doc.get("output_may_fail", False)),
                    expect=dict(doc.get("expect") or {}))
    return Case(fmt="saved", name=path.name, files={INPUT: path.read_bytes()},
                ext="".join(path.suffixes))
