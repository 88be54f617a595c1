"""Issue 66, the fifth hostile round (parsing): numbers are ASCII digits, every `-o` target is
refused or used as documented, file names the filesystem gives are shown and written escaped,
and stray bytes in a captured log never hide its OOM message."""

from __future__ import annotations

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
