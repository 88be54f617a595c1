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
    # only the columns the check reads are gathered (a trace has a million rows); an
    # offending event's whole row is taken from `events` by its position
    blocks = (events.lazy().with_row_index("_row")
              .filter(pl.col("action").is_in(BLOCK_ACTIONS))
              .select("_row", "device", "addr").collect())
    one_device = blocks["device"].n_unique() <= 1
    for dev in segments["device"].unique().to_list():  # devices with allocator state
        r = ranges.filter(pl.col("device") == dev).sort("address")
        starts = r["address"].to_numpy()
        reach = np.maximum.accumulate((r["address"] + r["total_size"]).to_numpy())
        if one_device:  # the usual case: no second pass over the rows
            ev = blocks if blocks.height and blocks["device"][0] == dev else blocks.clear()
        else:
            ev = blocks.filter(pl.col("device") == dev)
        if ev["addr"].null_count():
            return events.row(int(ev.filter(pl.col("addr").is_null())["_row"][0]), named=True)
        addrs = ev["addr"].to_numpy()
        at = np.searchsorted(starts, addrs, side="right") - 1
        inside = (at >= 0) & (reach[np.maximum(at, 0)] > addrs)
        if not inside.all():
            return events.row(int(ev["_row"][int(np.argmin(inside))]), named=True)
    return None
