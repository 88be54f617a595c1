"""Input formats. Detection is by content, never by file name: tickets rename attachments."""

from __future__ import annotations

import gzip
from collections.abc import Callable
from pathlib import Path

from snapana.errors import InputError
from snapana.model import Capture

Progress = Callable[[int, int], None]


def sniff(path: Path) -> str:
    """Name the format of a file from its first bytes ('torch_snapshot', 'json', ...)."""
    if not path.exists():
        raise InputError(f"{path}: no such file")
    if path.is_dir():
        raise InputError(f"{path}: is a directory, expected a snapshot file")
    try:
        with path.open("rb") as fh:
            head = fh.read(64)
            if head[:2] == b"\x1f\x8b":
                fh.seek(0)
                try:
                    head = gzip.GzipFile(fileobj=fh).read(64)
                except (OSError, EOFError) as exc:
                    raise InputError(f"{path}: corrupt gzip file: {exc}") from None
    except PermissionError:
        raise InputError(f"{path}: permission denied") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot read: {exc.strerror or exc}") from None
    if not head:
        raise InputError(f"{path}: empty file")
    if head[:1] == b"\x80" and len(head) > 1 and 2 <= head[1] <= 5:
        return "torch_snapshot"
    if head[:7] == b"memray\x00" or head.startswith(b"memray"):
        return "memray"
    stripped = head.lstrip()
    if stripped[:1] in (b"{", b"["):
        return "json"
    if head[:1] in (b"(", b"]", b"}") or head[:2] == b"(l":
        return "torch_snapshot"  # protocol 0/1 pickles (very old torch)
    raise InputError(
        f"{path}: unrecognised format (not a torch memory snapshot pickle, profiler trace "
        "or memray capture)"
    )


def load(path: Path | str, progress: Progress | None = None) -> Capture:
    """Read any supported artefact into the common model."""
    path = Path(path)
    kind = sniff(path)
    if kind == "torch_snapshot":
        from snapana.sources import torch_snapshot

        return torch_snapshot.load(path, progress)
    if kind == "json":
        raise InputError(
            f"{path}: a JSON file; snapana reads torch.cuda.memory._dump_snapshot pickles "
            "(profiler traces are not supported by this version)"
        )
    raise InputError(f"{path}: memray captures are not supported by this version")
