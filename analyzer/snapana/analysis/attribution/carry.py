"""One decision per allocation for the families decided among blocks held together.

Why: autocast's weight copies, a forward's returned K/V pairs and hand-written state are
named by the set of blocks live at a moment (their sizes beside the weights', a per-layer
pattern, a count per gradient), which one allocation's lifetime cannot show. Asked afresh at
every event, the same allocation could be a copy at one event and an activation at the next
(a crowd of same-size activations hides the copies at the peak and is gone by the backward),
so the timeline, the explorer's table and `Analysis.at` could not agree. The set methods are
therefore run at a few decision moments of the window; an allocation any of them names keeps
that name (the first such) wherever it is shown, and an allocation none of them saw takes the
name given to the same call path and size (the same copy or cache made again in another
step). Every other allocation keeps its own family.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import polars as pl

from snapana.analysis.attribution import hand_state, kept_outputs, kv_pairs, weight_copies

#: the columns a carried decision brings (null where nothing is carried)
CARRIED = ("family", "label", "reason", "method")


def set_methods() -> frozenset[str]:
    """The inference methods that decide a block among the blocks held together at a moment
    (their sizes beside the weights', a per-layer pattern, a count per gradient), which one
    allocation's lifetime cannot show: autocast's weight copies, a forward's returned K/V
    pairs, a forward's outputs the program keeps with no graph, hand-written parameters
    (re-bound ones too) and optimizer state."""
    hand = hand_state.spec()
    return frozenset({weight_copies.spec().method, kv_pairs.spec().method,
                      kv_pairs.spec().fused.method,
                      kept_outputs.spec().method,
                      hand.param_method, hand.state_method, hand.rebound_method})


@dataclass(frozen=True)
class SetDecisions:
    """What the decision moments said: each allocation seen there, with the set family the
    first moment that named it gave (null: none did), and each named call path's family."""

    by_key: pl.DataFrame  # alloc_idx, address, _seen, then `CARRIED` as _c_*
    by_path: pl.DataFrame  # stack_id, _req, then `CARRIED` as _p_*

    @staticmethod
    def of(decided: Sequence[pl.DataFrame], methods: frozenset[str]) -> SetDecisions | None:
        """From blocks attributed at the decision moments (with `method`), in order; None
        when no set method named anything."""
        cols = [c for c in CARRIED if c != "family"]
        frames = [d.select("alloc_idx", "address", "stack_id",
                           pl.coalesce("requested_size", "size").alias("_req"), "family",
                           *(pl.col(c) if c in d.columns else pl.lit(None, pl.Utf8).alias(c)
                             for c in cols),
                           pl.col("method").is_in(list(methods)).alias("_set"))
                  for d in decided if "method" in d.columns]
        if not frames:
            return None
        seen = pl.concat(frames)
        found = seen.filter("_set")
        if found.is_empty():
            return None
        named = found.unique(["alloc_idx", "address"], keep="first", maintain_order=True)
        by_key = (seen.select("alloc_idx", "address").unique(maintain_order=True)
                  .join(named.select("alloc_idx", "address",
                                     *(pl.col(c).alias(f"_c_{c}") for c in CARRIED)),
                        on=["alloc_idx", "address"], how="left")
                  .with_columns(pl.lit(True).alias("_seen")))
        by_path = (found.filter(pl.col("alloc_idx") >= 0)
                   .unique(["stack_id", "_req"], keep="first", maintain_order=True)
                   .select("stack_id", "_req", *(pl.col(c).alias(f"_p_{c}") for c in CARRIED)))
        return SetDecisions(by_key, by_path)

    def carried(self, frame: pl.DataFrame) -> pl.DataFrame:
        """`frame` (blocks or lifetimes: alloc_idx, address, stack_id, size, requested_size)
        with one `_carried_<column>` per `CARRIED`: the decision its allocation got at a
        decision moment, else (never seen there, allocated in the window) its call path's,
        else null."""
        out = (frame.with_columns(pl.coalesce("requested_size", "size").alias("_req"))
               .join(self.by_key, on=["alloc_idx", "address"], how="left",
                     maintain_order="left")
               .join(self.by_path, on=["stack_id", "_req"], how="left", maintain_order="left"))
        path_ok = pl.col("_seen").is_null() & (pl.col("alloc_idx") >= 0)
        return out.with_columns(
            pl.when(pl.col("_seen")).then(f"_c_{c}").when(path_ok).then(f"_p_{c}")
            .otherwise(None).alias(f"_carried_{c}") for c in CARRIED
        ).drop("_req", "_seen", *(f"_c_{c}" for c in CARRIED), *(f"_p_{c}" for c in CARRIED))
