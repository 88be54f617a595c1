"""A job's log or a paste, read for everything it says about GPU memory (issue 44): its
OOM messages (`oom_text`), the `memory_summary()` and `nvidia-smi` tables beside them
(`log_tables`), vLLM's KV-cache refusals and budget (`vllm_text`). A dying job's last words
are at the end, so the tail of a long log is what is read."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import BinaryIO, NoReturn

from snapana.errors import InputError
from snapana.limits import MAX_LOG_BYTES, MAX_LOG_MESSAGES
from snapana.log_model import KvBudget, KvRefusal, OomMessage
from snapana.sources._io import open_input
from snapana.sources.log_tables import MemorySummary, SmiTable, read_smi, read_summaries
from snapana.sources.memory_lines import MemoryLine, read_memory_lines
from snapana.sources.oom_text import messages_in, unescape
from snapana.sources.settings_text import Setting, read_settings
from snapana.sources.text_lines import bounded_lines
from snapana.sources.traceback_text import Traceback, read_tracebacks
from snapana.sources.vllm_text import read_budgets, read_refusals


@dataclass(frozen=True)
class TextLog:
    """What one text says about memory, and what limited the reading."""

    name: str
    messages: tuple[OomMessage, ...]
    notes: tuple[str, ...]
    summaries: tuple[MemorySummary, ...] = ()
    smi: tuple[SmiTable, ...] = ()
    refusals: tuple[KvRefusal, ...] = ()
    budgets: tuple[KvBudget, ...] = ()
    #: the Python tracebacks of the text (read for the OOM messages' stacks)
    tracebacks: tuple[Traceback, ...] = ()
    #: frameworks' own memory lines (SGLang, vLLM, torch_memory_saver, Megatron, DeepSpeed)
    memory_lines: tuple[MemoryLine, ...] = ()
    #: the settings its frameworks' args dumps print (vLLM, SGLang, Megatron / slime,
    #: DeepSpeed), the last print of each: not memory, so they alone leave a text empty
    settings: tuple[Setting, ...] = ()

    @property
    def empty(self) -> bool:
        return not (self.messages or self.summaries or self.smi or self.refusals
                    or self.budgets or self.memory_lines)


def read_text(text: str, name: str) -> TextLog:
    """What a text already in memory says (a notebook cell's paste)."""
    return _bounded(text.encode("utf-8", "replace"), 0, name)


def _bounded(data: bytes, skipped: int, name: str) -> TextLog:
    notes = []
    if skipped:
        notes.append(f"only the last {MAX_LOG_BYTES >> 20} MiB of the text were read "
                     f"({skipped:,} bytes before them skipped; SNAPANA has this bound in "
                     "limits.MAX_LOG_BYTES)")
    # each undecodable byte one U+FFFD in its own line (UTF-8 resynchronises at the next
    # character), so a stray byte never hides a message; NUL bytes (a copytruncate hole, a
    # NUL line) are no text at all
    lines, cut = bounded_lines(unescape(data.replace(b"\x00", b"").decode("utf-8",
                                                                           "replace")))
    if cut:
        notes.append(cut)
    try:
        found, anchors = messages_in(lines, MAX_LOG_MESSAGES)
        messages = [replace(m, source=name) for m in found]
        if anchors > MAX_LOG_MESSAGES:
            notes.append(f"{anchors:,} messages: the first {MAX_LOG_MESSAGES:,} are shown")
        return TextLog(name, tuple(messages), tuple(notes),
                       tuple(read_summaries(lines)[:MAX_LOG_MESSAGES]),
                       tuple(read_smi(lines)[:MAX_LOG_MESSAGES]),
                       tuple(read_refusals(lines)[:MAX_LOG_MESSAGES]),
                       tuple(read_budgets(lines)[:MAX_LOG_MESSAGES]),
                       tuple(read_tracebacks(lines)[-MAX_LOG_MESSAGES:]) if messages else (),
                       tuple(replace(m, source=name)
                             for m in read_memory_lines(lines)[-MAX_LOG_MESSAGES:]),
                       tuple(replace(s, source=name) for s in read_settings(lines)))
    except InputError as exc:  # a figure past its bound: said with the text's name
        raise InputError(f"{name}: {exc}") from None


def _tail(stream: BinaryIO, skipped: int = 0) -> tuple[bytes, int]:
    """The last MAX_LOG_BYTES of `stream`, read a bound at a time, and how many bytes came
    before them (plus `skipped`, already passed over by a seek)."""
    data = b""
    while more := stream.read(MAX_LOG_BYTES):
        data += more
        if len(data) > MAX_LOG_BYTES:
            skipped += len(data) - MAX_LOG_BYTES
            data = data[-MAX_LOG_BYTES:]
    return data, skipped


def read(path: Path, require: bool = True) -> TextLog:
    """The OOM messages of a text file (plain or gzip'd): its last MAX_LOG_BYTES, where a
    dying job's log keeps them. InputError when it holds none."""
    stream, raw, compressed = open_input(path)
    try:
        size = os.fstat(raw.fileno()).st_size
        skipped = 0
        if not compressed and size > MAX_LOG_BYTES:  # a plain file: straight to its tail
            skipped = size - MAX_LOG_BYTES
            raw.seek(skipped)
        data, skipped = _tail(stream, skipped)
    except OSError as exc:
        raise InputError(f"{path}: cannot read: {exc.strerror or exc}") from None
    finally:
        stream.close()
        raw.close()
    log = _bounded(data, skipped, str(path))
    return found(log, str(path)) if require else log


def read_stdin() -> TextLog:
    """The OOM messages of a paste on standard input (`snapana summary -`)."""
    data, skipped = _tail(sys.stdin.buffer)
    return found(_bounded(data, skipped, "standard input"), "standard input")


def found(log: TextLog, name: str) -> TextLog:
    if log.empty:
        raise InputError(f"{name}: unrecognised format (not a torch memory snapshot pickle, "
                         "profiler trace or memray capture, and no 'CUDA out of memory' / "
                         "'HIP/NPU out of memory' message, memory_summary(), nvidia-smi table, "
                         "vLLM KV-cache refusal or framework memory line in its text)")
    return log


def refuse_as_capture(path: Path, progress: object = None) -> NoReturn:
    """A text log given where a capture is read: refused, saying what it holds and what
    reads it (nothing about memory in it: "unrecognised")."""
    n = len(read(path).messages)
    raise InputError(f"{path}: a text log with {n} out-of-memory message(s), not a "
                     "capture: `snapana summary` and `snapana report` read it (alone, or "
                     "beside a snapshot with --log); this needs a snapshot, a profiler "
                     "trace or a memray capture")
