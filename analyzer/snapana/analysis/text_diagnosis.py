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
#: the outside memory not split by process. (Decisive causes, `Cause.weight`, come first.)
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

    @property
    def lead(self) -> Cause | None:
        return self.causes[0] if self.causes else None

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
        return TextDiagnosis(m, split, tuple(causes), _knobs(m, causes), req, shortfall)
    candidates, missing = _counterfactuals(m, req, shortfall, allocated, cached, own,
                                           reserved, cap, free)
    causes = _ranked(candidates, shortfall)
    return TextDiagnosis(m, split, tuple(causes), _knobs(m, causes), req, shortfall,
                         missing)


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


def _counterfactuals(m: OomMessage, req: int | None, shortfall: int | None,
                     allocated: int | None, cached: int | None, own: int | None,
                     reserved: int | None, cap: int | None, free: int | None
                     ) -> tuple[dict[type[Cause], Cause | None], tuple[str, ...]]:
    """Each cause with the bytes it held and what would have had to change; None where a
    figure it needs is missing. And the clauses missing that way."""
    have = {"unallocated": cached is not None, "this_process": own is not None,
            "allocated": allocated is not None}
    out: dict[type[Cause], Cause | None] = {}
    if req is None or shortfall is None:
        return {}, tuple(k for k in ("request", "capacity") if getattr(m, k) is None)
    if cached is None:
        out[Fragmentation] = None
    elif cached:
        out[Fragmentation] = _c(
            Fragmentation, (("cached but unallocated", cached), ("request", req)),
            needed=req if cached >= req else None)
    if own is not None and cap is not None and free is not None:
        listed = _other_processes(m)
        others = cap - free - own if listed is None else listed
        rounding = sum(s.slack for s in (m.capacity, m.free, m.this_process) if s is not None)
        if others > rounding:  # (less is the printed figures' rounding)
            out[OtherProcesses] = _c(
                OtherProcesses, ((OTHERS if listed is not None else ELSEWHERE, others),
                                    ("shortfall", shortfall)), needed=shortfall)
    if allocated is None:
        out[Demand] = None
    else:
        out[Demand] = _c(Demand, (("allocated by PyTorch", allocated),
                                             ("shortfall", shortfall)), needed=shortfall)
    if own is not None:
        if reserved is None:
            out[OwnOutside] = None
        elif own - reserved > 0:
            out[OwnOutside] = _c(
                OwnOutside, ((OWN_OUTSIDE, own - reserved), ("this process", own),
                                ("reserved", reserved), ("shortfall", shortfall)),
                needed=shortfall)
    elif cap is not None and free is not None:
        outside = cap - free - reserved if reserved is not None else 0
        if reserved is None:
            out[OutsidePytorch] = None
        elif outside >= ELSEWHERE_SHARE * cap:  # most of the card: something else holds it
            out[HeldElsewhere] = _c(
                HeldElsewhere, ((OUTSIDE, outside), ("capacity", cap),
                                   ("reserved", reserved), ("shortfall", shortfall)),
                needed=shortfall)
        elif outside > 0:
            out[OutsidePytorch] = _c(
                OutsidePytorch, ((OUTSIDE, outside), ("shortfall", shortfall)),
                needed=shortfall)
    missing = tuple(dict.fromkeys(
        clause for cause, c in out.items() if c is None
        for clause in NEEDS[cause] if not have.get(clause, True)))
    return out, missing


def _covers(c: Cause, shortfall: int) -> bool:
    """The cause alone would have let the request fit."""
    if isinstance(c, Fragmentation):
        return c.needed is not None  # one free block of the cache could have served it
    return c.held >= shortfall


def _ranked(candidates: dict[type[Cause], Cause | None], shortfall: int | None
            ) -> list[Cause]:
    """The lead (the first cause in LEAD_ORDER that alone covers the shortfall, unless one
    before it is open), then the contributors with their share, then the open ones."""
    if shortfall is None:
        return []
    lead: Cause | None = None
    open_before: list[type[Cause]] = []
    for cid in LEAD_ORDER:
        if cid not in candidates:
            continue
        c = candidates[cid]
        if c is None:
            open_before.append(cid)
        elif _covers(c, shortfall):
            lead = c
            break
    if open_before:
        undecided = _c(Undecided, ())
        opened = [_c(cid, (), "open") for cid in open_before]
        if lead is not None:  # it leads unless a missing figure says an open one does
            opened.append(replace(lead, role="candidate"))
        rest = [_contributor(c, shortfall) for c in candidates.values()
                if c is not None and c is not lead]
        return [undecided, *opened, *(r for r in rest if r is not None)]
    if lead is None:
        lead = candidates.get(Demand)
        if lead is None:
            return []
    rest = [_contributor(c, shortfall) for c in candidates.values()
            if c is not None and c is not lead]
    return [lead, *(r for r in rest if r is not None)]


def _contributor(c: Cause, shortfall: int) -> Cause | None:
    """A cause beside the lead, with the share of the shortfall it would have covered."""
    if c.held <= 0 or shortfall <= 0:
        return None
    return replace(c, role="contributor", share=min(c.held, shortfall) / shortfall)


def _other_processes(m: OomMessage) -> int | None:
    """Bytes of the other processes the message lists: PyTorch prints this process as the
    'this process has' sentence and every other one as a 'Process N' line; without that
    sentence one of the lines may be this process (a container), so no sum is made."""
    if not m.processes or m.this_process is None:
        return None
    return sum(s.bytes for _, s in m.processes)


def _knobs(m: OomMessage, causes: list[Cause]) -> tuple[tuple[str, str], ...]:
    """Knobs the message's figures support, each with the figure that supports it: only a
    leading fragmentation (the idle cache could have served the request)."""
    out: list[tuple[str, str]] = []
    env = f"PYTORCH_{m.backend}_ALLOC_CONF"  # CUDA, HIP, NPU: each allocator's own variable
    if causes and isinstance(causes[0], Fragmentation) and not m.expandable_on:
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
