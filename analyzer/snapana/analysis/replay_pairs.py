"""Block lifetimes from a trace: each `alloc` paired with its `free_requested` and
`free_completed` at the same address, in event indices (the replay's first step).

A block is live at event i when `alloc_idx <= i < free_done_idx`; a block freed without an
`alloc` in the trace was alive before recording began (`alloc_idx` -1), and one never freed
is live to the end (`NEVER`).
"""

from __future__ import annotations

import numpy as np
import polars as pl

from snapana.allocator_model.rules import SizeRules
from snapana.model import EMPTY_STACK

NEVER = np.iinfo(np.int64).max  # free index of a block still live at the end

_ALLOC, _FREE_REQ, _FREE_DONE = 0, 1, 2
_PAIR_KIND = {"alloc": _ALLOC, "free_requested": _FREE_REQ, "free_completed": _FREE_DONE,
              "free": _FREE_DONE}
LIFETIME_SCHEMA = {"address": pl.Int64, "size": pl.Int64, "stack_id": pl.Int64,
                   "stream": pl.Int64, "alloc_idx": pl.Int64, "free_req_idx": pl.Int64,
                   "free_done_idx": pl.Int64, "requested_size": pl.Int64}


def _pair_kinds(events: pl.DataFrame) -> np.ndarray:
    """Each event's kind for pairing (`_PAIR_KIND`; -1: not a block event), from the action
    strings compared with each kind's names (on a million rows, faster than a lookup)."""
    action, kind = pl.col("action"), pl.lit(-1, pl.Int8)
    for k in set(_PAIR_KIND.values()):
        names = [a for a, v in _PAIR_KIND.items() if v == k]
        kind = pl.when(action == names[0] if len(names) == 1 else action.is_in(names)) \
            .then(pl.lit(k, pl.Int8)).otherwise(kind)
    return events.select(kind).to_series().to_numpy()


def _column(events: pl.DataFrame, name: str, fill: int) -> np.ndarray:
    """An Int64 column of `events` as numpy, nulls as `fill` (a view where it has none)."""
    column = events[name]
    return (column.fill_null(fill) if column.null_count() else column).to_numpy()


def pair_lifetimes(events: pl.DataFrame, rules: SizeRules | None
                   ) -> tuple[dict[str, np.ndarray], list[tuple[int, str]]]:
    """Pair alloc / free_requested / free_completed events per address into lifetimes, each
    block sized by the capture allocator's `rules` (None: the requests as made).

    Vectorised form of this per-event state machine (events in order, one open row per
    address at most):
    - ``alloc``: a new row; an address already open is a mismatch, and its row ends here.
    - ``free_requested``: sets the open row's request index (the last one wins); with no
      open row, opens one that was alive before recording.
    - ``free_completed``/``free``: closes the open row (request index defaults to it); with
      no open row, a closed row alive before recording.
    Sorting by (address, event index) lays each address's events out in order: an event
    opens a row when it is an alloc, the address's first event, or follows a completion.
    Rows come back in the order they were opened; mismatches as (event index, message).
    """
    every_kind = _pair_kinds(events)
    values = {name: _column(events, name, fill) for name, fill in
              (("addr", 0), ("size", 0), ("stack_id", EMPTY_STACK), ("stream", 0))}
    order = _block_order(every_kind, values["addr"])
    i = order
    kind = every_kind[order]
    addr = values["addr"][order]
    m = len(i)
    if m == 0:
        return {k: np.zeros(0, np.int64) for k in LIFETIME_SCHEMA}, []
    same = np.zeros(m, dtype=bool)
    same[1:] = addr[1:] == addr[:-1]
    prev = np.full(m, -1, dtype=np.int8)
    prev[1:] = kind[:-1]
    prev[~same] = -1
    is_alloc = kind == _ALLOC
    new_row = is_alloc | (prev == -1) | (prev == _FREE_DONE)
    clash = np.flatnonzero(is_alloc & same & ((prev == _ALLOC) | (prev == _FREE_REQ)))
    mismatches = [(int(i[p]), f"event {int(i[p])}: alloc at 0x{int(addr[p]):x} which is "
                   "already live") for p in clash]

    starts = np.flatnonzero(new_row)
    row = np.cumsum(new_row)
    row -= 1
    opened_by_alloc = is_alloc[starts]
    sizes = values["size"][order]
    rounded = rules.blocks(sizes) if rules is not None else sizes.copy()
    opened_at = order[starts]  # the event that opened each row
    req_idx, done_idx = _end_indices(i, kind, addr, starts, row, opened_at)
    # a free that names another size than its alloc: the trace contradicts itself
    opener = starts[row]
    freed = np.flatnonzero(~new_row & (kind != _ALLOC) & (sizes > 0) & is_alloc[opener]
                           & (rounded != rounded[opener]))
    mismatches += [(int(i[p]), f"event {int(i[p])}: free at 0x{int(addr[p]):x} of "
                    f"{int(sizes[p])} bytes, allocated as {int(sizes[opener[p]])}")
                   for p in freed]

    cols = {
        "address": addr[starts],
        "size": rounded[starts],
        "stack_id": np.where(opened_by_alloc, values["stack_id"][opened_at], EMPTY_STACK),
        "stream": values["stream"][opened_at],
        "alloc_idx": np.where(opened_by_alloc, opened_at, -1),
        "free_req_idx": req_idx,
        "free_done_idx": done_idx,
        "requested_size": sizes[starts],
    }
    by_open = _in_order(opened_at, len(events))
    return {k: np.ascontiguousarray(v[by_open], dtype=np.int64) for k, v in cols.items()}, \
        mismatches


def _block_order(every_kind: np.ndarray, addr: np.ndarray) -> np.ndarray:
    """The block events' own positions, sorted by address: events are in index order
    already, so a stable sort keeps it within each address."""
    block = every_kind >= 0
    if block.all():  # (a trace of PyTorch's: segment events are few, when any)
        return np.argsort(addr, kind="stable")
    rows = np.flatnonzero(block)
    return rows[np.argsort(addr[rows], kind="stable")]


def _end_indices(i: np.ndarray, kind: np.ndarray, addr: np.ndarray, starts: np.ndarray,
                 row: np.ndarray, opened_at: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each row's free-request and free-completion event indices (`NEVER`: still open),
    from the events sorted by (address, index): `starts` the first event of each row, `row`
    each event's row."""
    ends = np.empty_like(starts)
    ends[:-1] = starts[1:] - 1
    ends[-1] = len(i) - 1
    completed = kind[ends] == _FREE_DONE  # a completion is always the last event of its row
    req_idx = np.where(completed, i[ends], NEVER)
    done_idx = req_idx.copy()
    # an open row followed by another row at its address was ended by a clashing alloc
    next_same = np.zeros(len(starts), dtype=bool)
    next_same[:-1] = addr[starts[1:]] == addr[starts[:-1]]
    clashed = ~completed & next_same
    done_idx[:-1] = np.where(clashed[:-1], opened_at[1:], done_idx[:-1])
    rpos = np.flatnonzero(kind == _FREE_REQ)
    if len(rpos):
        rrows = row[rpos]
        last = np.ones(len(rpos), dtype=bool)
        last[:-1] = rrows[1:] != rrows[:-1]
        req_idx[rrows[last]] = i[rpos[last]]
    # a row a clashing alloc ended is no longer allocated from then on either: the
    # allocated timeline and the blocks at a moment must count the same rows
    return np.minimum(req_idx, done_idx), done_idx


def _in_order(positions: np.ndarray, n: int) -> np.ndarray:
    """The order that sorts distinct positions in [0, n): `np.argsort(positions)`, by
    marking them and counting, without a sort."""
    marked = np.zeros(n, dtype=bool)
    marked[positions] = True
    rank = np.cumsum(marked)
    out = np.empty(len(positions), dtype=np.int64)
    out[rank[positions] - 1] = np.arange(len(positions))
    return out
