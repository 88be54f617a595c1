"""Group blocks that one allocation site made repeatedly (a loop over chunks or layers).

Why: chunking the log-prob softmax lowers the transient peak but every chunk is saved for
backward, so eight 486 MiB blocks from one line are really one 3.80 GiB tensor. Reports
must show the group ("8 x 486.00 MiB = 3.80 GiB from one site"), not eight unrelated small
blocks. This module returns the numbers only; renderers format them.

Only a loop's outputs are such copies: the families the vocabulary marks `loop`. Per-layer
model state (parameters, gradients, optimizer state, buffers) and an engine's per-layer KV
cache are many blocks from one site too, but they are the model, not a loop that keeps what
it should have dropped.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Iterable
from dataclasses import dataclass

AttributedBlock = tuple[Hashable, str, int, int]
"""(site_key, family, size, alloc_order): ``site_key`` identifies the allocation site (for
example the interned stack id); ``alloc_order`` is any increasing allocation sequence
number (trace index or time)."""


@dataclass(frozen=True)
class ChunkGroup:
    """Blocks of one site and family, counted as one logical tensor. Sizes in bytes."""

    site_key: Hashable
    family: str
    count: int
    chunk_size: int
    """The most common block size (the last chunk of a loop is often smaller)."""
    total: int
    """Sum of the blocks: the implied full tensor (what is kept, e.g. saved for backward)."""
    min_size: int
    max_size: int
    first_order: int
    last_order: int

    @property
    def uniform(self) -> bool:
        """All chunks have the same size."""
        return self.min_size == self.max_size


def chunk_groups(
    blocks: Iterable[AttributedBlock],
    *,
    min_count: int = 2,
    max_order_gap: int | None = None,
) -> list[ChunkGroup]:
    """Group same-site, same-family blocks; largest ``total`` first.

    ``min_count``: groups with fewer blocks are dropped (a single block is not a chunk
    loop). ``max_order_gap``: when set, a site's blocks are split into separate groups
    wherever consecutive ``alloc_order`` values differ by more than this — e.g. two
    micro-batches that each ran the same chunk loop.
    """
    by_site: dict[tuple[Hashable, str], list[tuple[int, int]]] = {}
    for site, family, size, order in blocks:
        by_site.setdefault((site, family), []).append((order, size))
    groups: list[ChunkGroup] = []
    for (site, family), items in by_site.items():
        items.sort()
        runs: list[list[tuple[int, int]]] = [[items[0]]]
        for prev, cur in zip(items, items[1:], strict=False):
            if max_order_gap is not None and cur[0] - prev[0] > max_order_gap:
                runs.append([])
            runs[-1].append(cur)
        for run in runs:
            if len(run) < min_count:
                continue
            sizes = [s for _, s in run]
            counts = Counter(sizes)
            # most common size; on a tie, the larger (a full chunk rather than the tail)
            chunk = max(counts.items(), key=lambda kv: (kv[1], kv[0]))[0]
            groups.append(
                ChunkGroup(
                    site_key=site,
                    family=family,
                    count=len(run),
                    chunk_size=chunk,
                    total=sum(sizes),
                    min_size=min(sizes),
                    max_size=max(sizes),
                    first_order=run[0][0],
                    last_order=run[-1][0],
                )
            )
    groups.sort(key=lambda g: (-g.total, str(g.family), g.first_order))
    return groups
