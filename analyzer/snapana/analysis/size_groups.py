"""What the block sizes of a state say when nothing else does.

A snapshot without allocation history (and often without frames) still holds every live
block's size, and sizes speak: a handful of equal multi-GiB blocks are a batch's activations,
a size that is a power-of-two multiple of another (3264 MiB = 4 × 816 = 8 × 408) is the same
tensor shape at another batch, sequence or head count. This module groups the blocks by size
(N × S = T, so every row adds up) and puts sizes related by such a multiple together, largest
first, so the reader starts from the few tensors that hold the memory.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

#: Only sizes of at least this many bytes are grouped with their multiples: below it equal
#: ratios are coincidence (and the bytes do not matter at an OOM).
MIN_RELATED_SIZE = 1 << 20
#: Ratios that make two sizes "related": the same shape with one dimension doubled or halved,
#: up to 64 times.
RATIOS = tuple(2**k for k in range(1, 7))


@dataclass(frozen=True)
class SizeRow:
    """`count` blocks of `size` bytes each: `count` × `size` = `total`."""

    size: int
    count: int

    @property
    def total(self) -> int:
        return self.size * self.count


@dataclass(frozen=True)
class SizeGroup:
    """Sizes that are power-of-two multiples of the largest one's fraction, largest first
    (a group of one size when no other is related)."""

    rows: tuple[SizeRow, ...]

    @property
    def total(self) -> int:
        return sum(r.total for r in self.rows)

    @property
    def count(self) -> int:
        return sum(r.count for r in self.rows)

    @property
    def largest(self) -> int:
        return self.rows[0].size

    def ratio(self, row: SizeRow) -> int:
        """How many times `row`'s size fits in the group's largest (1 for the largest)."""
        return self.largest // row.size


def size_groups(sizes: Iterable[int]) -> tuple[SizeGroup, ...]:
    """The blocks of `sizes` grouped by size, related sizes together (see the module), the
    groups by total bytes, largest first."""
    counts = Counter(int(s) for s in sizes if s > 0)
    left = sorted(counts, reverse=True)
    taken: set[int] = set()
    groups: list[SizeGroup] = []
    for size in left:
        if size in taken:
            continue
        taken.add(size)
        rows = [SizeRow(size, counts[size])]
        if size >= MIN_RELATED_SIZE:
            for ratio in RATIOS:
                part = size // ratio
                if size % ratio == 0 and part >= MIN_RELATED_SIZE and part in counts \
                        and part not in taken:
                    taken.add(part)
                    rows.append(SizeRow(part, counts[part]))
        groups.append(SizeGroup(tuple(rows)))
    return tuple(sorted(groups, key=lambda g: (-g.total, -g.largest)))
