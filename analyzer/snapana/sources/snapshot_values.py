"""Values of a decoded snapshot checked one by one: integers in range, bounded strings, dicts
and lists where they belong (`_Bad` names the field and entry otherwise), and frame lists
interned into stack ids, each distinct list validated once (`_Interner`).
"""

from __future__ import annotations

import math
from typing import Any, cast

from snapana.limits import LINE_RANGE, MAX_BYTES, MAX_LINE, MAX_STRING
from snapana.model import EMPTY_STACK, StackTable
from snapana.units import inert

_MAX_NAME = 256  # longest action, state or segment type


class _Bad(ValueError):
    """An invalid value: `where` names the field and entry, `what` says what is wrong."""

    def __init__(self, where: str, what: str) -> None:
        super().__init__(f"{where}: {what}")


def _describe(v: Any) -> str:
    """A short, safe description of a value (never str() of a container: it may be huge)."""
    if v is None or isinstance(v, (bool, float)):
        return repr(v)
    if isinstance(v, int):
        return repr(v) if abs(v) < 10**30 else f"an integer of {v.bit_length()} bits"
    if isinstance(v, str):
        return repr(v[:40]) + ("..." if len(v) > 40 else "")
    return f"a {type(v).__name__}"


def _int(v: Any, where: str, lo: int, hi: int, default: int | None = None,
         floats: bool = False) -> int | None:
    """An integer in [lo, hi); None/missing gives `default`; finite floats when allowed."""
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise _Bad(where, f"expected an integer, got {_describe(v)}")
    if isinstance(v, float):
        if not floats or not math.isfinite(v):
            raise _Bad(where, f"expected an integer, got {_describe(v)}")
        v = int(v)
    if not lo <= v < hi:
        raise _Bad(where, f"{_describe(v)} is out of range [{lo}, {hi})")
    return v


def _str(v: Any, where: str, default: str = "", limit: int = MAX_STRING) -> str:
    if v is None:
        return default
    if not isinstance(v, str):
        raise _Bad(where, f"expected a string, got {_describe(v)}")
    if len(v) > limit:
        raise _Bad(where, f"a string of {len(v):,} characters (limit {limit:,})")
    return inert(v, lines=False)  # controls and unpaired surrogates escaped, once


def _bytes(v: Any, where: str, default: int | None = 0) -> int | None:
    return _int(v, where, 0, MAX_BYTES, default)


def _dict(v: Any, where: str) -> dict[str, Any]:
    if not isinstance(v, dict):
        raise _Bad(where, f"expected a dict, got {_describe(v)}")
    return v


def _list(v: Any, where: str) -> list[Any]:
    if v is None:
        return []
    if not isinstance(v, (list, tuple)):
        raise _Bad(where, f"expected a list, got {_describe(v)}")
    return list(v) if isinstance(v, tuple) else v


def _flag(v: Any) -> bool:
    return isinstance(v, (bool, int)) and bool(v)


def _is_snapshot(data: Any) -> bool:
    if isinstance(data, list):  # PyTorch 1.13: a bare list of segments
        return all(isinstance(s, dict) and "blocks" in s for s in data)
    return isinstance(data, dict) and isinstance(data.get("segments"), list)


class _Interner:
    """Turns frame lists into stack ids, caching by object identity since PyTorch shares them;
    each distinct list is validated once (frames are dicts of strings and a line number)."""

    def __init__(self) -> None:
        self.table = StackTable()
        self._by_list_id: dict[int, int] = {}
        self._by_frame_dict: dict[int, int] = {}
        self._keepalive: list[Any] = []
        #: each distinct string object's checked text: one long name shared by thousands of
        #: frames through the pickle's memo is checked (and made inert) once, not per frame
        self._texts: dict[int, str] = {}
        #: distinct frames whose line PyTorch wrote as "none" (2**64 - 1, -1), read as 0
        self.unknown_lines = 0

    def __call__(self, frames: Any, where: Any = "frames") -> int:
        if frames is None or (isinstance(frames, (list, tuple)) and not frames):
            return EMPTY_STACK
        key = id(frames)
        sid = self._by_list_id.get(key)
        if sid is not None:
            return sid
        if not isinstance(frames, list):
            frames = _list(frames, where() if callable(where) else where)
        # frame dicts are shared too: each distinct one is validated and interned once
        by_dict = self._by_frame_dict
        ids = list(map(by_dict.get, map(id, frames)))
        if None in ids:
            at = where() if callable(where) else where
            fid = self.table.frame_id
            for k, f in enumerate(frames):
                if ids[k] is not None:
                    continue
                known = by_dict.get(id(f))  # the same dict earlier in this very list
                if known is not None:
                    ids[k] = known
                    continue
                f = _dict(f, f"{at}[{k}]")
                ids[k] = by_dict[id(f)] = fid((
                    self._text(f.get("filename"), f"{at}[{k}].filename"),
                    self._text(f.get("name"), f"{at}[{k}].name"),
                    self._line(f.get("line"), f"{at}[{k}].line")))
                self._keepalive.append(f)
        sid = self.table.stack_id(tuple(cast("list[int]", ids)))
        self._by_list_id[key] = sid
        self._keepalive.append(frames)
        return sid

    def _text(self, v: Any, where: str) -> str:
        """`_str` once per string object (the frame dicts kept alive keep their strings,
        so an id is not reused while the interner lives)."""
        got = self._texts.get(id(v))
        if got is None:
            got = self._texts[id(v)] = _str(v, where)
        return got

    def _line(self, v: Any, where: str) -> int:
        """A frame's line: PyTorch writes "no line" as 2**64 - 1 (uint64, Python path) or -1
        (int64, C++ path); those, and any line past MAX_LINE, are read as 0 and counted."""
        line = _int(v, where, *LINE_RANGE, 0) or 0
        if not 0 <= line < MAX_LINE:
            self.unknown_lines += 1
            return 0
        return line
