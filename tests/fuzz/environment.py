"""What surrounds the input (issue 43): outputs the environment cannot take, paths the OS
allows but a helper may not, modules planted beside the inputs, signals while snapana works.

- `write_failure_case`: standard output on /dev/full, closed, or ASCII / latin-1; a disk
  that fills under `report`, `export`, `diff`, `synth` (RLIMIT_FSIZE). One line and exit 4,
  the output whole or absent (no temporary file left).
- `path_case`: names of 240-255 bytes (no room for `.meta.json`), over 255 bytes, paths over
  PATH_MAX, a path through a file, a link loop, a dangling link, names that are not UTF-8 or
  carry escapes and newlines, an output name too long for its temporary file. One line and
  exit 2 (4 for an output), or the report.
- `planted_case`: `json.py`, `inspect.py`, `types.py`, ... beside the inputs, each writing a
  canary when imported; every command that starts a helper interpreter (the decode child,
  rank workers, the memray reader) run from that folder. A canary is an `executed` finding.
- `signal_case`: SIGINT, SIGTERM or SIGHUP sent to snapana after a delay or once it has a
  child; nothing it started may outlive it by a second (`orphan`), no traceback.
"""

from __future__ import annotations

import os
import random
from functools import cache

from . import seeds
from .cases import INPUT, SUMMARY, Case

#: Standard-library modules an interpreter imports early; each, planted, writes a canary
#: beside itself (no import needed: `__file__` is set before the module runs).
PLANTED = ("json", "inspect", "types", "typing", "enum", "functools", "threading", "pickle",
           "struct", "re", "encodings", "site", "sitecustomize", "usercustomize", "runpy")


def _snapshot() -> bytes:
    data = seeds.small_snapshot()
    return data if data is not None else seeds.rank_snapshot(0, True)


@cache
def slow_snapshot(segments_of_200_blocks: int = 300) -> bytes:
    """A snapshot whose decode takes a while (about a second at the default 60,000 blocks),
    each block with its own frames."""
    import pickle

    frames = [{"filename": f"/app/m{i}.py", "name": f"f{i}", "line": i} for i in range(8)]
    segments, address = [], 1 << 40
    for _ in range(segments_of_200_blocks):
        blocks = [{"address": address + 512 * b, "size": 512, "requested_size": 500,
                   "state": "active_allocated",
                   "frames": [dict(f, line=f["line"] + b) for f in frames]} for b in range(200)]
        segments.append({"device": 0, "address": address, "total_size": 512 * 200,
                         "stream": 0, "segment_type": "small", "blocks": blocks})
        address += 1 << 21
    return pickle.dumps({"segments": segments, "device_traces": [[]]}, protocol=4)


# ----- outputs the environment cannot take ---------------------------------------------------

STREAMS = ({"stdout": "full"}, {"stdout": "closed"}, {"encoding": "ascii"},
           {"encoding": "latin-1"})
STREAM_COMMANDS = (list(SUMMARY), ["summary", "{input}"], ["summary", "{input}", "-f", "markdown"],
                   ["explain", "{input}"], ["diff", "{input}", "{input}"])
WRITERS = (["report", "{input}", "-o", "out.html"], ["export", "{input}", "-o", "out-export"],
           ["diff", "{input}", "{input}", "-o", "diff.html"],
           ["synth", "--entries", "2000", "-o", "synth.pickle"],
           ["summary", "{input}", "-f", "html"])


def write_failure_case(r: random.Random) -> Case:
    if r.random() < 0.5:
        settings = dict(r.choice(STREAMS))
        argv = list(r.choice(STREAM_COMMANDS))
    else:
        settings = {"fsize": r.choice((4096, 65536, 1 << 20))}
        argv = list(r.choice(WRITERS))
    what = ",".join(f"{k}={v}" for k, v in settings.items())
    return Case("environment", f"{argv[0]} with {what}", {INPUT: _snapshot()}, argv=argv,
                process=settings, output_may_fail=True, ext=".pickle")


# ----- paths ---------------------------------------------------------------------------------

def path_case(r: random.Random) -> Case:
    data = _snapshot()
    kind = r.choice(("long-name", "too-long-name", "too-long-path", "through-file", "loop",
                     "dangling", "not-utf8", "escapes", "long-output", "output-through-file"))
    files, setup, path, out = {INPUT: data}, [], INPUT, "out.html"
    if kind == "long-name":  # valid, but `<name>.meta.json` is over the limit
        path = "n" * r.randrange(240, 256 - len(".pickle")) + ".pickle"
        files = {path: data}
    elif kind == "too-long-name":
        path = "n" * r.randrange(256, 400)
    elif kind == "too-long-path":  # (`d/..`, not `./`: pathlib keeps those)
        setup = [("dir", "d")]
        path = "d/../" * r.randrange(830, 1200) + INPUT
    elif kind == "through-file":
        path = INPUT + "/inner.pickle"
    elif kind == "loop":
        setup = [("symlink", "a", "b"), ("symlink", "b", "a")]
        path = "a"
    elif kind == "dangling":
        setup = [("symlink", "gone.pickle", "nowhere/at/all")]
        path = "gone.pickle"
    elif kind == "not-utf8":
        path = os.fsdecode(b"\xff\xfe-snap\xe9.pickle")
        files = {path: data}
    elif kind == "escapes":
        path = "r\x1b]0;owned\x07\n\x9b2J.pickle"
        files = {path: data}
    elif kind == "long-output":  # its temporary file's name is over the limit
        out = "o" * r.randrange(240, 251) + ".html"
    else:
        out = INPUT + "/out.html"
    argv = (["report", "{input}", "-o", out] if kind in ("long-output", "output-through-file")
            or r.random() < 0.3 else list(r.choice((SUMMARY, ["summary", "{input}"]))))
    return Case("paths", kind, files, argv=argv, input=path, setup=setup,
                output_may_fail=kind in ("long-output", "output-through-file"),
                ext=".pickle")


# ----- planted modules -----------------------------------------------------------------------

def _planted(modules: tuple[str, ...]) -> dict[str, bytes]:
    return {f"{m}.py": (f"open(__file__[:-{len(m) + 3}] + 'CANARY-{m}', 'w').write('ran')\n"
                        ).encode() for m in modules}


def planted_case(r: random.Random) -> Case:
    modules = tuple(r.sample(PLANTED, r.randrange(3, len(PLANTED) + 1)))
    captures = [c for c in seeds.memray_seeds() if c.startswith(b"memray\x00")][:1]  # own
    roll = r.random()
    if roll < 0.3 and captures:
        files = {"capture.bin": r.choice(captures)}
        argv = r.choice((["summary", "capture.bin"], ["report", "capture.bin", "-o", "r.html"],
                         ["convert", "capture.bin", "-o", "c.parquet"]))
    elif roll < 0.6:
        files = {"a.pickle": _snapshot(), "b.pickle": _snapshot()}
        argv = r.choice((["summary", "-j", "2", "a.pickle", "b.pickle"],
                         ["report", "-j", "2", "a.pickle", "b.pickle", "-o", "r.html"],
                         ["batch", ".", "-o", "batch-out"]))
    else:
        files = {"a.pickle": _snapshot()}
        argv = r.choice((["summary", "a.pickle"], ["report", "a.pickle", "-o", "r.html"],
                         ["export", "a.pickle", "-o", "a-export"]))
    files.update(_planted(modules))
    return Case("planted", f"{' '.join(argv[:2])} beside {len(modules)} modules", files,
                argv=argv, input=next(iter(files)), process={})


# ----- signals -------------------------------------------------------------------------------

SIGNALS = ("SIGINT", "SIGTERM", "SIGHUP")


def signal_case(r: random.Random) -> Case:
    delay: float | str = r.choice(("child", "child", 0.05, 0.2, 0.5, 1.0, 2.0))
    data = slow_snapshot() if delay == "child" or r.random() < 0.5 else _snapshot()
    argv = r.choice((["summary", "a.pickle"], ["summary", "-j", "2", "a.pickle", "b.pickle"],
                     ["report", "a.pickle", "-o", "r.html"],
                     ["report", "-j", "2", "a.pickle", "b.pickle", "-o", "r.html"]))
    files = {"a.pickle": data, "b.pickle": data}
    sig = r.choice(SIGNALS)
    return Case("signals", f"{sig} after {delay}: {' '.join(argv[:3])}", files, argv=argv,
                input="a.pickle", process={"signal": sig, "delay": delay})


def environment_case(r: random.Random) -> Case:
    roll = r.random()
    if roll < 0.35:
        return write_failure_case(r)
    if roll < 0.65:
        return path_case(r)
    if roll < 0.8:
        return planted_case(r)
    return signal_case(r)
