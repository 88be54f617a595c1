"""What a capture is: one enum of the input kinds, and one table with a row per kind that
says how the kind is recognised (by content, never by name), what reads it, what it
yields and what the later stages may assume of it. Everything that asks "is this a
snapshot?", "is this a log?" or "does this round to 512 B?" asks the row, never a string:
a new input format is a new member, a new row and its reader (in `sources/`). The table
stands below the model (it imports nothing of the pipeline), so the model, the findings and
the renderers read a capture's kind and its traits without an import running back up."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

from snapana.allocator_model.rules import MIN_BLOCK_SIZE


class CaptureKind(str, Enum):
    """An input's kind. The value is the name the reports and exports write (`source`):
    printed, formatted and serialised as that name (a StrEnum, on Python 3.10 too)."""

    TORCH_SNAPSHOT = "torch_snapshot"
    MEMRAY = "memray"
    MEMRAY_PARQUET = "memray_parquet"
    MEMORY_TIMELINE = "memory_timeline"
    KINETO_TRACE = "kineto_trace"
    TEXT_LOG = "text_log"
    SNAPANA_EXPORT = "snapana_export"

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)

    @property
    def row(self) -> Source:
        """This kind's row of `SOURCES`."""
        return SOURCES[self]


@dataclass(frozen=True)
class Source:
    """One input kind, all it is. Every field is given in its row: none has a default."""

    kind: CaptureKind
    #: what the input is, for a sentence ("a torch.profiler trace")
    what: str
    #: recognises the kind from a file's first 64 bytes (None: a folder, recognised by its
    #: marker file); the table is tried in order and the first that says yes wins
    detect: Callable[[bytes], bool] | None
    #: "module:function" that reads a path into a `Capture` (or refuses, saying why the
    #: input is not one: a text log is read by the log commands, never as a capture)
    reader: str
    #: True: a `Capture` (the report's figures); False: text read for its messages
    yields_capture: bool
    #: the allocator's rounding of a request, in bytes, for a capture whose `source` is this
    #: kind (a snapshot's caching allocator: 512; what records requests as made: 1); None
    #: for a kind that holds a capture of another kind (an export, a converted memray file:
    #: the capture inside names its own kind)
    size_rounding: int | None
    #: the caching allocator's own state is recorded: segments (even when none) and settings
    allocator_segments: bool
    #: a process's heap (host memory), not a device's caching allocator
    host_heap: bool
    #: a folder's rank table takes it as a rank
    rank_input: bool
    #: how it is given when not as a rank ("give it alone, or ..."); "" for a rank input
    given_as: str
    #: a folder of one snapshot reads it beside that snapshot (as --trace / --memray would)
    read_beside: bool
    #: what was live before recording began is known only as one total (a profiler trace's
    #: `Total Allocated`), not tensor by tensor: no sizes to read a model's shape from
    held_before_as_total: bool

    @property
    def not_a_rank(self) -> str:
        """Why a folder's rank table does not take a file of this kind."""
        return f"{self.what}: {self.given_as}"


#: A protocol 0 / 1 pickle's start: MARK and a dict or list opcode ("(dp0", "(lp0"), or an
#: empty dict / list and its memo (proto 1: "}q\x00", "]q\x00"). A log whose first line is
#: Ray's "(TaskActor pid=1234) ..." is text.
_OLD_PICKLE = re.compile(rb"\((?:[dl](?:p\d|\n|\()|\()|[\]}](?:q|\(|\x94)")

#: A JSON array's start: a value after the bracket. A log line "[rank0]: ..." or
#: "[2025-03-14 09:20:11] ..." is not one.
_JSON_ARRAY = re.compile(rb"\[\s*(?:[{\[\]\"]|-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?\s*(?:[,\]]|$)"
                         rb"|true\b|false\b|null\b|$)")


def _pickle(head: bytes) -> bool:
    """A pickle of protocol 2 to 5 (PROTO opcode), or a very old torch's protocol 0 / 1."""
    return (head[:1] == b"\x80" and len(head) > 1 and 2 <= head[1] <= 5) \
        or _OLD_PICKLE.match(head) is not None


def _memray(head: bytes) -> bool:
    return head.startswith(b"memray") or head[:4] == b"\x04\x22\x4d\x18"  # LZ4: a memray run


def _parquet(head: bytes) -> bool:
    return head[:4] == b"PAR1"  # written by `snapana convert`


#: An HTTP API's error body: an inference server's reply saved to a file. OpenAI's shape,
#: which vLLM's and SGLang's OpenAI-compatible servers return ({"error": {"message": ...,
#: "type": ..., "code": ...}}), vLLM's older ErrorResponse ({"object": "error", "message":
#: ...}) and FastAPI's HTTPException ({"detail": ...}). No profiler trace starts with one of
#: these keys; the body is text, read for the message it carries (as on standard input).
_ERROR_BODY = re.compile(rb'\{\s*"(?:error"\s*:|object"\s*:\s*"error"|detail"\s*:)')


def _json(head: bytes) -> bool:
    stripped = head.lstrip()
    if _ERROR_BODY.match(stripped):
        return False
    return stripped[:1] == b"{" or _JSON_ARRAY.match(stripped) is not None


def looks_like_timeline(head: bytes) -> bool:
    """Both layouts of a memory timeline are a JSON array whose first item is an array
    (`[[`), which no chrome trace (an object, or an array of objects) starts with."""
    text = head.lstrip()
    return text[:1] == b"[" and text[1:].lstrip()[:1] == b"["


#: The share of a text's head that may be noise: bytes that are not UTF-8 and controls no
#: terminal output holds. A captured log carries some (a stray 0xff, a Latin-1 word, a
#: progress bar cut mid-character); a binary file's head (a PNG's, random bytes, a zip's)
#: is mostly noise.
TEXT_NOISE = 0.125
#: Controls a terminal's output holds: tab, newline, carriage return (progress bars),
#: backspace, form feed and escape (colours).
_TEXT_CONTROLS = frozenset("\t\n\r\b\f\x1b")


def looks_like_text(head: bytes) -> bool:
    """Text, not a binary format, decided by share, not by the whole head's validity: one
    bad byte must not hide the OOM message after it. NUL bytes are left out first (a
    log rotated by copytruncate starts with a run of them; the reader drops them too);
    what is left must be at most TEXT_NOISE noise."""
    text = head.replace(b"\x00", b"").decode("utf-8", "replace")
    if not text.strip():
        return False
    noise = sum(1 for c in text if c == "\ufffd" or c == "\x7f"
                or (c < " " and c not in _TEXT_CONTROLS))
    return noise <= len(text) * TEXT_NOISE


#: Every input kind, one row each, in the order detection tries them.
SOURCES: dict[CaptureKind, Source] = {row.kind: row for row in (
    Source(CaptureKind.TORCH_SNAPSHOT, "a torch memory snapshot", _pickle,
           "snapana.sources.torch_snapshot:load", yields_capture=True, size_rounding=MIN_BLOCK_SIZE,
           allocator_segments=True, host_heap=False, rank_input=True, given_as="",
           read_beside=False,
           held_before_as_total=False),
    Source(CaptureKind.MEMRAY, "a memray capture", _memray,
           "snapana.sources.memray_capture:load", yields_capture=True, size_rounding=1,
           allocator_segments=False, host_heap=True, rank_input=False,
           given_as="give it alone, or beside a snapshot with --memray", read_beside=True,
           held_before_as_total=False),
    Source(CaptureKind.MEMRAY_PARQUET, "a converted memray capture", _parquet,
           "snapana.sources.memray_capture:load_parquet", yields_capture=True,
           size_rounding=None, allocator_segments=False, host_heap=True, rank_input=False,
           given_as="give it alone, or with --memray", read_beside=True,
           held_before_as_total=False),
    Source(CaptureKind.MEMORY_TIMELINE, "a profiler memory timeline", looks_like_timeline,
           "snapana.sources.memory_timeline:load", yields_capture=True, size_rounding=1,
           allocator_segments=False, host_heap=False, rank_input=False,
           given_as="give it alone, or with --trace", read_beside=True,
           held_before_as_total=False),
    Source(CaptureKind.KINETO_TRACE, "a torch.profiler trace", _json,
           # `Bytes` are exact (CPU) or already block sizes (CUDA): replay must not round
           "snapana.sources.kineto_trace:load", yields_capture=True, size_rounding=1,
           allocator_segments=False, host_heap=False, rank_input=False,
           given_as="give it alone, or beside a snapshot with --trace", read_beside=True,
           held_before_as_total=True),
    Source(CaptureKind.TEXT_LOG, "a text log", looks_like_text,
           "snapana.sources.log_text:refuse_as_capture", yields_capture=False,
           size_rounding=None, allocator_segments=False, host_heap=False, rank_input=False,
           given_as="give it alone, or beside a snapshot with --log", read_beside=False,
           held_before_as_total=False),
    Source(CaptureKind.SNAPANA_EXPORT, "a snapana export", None,
           "snapana.sources.parquet_dir:load", yields_capture=True, size_rounding=None,
           allocator_segments=False, host_heap=False, rank_input=False,
           given_as="give it alone", read_beside=False,
           held_before_as_total=False),
)}


def detect(head: bytes) -> CaptureKind | None:
    """The first kind whose row recognises these first bytes of a file; None: no row does."""
    return next((row.kind for row in SOURCES.values()
                 if row.detect is not None and row.detect(head)), None)


def capture_kind(name: str) -> CaptureKind | None:
    """The kind a capture's recorded `source` names (an export's marker), when it names a
    kind that yields allocations of its own; None otherwise."""
    try:
        kind = CaptureKind(name)
    except ValueError:
        return None
    return kind if kind.row.size_rounding is not None else None


def size_rounding(source: CaptureKind) -> int:
    """The rounding of a request in a capture of this kind (no default: a kind that holds
    another's capture never names a capture's source)."""
    rounding = source.row.size_rounding
    if rounding is None:
        raise ValueError(f"{source}: holds a capture of another kind, which names the rounding")
    return rounding
