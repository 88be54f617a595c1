"""Python tracebacks read from a log (issue 57): the failing allocation's stack.

The traceback above an OOM message holds the Python frames of the request that failed —
the same frames a snapshot records for a block, so the same rule packs can name it. Each
traceback starts at "Traceback (most recent call last):"; its frames are `File "path", line
N, in function` lines, each followed by its source line and, since 3.11, a line of carets;
the exception line ends it. A log prefix before every line is allowed (a timestamp, a
torchrun "[rank3]:" tag); where the header carries a rank tag, only lines with the same tag
belong to it, so the tracebacks of ranks printing at once are read apart. Chained
tracebacks ("During handling of the above exception ...") and Ray's remote one are each a
traceback of their own; the one ending at the OOM message is its stack.

Every line is matched in linear time: lines longer than MAX_TRACE_LINE are not frame
lines, a frame line is found by its literal `File "` and matched from there, every
repetition is bounded.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

#: A line longer than this is no traceback line (a frame line is a path and a name).
MAX_TRACE_LINE = 4096
#: Frames kept per traceback (the innermost ones: a recursion's are the same few).
MAX_FRAMES = 512
#: Lines of other ranks (or other output) a traceback may skip between two of its own.
MAX_INTERLEAVED = 200
#: Source lines one frame may print (a multi-line call in 3.13) before the text is no
#: longer read as its traceback.
MAX_SOURCE_LINES = 40

_HEADER = "Traceback (most recent call last):"
_FRAME_AT = 'File "'
#: Matched at the position of `File "`: path, line, function (absent where a markdown
#: paste ate `<module>`).
_FRAME = re.compile(r'File "([^"\n]{1,1024})", line (\d{1,9})(?:, in ([^\s,]{1,256}))?')
#: A torchrun rank tag before a line ("[rank3]:", "[Rank 3]").
RANK_TAG = re.compile(r"\[rank ?(\d{1,6})\]", re.IGNORECASE)
_CARETS = frozenset("^~ \t")


@dataclass(frozen=True)
class TraceFrame:
    path: str
    line: int
    function: str  # "" where the paste lost it
    code: str  # the source line printed under it ("" when none)


@dataclass(frozen=True)
class Traceback:
    """One traceback: its frames outermost first (as printed), where it ends."""

    first_line: int  # 1-based line of its header
    end_line: int  # 1-based line of its exception line (0: the text ends first)
    rank: int | None
    frames: tuple[TraceFrame, ...]
    exception: str  # the exception line, its prefix removed

    @property
    def stack(self) -> tuple[tuple[str, str, int], ...]:
        """The frames innermost first, as a snapshot stores them: (file, function, line)."""
        return tuple((f.path, f.function, f.line) for f in reversed(self.frames))


def _rank(line: str) -> int | None:
    m = RANK_TAG.search(line[:200])
    return int(m.group(1)) if m else None


def _body(line: str, prefix: str) -> str:
    """A line without the traceback's prefix (a tag or a timestamp of the same shape)."""
    if prefix and line.startswith(prefix):
        return line[len(prefix):]
    tag = RANK_TAG.search(line[:200])
    if tag is not None:  # "[rank0]: ..." with another timestamp before it
        rest = line[tag.end():]
        return rest[1:] if rest.startswith(":") else rest
    return line


def read_tracebacks(lines: list[str]) -> list[Traceback]:
    """Every traceback of `lines`, in the order their headers appear."""
    out = []
    for i, line in enumerate(lines):
        if len(line) > MAX_TRACE_LINE:
            continue
        at = line.find(_HEADER)
        if at >= 0:
            out.append(_read_one(lines, i, line[:at]))
    return out


def _read_one(lines: list[str], start: int, prefix: str) -> Traceback:
    rank = _rank(prefix)
    frames: list[TraceFrame] = []
    pending: tuple[str, int, str] | None = None  # a frame whose source line may follow
    skipped = loose = 0
    for k in range(start + 1, len(lines)):
        line = lines[k]
        if len(line) > MAX_TRACE_LINE or (rank is not None and _rank(line) != rank):
            skipped += 1
            if skipped > MAX_INTERLEAVED:
                break
            continue
        skipped = 0
        body = _body(line, prefix)
        at = body.find(_FRAME_AT)
        m = _FRAME.match(body, at) if at >= 0 else None
        if m is not None and not body[:at].strip(" \t|"):
            if pending is not None:
                frames.append(TraceFrame(*pending, ""))
            pending = (m.group(1), int(m.group(2)), m.group(3) or "")
            loose = 0
            continue
        text = body.strip()
        if not text or set(text) <= _CARETS:
            continue  # a blank line inside, or the carets under a source line
        if _is_exception(text) and not body[:1].isspace():
            if pending is not None:
                frames.append(TraceFrame(*pending, ""))
            return Traceback(start + 1, k + 1, rank, tuple(frames[-MAX_FRAMES:]), text)
        if pending is not None:  # its source line
            frames.append(TraceFrame(*pending, text))
            pending = None
            continue
        loose += 1  # more source lines of one frame (3.13 prints a call's every line)
        if loose > MAX_SOURCE_LINES:
            break
    if pending is not None:
        frames.append(TraceFrame(*pending, ""))
    return Traceback(start + 1, 0, rank, tuple(frames[-MAX_FRAMES:]), "")


#: An exception line: a dotted name (with Ray's "(Cause)" after it) and a colon, or a bare
#: exception class name.
_EXCEPTION = re.compile(r"[A-Za-z_][\w.]{0,200}(?:\([\w.]{1,200}\))?(?::|$)")
_BARE = ("Error", "Exception", "Interrupt", "Exit")


def _is_exception(text: str) -> bool:
    m = _EXCEPTION.match(text)
    if m is None:
        return False
    return m.group(0).endswith(":") or text.endswith(_BARE)


def traceback_of(tracebacks: list[Traceback], line: int, rank: int | None,
                 within: int = 3) -> Traceback | None:
    """The traceback of the OOM message at `line` (1-based): the one whose exception line it
    is, else the last one of its rank ending at most `within` lines before it."""
    best = None
    for t in tracebacks:
        if rank is not None and t.rank not in (None, rank):
            continue
        if t.end_line == line:
            return t
        if 0 < t.end_line < line and line - t.end_line <= within:
            best = t
    return best
