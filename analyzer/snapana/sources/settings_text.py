"""The settings a framework prints about itself at start-up, read from a log (issue 69): vLLM's
non-default args, its older API server's `args: Namespace(...)` and version line, and its
engine config, SGLang's ServerArgs repr, Megatron's (and so slime's) `_print_args` block,
DeepSpeed's configuration print and the user's JSON config after it, transformers'
TrainingArguments str (and TRL's configs, which print it under their own class names). A
knob can then say what it was set to when the job failed, and what to try.

The formats and the settings read from each are data (`settings_lines.toml`, each format
with the source and format string it was written from); this module only finds and reads
them. A setting's value is read as the Python repr or str the framework printed (numbers
with DeepSpeed's thousands commas, True / False / None, quoted strings, an enum's value);
one it cannot read is left out, never a reason to refuse the text. Work is linear in the
text: each line is looked at once for each format's literal anchor, and a repr is scanned
once for its depth."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from functools import lru_cache
from typing import Literal

from snapana import data_file
from snapana.log_model import Setting, SettingValue

#: Lines of one block read at most (Megatron prints a few hundred arguments).
MAX_BLOCK_LINES = 4_000
#: Lines inside a block that are not a setting (another process's output, a value printed
#: over several lines) before the block is taken to have ended unmarked.
MAX_STRAY_LINES = 50
#: Candidate places a block line's setting is tried at (its prefix may hold double spaces).
MAX_ITEM_TRIES = 8
#: Dumps of one one-line format read, the last ones (a restarted job prints its own again).
MAX_DUMPS = 16
#: Characters of a value kept as printed.
MAX_PRINTED = 200



class _Format(data_file.Table, frozen=True, kw_only=True):
    id: str
    framework: str
    kind: Literal["pairs", "block", "json", "value", "lines"]
    source: str
    style: Literal["assign", "dict"] = "assign"
    anchor: str = ""
    after: str = ""  # a literal the line holds before the anchor
    #: literals that, on another line of the text, make an anchor's line without `after`
    #: the framework's all the same (a paste that dropped its logger's prefix)
    unprefixed_if: list[str] = []
    begin: str = ""
    begins: list[str] = []  # kind "lines": the class names' "Name(" its first line ends in
    end: str = ""
    dots: int = 0
    key: str = ""  # kind "value": the name the one value after the anchor is read as


class _Setting(data_file.Table, frozen=True, kw_only=True):
    id: str
    framework: str
    keys: dict[str, str]
    type: Literal["int", "float", "bool", "str"]
    values: dict[str, str] = {}  # a printed value -> the value it means; others not read


@data_file.schema("sources/settings_lines.toml")
class _File(data_file.Table, frozen=True, kw_only=True):
    format: list[_Format]
    setting: list[_Setting]


@lru_cache(maxsize=1)
def _data() -> _File:
    return data_file.packaged("sources/settings_lines.toml", _File)


def format_source(fmt: str) -> str:
    """The framework source a format was written from."""
    return next(f.source for f in _data().format if f.id == fmt)


_KEY = {"assign": re.compile(r"(?<![\w.'\"])([A-Za-z_]\w{0,99})=(?!=)"),
        "dict": re.compile(r"'([A-Za-z_]\w{0,99})': ")}
_OPEN, _CLOSE = "([{", ")]}"
_CALL = re.compile(r"[A-Za-z_]\w{0,99}\(")
_INT = re.compile(r"-?[0-9][0-9,_]{0,30}")
_FLOAT = re.compile(r"-?[0-9]{1,20}(?:\.[0-9]{0,20})?(?:[eE][-+]?[0-9]{1,3})?")
_ENUM = re.compile(r"<[\w.]{1,100}: '([^']{0,100})'>")
#: A JSON member line of an indented dump: '"name": value' (value read to the line's end).
_JSON_KEY = re.compile(r'"([A-Za-z_]\w{0,99})": ?')
#: A setting's name at the start of a "lines" line ('name=value,').
_LINE_KEY = re.compile(r"([A-Za-z_]\w{0,99})=")
#: A line that closes a JSON object or array ('}', '},', ']'), behind any prefix.
_JSON_CLOSE = re.compile(r"[}\]],? {0,4}$")


def _top_level(text: str, style: str) -> dict[str, str]:
    """The `key` → raw value pairs of a repr's top level (`text` starts inside it): one pass
    for the bracket depth (quoted strings skipped), keys kept where the depth is 0, each
    value running to the next such key or to the bracket that closes the repr."""
    depth, quote, escaped = 0, "", False
    level = [0] * (len(text) + 1)
    end = len(text)
    for i, c in enumerate(text):
        level[i] = -1 if quote else depth
        if quote:
            if escaped:
                escaped = False
            elif c == "\\":
                escaped = True
            elif c == quote:
                quote = ""
        elif c in "'\"":
            quote = c
        elif c in _OPEN:
            depth += 1
        elif c in _CLOSE:
            depth -= 1
            if depth < 0:
                end = i
                break
    keys = [m for m in _KEY[style].finditer(text, 0, end) if level[m.start()] == 0]
    out: dict[str, str] = {}
    for m, nxt in zip(keys, [*keys[1:], None][:len(keys)], strict=True):  # none: '{' alone
        stop = nxt.start() if nxt is not None else end
        out.setdefault(m.group(1), text[m.end():stop].rstrip().rstrip(",").rstrip())
    return out


def _inside(raw: str) -> tuple[str, str] | None:
    """A nested repr's body and style: 'Name(a=1, ...)' or '{'a': 1, ...}'."""
    call = _CALL.match(raw)
    if call is not None:
        return raw[call.end():], "assign"
    if raw.startswith("{"):
        return raw[1:], "dict"
    return None


def _lookup(text: str, style: str, path: str) -> str | None:
    """The raw value at a dotted `path` of a repr (each step inside the one before)."""
    head, _, rest = path.partition(".")
    raw = _top_level(text, style).get(head)
    if raw is None or not rest:
        return raw
    body = _inside(raw)
    return _lookup(body[0], body[1], rest) if body is not None else None


def _value(raw: str, kind: str) -> tuple[bool, SettingValue]:
    """A printed value read as `kind`: (read?, value); None where it printed None."""
    raw = raw.strip()
    if raw in ("None", "null"):  # Python's repr, JSON's
        return True, None
    enum = _ENUM.fullmatch(raw)
    if enum is not None:
        raw = enum.group(1)
    elif len(raw) >= 2 and raw[0] == raw[-1] and raw[0] in "'\"":
        raw = raw[1:-1]
    if kind == "bool":
        low = raw.lower()
        return (True, low == "true") if low in ("true", "false") else (False, None)
    if kind == "int":
        if _INT.fullmatch(raw):
            return True, int(raw.replace(",", "").replace("_", ""))
        # DeepSpeed's JSON encoder prints a number over 1e3 as f"{o:e}" ('5.000000e+08')
        whole = float(raw) if _FLOAT.fullmatch(raw) else math.nan
        return (True, int(whole)) if math.isfinite(whole) and whole.is_integer() \
            else (False, None)
    if kind == "float":
        return (True, float(raw)) if _FLOAT.fullmatch(raw) else (False, None)
    return True, raw[:MAX_PRINTED]


def _meant(raw: str, values: dict[str, str]) -> tuple[bool, SettingValue]:
    """A value read through a setting's `values` (an old key's value as the setting it stands
    for: DeepSpeed's cpu_offload true is offload_optimizer's device cpu); one not listed is
    not read."""
    meant = values.get(raw.strip().lower())
    return (meant is not None), meant


def _block_item(line: str, dots: int) -> tuple[str, str] | None:
    """A block line's '  {name} {dots} {value}': the dots must be the format's width less the
    name's length (none from that length on), which a stray line seldom is."""
    at, tries = line.find("  "), 0
    while at >= 0 and tries < MAX_ITEM_TRIES:
        m = _ITEM.match(line, at + 2)
        if m is not None and len(m.group(2)) == max(dots - len(m.group(1)), 0):
            return m.group(1), m.group(3)
        at, tries = line.find("  ", at + 1), tries + 1
    return None


_ITEM = re.compile(r"([A-Za-z_]\w{0,99}) (\.{0,100}) (.*)")


def _one_line(rest: str, f: _Format) -> dict[str, str]:
    """What a one-line format prints after its anchor: a repr's top-level pairs, or (kind
    "value") the one word that follows, as the format's `key`."""
    if f.kind == "value":
        word = rest.split(maxsplit=1)
        return {f.key: word[0]} if word else {}
    return _top_level(rest, f.style)


def _vouched(lines: list[str], f: _Format) -> bool:
    """Whether a line other than the format's own holds one of its `unprefixed_if` literals
    (other evidence of its framework in the same text)."""
    return bool(f.unprefixed_if) and any(
        f.anchor not in ln and any(lit in ln for lit in f.unprefixed_if) for ln in lines)


def _pairs_lines(lines: list[str], f: _Format) -> list[tuple[int, dict[str, str]]]:
    """The last MAX_DUMPS lines of the format, read (the last print of a setting is the one
    kept; a text of thousands of dumps is not scanned character by character throughout)."""
    out = []
    vouched: bool | None = None  # whether the text holds an `unprefixed_if` line (asked once)
    for i in range(len(lines) - 1, -1, -1):
        line = lines[i]
        at = line.find(f.anchor)
        if at < 0:
            continue
        if f.after and line.find(f.after, 0, at) < 0:
            if vouched is None:
                vouched = _vouched(lines, f)
            if not vouched:
                continue
        out.append((i, _one_line(line[at + len(f.anchor):], f)))
        if len(out) >= MAX_DUMPS:
            break
    return out[::-1]


def _item_blocks(lines: list[str], begins: Callable[[str], bool], ends: Callable[[str], bool],
                 item: Callable[[str], tuple[str, str] | None]
                 ) -> list[tuple[int, dict[str, str]]]:
    """Each one-setting-a-line block's settings, with the line each was printed on: from a
    line `begins` accepts to one `ends` accepts (or MAX_BLOCK_LINES lines, or MAX_STRAY_LINES
    lines in a row that `item` does not read: the block ended unmarked)."""
    out: list[tuple[int, dict[str, str]]] = []
    i = 0
    while i < len(lines):
        if not begins(lines[i]):
            i += 1
            continue
        stray, j = 0, i + 1
        while j < len(lines) and j - i <= MAX_BLOCK_LINES and stray <= MAX_STRAY_LINES:
            if ends(lines[j]):
                break
            got = item(lines[j])
            if got is None:
                stray += 1
            else:
                stray = 0
                out.append((j, {got[0]: got[1]}))
            j += 1
        i = j + 1
    return out


def _blocks(lines: list[str], f: _Format) -> list[tuple[int, dict[str, str]]]:
    """Each "block" dump's settings ('  {name} {dots} {value}' lines)."""
    return _item_blocks(lines, lambda ln: f.begin in ln, lambda ln: f.end in ln,
                        lambda ln: _block_item(ln, f.dots))


def _json_blocks(lines: list[str], f: _Format) -> list[tuple[int, dict[str, str]]]:
    """Each indented JSON dump's members, keyed by their dotted path from the top
    ('zero_optimization.offload_optimizer.device'), with the line each was printed on. The
    dump is one log record over many lines, so only its first line has the log's prefix; a
    line is a member ('"name": value', '"name": {' opening an object), a closing '}' / ']',
    an array's item, or another process's output, and the dump ends where its top level
    closes (or after MAX_STRAY_LINES lines that are none of these)."""
    out: list[tuple[int, dict[str, str]]] = []
    i = 0
    while i < len(lines):
        if f.begin not in lines[i] or not lines[i].rstrip().endswith("{"):
            i += 1
            continue
        path: list[str] = []
        stray, j = 0, i + 1
        while j < len(lines) and j - i <= MAX_BLOCK_LINES and stray <= MAX_STRAY_LINES:
            line = lines[j].rstrip()
            m = _JSON_KEY.search(line)
            if m is not None:
                stray, raw = 0, line[m.end():].rstrip(",").rstrip()
                if raw in ("{", "["):
                    path.append(m.group(1))
                else:
                    out.append((j, {".".join([*path, m.group(1)]): raw}))
            elif line.endswith(("{", "[")):  # an array's object or array
                stray = 0
                path.append("[]")
            elif '"' not in line and _JSON_CLOSE.search(line) is not None:
                stray = 0
                if not path:
                    break  # the top level closed
                path.pop()
            else:
                stray += 1
            j += 1
        i = j + 1
    return out


def _line_item(line: str) -> tuple[str, str] | None:
    """A "lines" format's 'name=value,' (behind a launcher's '[rank0]:' prefix or none)."""
    if not line.endswith(","):
        return None
    m = _LINE_KEY.match(line)
    if m is None and line.startswith("["):
        close = line.find("]:")
        m = _LINE_KEY.match(line, close + 2 + (line[close + 2:close + 3] == " ")) \
            if close > 0 else None
    return None if m is None else (m.group(1), line[m.end():-1])


def _assign_lines(lines: list[str], f: _Format) -> list[tuple[int, dict[str, str]]]:
    """Each dump of a "lines" format: a line ending in one of `begins` (the classes that
    print so, by name), one 'name=value,' a line (a value printed with str(), over one
    line), until a line that is `end` alone."""
    begins = tuple(f.begins)

    def ends(line: str) -> bool:
        line = line.rstrip()
        return line.lstrip() == f.end or line.endswith("]:" + f.end)  # the repr's close

    return _item_blocks(lines, lambda ln: ln.rstrip().endswith(begins), ends,
                        lambda ln: _line_item(ln.rstrip()))


def _printed(lines: list[str], f: _Format) -> list[tuple[int, dict[str, str]]]:
    """The dumps of format `f` in `lines`, each a line number and its raw values by name."""
    if f.kind == "block":
        return _blocks(lines, f)
    if f.kind == "json":
        return _json_blocks(lines, f)
    if f.kind == "lines":
        return _assign_lines(lines, f)
    return _pairs_lines(lines, f)


def read_settings(lines: list[str]) -> tuple[Setting, ...]:
    """Every setting `lines` print, the last print of each (a restarted job's own)."""
    data = _data()
    found: dict[str, Setting] = {}
    for f in data.format:
        wanted = [(s, s.keys[f.id]) for s in data.setting if f.id in s.keys]
        for i, pairs in _printed(lines, f):
            for s, path in wanted:
                head, _, rest = path.partition(".")
                if f.kind == "json":  # keyed by the whole path already
                    head, rest = path, ""
                raw = pairs.get(head)
                if raw is not None and rest:
                    body = _inside(raw) if f.kind in ("pairs", "lines") else (raw, "assign")
                    raw = _lookup(body[0], body[1], rest) if body is not None else None
                if raw is None:
                    continue
                ok, value = _value(raw, s.type) if not s.values else _meant(raw, s.values)
                if ok:
                    new = Setting(s.id, s.framework, path, value, raw.strip()[:MAX_PRINTED],
                                  i + 1, f.id)
                    old = found.get(s.id)
                    if old is None or old.line <= new.line:
                        found[s.id] = new
    return tuple(sorted(found.values(), key=lambda s: (s.line, s.id)))
