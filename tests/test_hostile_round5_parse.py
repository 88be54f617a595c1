"""Issue 66, the fifth hostile round (parsing): numbers are ASCII digits, every `-o` target is
refused or used as documented, file names the filesystem gives are shown and written escaped,
and stray bytes in a captured log never hide its OOM message."""

from __future__ import annotations

import os
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
