"""Input formats. Detection is by content, never by file name: tickets rename attachments."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import TYPE_CHECKING

from snapana.errors import InputError
from snapana.sources._io import check_regular, note_input, open_input

if TYPE_CHECKING:  # the model (polars) is imported by the reader that builds one
    from snapana.model import Capture, ReadProgress


def sniff(path: Path) -> str:
    """Name the format of a file from its first bytes: 'torch_snapshot', 'kineto_trace',
    'memory_timeline', 'memray' (a capture, LZ4-compressed or not), 'memray_parquet' or
    'snapana_export' (a directory written by `snapana export`). Only regular files are
    opened: a FIFO or a device is refused before `open` could block on it."""
    if not os.path.lexists(path):
        raise InputError(f"{path}: no such file")
    if path.is_dir():
        from snapana.sources.parquet_dir import MARKER

        marker = path / MARKER
        if marker.is_file():
            check_regular(marker)
            note_input(path)  # nothing may be written into an input folder
            return "snapana_export"  # written by `snapana export`
        raise InputError(f"{path}: is a directory, expected a snapshot file")
    stream, raw, _ = open_input(path)
    try:
        head = stream.read(64)
    except OSError as exc:
        raise InputError(f"{path}: cannot read: {exc.strerror or exc}") from None
    finally:
        stream.close()
        raw.close()
    if not head:
        raise InputError(f"{path}: empty file")
    if head[:1] == b"\x80" and len(head) > 1 and 2 <= head[1] <= 5:
        return "torch_snapshot"
    if head.startswith(b"memray") or head[:4] == b"\x04\x22\x4d\x18":  # LZ4: memray run
        return "memray"
    if head[:4] == b"PAR1":
        return "memray_parquet"  # written by `snapana convert`
    stripped = head.lstrip()
    if stripped[:1] == b"{" or _JSON_ARRAY.match(stripped):
        from snapana.sources.memory_timeline import looks_like_timeline

        return "memory_timeline" if looks_like_timeline(stripped) else "kineto_trace"
    if _OLD_PICKLE.match(head):
        return "torch_snapshot"  # protocol 0/1 pickles (very old torch)
    from snapana.sources.log_text import looks_like_text

    if looks_like_text(head):
        return "text_log"  # a job's log or a paste: read for its OOM messages
    raise InputError(
        f"{path}: unrecognised format (not a torch memory snapshot pickle, profiler trace "
        "or memray capture)"
    )


#: A protocol 0 / 1 pickle's start: MARK and a dict or list opcode ("(dp0", "(lp0"), or an
#: empty dict / list and its memo (proto 1: "}q\x00", "]q\x00"). A log whose first line is
#: Ray's "(TaskActor pid=1234) ..." is text.
_OLD_PICKLE = re.compile(rb"\((?:[dl](?:p\d|\n|\()|\()|[\]}](?:q|\(|\x94)")

#: A JSON array's start: a value after the bracket. A log line "[rank0]: ..." or
#: "[2025-03-14 09:20:11] ..." is not one.
_JSON_ARRAY = re.compile(rb"\[\s*(?:[{\[\]\"]|-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?\s*(?:[,\]]|$)"
                         rb"|true\b|false\b|null\b|$)")


def load(path: Path | str, progress: ReadProgress | None = None) -> Capture:
    """Read any supported artefact into the common model."""
    path = Path(path)
    kind = sniff(path)
    if kind == "torch_snapshot":
        from snapana.sources import torch_snapshot

        return torch_snapshot.load(path, progress)
    if kind == "snapana_export":
        from snapana.sources import parquet_dir

        return parquet_dir.load(path, progress)
    if kind == "kineto_trace":
        from snapana.sources import kineto_trace

        return kineto_trace.load(path, progress)
    if kind == "memory_timeline":
        from snapana.sources import memory_timeline

        return memory_timeline.load(path, progress)
    if kind == "text_log":
        from snapana.sources import log_text

        n = len(log_text.read(path).messages)  # (nothing about memory: "unrecognised")
        raise InputError(f"{path}: a text log with {n} out-of-memory message(s), not a "
                         "capture: `snapana summary` and `snapana report` read it (alone, or "
                         "beside a snapshot with --log); this needs a snapshot, a profiler "
                         "trace or a memray capture")
    from snapana.sources import memray_capture

    return memray_capture.load(path, progress)
