"""Every data file of the package is read through a schema (issue 68): a key its schema does
not know is refused with the file and the line, not read as a default; and a framework log
reader is one entry (formats and name in memory_lines.toml, judge in framework_memory) whose
parts are checked against each other at import, not on a user's log."""

from __future__ import annotations

import importlib
import pkgutil
import re
from pathlib import Path

import pytest
import snapana
from snapana import data_file

PACKAGE = Path(snapana.__file__).parent
#: Every TOML file the package ships, found by globbing: a new one is covered (or fails the
#: schema test) without being listed here.
DATA_FILES = sorted(p.relative_to(PACKAGE).as_posix() for p in PACKAGE.rglob("*.toml"))
KEY = "not_a_key_68"


def _register_all() -> None:
    """Import every module of the analysis and the sources: each declares its schemas."""
    for package in ("snapana.sources", "snapana.analysis"):
        root = importlib.import_module(package)
        for info in pkgutil.walk_packages(root.__path__, package + "."):
            importlib.import_module(info.name)


_register_all()


def test_the_glob_finds_the_data_files() -> None:
    assert "sources/memory_lines.toml" in DATA_FILES
    assert "analysis/attribution/packs/vocabulary.toml" in DATA_FILES
    assert len(DATA_FILES) > 10


@pytest.mark.parametrize("path", DATA_FILES)
def test_every_data_file_has_a_schema_it_follows(path: str) -> None:
    cls = data_file.schema_of(path)
    assert cls is not None, f"{path} has no schema: declare one with @data_file.schema({path!r})"
    data_file.read((PACKAGE / path).read_text(encoding="utf-8"), path, cls)


def _with_key(text: str, where: str) -> tuple[str, int]:
    """`text` with an unknown key added at the top (before any table) or as the first key
    of its first table, and the 1-based line it is on."""
    lines = text.splitlines()
    if where == "top":
        at = 0
    else:
        at = next(n for n, line in enumerate(lines) if line.startswith("[")) + 1
    lines.insert(at, f"{KEY} = 1")
    return "\n".join(lines) + "\n", at + 1


@pytest.mark.parametrize("where", ["top", "first table"])
@pytest.mark.parametrize("path", DATA_FILES)
def test_an_unknown_key_is_refused_with_the_file_and_line(path: str, where: str) -> None:
    text, line = _with_key((PACKAGE / path).read_text(encoding="utf-8"), where)
    cls = data_file.schema_of(path)
    assert cls is not None
    with pytest.raises(data_file.DataFileError) as info:
        data_file.read(text, path, cls)
    msg = str(info.value)
    assert re.match(rf"{re.escape(path)}:{line}: (\S+\.)?{KEY}: unknown field \(allowed: ", msg), \
        msg


@pytest.mark.parametrize("path", [p for p in DATA_FILES if p.startswith(
    "analysis/attribution/packs/") and not p.endswith("vocabulary.toml")])
def test_a_pack_with_an_unknown_key_is_refused_with_its_line(path: str) -> None:
    """The packs' own reader (which checks the vocabulary too) names the line as well."""
    from snapana.analysis.attribution.pack_parser import RuleError, parse_pack_text

    text, line = _with_key((PACKAGE / path).read_text(encoding="utf-8"), "first table")
    with pytest.raises(RuleError, match=rf"^{re.escape(path)}:{line}: \S*{KEY}\b"):
        parse_pack_text(text, path, packaged=True)


def test_the_vocabulary_reader_refuses_an_unknown_key_with_its_line() -> None:
    from snapana.analysis.attribution.families import parse_vocabulary

    path = "analysis/attribution/packs/vocabulary.toml"
    text, line = _with_key((PACKAGE / path).read_text(encoding="utf-8"), "first table")
    with pytest.raises(ValueError, match=rf"^{re.escape(path)}:{line}: family\[0\]\.{KEY}: "):
        parse_vocabulary(text, path)


def test_the_readers_go_through_the_schemas() -> None:
    """No module reads TOML itself but the schema reader, the packs' parser (which caches
    what it read, then checks it against the pack schema) and the user's budget file's."""
    readers = {"data_file.py", "analysis/attribution/pack_parser.py", "analysis/budget.py"}
    direct = sorted(p.relative_to(PACKAGE).as_posix() for p in PACKAGE.rglob("*.py")
                    if "tomllib.load" in p.read_text(encoding="utf-8")
                    and p.relative_to(PACKAGE).as_posix() not in readers)
    assert not direct, f"TOML read without a schema in {direct}"


# ----- a framework log reader: one entry ------------------------------------------------------

def test_a_framework_reader_is_one_entry() -> None:
    """Every framework with formats has a name and a judge, and the other way round."""
    from snapana.analysis import framework_memory
    from snapana.sources.memory_lines import framework_names, line_formats

    assert {f.framework for f in line_formats()} == set(framework_names()) \
        == set(framework_memory._JUDGES) == set(framework_memory.FRAMEWORK_NAMES)


def test_a_framework_without_a_judge_fails_at_import(monkeypatch: pytest.MonkeyPatch) -> None:
    from snapana.analysis import framework_memory

    monkeypatch.setattr(framework_memory, "FRAMEWORK_NAMES",
                        {**framework_memory.FRAMEWORK_NAMES, "newframework": "New"})
    with pytest.raises(ImportError, match=r"without a judge: \['newframework'\]"):
        framework_memory._check_registry()
    monkeypatch.setattr(framework_memory, "FRAMEWORK_NAMES",
                        {k: v for k, v in framework_memory.FRAMEWORK_NAMES.items()
                         if k != "newframework" and k != "nccl"})
    with pytest.raises(ImportError, match=r"judges without a \[\[framework\]\]: \['nccl'\]"):
        framework_memory._check_registry()


def test_a_format_of_an_undeclared_framework_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """A [[line]] naming a framework that has no [[framework]] entry (no name, no judge) is
    refused when the formats are read, with its line."""
    from snapana.sources import memory_lines

    path = "sources/memory_lines.toml"
    text = (PACKAGE / path).read_text(encoding="utf-8")
    bad = text.replace('framework = "nccl"', 'framework = "nccl2"')
    line = bad.splitlines().index('framework = "nccl2"') + 1
    monkeypatch.setattr(data_file, "_text", lambda p: bad if p == path else "")
    with pytest.raises(data_file.DataFileError,
                       match=rf"^{re.escape(path)}:{line}: line\[\d+\]\.framework: 'nccl2'"):
        memory_lines._file.__wrapped__()


# ----- a capture's metadata: one declared set of keys -----------------------------------------

def _metadata_keys() -> dict[str, str]:
    """Every key the package writes into or reads from a capture's `metadata` (a dict
    literal given as `metadata=`, `….metadata["k"]`, `….metadata.get("k")` /
    `.setdefault("k")`) -> the first module that uses it."""
    import ast

    found: dict[str, str] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            keys: list[ast.expr] = []
            if isinstance(node, ast.keyword) and node.arg == "metadata" \
                    and isinstance(node.value, ast.Dict):
                keys = [k for k in node.value.keys if k is not None]
            elif isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute) \
                    and node.value.attr == "metadata":
                keys = [node.slice]
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and node.func.attr in ("get", "setdefault") \
                    and isinstance(node.func.value, ast.Attribute) \
                    and node.func.value.attr == "metadata" and node.args:
                keys = [node.args[0]]
            for k in keys:
                if isinstance(k, ast.Constant) and isinstance(k.value, str):
                    found.setdefault(k.value, rel)
    return found


def test_every_metadata_key_of_a_capture_is_declared() -> None:
    """`Capture.metadata` is typed (issue 68: an untyped dict read at five sites): every key
    a source writes or a stage reads is one of `CaptureMetadata`'s, so a misspelt key is a
    type error, not a silent miss."""
    from snapana.model import CaptureMetadata

    used = _metadata_keys()
    assert {"reserved_timeline", "inventory", "sidecar", "device_names"} <= set(used)
    undeclared = {k: m for k, m in used.items() if k not in CaptureMetadata.__annotations__}
    assert not undeclared, f"metadata keys not declared in CaptureMetadata: {undeclared}"
