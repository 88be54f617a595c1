"""A family for every block the trace ever held, not only those live at one moment.

Why: the family timeline needs each lifetime's family, and a trace holds hundreds of
thousands of them, so deciding them one by one (as `Attributor.attribute` does for the few
thousand blocks live at a moment) would cost more than the whole report. A decision depends
only on the stack and a small context key (pool kind, default stream, size band, whether an
``alloc`` event exists, the annotation windows open at the allocation, the trace's phase
hint), so the context of every lifetime is computed with array operations, each distinct
(stack, key) is decided once, and the decisions are joined back.

Blocks live at the report's moment keep the family and evidence the report gave them
(`held`): the inference stage and the tensor inventory decide those with evidence about that
moment, and the timeline must agree with the treemap where they meet. Every other lifetime's
evidence follows `Attributor.attribute`: "unknown" when no rule decided it, "frames" when its
stack has frames, else "inferred" (a rule on the pool or the trace's timeline).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import polars as pl

from snapana.analysis.attribution import inference
from snapana.analysis.attribution.assign import Attributor, parse_pool
from snapana.analysis.attribution.carry import CARRIED, SetDecisions, set_methods
from snapana.analysis.attribution.distinct import distinct, distinct_rows
from snapana.analysis.attribution.stack import BlockContext
from snapana.analysis.replay import DeviceReplay


def attribute_lifetimes(attributor: Attributor, dr: DeviceReplay,
                        held: pl.DataFrame | None = None) -> pl.DataFrame:
    """`dr.lifetimes` with `family`, `phase` and `evidence` columns (see the module
    docstring), and `framed`: whether its stack has frames (one alive before the first
    event with frames was allocated while recording, its event lost from the trace)."""
    lt = dr.lifetimes
    n = lt.height
    if n == 0:
        return lt.with_columns(pl.lit("", pl.Utf8).alias("family"),
                               pl.lit("", pl.Utf8).alias("phase"),
                               pl.lit("", pl.Utf8).alias("evidence"),
                               pl.lit(False).alias("framed"))
    capture = attributor.capture
    alloc_idx = lt["alloc_idx"].to_numpy()
    stack_ids = lt["stack_id"].to_numpy()
    ids, _, stack_code = distinct(stack_ids)
    framed = np.array([bool(attributor.stacks.stack(int(s))) for s in ids])[stack_code]
    has_event = alloc_idx >= 0

    ann = np.zeros(n, dtype=np.int64)
    names: list[tuple[str, ...]] = [()]
    clock = attributor.event_times()
    if clock is not None and attributor.windows.windows and len(clock[0]):
        times, timed = clock
        at = np.clip(alloc_idx, 0, len(times) - 1)
        ann, names = attributor.windows.at_many(times[at])
        # windows no rule can tell apart share a key (rules.annotation_key)
        seen: dict[tuple[str | None, ...], int] = {}
        same = np.array([seen.setdefault(attributor.rules.annotation_key(n), i)
                         for i, n in enumerate(names)], dtype=np.int64)
        ann = np.where(has_event & timed[at], same[ann], 0)
    hint = np.zeros(n, dtype=bool)
    frameless = has_event & ~framed
    if capture.has_trace and frameless.any():
        hint[frameless] = attributor.trace_phases().in_backward(alloc_idx[frameless])

    pool_names, pool_code = _pools(dr)
    parts = (stack_code, pool_code, lt["stream"].to_numpy() == 0,
             attributor.rules.size_bands(lt["size"].to_numpy()), has_event, ann, hint)
    first, which = distinct_rows(parts)
    sizes = lt["size"].to_numpy()
    families: list[str | None] = []
    phases: list[str | None] = []
    for row in first:
        d = attributor.decide(int(stack_ids[row]), BlockContext(
            pool_id=parse_pool(pool_names[pool_code[row]]),
            stream=0 if parts[2][row] else 1, size=int(sizes[row]),
            has_alloc_event=bool(has_event[row]) if capture.has_trace else None,
            annotations=names[ann[row]], phase_hint="backward" if hint[row] else None))
        families.append(d.family)
        phases.append(d.phase)
    # each column as an index into its values, so that the blocks held at the moment take
    # theirs by a small join and one write (not a join of every lifetime), and each column
    # is made by one gather
    unknown = np.array([f == "unknown" for f in families], dtype=bool)
    evidences: list[str | None] = ["unknown", "frames", "inferred"]
    codes: dict[str, tuple[np.ndarray, list[str | None]]] = {
        "family": (which, families), "phase": (which.copy(), phases),
        "evidence": (np.where(unknown[which], 0, np.where(framed, 1, 2)), evidences)}
    # a state family's blocks its phase frees in the same run: its working set
    index, values = codes["family"]
    for rows, t in attributor.transient(which, families, alloc_idx,
                                        lt["free_req_idx"].to_numpy()):
        if t.becomes not in values:
            values.append(t.becomes)
        index[rows] = values.index(t.becomes)
    _freed_before(attributor, lt, framed, codes)
    if held is not None and not held.is_empty():
        _take_held(lt, held, codes)
    out = lt.with_columns(
        *(pl.Series(name, values, dtype=pl.Utf8).gather(pl.Series(index, dtype=pl.Int64))
          for name, (index, values) in codes.items()),
        pl.Series("framed", framed, dtype=pl.Boolean))
    # the set families the attributor decided once for the window (`Attributor.set_decisions`)
    window = attributor.set_decisions()
    return out if window is None else _carry(out, window)


def carry_families(lt: pl.DataFrame, decided: Sequence[pl.DataFrame]) -> pl.DataFrame:
    """`lt` (attributed lifetimes) with the families the set methods (`set_methods`) gave
    blocks at the moments `decided` (blocks attributed at a moment, the one shown first)
    carried over to the same allocations, and to every other allocation of the window of the
    same call path and size (the same copy or cache made again in another step), so that a
    block carries one family wherever the report shows it (`carry.SetDecisions`)."""
    found = SetDecisions.of(decided, set_methods())
    return lt if found is None else _carry(lt, found)


def _carry(lt: pl.DataFrame, found: SetDecisions) -> pl.DataFrame:
    """`lt` with the families `found` carries to its allocations, their evidence inferred."""
    out = found.carried(lt)
    if "evidence" in out.columns:
        out = out.with_columns(pl.when(pl.col("_carried_family").is_not_null())
                               .then(pl.lit("inferred")).otherwise("evidence")
                               .alias("evidence"))
    return (out.with_columns(pl.coalesce("_carried_family", "family").alias("family"))
            .drop(*(f"_carried_{c}" for c in CARRIED)))


def _freed_before(attributor: Attributor, lt: pl.DataFrame, framed: np.ndarray,
                  codes: dict[str, tuple[np.ndarray, list[str | None]]]) -> None:
    """Lifetimes alive before the first event, without frames, that no rule decided and
    that the window frees: the stack that frees them says what they were, by the inference
    stage's lifetime methods (`inference.freed_as`: zero_grad frees last step's gradients,
    an optimizer step the state it replaces), as it says for such a block at a moment, so a
    family's bytes before the window do not depend on the moment shown."""
    n = attributor.capture.device_events(attributor.device).height
    index, values = codes["family"]
    freed = lt["free_req_idx"].to_numpy()
    unknown = np.asarray([v == "unknown" for v in values], dtype=bool)[index]
    rows = np.flatnonzero((lt["alloc_idx"].to_numpy() < 0) & ~framed & (freed >= 0)
                          & (freed < n) & unknown)
    if not rows.size:
        return
    how = attributor.freeing_at(freed[rows], lt["size"].to_numpy()[rows])
    evidence_index, evidence = codes["evidence"]
    for row, h in zip(rows.tolist(), how, strict=True):
        method = None if h is None else inference.freed_as(h, window=False)
        if method is None:
            continue
        if method.family not in values:
            values.append(method.family)
        index[row] = values.index(method.family)
        evidence_index[row] = evidence.index("inferred")


def _take_held(lt: pl.DataFrame, held: pl.DataFrame,
               codes: dict[str, tuple[np.ndarray, list[str | None]]]) -> None:
    """Point the lifetimes held at the report's moment (the same address and alloc event as
    a row of `held`, its first) at `held`'s family and phase (and evidence, where it has
    one), appended to `codes`' values; a null in `held` keeps the lifetime's own."""
    kept = [c for c in ("family", "phase", "evidence") if c in held.columns]
    moment = held.select("address", "alloc_idx", *(pl.col(c).alias(f"_held_{c}")
                                                   for c in kept)).unique(
        subset=["address", "alloc_idx"], keep="first", maintain_order=True)
    found = (lt.select("address", "alloc_idx").with_row_index("_row")
             .filter(pl.col("alloc_idx").is_in(moment["alloc_idx"].implode()))
             .join(moment, on=["address", "alloc_idx"], how="inner"))
    rows = found["_row"].to_numpy().astype(np.int64)
    for c in kept:
        value = found[f"_held_{c}"]
        given = value.is_not_null().to_numpy()
        index, values = codes[c]
        index[rows[given]] = len(values) + np.arange(int(given.sum()))
        values.extend(value.filter(pl.Series(given)).to_list())


def _pools(dr: DeviceReplay) -> tuple[list[str], np.ndarray]:
    """Each lifetime's pool, as a code into the returned names: that of the segment holding
    its address when it was allocated (the default pool where no recorded segment does).
    Only segments outside the default pool are looked up, each over the blocks inside its
    address range."""
    lt = dr.lifetimes
    names = ["0,0"]
    codes = np.zeros(lt.height, dtype=np.int64)
    private = dr.segment_intervals.filter(pl.col("pool") != "0,0")
    if private.is_empty():
        return names, codes
    order = np.argsort(lt["address"].to_numpy(), kind="stable")
    addr = lt["address"].to_numpy()[order]
    born = lt["alloc_idx"].to_numpy()[order]
    for a, size, pool, opened, closed in private.select(
            "address", "total_size", "pool", "open_idx", "close_idx").iter_rows():
        if pool not in names:
            names.append(pool)
        lo, hi = np.searchsorted(addr, [a, a + size], side="left")
        inside = order[lo:hi][(born[lo:hi] >= opened) & (born[lo:hi] < closed)]
        codes[inside] = names.index(pool)
    return names, codes
