"""Sorting a trace's integer columns the way their values allow: a column of a million rows
often spans little once its common factor is taken out (lifetimes in events, sizes in 512 B
steps, stack numbers), and `np.unique(..., return_inverse=True)` / a stable `np.argsort`
would sort the million rows with an index beside them, the costliest step of the page's
packing. Over such a span, a table of the range gives the same result with no sort; any
other column takes numpy's own way."""

from __future__ import annotations

import numpy as np

#: A column whose values (less their minimum, over their common factor) span at most this
#: many times its rows, plus `_SLACK` (a table of 4 Mi entries: 20 MB at most), is indexed
#: by a table of that range.
_SPAN = 4
_SLACK = 1 << 22
#: Rows whose common factor is tried first (`_factor`).
_GUESS = 1024
#: Codes that fit 16 bits sort by radix (`np.argsort(kind="stable")` on uint16).
_RADIX = 1 << 16


def _factor(offset: np.ndarray) -> int:
    """The common factor of the non-negative `offset` (0 at its minimum), where the first
    rows' one divides them all; else 1 (a table is then tried over the whole span)."""
    head = offset[:_GUESS]
    g = int(np.gcd.reduce(head[head > 0])) if head.any() else 0
    if g <= 1 or (offset % g).any():
        return 1
    return g


def _table(v: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """`unique_inverse` by a table of the values' range, or None where it spans too much."""
    low, high = int(v.min()), int(v.max())
    limit = _SPAN * v.size + _SLACK
    if high - low >= 1 << 62:  # (the offsets would pass int64)
        return None
    offset = v - low if low else v
    step = 1
    if high - low > limit:
        step = _factor(offset)
        if (high - low) // step > limit:
            return None
        offset = offset // step
    present = np.zeros((high - low) // step + 1, dtype=bool)
    present[offset] = True
    rank = np.cumsum(present, dtype=np.int32 if present.size < 1 << 31 else np.int64)
    rank -= 1
    distinct = np.flatnonzero(present)
    if step > 1:
        distinct *= step
    return (distinct + low).astype(v.dtype), rank[offset].astype(np.intp)


def _fits(v: np.ndarray) -> bool:
    """A 1-D array of integers that int64 holds."""
    return v.ndim == 1 and (v.dtype.kind == "i" or v.dtype.kind == "u" and v.dtype.itemsize < 8)


def unique_inverse(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`np.unique(values, return_inverse=True)` of a 1-D integer array: its distinct values
    in order and each row's index into them."""
    v = np.asarray(values)
    if v.size and _fits(v):
        got = _table(v.astype(np.int64, copy=False))
        if got is not None:
            return got[0].astype(v.dtype, copy=False), got[1]
    return np.unique(v, return_inverse=True)


def stable_order(keys: np.ndarray) -> np.ndarray:
    """`np.argsort(keys, kind="stable")` of a 1-D integer array: where its values span little
    and are few, a radix sort of their 16-bit codes (the same order: codes keep the
    values')."""
    k = np.asarray(keys)
    # (keys in order already: numpy's own sort, which takes them in one run)
    if k.size >= _RADIX and _fits(k) and not (k[1:] >= k[:-1]).all():
        got = _table(k.astype(np.int64, copy=False))
        if got is not None and got[0].size <= _RADIX:
            return np.argsort(got[1].astype(np.uint16), kind="stable")
    return np.argsort(k, kind="stable")
