"""The package's own data files (TOML), each read through a schema (issue 68).

Every ``*.toml`` shipped in the package declares its schema once, as a msgspec struct
registered here with the file's path (:func:`schema`); its reader gets typed data back from
:func:`packaged`. Types, required keys and fixed choices are the schema's, and an unknown key is
refused, not ignored: a misspelt key in a data file would otherwise silently take the
default. Every error is one line naming the file, the line and the path in it
(``sources/memory_lines.toml:23: line[1].unit: unknown field (allowed: ...)``). The rule packs
(``attribution/pack_schema.py``) use the same explanation of msgspec's errors.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Mapping
from fnmatch import fnmatch
from pathlib import Path
from types import UnionType
from typing import Annotated, Any, Literal, TypeVar, Union, get_args, get_origin, get_type_hints

import msgspec

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10 needs the ``tomli`` backport
    import tomli as tomllib

T = TypeVar("T")
PACKAGE = Path(__file__).parent

#: Data file (path under ``snapana/``, a glob for a folder of them) -> its schema. Filled by
#: :func:`schema` when the module declaring it is imported; a test checks every ``*.toml`` of
#: the package has one.
SCHEMAS: dict[str, type[Any]] = {}


class DataFileError(ValueError):
    """A data file does not follow its schema; the message is one line: file, line, path."""


class Table(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """A TOML table: its keys are the struct's fields and nothing else."""


def schema(path: str) -> Callable[[type[T]], type[T]]:
    """Register the decorated struct as the schema of the data file `path` (relative to the
    package; a glob names a folder of files of one schema)."""
    def register(cls: type[T]) -> type[T]:
        SCHEMAS[path] = cls
        return cls
    return register


def schema_of(path: str) -> type[Any] | None:
    """The schema registered for `path`: its own entry, else a glob's that matches it."""
    if path in SCHEMAS:
        return SCHEMAS[path]
    return next((s for p, s in SCHEMAS.items() if fnmatch(path, p)), None)


def packaged(path: str, cls: type[T]) -> T:
    """The package's data file `path` (``"sources/memory_lines.toml"``), read as `cls`."""
    return read(_text(path), path, cls)


def refuse(path: str, where: str, problem: str) -> DataFileError:
    """The error for what the schema cannot say (an id no other table declares) at `where`
    in the package's data file `path`, with its line."""
    return DataFileError(f"{at(path, _text(path), where)}: {where}: {problem}")


def _text(path: str) -> str:
    """The package's file `path` (a file beside the modules, as every data file is)."""
    return (PACKAGE / path).read_text(encoding="utf-8")


def read(text: str, source: str, cls: type[T]) -> T:
    """TOML `text` read as `cls`; `source` names the file in errors."""
    return convert(_toml(text, source), text, source, cls)


def checked(text: str, source: str, cls: type[Any]) -> dict[str, Any]:
    """TOML `text` as plain data, once checked against `cls` (for a reader that walks the
    data itself)."""
    data = _toml(text, source)
    convert(data, text, source, cls)
    return data


def _toml(text: str, source: str) -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise DataFileError(f"{source}: TOML syntax error: {' '.join(str(exc).split())}"
                            ) from None


def convert(data: Mapping[str, Any], text: str, source: str, cls: type[T]) -> T:
    """`data` (`text` as TOML) checked and typed as `cls`; a mismatch is one line naming the
    file, the line and the path (`DataFileError`)."""
    try:
        return msgspec.convert(data, cls)
    except msgspec.ValidationError as exc:
        path, problem = explain(exc, cls)
        raise DataFileError(f"{at(source, text, path)}: {path or '(top level)'}: {problem}"
                            ) from None


def at(source: str, text: str, path: str) -> str:
    """``file:line`` of `path` in `text` (just the file where no line shows it)."""
    line = line_of(text, path)
    return f"{source}:{line}" if line else source


# ----- the line of a path ---------------------------------------------------------------------

def line_of(text: str, path: str) -> int | None:
    """The 1-based line of `text` where `path` (``line[3].units.kv``, as :func:`explain`
    gives it) is written: the header of each table or array entry on the way is found in
    turn, then the last key's line after it. None where the path is not found."""
    steps = re.findall(r"([^.\[\]]+)(?:\[(\d+)\])?", path)
    if not steps:
        return None
    lines = text.splitlines()
    start, prefix, anchored = 0, "", False
    for name, index in steps[:-1]:
        prefix = f"{prefix}.{name}" if prefix else name
        if index:
            header = re.compile(r"\s*\[\[\s*" + re.escape(prefix) + r"\s*\]\]")
            seen = [n for n in range(start, len(lines)) if header.match(lines[n])]
            if int(index) < len(seen):
                start, anchored = seen[int(index)], True
        else:
            header = re.compile(r"\s*\[\s*" + re.escape(prefix) + r"\s*\]")
            found = next((n for n in range(start, len(lines)) if header.match(lines[n])), None)
            if found is not None:
                start, anchored = found, True
    key = re.escape(steps[-1][0])
    written = re.compile(rf"(^|[\s{{,])(\"?){key}\2\s*=|^\s*\[+\s*[\w.\-]*\b{key}\s*\]")
    end = len(lines)
    if anchored:  # the entry ends where a table that is not one of its own begins
        own = re.compile(r"\s*\[+\s*" + re.escape(prefix) + r"\.")
        end = next((n for n in range(start + 1, len(lines))
                    if lines[n].lstrip().startswith("[") and not own.match(lines[n])), end)
    found = next((n for n in range(start, end) if written.search(lines[n])), None)
    if found is None and not anchored:
        found = next((n for n in range(len(lines)) if written.search(lines[n])), None)
    return found + 1 if found is not None else (start + 1 if anchored else None)


# ----- a validation error in the file's terms ---------------------------------------------------

def explain(exc: msgspec.ValidationError, root: type[Any],
            pattern_words: Mapping[str, str] | None = None) -> tuple[str, str]:
    """(path in the file, problem) of msgspec's message (``Expected `str`, got `int` - at
    `$.rule[3].label```) against the schema `root`, in the file's terms: tables, lists, the
    allowed fields or values. `pattern_words`: a name pattern in words, for its errors."""
    problem, sep, where = str(exc).rpartition(" - at `")
    if not sep:
        problem, where = str(exc), "$`"
    path = where[:-1].removeprefix("$").lstrip(".")
    if m := re.fullmatch(r"Object contains unknown field `(.*)`", problem):
        allowed = ", ".join(sorted(f.name for f in msgspec.structs.fields(
            _type_at(root, path))))
        return _join(path, m[1]), f"unknown field (allowed: {allowed})"
    if m := re.fullmatch(r"Object missing required field `(.*)`", problem):
        return _join(path, m[1]), "missing required field"
    if m := re.fullmatch(r"Invalid enum value (.*)", problem):
        return path, f"{m[1]} is not one of {_choices_at(root, path)}"
    words = pattern_words or {}
    pattern = _pattern_at(root, path)
    if pattern in words:
        problem = re.sub(r"matching regex '.*'", lambda _: "that is a " + words[pattern], problem)
    problem = re.sub(r"\barray\b", "list", re.sub(r"\bobject\b", "table", problem))
    return path, problem.replace(" | null", "").replace("Expected", "expected")


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _arms(t: Any) -> list[Any]:
    """The alternatives of a (possibly annotated) union type, annotations removed."""
    while get_origin(t) is Annotated:
        t = get_args(t)[0]
    if get_origin(t) in (Union, UnionType):
        return [a for arm in get_args(t) for a in _arms(arm)]
    return [t]


def _is_struct(t: Any) -> bool:
    return isinstance(t, type) and issubclass(t, msgspec.Struct)


def _type_at(root: type[Any], path: str) -> Any:
    """The type a path of the file is checked against (``rule[0].frames[1]``)."""
    t: Any = root
    for step in re.findall(r"\[\d+\]|\[\.\.\.\]|[^.\[\]]+", path):
        arms = _arms(t)
        if step == "[...]":  # a value of a table of names (dict[str, V])
            t = next(get_args(a)[1] for a in arms if get_origin(a) is dict)
        elif step.startswith("["):
            t = next(get_args(a)[0] for a in arms if get_origin(a) in (list, tuple))
        else:
            t = get_type_hints(next(a for a in arms if _is_struct(a)), include_extras=True)[step]
    return next((a for a in _arms(t) if _is_struct(a)), t)


def _choices_at(root: type[Any], path: str) -> tuple[str, ...]:
    arms = _arms(_type_at(root, path))
    arms += [a for arm in arms if get_origin(arm) is list for a in _arms(get_args(arm)[0])]
    return tuple(dict.fromkeys(v for a in arms if get_origin(a) is Literal for v in get_args(a)))


def _pattern_at(root: type[Any], path: str) -> str:
    """The regex a path's string must match (the ``Meta(pattern=...)`` of its type)."""
    t = _type_at(root, path)
    while get_origin(t) in (Annotated, Union, UnionType):
        for a in get_args(t)[1:] if get_origin(t) is Annotated else ():
            if isinstance(a, msgspec.Meta) and a.pattern is not None:
                return a.pattern
        t = get_args(t)[0]
    return ""
