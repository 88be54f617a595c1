"""Python tracebacks read from a log (issue 57): the failing allocation's stack.

The traceback above an OOM message holds the Python frames of the request that failed —
the same frames a snapshot records for a block, so the same rule packs can name it. Each
traceback starts at "Traceback (most recent call last):"; its frames are `File "path", line
N, in function` lines, each followed by its source line and, since 3.11, a line of carets;
the exception line ends it. A log prefix before every line is allowed (a timestamp, a
torchrun "[rank3]:" tag); where the header carries a rank tag, only lines with the same tag
belong to it, so the tracebacks of ranks printing at once are read apart. Chained
tracebacks ("During handling of the above exception ...") and Ray's remote one (the
actor's frames printed after the RayTaskError line, with no header) are each a traceback
of their own; the one ending at the OOM message is its stack.

Pasted logs often lose the header (issue 69): a code block that starts mid-stack, a Ray
actor's lines each behind its "(ClassName pid=N[, ip=A])" prefix (ray/_private/worker.py,
print_worker_logs), frames with log lines between them. A frame line (`File "…", line N,
in f`) with no traceback open for its line's group starts one there; a group is the line's
Ray actor (its pid) or its torchrun rank tag, so several processes' interleaved output is
read apart, and lines of another group between the frames are passed over. A line that
says "out of memory" ends a traceback as its exception line does.

A traceback flattened onto one line (a paste whose newlines were lost: the header, every
`File "…", line N, in f` with its source line and carets, and the exception one after
another) is cut back into its lines at each frame and at the exception before it is read;
its pieces keep the line's number.

A paste that kept only the innermost frame's source line (its `File` line cut off) names
that frame where the line is a library's own statement, printed verbatim from its file
(`source_lines.toml`: Module.to's `convert`, autograd's `backward`, transformers' checkpoint
loader): a headless traceback of that one frame starts there, its line number unknown (0).
IPython's `--> N` marker before such a line is passed over.

Every line is matched in linear time: lines longer than MAX_TRACE_LINE are not frame
lines, a frame line is found by its literal `File "` and matched from there, every
repetition is bounded.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache

from snapana import data_file

#: A line longer than this is no traceback line (a frame line is a path and a name).
MAX_TRACE_LINE = 4096
#: Frames kept per traceback (the innermost ones: a recursion's are the same few).
MAX_FRAMES = 512
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
#: Ray's exception for a remote task's failure: the actor's own frames follow it without a
#: header of their own ("ray.exceptions.RayTaskError(OutOfMemoryError): ray::A.f() ...").
_REMOTE = "RayTaskError("
#: How much of a line's start is searched for its rank tag.
RANK_SPAN = 200
#: Ray's prefix before a worker's line: "(" [actor or task name " "] "pid=" N [", ip=" A] ")"
#: (ray/_private/worker.py print_worker_logs; "(raylet)" and "(autoscaler …)" name no pid).
RAY_PREFIX = re.compile(r"\((?:[\w.<>:-]{1,200} )?pid=(\d{1,9})(?:, ip=[\w.:-]{1,64})?\)")
#: The colour codes Ray (colorama) puts around its prefix: SGR sequences.
_ANSI = re.compile(r"\x1b\[[0-9;]{0,32}m")
#: An exception standing inside a flattened line: a dotted class name that ends as Python's
#: exceptions' do, a colon and a space (`torch.OutOfMemoryError: CUDA out of memory`).
_INLINE_EXCEPTION = re.compile(
    r"(?<![\w.])[A-Za-z_][\w.]{0,200}(?:Error|Exception)(?:\([\w.]{1,200}\))?: ")
#: Carets under a source line, at the end of a flattened piece.
_TRAILING_CARETS = re.compile(r"(?<!\s)\s++[\^~][\^~\s]*+$")
#: Frames one flattened line may hold before the rest of it is left unread.
MAX_FLAT_FRAMES = MAX_FRAMES
#: A longer line is not cut back into a traceback (each piece is bounded by MAX_TRACE_LINE).
MAX_FLAT_LINE = MAX_TRACE_LINE * MAX_SOURCE_LINES

#: Words of an OOM message's line: it ends the traceback whose exception it is, even where
#: a paste lost the exception's class name.
_OOM_WORDS = "out of memory"


class SourceLine(data_file.Table, frozen=True, kw_only=True):
    """``[[line]]``: a library's source line as CPython prints it, and the frame it is in."""

    code: str
    path: str
    function: str
    source: str  # the library's file and function it was read from


@data_file.schema("sources/source_lines.toml")
class SourceLinesFile(data_file.Table, frozen=True, kw_only=True):
    line: list[SourceLine]


@lru_cache(maxsize=1)
def _source_lines() -> tuple[SourceLine, ...]:
    return tuple(data_file.packaged("sources/source_lines.toml", SourceLinesFile).line)


#: IPython's marker before the line a frame stopped at ("--> 781     return …").
_IPYTHON_MARK = re.compile(r"-->\s{0,8}\d{1,9}")
#: What a log prefix may end with before a source line's indentation.
_PREFIX_ENDS = frozenset(":|)]>`")


@dataclass(frozen=True)
class TraceFrame:
    path: str
    line: int
    function: str  # "" where the paste lost it
    code: str  # the source line printed under it ("" when none)


@dataclass(frozen=True)
class Traceback:
    """One traceback: its frames outermost first (as printed), where it ends."""

    first_line: int  # 1-based line of its header (of its first frame, where it has none)
    end_line: int  # 1-based line of its exception line (0: the text ends first)
    rank: int | None
    frames: tuple[TraceFrame, ...]
    exception: str  # the exception line, its prefix removed
    headless: bool = False  # read from a frame line: the paste had no header
    #: 1-based line of its last frame or source line (what a cut one is matched by)
    last_line: int = 0
    #: 1-based lines it read (its frames, their source lines, its exception)
    lines_read: int = 0

    @property
    def stack(self) -> tuple[tuple[str, str, int], ...]:
        """The frames innermost first, as a snapshot stores them: (file, function, line)."""
        return tuple((f.path, f.function, f.line) for f in reversed(self.frames))


def _rank(line: str) -> int | None:
    m = RANK_TAG.search(line[:RANK_SPAN])
    return int(m.group(1)) if m else None


def _group(line: str, rank: int | None) -> tuple[str, int] | None:
    """Which process printed `line`, as far as its prefix says: a Ray worker's pid, else a
    torchrun rank tag (None: no prefix names one)."""
    m = RAY_PREFIX.match(line.lstrip()[:RANK_SPAN])
    if m is not None:
        return ("pid", int(m.group(1)))
    return None if rank is None else ("rank", rank)


def _headless_frame(line: str) -> int:
    """Where a frame line's `File "` stands (-1: not a frame line that can start a
    traceback: it must name its function and stand after its prefix, not inside a text)."""
    at = line.find(_FRAME_AT)
    if at < 0:
        return -1
    m = _FRAME.match(line, at)
    if m is None or m.group(3) is None:
        return -1
    before = line[:at]
    return at if not before or before[-1] in " \t:|)]" else -1


def _frame_prefix(line: str, at: int) -> str:
    """The prefix of a headless traceback: what stands before its first frame's indent,
    with the one space that separates a prefix from the text."""
    head = line[:at].rstrip(" \t")
    return head + " " if head and line[len(head):len(head) + 1] == " " else head


def _library_line(line: str) -> tuple[TraceFrame, str] | None:
    """The frame a library's own source line names (`source_lines.toml`), where `line` is
    that source line after a log prefix, and the prefix; None otherwise."""
    text = line.rstrip()
    for known in _source_lines():
        if not text.endswith(known.code):
            continue
        before = text[:len(text) - len(known.code)]
        head = before.rstrip(" \t")
        if head and head[-1] not in _PREFIX_ENDS and not _IPYTHON_MARK.fullmatch(head):
            continue  # the statement stands inside other text, not as a line of its own
        if before and before != head and _IPYTHON_MARK.fullmatch(head) is None:
            prefix = _frame_prefix(text, len(head) + 1) if head else ""
        else:
            prefix = ""
        return TraceFrame(known.path, 0, known.function, known.code), prefix
    return None


#: Digits made one, to compare a prefix's shape (a timestamp that moved on).
_DIGITS = str.maketrans("0123456789", "0000000000")


def _body(line: str, prefix: str) -> str:
    """A line without the traceback's prefix (a tag or a timestamp of the same shape)."""
    if prefix and (line.startswith(prefix) or line[:len(prefix)].translate(_DIGITS)
                   == prefix.translate(_DIGITS)):
        return line[len(prefix):]
    tag = RANK_TAG.search(line[:RANK_SPAN])
    if tag is not None:  # "[rank0]: ..." with another timestamp before it
        rest = line[tag.end():]
        return rest[1:] if rest.startswith(":") else rest
    return line


def read_tracebacks(lines: list[str]) -> list[Traceback]:
    """Every traceback of `lines`, in the order their headers appear. One pass: each line
    goes to the traceback open for its rank tag (or for untagged lines), so ranks printing
    at once are read apart and no line is read twice."""
    reading: dict[tuple[str, int] | None, _Reading] = {}
    out: list[Traceback] = []
    for i, line in ((i, piece) for i, whole in enumerate(lines) for piece in _unflatten(whole)):
        if len(line) > MAX_TRACE_LINE:
            continue
        if "\x1b" in line:
            line = _ANSI.sub("", line)
        rank = _rank(line)
        group = _group(line, rank)
        at = line.find(_HEADER)
        if at >= 0:
            if group in reading:  # cut: a new one begins before it ended
                out.append(reading.pop(group).finish(0, ""))
            reading[group] = _Reading(i + 1, line[:at], rank)
        elif group in reading:
            done = reading[group].feed(line, i + 1)
            if done is not None:
                out.append(done)
                del reading[group]
                if _REMOTE in done.exception:  # Ray prints the actor's frames next, headless
                    reading[group] = _Reading(i + 1, _prefix_of(line, done.exception), rank)
        elif (frame_at := _headless_frame(line)) >= 0:  # a paste that starts mid-stack
            r = reading[group] = _Reading(i + 1, _frame_prefix(line, frame_at), rank, True)
            r.feed(line, i + 1)
        elif (known := _library_line(line)) is not None:  # only the frame's source line
            r = reading[group] = _Reading(i + 1, known[1], rank, True)
            r.frames.append(known[0])
            r.read = 1
    out += [r.finish(0, "") for r in reading.values()]
    return sorted(out, key=lambda t: t.first_line)


def _unflatten(line: str) -> list[str]:
    """A traceback flattened onto one line, back in the lines CPython printed: the header,
    each frame line, its source line (carets dropped), the exception line, each behind the
    line's own prefix. A line with fewer than two of header and frames is itself."""
    if len(line) > MAX_FLAT_LINE or line.count(_FRAME_AT) < 1:
        return [line]
    starts = []
    at = line.find(_HEADER)
    if at >= 0:
        starts.append((at, len(_HEADER)))
    at = line.find(_FRAME_AT)
    while at >= 0 and len(starts) <= MAX_FLAT_FRAMES:
        m = _FRAME.match(line, at)
        if m is not None and m.group(3) is not None:
            starts.append((at, m.end() - at))
        at = line.find(_FRAME_AT, at + len(_FRAME_AT))
    if len(starts) < 2:
        return [line]
    starts.sort()
    prefix = line[:starts[0][0]]
    out = [prefix + line[starts[0][0]:starts[0][0] + starts[0][1]]]
    for k, (begin, width) in enumerate(starts):
        if k:
            out.append(f'{prefix}  {line[begin:begin + width]}')
        rest = line[begin + width:starts[k + 1][0] if k + 1 < len(starts) else len(line)]
        exc = _INLINE_EXCEPTION.search(rest) if k + 1 == len(starts) else None
        code = _TRAILING_CARETS.sub("", rest[:exc.start()] if exc else rest).strip()
        if code:
            out.append(f"{prefix}    {code}")
        if exc is not None:
            out.append(prefix + rest[exc.start():].strip())
    return out


def _prefix_of(line: str, exception: str) -> str:
    """The prefix of the line an exception was read from (what stands before it)."""
    at = line.find(exception[:40])
    return line[:at] if at > 0 else ""


class _Reading:
    """A traceback being read: its frames so far, a frame whose source line may follow."""

    def __init__(self, first_line: int, prefix: str, rank: int | None,
                 headless: bool = False) -> None:
        self.first_line, self.prefix, self.rank = first_line, prefix, rank
        self.headless = headless
        self.frames: list[TraceFrame] = []
        self.pending: tuple[str, int, str] | None = None
        self.indented = False  # the pending frame's line was indented (CPython's 2 spaces)
        self.loose = 0
        self.last = first_line
        self.read = 0 if headless else 1  # the header

    def finish(self, end_line: int, exception: str) -> Traceback:
        if self.pending is not None:
            self.frames.append(TraceFrame(*self.pending, ""))
            self.pending = None
        return Traceback(self.first_line, end_line, self.rank,
                         tuple(self.frames[-MAX_FRAMES:]), exception, self.headless,
                         self.last, self.read + (1 if end_line else 0))

    def feed(self, line: str, number: int) -> Traceback | None:
        """Read one more line; the traceback when this line ends it."""
        body = _body(line, self.prefix)
        at = body.find(_FRAME_AT)
        m = _FRAME.match(body, at) if at >= 0 else None
        if m is not None and not body[:at].strip(" \t|"):
            if self.pending is not None:
                self.frames.append(TraceFrame(*self.pending, ""))
            self.pending = (m.group(1), int(m.group(2)), m.group(3) or "")
            self.indented = at > 0
            self.loose = 0
            self.last, self.read = number, self.read + 1
            if len(self.frames) > 2 * MAX_FRAMES:
                del self.frames[:MAX_FRAMES]  # the innermost are kept
            return None
        text = body.strip()
        if not text or set(text) <= _CARETS:
            return None  # a blank line inside, or the carets under a source line
        if not body[:1].isspace() and (_is_exception(text) or _OOM_WORDS in text.lower()):
            return self.finish(number, text)
        if self.pending is not None and (body[:1].isspace() or not self.indented):
            # its source line (indented under an indented frame: a log line between two
            # frames is not)
            self.frames.append(TraceFrame(*self.pending, text))
            self.pending = None
            self.last, self.read = number, self.read + 1
            return None
        self.loose += 1  # more source lines of one frame (3.13 prints a call's every line)
        return self.finish(0, "") if self.loose > MAX_SOURCE_LINES else None


#: An exception line: a dotted name (with Ray's "(Cause)" after it) and a colon, or a bare
#: exception class name.
_EXCEPTION = re.compile(r"[A-Za-z_][\w.]{0,200}(?:\([\w.]{1,200}\))?(?::|$)")
_BARE = ("Error", "Exception", "Interrupt", "Exit")


def _is_exception(text: str) -> bool:
    """An exception's line: its class name ends as Python's exceptions' names do, so a log
    line between the frames ("INFO:root:…", "Note: …") does not end the traceback."""
    m = _EXCEPTION.match(text)
    if m is None:
        return False
    name = m.group(0).rstrip(":").split("(", 1)[0]
    return name.endswith(_BARE) and (m.group(0).endswith(":") or text.endswith(_BARE))


def traceback_of(by_end: dict[int, Traceback], line: int, rank: int | None,
                 within: int = 3) -> Traceback | None:
    """The traceback of the OOM message at `line` (1-based), from the tracebacks keyed by
    their exception line (`ending_at`): the one whose exception line it is, else the nearest
    of its rank ending at most `within` lines before it."""
    for end in range(line, line - within - 1, -1):
        t = by_end.get(end)
        if t is not None and (rank is None or t.rank in (None, rank)):
            return t
    return None


def ending_at(tracebacks: Iterable[Traceback]) -> dict[int, Traceback]:
    """Tracebacks keyed by the line of their exception; one cut short (a paste whose OOM
    message stands apart from its frames) by its last frame's line, where no exception
    line is there."""
    tracebacks = list(tracebacks)
    out = {t.last_line: t for t in tracebacks if not t.end_line and t.frames}
    out.update({t.end_line: t for t in tracebacks if t.end_line})
    return out
