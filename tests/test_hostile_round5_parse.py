"""Issue 66, the fifth hostile round (parsing): numbers are ASCII digits, every `-o` target is
refused or used as documented, file names the filesystem gives are shown and written escaped,
and stray bytes in a captured log never hide its OOM message."""

from __future__ import annotations

import io
import json
import os
import re
import shutil
from pathlib import Path

import pytest
from snapana.analysis.scaling import ScaleError, parse_sizes
from snapana.record.sidecar import launcher_ranks

from .conftest import ROOT, invoke

SAMPLE = ROOT / "sample_snapshots" / "expandable-segments-oom.pickle"
OTHER = ROOT / "sample_snapshots" / "fsdp-train-step.pickle"

# -- finding 1: numbers on the command line are ASCII digits ------------------------------

#: '²' and '①' pass str.isdigit and fail int(); Arabic-Indic and fullwidth digits pass int().
NOT_ASCII = ["²", "①", "١٢٨", "１２８", "1_000", "--3"]


def _one_line_refusal(r, option: str) -> None:
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and option in lines[0] and "Traceback" not in r.stderr, r.stderr


@pytest.mark.parametrize("args,option", [
    (["whatif", str(SAMPLE), "--scale", "seq=²"], "--scale"),
    (["whatif", str(SAMPLE), "--scale", "seq=128:２０４８"], "--scale"),
    (["whatif", str(SAMPLE), "--scale", "seq=١٢٨:٢٥٦"], "--scale"),
    (["whatif", str(SAMPLE), "--scale", "batch=①:2", "--fit"], "--scale"),
    (["whatif", str(SAMPLE), "--scale", "seq=128", "--fit", "--calibrate", str(OTHER),
      "--calibrate-size", "seq=²"], "--calibrate-size"),
    (["record", "--max-entries", "١٠", "--", "/nonexistent/snapana-job"], "--max-entries"),
    (["record", "--dump-at-step", "²", "--", "/nonexistent/snapana-job"], "--dump-at-step"),
], ids=["scale-superscript", "scale-fullwidth", "scale-arabic", "fit-circled",
        "calibrate-size", "record-max-entries", "record-dump-at-step"])
def test_numbers_are_ascii_digits(args: list[str], option: str) -> None:
    """A number in another script's digits is refused in one line naming its option, exit 2
    (it was an internal error, exit 3, or read as a number nobody typed)."""
    _one_line_refusal(invoke(*args), option)


@pytest.mark.parametrize("text", NOT_ASCII)
def test_one_integer_helper(text: str) -> None:
    """The helper behind every such number, and the readers that use it, never raise."""
    from snapana.units import ascii_int

    assert ascii_int(text) is None
    assert ascii_int(" 42 ") == 42 and ascii_int("-3") == -3
    with pytest.raises(ScaleError):
        parse_sizes([f"seq={text}"])
    assert launcher_ranks({"RANK": text, "WORLD_SIZE": "8"}) == {
        "rank": None, "local_rank": None, "world_size": 8}


# -- finding 2: every -o target is refused in one line or used as the README says ---------

#: What stands at the output path, made in `tmp` (`elsewhere/f` is a file a link points to).
TARGETS = ("dangling", "link-file", "link-dir", "file", "fifo", "dir", "link-loop")


def _target(tmp: Path, kind: str) -> Path:
    (tmp / "elsewhere").mkdir()
    (tmp / "elsewhere" / "f").write_text("keep")
    out = tmp / kind
    make = {"dangling": lambda: out.symlink_to(tmp / "nowhere" / "x"),
            "link-file": lambda: out.symlink_to(tmp / "elsewhere" / "f"),
            "link-dir": lambda: out.symlink_to(tmp / "elsewhere"),
            "file": lambda: out.write_text("old"),
            "fifo": lambda: os.mkfifo(out),
            "dir": out.mkdir,
            "link-loop": lambda: out.symlink_to(out)}
    make[kind]()
    return out


#: command line (OUT: the output path) -> the targets it refuses; the rest it writes: a file
#: output replaces a link (never writing through it) and writes inside a folder; a folder
#: written into may be a link to one; a folder replaced whole is a folder of its own.
WRITERS = {
    "report": (["report", str(SAMPLE), "-o", "OUT"], {"fifo", "link-loop"}),
    "diff": (["diff", str(SAMPLE), str(OTHER), "-o", "OUT"], {"fifo", "link-loop"}),
    "synth": (["synth", "expandable-segments-oom", "-o", "OUT"], {"fifo", "link-loop"}),
    "check-junit": (["check", str(SAMPLE), "--budget", "BUDGET", "--junit", "OUT"],
                    {"fifo", "link-loop", "dir", "link-dir"}),
    "ticket": (["ticket", str(SAMPLE), "-o", "OUT"],
               {"dangling", "link-file", "file", "fifo", "link-loop"}),
    "record": (["record", "-o", "OUT", "--", "/nonexistent/snapana-job"],
               {"dangling", "link-file", "file", "fifo", "link-loop"}),
    "export": (["export", str(SAMPLE), "-o", "OUT"], set(TARGETS) - {"dir"}),
    "batch": (["batch", str(SAMPLE), "-o", "OUT"], set(TARGETS) - {"dir"}),
}


@pytest.mark.parametrize("kind", TARGETS)
@pytest.mark.parametrize("command", WRITERS)
def test_every_output_target(tmp_path: Path, command: str, kind: str) -> None:
    """A dangling link made `ticket` fail with a traceback (FileExistsError, exit 1) and
    `export` / `batch` name their temp folder; a link loop made `check --junit` an internal
    error. Now: refused in one line naming the path, exit 2, before any work, or written
    where the README says, the file a link named left alone."""
    args, refused = WRITERS[command]
    out = _target(tmp_path, kind)
    budget = tmp_path / "budget.toml"
    budget.write_text('peak_allocated = "100 GiB"\n')
    r = invoke(*(str(out) if a == "OUT" else str(budget) if a == "BUDGET" else a
                 for a in args), cwd=tmp_path)
    assert (tmp_path / "elsewhere" / "f").read_text() == "keep"
    if kind in refused:
        _one_line_refusal(r, str(out))
        return
    if command == "record":  # the folder is taken; the job is not found
        _one_line_refusal(r, "no such command")
        return
    assert r.returncode == 0, (r.stdout, r.stderr)
    if kind in ("dir", "link-dir") and command in ("report", "diff", "synth"):
        assert any(p.suffix in (".html", ".pickle") for p in out.iterdir())
    elif command == "ticket":
        assert (out / "ticket.md").is_file()
    else:
        assert out.is_dir() if command in ("export", "batch") else (
            out.is_file() and not out.is_symlink())


# -- finding 3: a file name with a byte that is not UTF-8 ---------------------------------

def _written_utf8(where: Path) -> None:
    """Every file under `where` that snapana wrote holds UTF-8 only (read through open
    files: polars takes a path as UTF-8 only): text and JSON decode,
    JSON strings re-encode (no lone surrogate escaped), Parquet columns read."""
    import polars as pl

    for f in [where] if where.is_file() else sorted(p for p in where.rglob("*") if p.is_file()):
        if f.suffix == ".parquet":
            table = pl.read_parquet(io.BytesIO(f.read_bytes())).select(pl.col(pl.Utf8))
            for row in table.rows():
                "".join(v for v in row if v is not None).encode("utf-8")  # raises if not
        elif f.suffix in (".json", ".md", ".html", ".xml"):
            text = f.read_bytes().decode("utf-8")
            if f.suffix == ".json":
                json.dumps(json.loads(text), ensure_ascii=False).encode("utf-8")


@pytest.mark.parametrize("args,written", [
    (["batch", "DIR", "-o", "ds"], "ds"),
    (["batch", "DIR", "-o", "FF/ds"], "FF"),
    (["summary", "DIR"], None),
    (["summary", "DIR", "-f", "json"], None),
    (["summary", "DIR", "-f", "markdown"], None),
    (["report", "DIR", "-o", "r.html"], "r.html"),
    (["summary", "ONE", "-f", "json"], None),
    (["report", "ONE", "-o", "FF/r.html"], "FF"),
    (["ticket", "ONE", "-o", "FF"], "FF"),
    (["export", "ONE", "-o", "FF"], "FF"),
], ids=["batch", "batch-into-such-folder", "summary", "summary-json", "summary-markdown",
        "report", "one-summary-json", "one-report", "one-ticket", "one-export"])
def test_file_names_not_utf8(tmp_path: Path, args: list[str], written: str | None) -> None:
    """'rank\\xff.pickle' (and a folder so named) as the filesystem gives it: `batch` was a
    UnicodeEncodeError (exit 1) and JSON held the escape of a lone surrogate. Now shown and
    written escaped (`rank\\\\udcff.pickle`), as a newline in a name is; every output is
    UTF-8."""
    from .conftest import run_cli

    folder = tmp_path / os.fsdecode(b"job\xff")
    folder.mkdir()
    shutil.copy(SAMPLE, folder / os.fsdecode(b"rank\xff.pickle"))
    shutil.copy(OTHER, folder / "rank1.pickle")
    one = folder / os.fsdecode(b"rank\xff.pickle")
    ff = os.fsdecode(b"out\xff")
    if args[-1].startswith("FF/"):
        (tmp_path / ff).mkdir()
    names = {"DIR": str(folder), "ONE": str(one)}
    r = run_cli(*(names.get(a) or a.replace("FF", ff) for a in args), cwd=tmp_path)
    assert r.returncode == 0, r.stderr  # (run_cli decodes both streams as UTF-8, strictly)
    assert "\\udcff" in r.stdout + r.stderr or written is not None
    if args[-2:] == ["-f", "json"]:
        json.dumps(json.loads(r.stdout), ensure_ascii=False).encode("utf-8")
    if written is not None:
        _written_utf8(tmp_path / written.replace("FF", ff))
        if args[0] == "batch":
            files = pl_files(tmp_path / written.replace("FF", ff))
            assert any("rank\\udcff.pickle" in f for f in files), files


def pl_files(dataset: Path) -> list[str]:
    """The `file` column of a batch dataset's ranks table."""
    import polars as pl

    return [f for p in dataset.rglob("ranks/**/*.parquet")
            for f in pl.read_parquet(io.BytesIO(p.read_bytes()))["file"].to_list()]


# -- finding 4: stray bytes in a captured log never hide its OOM message ------------------

#: A PyTorch 2.1+ message, whole (the test runs without the corpus).
OOM_MESSAGE = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a "
    "total capacity of 79.15 GiB of which 1.50 GiB is free. Including non-PyTorch memory, "
    "this process has 77.64 GiB memory in use. Of the allocated memory 75.00 GiB is "
    "allocated by PyTorch, and 1.20 GiB is reserved by PyTorch but unallocated.\n")
_BAR = "█".encode()
#: What captured terminal output carries before a message.
NOISE = {
    "stray-ff": b"step 1 loss 2.31\xff\n",
    "ff-first": b"\xff",
    "cut-progress-bar": b" 40%|" + _BAR * 8 + _BAR[:2] + b"\n",
    "latin-1-line": "Température GPU: 45°C\n".encode("latin-1"),
    "nul-line": b"\x00" * 40 + b"\n",
    "copytruncate-hole": b"\x00" * 100_000,
}


def _corpus_message() -> str | None:
    """A real message as pasted (the corpus's first of PyTorch 2.1+ wording), when present."""
    from .conftest import CORPUS

    f = CORPUS / "oom_messages" / "messages.jsonl"
    if not f.is_file():
        return None
    for line in f.read_text(encoding="utf-8").splitlines():
        text = json.loads(line).get("text", "")
        if "has a total capacity of" in text and "Tried to allocate" in text:
            return text + "\n"
    return None


@pytest.mark.parametrize("noise", NOISE)
@pytest.mark.parametrize("base", ["self-contained", "corpus"])
def test_stray_bytes_before_the_message(tmp_path: Path, noise: str, base: str) -> None:
    """One bad byte (or a NUL line, a Latin-1 line, a cut character) before the message
    made the log 'unrecognised format', exit 2, though the same byte after it was read.
    Now the message is read wherever the noise stands."""
    message = OOM_MESSAGE if base == "self-contained" else _corpus_message()
    if message is None:
        pytest.skip("../shared/corpus absent")
    requested = re.search(r"Tried to allocate ([0-9.]+ [GMK]iB)", message)
    assert requested is not None
    log = tmp_path / "job.log"
    for data in (NOISE[noise] + message.encode(), message.encode() + NOISE[noise]):
        log.write_bytes(data)
        r = invoke("summary", str(log))
        assert r.returncode == 0, r.stderr
        assert requested.group(1) in r.stdout


@pytest.mark.parametrize("data", [
    bytes.fromhex("89504e470d0a1a0a0000000d4948445200000100") + bytes(range(256)) * 4,
    bytes((i * 7919 + 13) % 256 for i in range(4096)),
    b"\x00" * 5000,
    b"PK\x03\x04" + bytes((i * 31) % 256 for i in range(600)),
], ids=["png", "scrambled", "all-nul", "zip"])
def test_binary_is_still_refused(tmp_path: Path, data: bytes) -> None:
    """Textness is a share of the head, not its validity: a binary file stays refused."""
    f = tmp_path / "x.bin"
    f.write_bytes(data)
    _one_line_refusal(invoke("summary", str(f)), "unrecognised format")
