"""Before vs after: what a fix changed, family by family and site by site.

Each side is taken at its own moment of interest (the OOM, else the peak), which is the
honest comparison for "did `--recompute-loss-function` fix it": the crashed run at its crash
against the fixed run at its worst. Numbers only (ints); the diff view-model and renderers
(`render/views.py`, one module per format) word and format them.
Everything comes from two DeviceReports, so any two sources with families can be compared;
the diff keeps them (`reports`) for the views that draw each side's family timeline.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import PurePath
from typing import Literal

from snapana.analysis.diagnosis.findings import DeviceReport
from snapana.analysis.family_timeline import FamilyGrowth
from snapana.analysis.replay import MomentKind

#: A family's growth over the trace differs notably between the sides when its growth
#: (start to moment) or the most it held differ by this share of the larger side's
#: allocated bytes.
GROWTH_SHARE = 0.005
GROWTH_CHANGES = 5  # families whose growth the diff names, at most

#: How one family or site changed from before to after.
ChangeStatus = Literal["new", "vanished", "changed", "same"]
#: a family or site whose bytes did not change between the two captures
SAME: ChangeStatus = "same"


class _Change:
    """What a family change and a site change share: the byte delta and its status."""

    before_bytes: int
    after_bytes: int
    before_blocks: int
    after_blocks: int

    @property
    def change_bytes(self) -> int:
        return self.after_bytes - self.before_bytes

    @property
    def status(self) -> ChangeStatus:
        """'new', 'vanished', 'changed' or 'same'."""
        if self.before_blocks == 0 and self.after_blocks > 0:
            return "new"
        if self.after_blocks == 0 and self.before_blocks > 0:
            return "vanished"
        same = (self.before_bytes == self.after_bytes
                and self.before_blocks == self.after_blocks)
        return "same" if same else "changed"


@dataclass(frozen=True)
class FamilyChange(_Change):
    """Bytes and blocks one family held at each side's moment of interest."""

    family: str
    label: str
    before_bytes: int
    after_bytes: int
    before_blocks: int
    after_blocks: int


@dataclass(frozen=True)
class SiteChange(_Change):
    """One (family, site) pair: a site whose tensors changed family (a softmax saved before,
    recomputed after) shows as one pair vanishing and another appearing."""

    family: str
    site: str
    before_bytes: int
    after_bytes: int
    before_blocks: int
    after_blocks: int
    before_chunks: int = 0  # blocks in chunk loops (one site, many equal blocks)
    after_chunks: int = 0


@dataclass(frozen=True)
class GrowthChange:
    """One family's growth over each side's recorded trace, from before the first event to
    the side's moment (`FamilyTimeline.growth`); None: the side's trace never held it."""

    family: str
    before: FamilyGrowth | None
    after: FamilyGrowth | None

    @property
    def change_bytes(self) -> int:
        """How much more the family grew after than before."""
        return _grown(self.after) - _grown(self.before)

    @property
    def max_change_bytes(self) -> int:
        """How much more the family held at its most after than before."""
        return _most(self.after) - _most(self.before)

    @property
    def score(self) -> int:
        """How much the two sides' growths differ: the larger of the two changes."""
        return max(abs(self.change_bytes), abs(self.max_change_bytes))


def _grown(g: FamilyGrowth | None) -> int:
    return 0 if g is None else g.moment_bytes - g.start_bytes


def _most(g: FamilyGrowth | None) -> int:
    return 0 if g is None else g.max_bytes


@dataclass(frozen=True)
class Side:
    """What is known about one capture, at its moment of interest."""

    path: str
    source: str
    device: int
    moment_kind: MomentKind
    moment_idx: int
    has_oom: bool
    request_bytes: int | None  # the failed request, when there was an OOM
    peak_allocated_bytes: int
    allocated_bytes: int
    reserved_bytes: int
    history: bool = False  # the trace records allocations: a family timeline exists

    @classmethod
    def of(cls, r: DeviceReport) -> Side:
        return cls(r.path, r.source, r.device, r.diagnosis.kind, r.moment.idx,
                   r.oom is not None, None if r.oom is None else r.oom.requested_bytes,
                   r.peak_allocated_bytes, r.allocated_bytes, r.reserved_bytes,
                   has_history(r))


def has_history(r: DeviceReport) -> bool:
    """Whether the report has a family timeline (its trace records allocations)."""
    return r.diagnosis.history and r.timeline.families is not None


@dataclass(frozen=True)
class CaptureDiff:
    before: Side
    after: Side
    families: tuple[FamilyChange, ...] = ()  # largest change first
    sites: tuple[SiteChange, ...] = ()
    #: the families whose growth over the trace differs most (both sides with history)
    growth: tuple[GrowthChange, ...] = ()
    #: the two reports compared, for the views that draw each side (not compared)
    reports: tuple[DeviceReport, DeviceReport] | None = field(
        default=None, repr=False, compare=False)

    @property
    def peak_change_bytes(self) -> int:
        return self.after.peak_allocated_bytes - self.before.peak_allocated_bytes

    def __repr__(self) -> str:
        """One line: the two captures and how the peak moved."""
        before, after = PurePath(self.before.path).name, PurePath(self.after.path).name
        return (f"<snapana CaptureDiff {before!r} -> {after!r}: peak "
                f"allocated {self.peak_change_bytes:+,} bytes, {len(self.families)} "
                "families changed>")

    @property
    def allocated_change_bytes(self) -> int:
        return self.after.allocated_bytes - self.before.allocated_bytes

    @property
    def reserved_change_bytes(self) -> int:
        return self.after.reserved_bytes - self.before.reserved_bytes

    @property
    def new_sites(self) -> tuple[SiteChange, ...]:
        return tuple(s for s in self.sites if s.status == "new")

    @property
    def vanished_sites(self) -> tuple[SiteChange, ...]:
        return tuple(s for s in self.sites if s.status == "vanished")

    @property
    def oom_gone(self) -> bool:
        return self.before.has_oom and not self.after.has_oom

    def family(self, name: str) -> FamilyChange | None:
        return next((f for f in self.families if f.family == name), None)

    @property
    def is_empty(self) -> bool:
        """Nothing changed: same families and sites, same bytes, same peak and totals."""
        return (all(f.status == "same" for f in self.families)
                and all(s.status == "same" for s in self.sites)
                and self.peak_change_bytes == 0 and self.allocated_change_bytes == 0
                and self.reserved_change_bytes == 0
                and self.before.has_oom == self.after.has_oom)


def _by_change(change: int, name: str) -> tuple[int, str]:
    return (-abs(change), name)


def diff_reports(before: DeviceReport, after: DeviceReport) -> CaptureDiff:
    """Compare two device reports at their moments of interest."""
    fb = {g.name: g for g in before.groups}
    fa = {g.name: g for g in after.groups}
    families = []
    for name in dict.fromkeys([*fb, *fa]):
        b, a = fb.get(name), fa.get(name)
        label = (fb.get(name) or fa[name]).label
        families.append(FamilyChange(
            name, label, b.bytes if b else 0, a.bytes if a else 0, b.blocks if b else 0,
            a.blocks if a else 0))
    families.sort(key=lambda c: _by_change(c.change_bytes, c.family))
    sb, sa = _sites(before), _sites(after)
    sites = []
    for key in dict.fromkeys([*sb, *sa]):
        b_bytes, b_blocks, b_chunks = sb.get(key, (0, 0, 0))
        a_bytes, a_blocks, a_chunks = sa.get(key, (0, 0, 0))
        sites.append(SiteChange(key[0], key[1], b_bytes, a_bytes, b_blocks, a_blocks,
                                b_chunks, a_chunks))
    sites.sort(key=lambda c: _by_change(c.change_bytes, f"{c.family}\0{c.site}"))
    return CaptureDiff(Side.of(before), Side.of(after), tuple(families), tuple(sites),
                       _growth(before, after), (before, after))


def _growth(before: DeviceReport, after: DeviceReport) -> tuple[GrowthChange, ...]:
    """The `GROWTH_CHANGES` families whose growth from the start of the trace to the moment
    (or the most they held on the way) differs most between the sides, when by at least
    `GROWTH_SHARE` of the larger side's allocated bytes (none unless both sides have
    history)."""
    if not (has_history(before) and has_history(after)):
        return ()
    gb, ga = _growths(before), _growths(after)
    floor = GROWTH_SHARE * max(before.allocated_bytes, after.allocated_bytes, 1)
    changes = [GrowthChange(f, gb.get(f), ga.get(f)) for f in dict.fromkeys([*gb, *ga])]
    changes = [c for c in changes if c.score >= floor]
    changes.sort(key=lambda c: _by_change(c.score, c.family))
    return tuple(changes[:GROWTH_CHANGES])


def _growths(r: DeviceReport) -> dict[str, FamilyGrowth]:
    t = r.timeline
    assert t.families is not None
    return {g.family: g for g in t.families.growth(r.moment.idx, t.peak_idx)}


def _sites(r: DeviceReport) -> dict[tuple[str, str], tuple[int, int, int]]:
    out = {}
    for g in r.groups:
        chunks: dict[str, int] = {}
        for c in g.chunks:
            chunks[c["site"]] = chunks.get(c["site"], 0) + c["count"]
        for s in g.sites:
            site = str(s["site"])
            out[(g.name, site)] = (s["bytes"], s["blocks"], chunks.get(site, 0))
    return out
