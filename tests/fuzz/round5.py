"""Issue 66, the fifth round: one strategy per class of its findings, each a format of its
own in the campaign's table (`STRATEGIES`).

- `cache`: a relative `$XDG_CACHE_HOME` (`cache`, `.`) or `HOME=.` with it unset, and the
  working folder holding a planted `snapana/sealed/` entry: a compiled template whose body
  (digest line recomputed) is marshalled code writing a canary, an edited packs JSON, an
  edited plotly copy, an entry cut short. No canary (`executed`), no planted text in the
  report, no internal error.
- `markdown`: frame names and log lines holding a markdown image or link, raw HTML and
  zero-width characters: `summary -f markdown` and `ticket.md` show them as text.
- `digits`: `whatif --scale`, `--fit`, `--calibrate-size` with superscript, circled,
  Arabic-Indic or fullwidth digits: refused in one line (exit 2), never accepted.
- `targets`: `-o` onto a dangling link, a link to another file, a FIFO, a folder: exit 0
  or 2 (4 where the output fails), never 1 or 3, the linked file unchanged.
- `names`: a rank folder holding a file whose name is not UTF-8 (`rank\\xff.pickle`).
- `logbytes`: a log with one bad byte, a Latin-1 line, a NUL line or a UTF-8 sequence cut
  mid-character before its OOM message: read, never refused as an unknown format.
- `manyranks`: a folder of hundreds of tiny rank files: the time per file is recorded
  (`Result.per_file`), a case over the time limit is a `hang`.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import io
import json
import marshal
import os
import pickle
import random
import subprocess
import sys
import tempfile
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

from . import seeds
from .cases import INPUT, Case
from .pickle_codec import safe_loads

ROOT = Path(__file__).resolve().parents[2]
#: What marks planted text, so that the runner can look for it in every output.
PLANTED = "snapana-fuzz-planted"


def _snapshot() -> bytes:
    data = seeds.small_snapshot()
    return data if data is not None else seeds.rank_snapshot(0, True)


def _sealed(body: bytes) -> bytes:
    """A kept file as `user_cache` writes it: the SHA-256 of the body, a newline, the body."""
    return hashlib.sha256(body).hexdigest().encode("ascii") + b"\n" + body


# ----- a planted user cache ------------------------------------------------------------------

@cache
def cache_entries() -> tuple[tuple[str, bytes], ...]:
    """The files a `report` keeps in a fresh user cache (name, bytes): the compiled page
    templates, the parsed packs, the plotly copy, made once per process by this tree."""
    with tempfile.TemporaryDirectory(prefix="snapana-fuzz-cache-") as tmp:
        snap = Path(tmp, "a.pickle")
        snap.write_bytes(_snapshot())
        env = {**os.environ, "XDG_CACHE_HOME": str(Path(tmp, "xdg")),
               "PYTHONPATH": str(ROOT / "analyzer")}
        subprocess.run([sys.executable, "-m", "snapana", "report", str(snap), "-o",
                        str(Path(tmp, "r.html"))], env=env, cwd=tmp, timeout=300,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
        sealed = Path(tmp, "xdg", "snapana", "sealed")
        return tuple(sorted((p.name, p.read_bytes()) for p in sealed.glob("*")
                            if p.is_file())) if sealed.is_dir() else ()


def _canary_code() -> bytes:
    """Marshalled module code that writes a canary in the working folder (the runner's
    `executed` class) when a template's code is run."""
    return marshal.dumps(compile("open('CANARY-cache', 'w').write('ran')\n", "<planted>",
                                 "exec"))


def _planted_template(body: bytes) -> bytes | None:
    """A compiled template's kept body with its code replaced: jinja2's magic and the
    source's checksum as they were (so it is taken as current), then the canary's code."""
    try:
        from jinja2.bccache import bc_magic
    except ImportError:
        return None
    if not body.startswith(bc_magic):
        return None
    stream = io.BytesIO(body[len(bc_magic):])
    try:
        pickle.load(stream)  # the checksum (jinja2 reads it so)
    except Exception:  # noqa: BLE001 - not a template entry after all
        return None
    return body[:len(bc_magic) + stream.tell()] + _canary_code()


def _edited_packs(r: random.Random, body: bytes) -> tuple[bytes, str]:
    """The parsed packs, edited: a rule's family renamed to planted text, every rule gone,
    or a value of the wrong type."""
    try:
        packs = json.loads(body)
    except ValueError:
        return body[: len(body) // 2], "packs cut"
    how = r.choice(("family", "empty", "type"))
    for pack in packs if isinstance(packs, list) else []:
        rules = pack.get("rule") or pack.get("rules") if isinstance(pack, dict) else None
        if not isinstance(rules, list):
            continue
        if how == "empty":
            rules.clear()
        elif how == "family":
            for rule in rules:
                if isinstance(rule, dict) and "family" in rule:
                    rule["family"] = f"{PLANTED}-<img src=x onerror=1>"
        else:
            for rule in rules:
                if isinstance(rule, dict):
                    rule["priority"] = {"x": [1e308]}
    return json.dumps(packs).encode(), f"packs {how}"


def cache_case(r: random.Random) -> Case:
    env_kind = r.choice(("cache", ".", "home"))
    env: dict[str, Any]
    if env_kind == "home":
        env, base = {"HOME": ".", "XDG_CACHE_HOME": None}, ".cache/snapana/sealed"
    else:
        env = {"XDG_CACHE_HOME": env_kind}
        base = ("cache/" if env_kind == "cache" else "") + "snapana/sealed"
    entries = dict(cache_entries())
    kinds = [k for k, prefix in (("template", "template-"), ("packs", "packs-"),
                                 ("plotly", "plotly")) if any(n.startswith(prefix)
                                                              for n in entries)]
    kind = r.choice(kinds + ["truncated"] if entries else ["template"])
    files = {"a.pickle": _snapshot()}
    planted: dict[str, bytes] = {}  # not inputs: snapana may replace an entry it rejects
    absent: list[str] = []
    what = kind
    for name, data in entries.items():
        body = data.partition(b"\n")[2]
        if kind == "template" and name.startswith("template-"):
            code = _planted_template(body)
            if code is not None:
                planted[f"{base}/{name}"] = _sealed(code)
        elif kind == "packs" and name.startswith("packs-"):
            edited, what = _edited_packs(r, body)
            planted[f"{base}/{name}"] = _sealed(edited)
        elif kind == "plotly" and name.startswith("plotly"):
            if r.random() < 0.5:
                text = f"</script><script>/*{PLANTED}*/</script>"
            else:
                text = base64.b64encode(gzip.compress(f"/*{PLANTED}*/".encode(),
                                                      mtime=0)).decode()
            planted[f"{base}/{name}"] = _sealed(text.encode())
            absent.append(text)
        elif kind == "truncated":
            planted[f"{base}/{name}"] = data[: r.randrange(1, max(len(data), 2))]
    if kind == "template" and not planted:  # no entry made here: one by a guessed name
        planted[f"{base}/template-{'0' * 40}.cache"] = _sealed(b"j2" + _canary_code())
    argv = r.choice((["report", "a.pickle", "-o", "r.html"], ["report", "a.pickle", "-o",
                                                               "r.html"],
                     ["summary", "a.pickle", "-f", "json"], ["ticket", "a.pickle", "-o", "t"]))
    setting = ", ".join(f"{k}={v}" if v is not None else f"no {k}" for k, v in env.items())
    setup = [("bytes", path, base64.b64encode(data).decode("ascii"))
             for path, data in planted.items()]
    return Case("cache", f"{what} planted, {setting}: {argv[0]}", files, argv=argv,
                input="a.pickle", setup=setup, process={"env": env},
                expect={"absent": absent} if absent else {})


# ----- markdown in names and log lines -------------------------------------------------------

MARKUP = ("![x](https://evil.example/p.png)", "[click](javascript:alert(1))",
          "<img src=x onerror=1>", "<a href=javascript:alert(1)>x</a>", "\u200b", "\u200d",
          "\ufeff", "see\u200b[docs](https://evil.example)")


def _frames(tree: Any) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for seg in tree.get("segments") or []:
        for b in seg.get("blocks") or []:
            out += [f for f in b.get("frames") or [] if isinstance(f, dict)]
    for trace in tree.get("device_traces") or []:
        for e in trace or []:
            out += [f for f in e.get("frames") or [] if isinstance(f, dict)]
    return out


def markdown_case(r: random.Random) -> Case:
    if r.random() < 0.3:  # a log line
        from .texts import _parts

        oom = _parts(r)[0]
        lines = [f"step 12 {r.choice(MARKUP)} loss 2.1\n" for _ in range(r.randrange(1, 4))]
        text = "".join(lines) + f"{r.choice(MARKUP)} " + oom
        return Case("markdown", "log lines with markup", {"job.log": text.encode()},
                    argv=["summary", "job.log", "-f", "markdown"], input="job.log",
                    expect={"markdown": True})
    tree = safe_loads(seeds.rank_snapshot(r.randrange(4), True))
    frames = _frames(tree)
    picked = [r.choice(MARKUP) for _ in range(r.randrange(1, 4))]
    for f in frames:
        mark = r.choice(picked)
        if r.random() < 0.5:
            f["name"] = f"{f.get('name', 'f')}{mark}"
        else:
            f["filename"] = f"/app/{mark}/model.py"
    argv = r.choice((["summary", "{input}", "-f", "markdown"], ["ticket", "{input}", "-o", "t"]))
    return Case("markdown", f"frames with {' '.join(picked)!r}: {argv[0]}",
                {INPUT: pickle.dumps(tree, protocol=4)}, argv=argv, ext=".pickle",
                expect={"markdown": True})


# ----- numbers in other digits ---------------------------------------------------------------

#: Digits Python's int() reads but a command line's sizes must not: superscript, circled,
#: Arabic-Indic, fullwidth, mathematical.
ODD_DIGITS = ("²", "①", "١٢", "２", "１２８", "𝟙𝟚", "٣:٤", "2:４")


def digits_case(r: random.Random) -> Case:
    d = r.choice(ODD_DIGITS)
    knob = r.choice(("seq", "batch"))
    shape = r.choice(("scale", "scale-target", "fit", "calibrate"))
    argv = ["whatif", "{input}"]
    if shape == "scale":
        argv += ["--scale", f"{knob}={d}"]
    elif shape == "scale-target":
        argv += ["--scale", f"{knob}=2:{d}"]
    elif shape == "fit":
        argv += ["--scale", f"{knob}={d}:2", "--fit", "--capacity", "80GiB"]
    else:
        argv += ["--scale", f"{knob}=2:4", "--calibrate", "{input}", "--calibrate-size",
                 f"{knob}={d}"]
    if r.random() < 0.3:
        argv += ["-f", "json"]
    return Case("digits", " ".join(argv[2:]), {INPUT: _snapshot()}, argv=argv, ext=".pickle",
                expect={"refuse": d})


# ----- -o onto what is not a new file ---------------------------------------------------------

TARGET_WRITERS = (["report", "{input}", "-o", "{out}"], ["ticket", "{input}", "-o", "{out}"],
                  ["export", "{input}", "-o", "{out}"],
                  ["diff", "{input}", "{input}", "-o", "{out}"],
                  ["report", "{input}", "{input}", "-o", "{out}"])


def target_case(r: random.Random) -> Case:
    kind = r.choice(("dangling", "elsewhere", "fifo", "dir", "dir-link"))
    out = r.choice(("out.html", "out"))
    files = {INPUT: _snapshot()}
    setup: list[tuple[str, ...]] = []
    if kind == "dangling":
        setup.append(("symlink", out, "nowhere/at/all.html"))
    elif kind == "elsewhere":  # a file the user keeps: hashed as an input, must not change
        files["keep/precious.html"] = b"<p>the user's own page</p>\n"
        setup.append(("symlink", out, "keep/precious.html"))
    elif kind == "fifo":
        setup.append(("fifo", out))
    elif kind == "dir":
        setup.append(("dir", out))
    else:
        setup += [("dir", "elsewhere"), ("symlink", out, "elsewhere")]
    argv = [a.replace("{out}", out) for a in r.choice(TARGET_WRITERS)]
    return Case("targets", f"{argv[0]} -o {kind}", files, argv=argv, setup=setup,
                ext=".pickle")


# ----- a name that is not UTF-8 ----------------------------------------------------------------

def names_case(r: random.Random) -> Case:
    odd = os.fsdecode(r.choice((b"rank\xff.pickle", b"rank1\xe9.pickle", b"\xc3(.pickle",
                                b"rank\xed\xa0\x80.pickle")))
    files = {"ranks/rank0.pickle": seeds.rank_snapshot(0, True),
             f"ranks/{odd}": seeds.rank_snapshot(1, r.random() < 0.5)}
    argv = r.choice((["summary", "ranks", "-f", "json"], ["summary", "ranks"],
                     ["summary", "ranks", "-f", "markdown"],
                     ["report", "ranks", "-o", "out.html"], ["batch", "ranks", "-o", "ds"],
                     ["summary", f"ranks/{odd}"]))
    return Case("names", f"{os.fsencode(odd)!r}: {' '.join(argv[:1])}", files, argv=argv,
                input="ranks")


# ----- a bad byte before the OOM message -----------------------------------------------------

BAD_LINES = (b"\xff\n", b"caf\xe9 d\xe9j\xe0 vu, loss 2.1\n", b"\x00" * 64 + b"\n",
             b"step 3 \xe2\x82\n", b"\x00\n", b"temp 37\xb0C\n", b"\xf0\x9f\x98\n")


def logbytes_case(r: random.Random) -> Case:
    from .texts import _parts

    oom = r.choice(_parts(r)[:4]).encode()
    before = [b"epoch 1 step 12 loss 2.13\n"] * r.randrange(0, 4)
    bad = r.choice(BAD_LINES)
    before.insert(r.randrange(len(before) + 1), bad)
    return Case("logbytes", f"{bad[:12]!r} before the OOM", {"job.log": b"".join(before) + oom},
                argv=["summary", "job.log", "-f", "json"], input="job.log",
                expect={"read": True})


# ----- many tiny ranks -----------------------------------------------------------------------

def manyranks_case(r: random.Random, n: int | None = None) -> Case:
    n = n or r.choice((100, 300))
    files = {f"ranks/rank{k}.pickle": seeds.rank_snapshot(k % 4, k == 7) for k in range(n)}
    argv = r.choice((["summary", "ranks", "-f", "json"], ["summary", "ranks", "-f", "json",
                                                          "-j", "2"]))
    return Case("manyranks", f"{n} rank files: {' '.join(argv[3:]) or 'default'}", files,
                argv=argv, input="ranks", expect={"units": n})


STRATEGIES: dict[str, Callable[[random.Random], Case]] = {
    "cache": cache_case, "markdown": markdown_case, "digits": digits_case,
    "targets": target_case, "names": names_case, "logbytes": logbytes_case,
    "manyranks": manyranks_case,
}
#: The strategies quick enough for CI (a case in well under a second or two).
FAST = ("cache", "markdown", "digits", "targets", "names", "logbytes")
