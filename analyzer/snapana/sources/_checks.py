"""Consistency checks of a capture's tables that more than one source needs."""

from __future__ import annotations

from typing import Any

import numpy as np
import polars as pl

BLOCK_ACTIONS = ["alloc", "free_requested", "free_completed", "free"]
SEGMENT_ACTIONS = ["segment_alloc", "segment_free", "segment_map", "segment_unmap"]


def first_event_outside_segments(events: pl.DataFrame, segments: pl.DataFrame
                                 ) -> dict[str, Any] | None:
    """On a device with final segments, every block event starts inside a segment the
    capture knows (a final one, or one the trace allocates, maps or frees): PyTorch carves
    blocks out of segments, so an address outside all of them is not a real snapshot, and
    replaying it would count bytes that no segment reserves. The first offending event (a
    row of `events`), or None."""
    ranges = pl.concat([
        segments.select("device", "address", "total_size"),
        events.lazy().filter(pl.col("action").is_in(SEGMENT_ACTIONS)).select(
            "device", pl.col("addr").alias("address"), pl.col("size").alias("total_size"))
        .collect(),
    ]).drop_nulls()
    # each device's distinct block addresses are checked (a trace of a million events
    # reuses a few thousand), then the first event at an address found outside is looked up
    blocks = events.lazy().with_row_index("_row").filter(pl.col("action").is_in(BLOCK_ACTIONS))
    first: int | None = None  # of every device's: the same one whatever order devices come in
    for dev in segments["device"].unique().to_list():  # devices with allocator state
        r = ranges.filter(pl.col("device") == dev).sort("address")
        starts = r["address"].to_numpy()
        reach = np.maximum.accumulate((r["address"] + r["total_size"]).to_numpy())
        on = blocks.filter(pl.col("device") == dev)
        addrs = on.select(pl.col("addr").unique()).collect().to_series()
        if addrs.null_count():
            bad = on.filter(pl.col("addr").is_null())
        else:
            v = addrs.to_numpy()
            at = np.searchsorted(starts, v, side="right") - 1
            outside = v[(at < 0) | (reach[np.maximum(at, 0)] <= v)]
            if not outside.size:
                continue
            bad = on.filter(pl.col("addr").is_in(outside.tolist()))
        row = int(bad.select(pl.col("_row").min()).collect().item())
        first = row if first is None else min(first, row)
    return None if first is None else events.row(first, named=True)
