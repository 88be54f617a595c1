"""`snapana batch`: a partitioned Parquet dataset of per-rank summaries, for DuckDB / polars /
Spark over many incidents: ranks/job=J/rank=R/part-N.parquet and
families/job=J/rank=R/part-N.parquet, one part per input file (inputs whose names carry no
rank share rank=-1, and two inputs of one rank each get a part). A file writer, not a
renderer."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import polars as pl

from snapana.analysis.ranks.aggregate import MultiReport
from snapana.io.output import atomic_dir, parquet_target
from snapana.units import encodable

MARKER = "snapana-dataset.json"


def write(m: MultiReport, out: Path, job: str, verdicts: Mapping[str, str]) -> None:
    """Write atomically: build the dataset in a temp folder beside `out`, then swap it in
    (replacing only an earlier dataset). `verdicts`: each input file's verdict, worded by
    the face (a writer never words). A name with a byte that is not UTF-8 (the filesystem
    gives it as a lone surrogate) is written escaped (`units.encodable`): Parquet and
    JSON hold UTF-8 only."""
    job = encodable(job)
    with atomic_dir(out, MARKER, "dataset") as tmp:
        parts: dict[str, int] = {}
        for r in m.ranks:
            rank = r.rank if r.rank is not None else -1
            part = f"job={job}/rank={rank}"
            name = f"part-{parts.setdefault(part, 0)}.parquet"
            parts[part] += 1
            file = encodable(r.file)
            row = {"file": file, "error": r.error and encodable(r.error), "device": r.device,
                   "oom": r.oom is not None,
                   "requested_bytes": (r.oom or {}).get("requested_bytes"),
                   "device_free_bytes": (r.oom or {}).get("device_free_bytes"),
                   "oom_time_us": (r.oom or {}).get("time_us"),
                   "reserved_bytes": r.reserved_bytes, "allocated_bytes": r.allocated_bytes,
                   "peak_allocated_bytes": r.peak_allocated_bytes, "top_family": r.top_family,
                   "first_oom": m.first_oom is r,
                   "verdict": encodable(verdicts.get(r.file, "")),
                   "outliers": json.dumps([o["family"] for o in m.outliers
                                           if o["file"] == r.file])}
            (tmp / "ranks" / part).mkdir(parents=True, exist_ok=True)
            with parquet_target(tmp / "ranks" / part / name) as target:
                pl.DataFrame([row], schema_overrides={
                    "error": pl.Utf8, "device": pl.Int64, "requested_bytes": pl.Int64,
                    "device_free_bytes": pl.Int64, "oom_time_us": pl.Int64,
                    "top_family": pl.Utf8,
                }).write_parquet(target)
            (tmp / "families" / part).mkdir(parents=True, exist_ok=True)
            with parquet_target(tmp / "families" / part / name) as target:
                pl.DataFrame({"file": [file] * len(r.families), "family": list(r.families),
                              "bytes": list(r.families.values())},
                             schema={"file": pl.Utf8, "family": pl.Utf8, "bytes": pl.Int64}
                             ).write_parquet(target)
        (tmp / MARKER).write_text(json.dumps({"job": job, "inputs": len(m.ranks)}) + "\n",
                                  encoding="utf-8")
