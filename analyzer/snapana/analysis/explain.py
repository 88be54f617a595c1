"""Why did a block get its family? The decision, the frames it matched, the near misses."""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from snapana.analysis.attribution.assign import Attributor
from snapana.analysis.attribution.engine import Explanation
from snapana.errors import InputError
from snapana.model import Capture, Frame
from snapana.units import fmt_bytes

#: how a block's family was decided: the recording's tensor inventory named it, or the
#: inference stage did (no stack rule)
INVENTORY, INFERRED = "inventory", "inferred"


@dataclass
class ExplainedSite:
    """One distinct (stack, context) among the selected blocks: many blocks share it."""

    site: str
    blocks: int
    bytes: int
    addresses: list[int]
    stack: tuple[Frame, ...]
    explanation: Explanation
    family: str = "unknown"  # the family the blocks got, after the inference stage
    evidence: str = "unknown"  # INVENTORY | "frames" | INFERRED | "unknown"
    method: str = ""  # with "inferred": how (e.g. size-mirror:gradients)
    why: str = ""  # the evidence in words

    def __repr__(self) -> str:
        """One line: what and where (not the rule's regexes and the frames)."""
        decided = self.explanation.decision.rule_id or self.method or self.evidence
        return (f"<snapana ExplainedSite {self.family}: {fmt_bytes(self.bytes)} in "
                f"{self.blocks} block(s) at {self.site[:80]} ({decided})>")


def explain(capture: Capture, attributor: Attributor, live: pl.DataFrame, when: str, *,
            block: int | None = None, family: str | None = None, site: str | None = None,
            limit: int = 10) -> list[ExplainedSite]:
    """Explain the attributed live blocks `live` (at the moment `when` names) that match the
    selection, one entry per distinct stack and context, largest first. Without a selection,
    all live blocks (the `limit` largest groups; none live: an empty list)."""
    if block is not None:
        sel = live.filter((pl.col("address") <= block)
                          & (pl.col("address") + pl.col("size") > block))
        what = f"no live block contains address 0x{block:x}"
    elif family is not None:
        sel = live.filter(pl.col("family") == family)
        what = f"no live block has family {family!r}"
    elif site is not None:
        sel = live.filter(pl.col("site").str.contains(site, literal=True))
        what = f"no live block's site contains {site!r}"
    else:
        sel, what = live, ""
    if sel.is_empty() and what:
        raise InputError(f"{capture.path}: {what} {when}")
    out = []
    groups = (
        sel.group_by("stack_id", "pool", "state", "family", "evidence", "method")
        .agg(pl.len().alias("n"), pl.col("size").sum().alias("bytes"),
             pl.col("address").alias("addresses"), pl.col("size").max().alias("size"),
             pl.col("alloc_idx").min().alias("alloc_idx"),
             pl.col("segment_stream").first().alias("stream"), pl.col("site").first(),
             pl.col("reason").first())
        .sort(["bytes", "stack_id", "pool", "state", "family", "evidence", "method"],
              descending=[True, False, False, False, False, False, False])  # a total order
        .head(limit)
    )
    for row in groups.iter_rows(named=True):
        ctx = attributor.context(row["stack_id"], row["pool"], row["stream"] or 0,
                                 row["state"], row["size"], row["alloc_idx"])
        stack = capture.stacks.stack(row["stack_id"])
        out.append(ExplainedSite(row["site"], row["n"], row["bytes"],
                                 sorted(row["addresses"])[:5], stack,
                                 attributor.rules.explain(stack, ctx), row["family"],
                                 row["evidence"], row["method"], row["reason"]))
    return out
