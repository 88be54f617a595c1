"""Why an OOM message's allocation failed, from its own figures (issues 44, 57).

The message holds the request, the device's capacity and free bytes, what PyTorch's
allocator held (allocated, and reserved but unallocated) and, since 2.2, what this process
held in all. From those alone the device's memory splits into free + PyTorch's reserved +
the rest (this process's memory outside PyTorch's allocator, other processes, the driver).

Causes are counterfactual (DESIGN.md, "one evidence model"): the request did not fit by its
shortfall (request − free); each cause says what would have had to be different, in bytes,
for it to fit, and a cause leads only if that change alone covers the shortfall. The idle
cache (reserved but unallocated) is the exception: what it holds is not free to the device,
so it speaks only where it is at least the request (one free block of it would have served
the request: fragmentation). Where no cause alone covers the shortfall, the live tensors
(demand) lead and the others follow as contributors with their share of it. A figure the
text lacks (a paste cut mid-clause) leaves the causes it decides open, and says so. Nothing
the message does not print is assumed: the largest free cached block is never in it.

All of that is one table per message (`Counterfactuals`, issue 69): each holder's bytes and
whether removing it alone covers the shortfall, computed once. The lead, the holders 'also
enough alone', the shares and the knobs' order read it, and so do the sentences (`covers`),
so no sentence can say a holder alone held that much while another says none did.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from snapana.analysis.diagnosis.causes import (
    CardFull,
    Cause,
    Demand,
    Fragmentation,
    HeldElsewhere,
    OtherLimit,
    OtherProcesses,
    OutsidePytorch,
    OwnOutside,
    Role,
    SizeBug,
    Spill,
    Undecided,
)
from snapana.log_model import OomMessage
from snapana.sources.oom_text import CLAUSES, EXPANDABLE_WORDINGS

#: The names of the split's terms renderers look up.
OUTSIDE = "outside PyTorch's allocator"
OTHERS = "other processes (the message's process lines)"
OWN_OUTSIDE = "this process outside PyTorch's allocator"
ELSEWHERE = "other processes and the driver"

#: cudaMemGetInfo's free counts memory a new allocation cannot take (the driver's page
#: tables and reserve); a request that is larger than what is free by no more than this
#: share of the card, yet failed, met a full card rather than another limit.
FULL_CARD_SHARE = 0.01

#: Memory outside PyTorch's allocator, not split by process, from this share of the card on
#: is something else holding the GPU (another process, a colocated engine): a CUDA context
#: and its libraries take a few hundred MiB to a few GiB, never half a card (issue 69).
ELSEWHERE_SHARE = 0.5

#: The order in which causes that each alone cover the shortfall lead: what the figures
#: show to be the story first (half the card or more held outside this process's cache, a
#: cache with the bytes, another process), then the live tensors, and only last this
#: process's memory outside the cache (mostly its CUDA context, which no setting removes) and
#: the outside memory not split by process. Other processes that hold half the card or more
#: (`ELSEWHERE_SHARE`) are weighed before all of them, as the unsplit `HeldElsewhere` is
#: (`Holder.first`). (Decisive causes, `Cause.weight`, come first.)
LEAD_ORDER: tuple[type[Cause], ...] = (HeldElsewhere, Fragmentation, OtherProcesses, Demand,
                                       OwnOutside, OutsidePytorch)

#: Each clause's meaning in a few words, for a sentence naming a missing figure.
CLAUSE_WORDS = {k: v[1].split(" (")[0].split(":")[0] for k, v in CLAUSES.items()} | {
    "unallocated": "reserved by PyTorch but unallocated", "allocated": "allocated by PyTorch",
    "this_process": "this process has ... memory in use", "request": "Tried to allocate",
    "capacity": "total capacity ... is free"}

#: Which figure each counterfactual cause needs (a message clause, named as CLAUSES does).
NEEDS: dict[type[Cause], tuple[str, ...]] = {
    Fragmentation: ("unallocated",), OtherProcesses: ("this_process",), Demand: ("allocated",),
    OwnOutside: ("this_process", "unallocated"), OutsidePytorch: ("unallocated",),
    HeldElsewhere: ("unallocated",)}


def _c(kind: type[Cause], terms: tuple[tuple[str, int], ...], role: Role = "lead",
       needed: int | None = None) -> Cause:
    """A cause as a log's message shows it."""
    return kind(terms=terms, role=role, needed=needed, log=True)


@dataclass(frozen=True)
class TextDiagnosis:
    """An OOM message's figures and what they say."""

    message: OomMessage
    #: the device's memory, split: (what, bytes), adding up to the capacity where it is known
    split: tuple[tuple[str, int], ...]
    #: the lead cause first, then contributors and causes left open
    causes: tuple[Cause, ...]
    #: PYTORCH_CUDA_ALLOC_CONF / environment knobs the causes support, each with its reason
    knobs: tuple[tuple[str, str], ...]
    #: bytes the allocator would have asked the device for (the request's segment)
    segment: int | None
    #: request − free: what the device lacked (None: a figure is missing)
    shortfall: int | None = None
    #: message clauses the causes needed and the text does not hold (a cut paste)
    missing: tuple[str, ...] = ()
    #: the holders and what removing each alone would have done (None: a decisive cause,
    #: or the request or free figure missing)
    table: Counterfactuals | None = None

    @property
    def lead(self) -> Cause | None:
        return self.causes[0] if self.causes else None

    def covers(self, kind: type[Cause]) -> bool:
        """Removing that holder alone would have let the request fit (its table row)."""
        return self.table is not None and self.table.covers(kind)

    @property
    def missing_words(self) -> tuple[str, ...]:
        """The missing clauses, each in a few words (`CLAUSE_WORDS`)."""
        return tuple(CLAUSE_WORDS.get(k, k) for k in self.missing)


def _bytes(s: object) -> int | None:
    return getattr(s, "bytes", None)


def diagnose(m: OomMessage) -> TextDiagnosis:
    req, cap, free = _bytes(m.request), _bytes(m.capacity), _bytes(m.free)
    reserved, allocated = _bytes(m.reserved), _bytes(m.allocated)
    cached = _bytes(m.unallocated) if m.unallocated is not None else (
        reserved - allocated if reserved is not None and allocated is not None else None)
    own = _bytes(m.this_process) or None  # 0: the driver could not see this process
    split = _split(cap, free, reserved, own)
    shortfall = req - free if req is not None and free is not None else None
    decisive = _decisive(m, req, cap, free, reserved)
    if decisive:
        causes = decisive + _holders(m, allocated, cached, own, reserved, cap, free)
        return TextDiagnosis(m, split, tuple(causes), _knobs(m, causes, None), req, shortfall)
    table, missing = _table(m, req, shortfall, allocated, cached, own, reserved, cap, free)
    causes = _ranked(table)
    return TextDiagnosis(m, split, tuple(causes), _knobs(m, causes, table), req, shortfall,
                         missing, table)


def _split(cap: int | None, free: int | None, reserved: int | None, own: int | None
           ) -> tuple[tuple[str, int], ...]:
    if cap is None or free is None or reserved is None:
        return ()
    if own:  # this process's figure splits the rest
        return (("free", free), ("reserved by PyTorch", reserved),
                (OWN_OUTSIDE, own - reserved), (ELSEWHERE, cap - free - own))
    return (("free", free), ("reserved by PyTorch", reserved), (OUTSIDE, cap - free - reserved))


def _decisive(m: OomMessage, req: int | None, cap: int | None, free: int | None,
              reserved: int | None) -> list[Cause]:
    """Causes no counterfactual about the card's other holders can change: a request larger
    than the card, figures that are not the card's, a limit other than the card's memory,
    a card full to within its last percent."""
    out: list[Cause] = []
    if m.exabyte:
        out.append(_c(SizeBug, (("request", 1 << 60), ("capacity", cap or 0))))
    if req is not None and cap is not None and req > cap + m.capacity.slack:  # type: ignore[union-attr]
        out.append(_c(SizeBug, (("request", req), ("capacity", cap))))
    if m.allocated is not None and cap is not None and m.allocated.bytes > cap:
        out.append(_c(Spill, (("allocated", m.allocated.bytes), ("capacity", cap))))
    if m.wording == "2.12+ fraction" and req is not None:
        out.append(_c(OtherLimit, (("request", req),)))
    if m.allowed is not None and reserved is not None and req is not None:
        out.append(_c(OtherLimit, (("allowed", m.allowed.bytes),
                                             ("reserved", reserved), ("request", req))))
    if out or req is None or free is None or m.allowed is not None:
        return out
    slack = m.request.slack + m.free.slack  # type: ignore[union-attr]
    if req <= free + slack:  # the figures say it fits, yet it failed
        margin = int(FULL_CARD_SHARE * cap) if cap else 0
        if cap is not None and free - req <= max(margin, slack):
            out.append(_c(CardFull, (("free", free), ("request", req),
                                               ("capacity", cap), ("within", margin))))
        else:
            out.append(_c(OtherLimit, (("segment asked for", req), ("free", free))))
    return out


def _holders(m: OomMessage, allocated: int | None, cached: int | None, own: int | None,
             reserved: int | None, cap: int | None, free: int | None) -> list[Cause]:
    """Beside a decisive cause: what held the card, as contributors without a share."""
    out = []
    if allocated is not None:
        out.append(_c(Demand, (("allocated by PyTorch", allocated),), "contributor"))
    if cached:
        out.append(_c(Fragmentation, (("cached but unallocated", cached),),
                             "contributor"))
    if own and reserved is not None and cap is not None and free is not None:
        if cap - free - own > 0:
            out.append(_c(OtherProcesses, ((OTHERS, cap - free - own),),
                                 "contributor"))
    return out


@dataclass(frozen=True)
class Holder:
    """One row of a message's counterfactual table: one holder of the card, the bytes it
    held (as its cause, role "lead"), and whether removing it alone would have let the
    request fit. `cause` None: a figure it needs is missing (the row is open)."""

    kind: type[Cause]
    cause: Cause | None
    #: removing it alone would have let the request fit (the idle cache: one free block of
    #: it would have served the request, so it must be at least the request)
    covers: bool = False
    #: outside this process and most of the card (`ELSEWHERE_SHARE`): weighed first
    first: bool = False

    @property
    def rank(self) -> tuple[int, int]:
        """Its place in the order holders are weighed in (`LEAD_ORDER`, most of the card
        outside this process first)."""
        return (0 if self.first else 1, LEAD_ORDER.index(self.kind))


@dataclass(frozen=True)
class Counterfactuals:
    """A message's counterfactual table (issue 69), computed once: every holder of the card
    the figures show, in the message's order. The lead, the causes 'also enough alone', the
    shares and the knobs all read it, so no two sentences made from it can disagree."""

    request: int
    shortfall: int
    rows: tuple[Holder, ...]

    @property
    def weighed(self) -> tuple[Holder, ...]:
        return tuple(sorted(self.rows, key=lambda h: h.rank))

    @property
    def lead(self) -> Holder | None:
        """The first decided holder, in the order they are weighed, that alone covers the
        shortfall (None: none does)."""
        return next((h for h in self.weighed if h.cause is not None and h.covers), None)

    @property
    def open(self) -> tuple[Holder, ...]:
        """Open holders weighed before the lead (all of them where none covers): a missing
        figure may say one of them leads."""
        lead = self.lead
        return tuple(h for h in self.weighed if h.cause is None
                     and (lead is None or h.rank < lead.rank))

    def covers(self, kind: type[Cause]) -> bool:
        return any(h.kind is kind and h.covers for h in self.rows)

    def share(self, h: Holder) -> float | None:
        """The share of the shortfall the holder's bytes are (capped at all of it)."""
        if h.cause is None or h.cause.held <= 0 or self.shortfall <= 0:
            return None
        return min(h.cause.held, self.shortfall) / self.shortfall


def _table(m: OomMessage, req: int | None, shortfall: int | None,
           allocated: int | None, cached: int | None, own: int | None,
           reserved: int | None, cap: int | None, free: int | None
           ) -> tuple[Counterfactuals | None, tuple[str, ...]]:
    """Each holder with the bytes it held and whether removing it alone would have covered
    the shortfall; None where the request or the free figure is missing. And the clauses the
    open rows need that the text lacks."""
    if req is None or shortfall is None:
        return None, tuple(k for k in ("request", "capacity") if getattr(m, k) is None)
    have = {"unallocated": cached is not None, "this_process": own is not None,
            "allocated": allocated is not None}
    rows: list[Holder] = []

    def row(kind: type[Cause], terms: tuple[tuple[str, int], ...] | None, covers: bool,
            needed: int | None = shortfall, first: bool = False) -> None:
        cause = _c(kind, terms, needed=needed) if terms is not None else None
        rows.append(Holder(kind, cause, covers and cause is not None, first))

    if cached is None:
        row(Fragmentation, None, False)
    elif cached:
        row(Fragmentation, (("cached but unallocated", cached), ("request", req)),
            cached >= req, needed=req if cached >= req else None)
    if own is not None and cap is not None and free is not None:
        listed = _other_processes(m)
        others = cap - free - own if listed is None else listed
        rounding = sum(s.slack for s in (m.capacity, m.free, m.this_process) if s is not None)
        if others > rounding:  # (less is the printed figures' rounding)
            row(OtherProcesses, ((OTHERS if listed is not None else ELSEWHERE, others),
                                 ("shortfall", shortfall)), others >= shortfall,
                first=others >= ELSEWHERE_SHARE * cap)
    if allocated is None:
        row(Demand, None, False)
    else:
        row(Demand, (("allocated by PyTorch", allocated), ("shortfall", shortfall)),
            allocated >= shortfall)
    if own is not None:
        if reserved is None:
            row(OwnOutside, None, False)
        elif own - reserved > 0:
            row(OwnOutside, ((OWN_OUTSIDE, own - reserved), ("this process", own),
                             ("reserved", reserved), ("shortfall", shortfall)),
                own - reserved >= shortfall)
    elif cap is not None and free is not None:
        outside = cap - free - reserved if reserved is not None else 0
        if reserved is None:
            row(OutsidePytorch, None, False)
        elif outside >= ELSEWHERE_SHARE * cap:  # most of the card: something else holds it
            row(HeldElsewhere, ((OUTSIDE, outside), ("capacity", cap), ("reserved", reserved),
                                ("shortfall", shortfall)), outside >= shortfall)
        elif outside > 0:
            row(OutsidePytorch, ((OUTSIDE, outside), ("shortfall", shortfall)),
                outside >= shortfall)
    missing = tuple(dict.fromkeys(
        clause for h in rows if h.cause is None
        for clause in NEEDS[h.kind] if not have.get(clause, True)))
    return Counterfactuals(req, shortfall, tuple(rows)), missing


def _ranked(table: Counterfactuals | None) -> list[Cause]:
    """The causes as the table says them: the lead (the first holder weighed that alone
    covers the shortfall, unless an open one is weighed before it; the live tensors where
    none covers), then the others with their share, in the message's order; with open
    holders, 'undecided' first, the open ones, the would-be lead as a candidate."""
    if table is None:
        return []
    lead = table.lead
    first = lead.cause if lead is not None else None
    rest = [replace(h.cause, role="contributor", share=share) for h in table.rows
            if h.cause is not None and h is not lead and (share := table.share(h)) is not None]
    if table.open:
        opened = [_c(h.kind, (), "open") for h in table.open]
        if first is not None:  # it leads unless a missing figure says an open one does
            opened.append(replace(first, role="candidate"))
        return [_c(Undecided, ()), *opened, *rest]
    if first is None:  # no holder alone covers it: the live tensors lead
        first = next((h.cause for h in table.rows if h.kind is Demand), None)
        if first is None:
            return []
        rest = [c for c in rest if not isinstance(c, Demand)]
    return [first, *rest]


def _other_processes(m: OomMessage) -> int | None:
    """Bytes of the other processes the message lists: PyTorch prints this process as the
    'this process has' sentence and every other one as a 'Process N' line; without that
    sentence one of the lines may be this process (a container), so no sum is made."""
    if not m.processes or m.this_process is None:
        return None
    return sum(s.bytes for _, s in m.processes)


def _knobs(m: OomMessage, causes: list[Cause], table: Counterfactuals | None
           ) -> tuple[tuple[str, str], ...]:
    """Knobs the message's figures support, each with the figure that supports it, in the
    order the table weighs their holders: only the idle cache has one, where one free block
    of it would have served the request (its row covers) and the lead is decided."""
    weighed = [h.kind for h in table.weighed if h.covers] if table is not None else []
    if not causes or isinstance(causes[0], Undecided):
        weighed = []
    out: list[tuple[str, str]] = []
    env = f"PYTORCH_{m.backend}_ALLOC_CONF"  # CUDA, HIP, NPU: each allocator's own variable
    if Fragmentation in weighed and not m.expandable_on:
        if m.wording in EXPANDABLE_WORDINGS:
            out.append((f"{env}=expandable_segments:True",
                        "the cached but unallocated bytes are at least the request: segments "
                        "that grow in place leave no gaps between them (unless it was already "
                        "set: the message does not say)"))
        else:
            out.append((f"{env}=max_split_size_mb:<size>",
                        "the cached but unallocated bytes are at least the request; this "
                        "release predates expandable segments (2.1): capping splits keeps "
                        "large blocks whole"))
    return tuple(out)
