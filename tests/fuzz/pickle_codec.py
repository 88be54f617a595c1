"""Decode seed pickles safely and encode mutated trees, including shapes `pickle.dumps` cannot
write: nesting 100,000 deep, "billion laughs" sharing, hostile dict keys, raw opcodes.

The encoder writes protocol 2-5 opcodes by hand and memoizes every container and string by
identity, so a seed's shared frame lists stay shared (and small) after a mutation.
"""

from __future__ import annotations

import io
import pickle
import struct
from dataclasses import dataclass
from typing import Any


class _Refuse(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"fuzz seed loader refuses {module}.{name}")

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError("fuzz seed loader refuses persistent ids")


def safe_loads(data: bytes) -> Any:
    """Decode a seed (builtins only)."""
    return _Refuse(io.BytesIO(data)).load()


# ----- hostile nodes the encoder writes as opcodes ---------------------------------------------

@dataclass(frozen=True)
class Deep:
    """A container nested `depth` levels ('list', 'tuple' or 'dict'), `leaf` innermost."""

    kind: str
    depth: int
    leaf: Any = None


@dataclass(frozen=True)
class Laughs:
    """Level i holds level i-1 twice: 2**levels leaves in a few hundred bytes."""

    kind: str  # 'list' or 'tuple'
    levels: int


@dataclass(frozen=True)
class Raw:
    """Opcodes pushing exactly one value, written as they are (e.g. a huge memo index)."""

    ops: bytes


# ----- encoder -----------------------------------------------------------------------------------

class Encoder:
    def __init__(self, protocol: int = 4) -> None:
        if not 2 <= protocol <= 5:
            raise ValueError(protocol)
        self.proto = protocol
        self.out = bytearray()
        self.memo: dict[int, int] = {}
        self.keep: list[Any] = []
        self.next_memo = 0

    # memo -------------------------------------------------------------------------------------
    def _put(self) -> int:
        idx = self.next_memo
        self.next_memo += 1
        if self.proto >= 4:
            self.out += b"\x94"  # MEMOIZE
        elif idx < 256:
            self.out += b"q" + bytes([idx])
        else:
            self.out += b"r" + struct.pack("<I", idx)
        return idx

    def _get(self, idx: int) -> None:
        if idx < 256:
            self.out += b"h" + bytes([idx])
        else:
            self.out += b"j" + struct.pack("<I", idx)

    def _remember(self, obj: Any) -> None:
        self.memo[id(obj)] = self._put()
        self.keep.append(obj)

    # values -----------------------------------------------------------------------------------
    def value(self, obj: Any) -> None:
        out = self.out
        if obj is None:
            out += b"N"
        elif obj is True:
            out += b"\x88"
        elif obj is False:
            out += b"\x89"
        elif isinstance(obj, int):
            self._int(obj)
        elif isinstance(obj, float):
            out += b"G" + struct.pack(">d", obj)
        elif isinstance(obj, str):
            if id(obj) in self.memo:
                self._get(self.memo[id(obj)])
                return
            raw = obj.encode("utf-8", "surrogatepass")
            if self.proto >= 4 and len(raw) < 256:
                out += b"\x8c" + bytes([len(raw)]) + raw
            else:
                out += b"X" + struct.pack("<I", len(raw)) + raw
            self._remember(obj)
        elif isinstance(obj, (bytes, bytearray)):
            if self.proto >= 3:
                out += b"B" + struct.pack("<I", len(obj)) + bytes(obj)
            else:  # protocol 2 has no bytes opcode without a global: a str instead
                self.value(bytes(obj).decode("latin-1"))
        elif isinstance(obj, list):
            if id(obj) in self.memo:
                self._get(self.memo[id(obj)])
                return
            out += b"]"
            self._remember(obj)
            for start in range(0, len(obj), 1000):
                out += b"("
                for item in obj[start:start + 1000]:
                    self.value(item)
                self.out += b"e"
        elif isinstance(obj, dict):
            if id(obj) in self.memo:
                self._get(self.memo[id(obj)])
                return
            out += b"}"
            self._remember(obj)
            items = list(obj.items())
            for start in range(0, len(items), 1000):
                self.out += b"("
                for k, v in items[start:start + 1000]:
                    self.value(k)
                    self.value(v)
                self.out += b"u"
        elif isinstance(obj, tuple):
            if id(obj) in self.memo:
                self._get(self.memo[id(obj)])
                return
            if len(obj) <= 3:
                for item in obj:
                    self.value(item)
                self.out += (b")", b"\x85", b"\x86", b"\x87")[len(obj)]
            else:
                self.out += b"("
                for item in obj:
                    self.value(item)
                self.out += b"t"
            self._remember(obj)
        elif isinstance(obj, Deep):
            self._deep(obj)
        elif isinstance(obj, Laughs):
            self._laughs(obj)
        elif isinstance(obj, Raw):
            out += obj.ops
        else:
            raise TypeError(f"cannot encode {type(obj).__name__}")

    def _int(self, v: int) -> None:
        if 0 <= v < 256:
            self.out += b"K" + bytes([v])
        elif 0 <= v < 65536:
            self.out += b"M" + struct.pack("<H", v)
        elif -(2**31) <= v < 2**31:
            self.out += b"J" + struct.pack("<i", v)
        else:
            raw = v.to_bytes((v.bit_length() + 8) // 8, "little", signed=True)
            if len(raw) < 256:
                self.out += b"\x8a" + bytes([len(raw)]) + raw
            else:
                self.out += b"\x8b" + struct.pack("<i", len(raw)) + raw

    def _deep(self, d: Deep) -> None:
        n = max(d.depth, 1)
        if d.kind == "tuple":
            self.value(d.leaf)
            self.out += b"\x85" * n
        elif d.kind == "dict":
            self.out += b"}" + b"K\x00}" * (n - 1)
            self.out += b"s" * (n - 1)
        else:
            self.out += b"]" * n
            if d.leaf is not None:
                self.value(d.leaf)
                self.out += b"a"
            self.out += b"a" * (n - 1)

    def _laughs(self, lg: Laughs) -> None:
        first = self.next_memo
        self.out += b")" if lg.kind == "tuple" else b"]"
        self._put()
        for i in range(1, lg.levels + 1):
            self.out += b"0"  # POP the previous level, kept in the memo
            if lg.kind == "tuple":
                self._get(first + i - 1)
                self._get(first + i - 1)
                self.out += b"\x86"
            else:
                self.out += b"]("
                self._get(first + i - 1)
                self._get(first + i - 1)
                self.out += b"e"
            self._put()

    def dumps(self, obj: Any) -> bytes:
        self.out += b"\x80" + bytes([self.proto])
        self.value(obj)
        self.out += b"."
        return bytes(self.out)


def has_special(obj: Any, _seen: set[int] | None = None) -> bool:
    """True when the tree holds a node only `Encoder` can write (Deep, Laughs, Raw)."""
    seen = _seen if _seen is not None else set()
    stack = [obj]
    while stack:
        o = stack.pop()
        if isinstance(o, (Deep, Laughs, Raw)):
            return True
        if isinstance(o, (list, tuple, dict)):
            if id(o) in seen:
                continue
            seen.add(id(o))
            if isinstance(o, dict):
                stack.extend(o.keys())
                stack.extend(o.values())
            else:
                stack.extend(o)
    return False


def encode(obj: Any, protocol: int = 4, stdlib: bool = False) -> bytes:
    """Pickle `obj` with the stdlib pickler when asked and possible, else with `Encoder`."""
    if stdlib and not has_special(obj):
        try:
            return pickle.dumps(obj, protocol=protocol)
        except (RecursionError, TypeError, ValueError, OverflowError):
            pass
    return Encoder(protocol).dumps(obj)
