"""`snapana convert`: turn a capture only one tool release can read into a Parquet any can.

memray's reader accepts only the capture format its own release writes, so a `.bin` from a
ticket may be unreadable next to today's memray. Run under the release that reads it (the
error message says which), `convert_memray` writes what snapana needs in a file that no
longer depends on memray:

- one Parquet file, one row per allocation site alive at the high-water mark, columns
  `size`, `n_allocations`, `allocator`, `tid`, `thread_name` and `frames` (a list of
  `{filename, name, line}`, innermost first);
- the file's key-value metadata `snapana.memray` holds JSON: memray's own metadata
  (`peak_memory`, `total_allocations`, command line, pid, allocator, times), the parsed
  header (format version, Python version), the memray release that converted it, the
  layout version, and the RSS/heap series over time (`snapshots`).

`snapana.sources.memray_capture.load` reads it back into the same Capture as the `.bin`.
The reader needs only memray, so `--memray-python` can point at any environment where the
right release is installed (`pip install memray==X` in a bare venv is enough).
"""

from __future__ import annotations

import json
from pathlib import Path

from snapana.io.output import atomic_path, parquet_target
from snapana.model import ReadProgress
from snapana.sources import memray_capture
from snapana.sources._io import check_regular


def convert_memray(path: Path | str, out_parquet: Path | str, python: str | None = None,
                   progress: ReadProgress | None = None) -> Path:
    """Write the high-water mark of a memray capture as Parquet (atomically); return it.
    `python`: an interpreter where the memray release that reads the capture is installed
    (memray alone is enough there), when it is not the one running snapana."""
    path, out = Path(path), Path(out_parquet)
    check_regular(path)  # missing, a FIFO or a device: refused before anything opens it
    records, meta = memray_capture.read_records(path, progress, python=python, out=out)
    with atomic_path(out) as tmp, parquet_target(tmp) as target:
        records.write_parquet(
            target, metadata={memray_capture.PARQUET_META_KEY: json.dumps(meta)}
        )
    return out
