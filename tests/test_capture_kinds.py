"""A capture's kind is a type: one enum, one table row per kind (no field left to a default),
detection by the rows in order, and no string compared for a kind anywhere else (#59)."""

from __future__ import annotations

import ast
import dataclasses
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
import snapana
from snapana.capture_kinds import SOURCES, CaptureKind, Source, detect
from snapana.errors import InputError
from snapana.sources import load, reader, sniff

PACKAGE = Path(snapana.__file__).parent
TABLE = PACKAGE / "capture_kinds.py"
KIND_NAMES = {k.value for k in CaptureKind}


def test_every_kind_has_one_row_and_no_field_defaults() -> None:
    assert list(SOURCES) == [row.kind for row in SOURCES.values()]
    assert set(SOURCES) == set(CaptureKind)
    for f in dataclasses.fields(Source):
        assert f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING, \
            f"Source.{f.name} has a default: every row must say it"
    for kind in CaptureKind:
        assert callable(reader(kind)), kind


def test_capture_sources_name_their_rounding() -> None:
    """The kinds a capture's `source` can be have a rounding; containers name none."""
    for row in SOURCES.values():
        if row.size_rounding is not None:
            assert row.yields_capture and row.size_rounding >= 1
    assert CaptureKind.TORCH_SNAPSHOT.row.size_rounding == 512  # CUDACachingAllocator kRoundSmall


# The first bytes of each format, as its own writer puts them (independent of the sniffer).
HEADS = {
    CaptureKind.TORCH_SNAPSHOT: pickle.dumps({"segments": [], "device_traces": []}, protocol=4),
    CaptureKind.MEMRAY: b"memray\x00\x0b\x00\x00\x00",
    CaptureKind.MEMRAY_PARQUET: b"PAR1\x15\x04\x15",
    CaptureKind.MEMORY_TIMELINE: b'[[1712000000000, 0, 0, 1024]]',
    CaptureKind.KINETO_TRACE: b'{"schemaVersion": 1, "traceEvents": []}',
    CaptureKind.TEXT_LOG: b"torch.OutOfMemoryError: CUDA out of memory. Tried to alloc",
}


@pytest.mark.parametrize("kind", sorted(HEADS))
def test_each_row_detects_its_format(kind: CaptureKind) -> None:
    assert detect(HEADS[kind]) is kind
    assert detect(pickle.dumps([1, 2], protocol=0)) is CaptureKind.TORCH_SNAPSHOT


def test_an_unlisted_format_is_refused_not_read_as_memray(tmp_path: Path) -> None:
    png = tmp_path / "card.png"
    png.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(64))
    assert detect(png.read_bytes()[:64]) is None
    with pytest.raises(InputError, match="unrecognised format"):
        sniff(png)
    with pytest.raises(InputError, match="unrecognised format"):
        load(png)
    run = subprocess.run([sys.executable, "-m", "snapana", "summary", str(png)],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and run.stdout == ""
    assert run.stderr.count("\n") == 1 and "unrecognised format" in run.stderr


def _kind_strings(node: ast.AST) -> list[str]:
    """The capture kinds a comparison operand spells as a string (alone or in a literal
    tuple, list or set)."""
    items = node.elts if isinstance(node, ast.Tuple | ast.List | ast.Set) else [node]
    return [i.value for i in items
            if isinstance(i, ast.Constant) and isinstance(i.value, str) and i.value in KIND_NAMES]


def _comparisons(tree: ast.AST) -> list[int]:
    """The lines of `tree` that compare something with a capture kind spelled as a string
    (`==`, `in`, ..., or `.startswith` / `.get` with one)."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare) and any(
                _kind_strings(operand) for operand in [node.left, *node.comparators]):
            lines.append(node.lineno)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr in {"startswith", "endswith", "get"} \
                and any(_kind_strings(a) for a in node.args):
            lines.append(node.lineno)
    return lines


def test_no_capture_kind_is_compared_as_a_string_outside_the_table() -> None:
    found = [f"{path.relative_to(PACKAGE)}:{line}"
             for path in sorted(PACKAGE.rglob("*.py"))
             if path != TABLE and "synth" not in path.relative_to(PACKAGE).parts
             for line in _comparisons(ast.parse(path.read_text()))]
    assert not found, f"a capture's kind compared as a string: {found}"


@pytest.mark.parametrize("code", ['x == "memray"', 'x.source in ("torch_snapshot", "memray")',
                                  '"text_log" != kind', 'd.get("kineto_trace")',
                                  'k not in {"snapana_export"}'])
def test_the_scan_sees_a_string_comparison(code: str) -> None:
    """The scan above is not vacuous: it flags each spelling it looks for."""
    assert _comparisons(ast.parse(code)) == [1]
    assert _comparisons(ast.parse(code.replace('"', "'").replace("_", "-").replace(
        "memray", "memory"))) == []
