"""A streaming JSON reader: pulls one value at a time from a (possibly gzip) text file, so a
profiler trace or a memory timeline of gigabytes is never held whole. Bounded: a single value
longer than `limits.max_json_value()` is refused, with the environment variable that raises it.
Used by `kineto_trace` and `memory_timeline`; knows nothing of either format.
"""

from __future__ import annotations

import io
import json
import os
import re
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from snapana.errors import InputError
from snapana.limits import limit_hint, max_json_value
from snapana.model import ReadProgress
from snapana.sources._io import first_line, open_input

_CHUNK = 1 << 20


_WS = re.compile(r"[ \t\r\n]*")


class _JsonStream:
    """Pulls one JSON value at a time from a text stream, so a trace is never held whole.

    `raw_decode` works on a window of the text; a value cut by the window's end fails to
    decode (objects, arrays and strings need their closing character) or ends exactly at the
    window's end (numbers), and both cases read more and retry. One value may not be longer
    than `max_value` characters (which bounds its strings and numbers too); runs of blanks
    between values are skipped in bulk; nesting deeper than the interpreter allows, numbers
    of over 4,300 digits and malformed text are refused with their offset.
    """

    def __init__(self, text: io.TextIOBase, path: Path, on_read: Callable[[], None],
                 max_value: int | None = None) -> None:
        self._text = text
        self._path = path
        self._on_read = on_read
        self._buf = ""
        self._pos = 0
        self._eof = False
        self._dec = json.JSONDecoder()
        self._max = max_value if max_value is not None else max_json_value()
        self._no_batch_before = 0
        self.consumed = 0  # characters before the window, for error offsets

    def _fill(self, want: int = _CHUNK) -> bool:
        if self._eof:
            return False
        chunk = self._text.read(max(want, _CHUNK))
        self._on_read()
        if not chunk:
            self._eof = True
            return False
        self.consumed += self._pos
        self._no_batch_before -= self._pos
        self._buf = self._buf[self._pos:] + chunk
        self._pos = 0
        return True

    def peek(self) -> str:
        """The next non-blank character without consuming it ('' at the end)."""
        while True:
            pos = _WS.match(self._buf, self._pos).end()  # type: ignore[union-attr]
            self._pos = pos
            if pos < len(self._buf):
                return self._buf[pos]
            if not self._fill():
                return ""

    def take(self, expected: str) -> None:
        ch = self.peek()
        if ch != expected:
            raise self.error(f"expected '{expected}', found {ch!r}" if ch else "ends early")
        self._pos += 1

    def batch(self) -> list[Any] | None:
        """Several complete items of the array being read, decoded at once (a timeline or a
        trace is millions of small items): the window up to its last `],` or `},`, decoded
        as one array. None when that does not decode (the cut fell inside an item: the
        caller reads one item, and batches resume past this cut)."""
        buf, pos = self._buf, self._pos
        if len(buf) - pos < 8192 or pos < self._no_batch_before:
            return None
        end = max(buf.rfind("],", pos), buf.rfind("},", pos))
        if end <= pos:
            return None
        try:
            items = json.loads("[" + buf[pos:end + 1] + "]")
        except (ValueError, RecursionError):
            self._no_batch_before = end + 1
            return None
        self._pos = end + 1
        return items

    def _too_long(self) -> InputError:
        return InputError(
            f"{self._path}: a single JSON value longer than {self._max:,} characters at "
            f"character {self.consumed + self._pos}; "
            f"{limit_hint('SNAPANA_MAX_JSON_VALUE')}")

    def value(self) -> Any:
        self.peek()
        while True:
            try:
                obj, end = self._dec.raw_decode(self._buf, self._pos)
            except json.JSONDecodeError as exc:
                cut = exc.pos >= len(self._buf) - 10 or exc.msg.startswith("Unterminated")
                if not cut:  # a real syntax error, not the window's end: say it now
                    self._pos = exc.pos
                    raise self.error(exc.msg) from None
                if len(self._buf) - self._pos > self._max:
                    raise self._too_long() from None
                if self._fill(len(self._buf)):
                    continue
                raise self.error(exc.msg) from None
            except RecursionError:
                raise self.error("arrays or objects nested too deep") from None
            except ValueError as exc:  # int() of a number of more than 4,300 digits
                raise self.error(f"a number too long to read ({first_line(exc)[:60]})"
                                 ) from None
            if end == len(self._buf) and self._fill():
                if len(self._buf) - self._pos > self._max:
                    raise self._too_long()
                continue  # a number may go on in the next chunk
            self._pos = end
            return obj

    def error(self, what: str) -> InputError:
        at = self.consumed + self._pos
        if self._eof:
            return InputError(f"{self._path}: truncated or malformed JSON ({what} at character "
                              f"{at}); was the trace copied completely?")
        return InputError(f"{self._path}: malformed JSON ({what} at character {at})")


def open_text(path: Path, progress: ReadProgress | None = None
              ) -> tuple[io.TextIOBase, Callable[[], None], Callable[[], None]]:
    """Open plain or gzip JSON as text (a regular file only, decompression bounded); returns
    the stream, a progress tick and a closer."""
    binary, raw, _ = open_input(path)
    total = os.fstat(raw.fileno()).st_size
    text = io.TextIOWrapper(binary, encoding="utf-8")

    def tick() -> None:
        if progress is not None:
            progress(raw.tell(), total)

    def close() -> None:
        text.close()
        raw.close()

    return text, tick, close


def stream_json(path: Path, progress: ReadProgress | None,
                on_item: Callable[[Any], None], max_value: int | None = None
                ) -> tuple[str, dict[str, Any]]:
    """Walk the top level of a JSON file, handing each element of the big array to `on_item`.

    For an object, the array is its `traceEvents` value and the other keys are returned; for
    an array, its elements are the items. Returns ('object' | 'array', other keys).
    """
    text, tick, close = open_text(path, progress)
    try:
        s = _JsonStream(text, path, tick, max_value)
        first = s.peek()
        meta: dict[str, Any] = {}
        if first == "{":
            s.take("{")
            if s.peek() == "}":
                return "object", meta
            while True:
                key = s.value()
                if not isinstance(key, str):
                    raise s.error("object key is not a string")
                s.take(":")
                if key == "traceEvents" and s.peek() == "[":
                    meta[key] = _stream_array(s, on_item)
                else:
                    meta[key] = s.value()
                ch = s.peek()
                if ch == ",":
                    s.take(",")
                    continue
                s.take("}")
                return "object", meta
        if first == "[":
            meta["items"] = _stream_array(s, on_item)
            return "array", meta
        raise InputError(f"{path}: not JSON (starts with {first!r})" if first
                         else f"{path}: empty file")
    except (OSError, EOFError, zlib.error) as exc:
        raise InputError(f"{path}: corrupt or truncated gzip/JSON file: {first_line(exc)}"
                         ) from None
    except UnicodeDecodeError:
        raise InputError(f"{path}: not UTF-8 text, so not a JSON trace") from None
    except RecursionError:
        raise InputError(f"{path}: JSON nested too deep") from None
    finally:
        close()


def _stream_array(s: _JsonStream, on_item: Callable[[Any], None]) -> int:
    s.take("[")
    n = 0
    if s.peek() == "]":
        s.take("]")
        return 0
    while True:
        items = s.batch()
        if items is not None:
            for item in items:
                on_item(item)
            n += len(items)
        else:
            on_item(s.value())
            n += 1
        ch = s.peek()
        if ch == ",":
            s.take(",")
            continue
        s.take("]")
        return n
