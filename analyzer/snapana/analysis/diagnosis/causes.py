"""Why an allocation failed: one frozen dataclass per cause kind, registered once with its
vocabulary id, the id a log's diagnosis prints, its label, the words for what it holds and
its weight. A snapshot's diagnosis (`diagnose.py`) and a log's (`text_diagnosis.py`) build the
same classes, so a log's demand and a snapshot's demand are one type. Each kind owns its words
(`reason`, `verdict`, `short` for a snapshot, `says` for a log): renderers reach them by
dispatch on the type, a sentence is made from the cause's own figures, and a kind a diagnosis
builds without words fails a test (test_cause_kinds) instead of printing its id.

The cause ids ("fragmentation", "real_demand", "demand", ...) are spelt here and nowhere else
in the package: the other modules name the classes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import ClassVar, Literal, Protocol, TypeVar

from snapana.units import fmt_bytes

#: An instance's place in a log's diagnosis: it alone explains the failure (lead), part of
#: the shortfall (contributor), a figure it needs is missing (open), or it would lead unless
#: the missing figure says an open one does (candidate). A snapshot's causes are all "lead"
#: (each checked on its own: `holds` says whether it does).
Role = Literal["lead", "contributor", "open", "candidate"]
#: What a kind can decide: alone, whatever else the figures say (decisive); by a
#: counterfactual (it leads only if removing it alone would have let the request fit); or
#: nothing (context: a measurement a cause needs, a setting's target, a missing figure).
Weight = Literal["decisive", "counterfactual", "context"]
#: The diagnoses that build a kind: a snapshot's (with `holds` and `numbers`), a log's (with
#: `terms`, `role`, `needed` and `share`). A kind built by none is a vocabulary id only (the
#: `causes` a knob acts on).
Path = Literal["snapshot", "log"]


class Checked(Protocol):
    """What a snapshot cause's words read of the diagnosis (`findings.Diagnosis`)."""

    @property
    def causes(self) -> tuple[Cause, ...]: ...


class DeviceReport(Protocol):
    """What a snapshot cause's words read of the report (`findings.DeviceReport`, which
    imports this module)."""

    @property
    def has_segments(self) -> bool: ...
    @property
    def expandable(self) -> bool: ...
    @property
    def cached_unallocated_bytes(self) -> int | None: ...
    @property
    def diagnosis(self) -> Checked: ...


class TextDiagnosis(Protocol):
    """What a log cause's words read of the log's diagnosis (`text_diagnosis.TextDiagnosis`,
    which imports this module)."""

    @property
    def shortfall(self) -> int | None: ...
    @property
    def segment(self) -> int | None: ...
    @property
    def missing_words(self) -> tuple[str, ...]: ...
    @property
    def causes(self) -> tuple[Cause, ...]: ...
    def covers(self, kind: type[Cause]) -> bool: ...


#: How the expandable-segments allocator places a request (placement.py's rule), in words.
EXPANDABLE_RULE = ("with expandable segments the allocator maps more pages at the end of a "
                   "segment when the device has free memory, and never needs one contiguous "
                   "cached block")


def pct(x: float) -> str:
    """A share as a report prints it."""
    return f"{100 * x:.1f}%"


def shortfall_words(d: TextDiagnosis) -> str:
    """A log's shortfall as the sum it is: the request, what it was more than the free."""
    gap = d.shortfall or 0
    return (f"the request ({fmt_bytes(d.segment or 0)}) was {fmt_bytes(gap)} more than "
            f"the device's free {fmt_bytes((d.segment or 0) - gap)}")


@dataclass(frozen=True)
class Cause:
    """One reason the allocation failed, with the figures that show it (bytes as ints).

    A snapshot's: `holds` and `numbers` (named figures). A log's: `terms` (what, bytes; the
    first is what the cause held), `role`, `needed` (the bytes that would have had to be
    different for the request to fit; None: no change to it would have) and `share` (of the
    shortfall a contributor would have covered)."""

    holds: bool = True
    numbers: Mapping[str, int | float | bool] = field(default_factory=dict)
    terms: tuple[tuple[str, int], ...] = ()
    role: Role = "lead"
    needed: int | None = None
    share: float | None = None
    #: built from a log's message (its id is the log's: `log_id`)
    log: bool = False

    #: the vocabulary id (`packs/vocabulary.toml` [[cause]]), stable API
    vocab_id: ClassVar[str]
    #: the id a log's diagnosis prints for it
    log_id: ClassVar[str]
    #: its name in a report's cause table
    label: ClassVar[str]
    #: what it holds, in words (a log's open, candidate and contributor sentences)
    holder: ClassVar[str]
    weight: ClassVar[Weight]
    counterfactual: ClassVar[bool]
    paths: ClassVar[tuple[Path, ...]]

    @property
    def id(self) -> str:
        """The id as the diagnosis that built it prints it (JSON, the rank table)."""
        return self.log_id if self.log else self.vocab_id

    def term(self, what: str) -> int:
        """The log figure named `what`."""
        return dict(self.terms)[what]

    @property
    def undecided_by(self) -> bool:
        """A log's cause whose missing figure leaves the lead undecided."""
        return self.counterfactual and self.role in ("open", "candidate")

    @property
    def held(self) -> int:
        """What the cause held: its first term."""
        return self.terms[0][1]

    def b(self, key: str) -> str:
        """A snapshot figure, formatted."""
        return fmt_bytes(int(self.numbers[key]))

    # ----- the words (a kind a diagnosis builds and that lacks one fails test_cause_kinds)

    def reason(self, r: DeviceReport) -> str:
        """A snapshot's cause table: why it holds or is rejected, with the report's figures."""
        raise NotImplementedError(f"cause {self.id} has no reason")

    def verdict(self, r: DeviceReport) -> str:
        """A snapshot's OOM verdict: its sentence ('' where it says nothing)."""
        raise NotImplementedError(f"cause {self.id} has no verdict sentence")

    def short(self, r: DeviceReport) -> str:
        """A snapshot's headline evidence line: the cause that holds, short ('' where it does
        not hold)."""
        raise NotImplementedError(f"cause {self.id} has no short sentence")

    def says(self, d: TextDiagnosis) -> str:
        """A log's verdict: the cause as the lead."""
        raise NotImplementedError(f"cause {self.id} has no log sentence")

    @property
    def status(self) -> str:
        """A snapshot's cause table: holds, rejected (or not measured)."""
        return "holds" if self.holds else "rejected"


#: Every cause kind, by vocabulary id (display order: the order of registration).
KINDS: dict[str, type[Cause]] = {}
#: Every kind a log's diagnosis builds, by the id it prints.
LOG_KINDS: dict[str, type[Cause]] = {}

C = TypeVar("C", bound=type[Cause])


def kind(vocab_id: str, label: str, weight: Weight, paths: tuple[Path, ...], *,
         log_id: str | None = None, holder: str = "") -> Callable[[C], C]:
    """Register a cause kind once: its ids, label, holder words, weight and the diagnoses
    that build it."""
    def register(cls: C) -> C:
        if vocab_id in KINDS:
            raise ValueError(f"cause {vocab_id} registered twice")
        cls.vocab_id, cls.log_id = vocab_id, log_id or vocab_id
        cls.label, cls.holder, cls.weight, cls.paths = label, holder or label, weight, paths
        cls.counterfactual = weight == "counterfactual"
        KINDS[vocab_id] = cls
        if "log" in paths:
            LOG_KINDS[cls.log_id] = cls
        return cls
    return register


@kind("real_demand", "real demand", "counterfactual", ("snapshot", "log"), log_id="demand",
      holder="the live tensors (allocated by PyTorch)")
@dataclass(frozen=True)
class Demand(Cause):
    """The live tensors need more than the device has."""

    def reason(self, r: DeviceReport) -> str:
        n, b = self.numbers, self.b
        head = (f"{b('requested_bytes')} requested, {b('device_free_bytes')} free on the "
                f"device: short by {b('short_by_bytes')}")
        if not r.has_segments:
            return head
        if n["short_after_compaction_bytes"]:
            return (f"{head}; the {b('default_pool_free_bytes')} cached free in its pool would "
                    f"still leave it {b('short_after_compaction_bytes')} short")
        if self.holds:
            frag = next((c for c in r.diagnosis.causes if isinstance(c, Fragmentation)),
                        None)
            share = float(frag.numbers["cached_share"]) if frag else 0.0
            return (f"{head}; with the {b('default_pool_free_bytes')} cached free in its pool "
                    f"it would fit (device free {b('device_free_bytes')} + cached free "
                    f"{b('default_pool_free_bytes')} − request "
                    f"{b('rounded_request_bytes')} = "
                    f"{b('spare_after_compaction_bytes')} to spare), but that is "
                    f"{pct(share)} of reserved: the memory is in use, not stranded")
        return f"{head}, yet enough is cached free: see fragmentation"

    def verdict(self, r: DeviceReport) -> str:
        return ""  # the verdict's opening says the shortfall; fragmentation's says "not it"

    def short(self, r: DeviceReport) -> str:
        return ""  # the headline says demand where no other cause holds (`headline._cause`)

    def says(self, d: TextDiagnosis) -> str:
        gap = d.shortfall or 0
        held = fmt_bytes(self.held)
        if not d.covers(Demand):  # no holder alone covers it: the live tensors lead
            return (f"demand: {shortfall_words(d)}, and no holder alone would have let it "
                    f"fit; PyTorch's live tensors held {held} ({self.held / gap:.0%} of it), "
                    "and the holders below the rest")
        others = [c for c in d.causes if c is not self and c.counterfactual and c.terms
                  and c.held >= gap]
        alone = [c for c in others if d.covers(type(c))]
        if alone:
            said = ("and besides them " + " and ".join(
                f"{c.holder} ({fmt_bytes(c.held)})" for c in alone) + " alone held that much "
                "(below: weighed after the live tensors)")
        elif others:  # the idle cache held more, but no one block of it was the request
            said = ("and no other holder alone would have let it fit (the idle cache held "
                    "more, but less than the request: see below)")
        else:
            said = "and no other holder alone held that much"
        return (f"demand: {shortfall_words(d)}, {said}; PyTorch's live tensors held {held}, "
                f"and {fmt_bytes(gap)} fewer of them would have let it fit")


@kind("fragmentation", "fragmentation", "counterfactual", ("snapshot", "log"),
      holder="the idle cache (reserved by PyTorch but unallocated)")
@dataclass(frozen=True)
class Fragmentation(Cause):
    """Enough is cached but unallocated, in pieces no one of which fits the request."""

    def reason(self, r: DeviceReport) -> str:
        return self._reason() + (f" ({EXPANDABLE_RULE})" if r.expandable else "")

    def _reason(self) -> str:
        n, b = self.numbers, self.b
        of_reserved = f"{pct(n['cached_share'])} of reserved"
        if self.holds:
            return (f"{b('cached_unallocated_bytes')} ({of_reserved}) is cached but "
                    "unallocated and would fit the request if compacted, yet the largest "
                    "free block is "
                    f"{b('largest_free_block_bytes')} < {b('rounded_request_bytes')}")
        if not n["fits_if_compacted"]:
            return ("even compacted, device free plus the cached free in its pool is less "
                    f"than the {b('rounded_request_bytes')} request")
        if n["largest_free_block_bytes"] >= n["rounded_request_bytes"]:
            return (f"a cached block of {b('largest_free_block_bytes')} is large enough: the "
                    "replayed state is incomplete")
        return (f"only {b('cached_unallocated_bytes')} ({of_reserved}, below "
                f"{pct(n['share_threshold'])}) is cached but unallocated: compacting it "
                "would fit this one request, but it is not what filled the device")

    def verdict(self, r: DeviceReport) -> str:
        cached = fmt_bytes(r.cached_unallocated_bytes)
        of_reserved = f"({pct(self.numbers['cached_share'])} of reserved)"
        if self.holds and r.expandable:
            return (f"Fragmentation: {cached} is cached but unallocated {of_reserved}, in pages "
                    "live blocks partly hold: the allocator unmaps whole free pages before "
                    "failing, never these; compacted, the request would fit.")
        if self.holds:
            return (f"Fragmentation: {cached} is cached but unallocated {of_reserved}, yet no "
                    "free block is large enough; compacted, the request would fit.")
        if r.has_segments:
            return (f"This is real demand, not fragmentation: only {cached} is cached but "
                    f"unallocated {of_reserved}.")
        return ""

    def short(self, r: DeviceReport) -> str:
        if not self.holds:
            return ""
        return (f"fragmentation: {fmt_bytes(r.cached_unallocated_bytes)} is cached but "
                "unallocated, yet no free block is large enough (largest "
                f"{self.b('largest_free_block_bytes')})")

    def says(self, d: TextDiagnosis) -> str:
        return (f"fragmentation: PyTorch held {fmt_bytes(self.term('cached but unallocated'))} "
                "reserved but unallocated, at least the request "
                f"({fmt_bytes(self.term('request'))}): had that idle cache been one free "
                "block, the request would have fit in it (the message does not record the "
                "largest free block: a snapshot does)")


@kind("private_pool", "private pools", "context", ("snapshot",))
@dataclass(frozen=True)
class PrivatePool(Cause):
    """The free cached memory sits in private pools the request cannot use."""

    def reason(self, r: DeviceReport) -> str:
        if self.holds:
            return (f"{self.b('private_pool_free_bytes')} sits free in private pools the "
                    "request cannot use; with it the request would fit")
        if not self.numbers["private_pool_free_bytes"]:
            return "no private pool has free memory"
        return (f"{self.b('private_pool_free_bytes')} free in private pools would not change "
                "whether the request fits")

    def verdict(self, r: DeviceReport) -> str:
        return (f"{self.b('private_pool_free_bytes')} sits free in private pools the request "
                "cannot use.") if self.holds else ""

    def short(self, r: DeviceReport) -> str:
        return (f"{self.b('private_pool_free_bytes')} sits free in private pools the request "
                "cannot use") if self.holds else ""


@kind("outside_pytorch", "memory outside PyTorch", "counterfactual", ("snapshot", "log"),
      holder="memory outside PyTorch's allocator")
@dataclass(frozen=True)
class OutsidePytorch(Cause):
    """Memory used on the device outside this process's caching allocator."""

    def reason(self, r: DeviceReport) -> str:
        where = (f"{self.b('outside_pytorch_bytes')} ({pct(self.numbers['share'])} of the "
                 f"{self.b('capacity_bytes')} device) is held outside this process's PyTorch "
                 "allocator")
        return where if self.holds else f"only {where}: too little to be the cause"

    def verdict(self, r: DeviceReport) -> str:
        return (f"{self.b('outside_pytorch_bytes')} ({pct(self.numbers['share'])} of the "
                "device) is held outside this process's PyTorch allocator: another process, "
                "NCCL, or a colocated inference engine.") if self.holds else ""

    def short(self, r: DeviceReport) -> str:
        return (f"{self.b('outside_pytorch_bytes')} of the device is held outside this "
                "process's PyTorch allocator") if self.holds else ""

    def says(self, d: TextDiagnosis) -> str:
        return (f"memory outside PyTorch's allocator ({fmt_bytes(self.held)}: this process's "
                "CUDA context and libraries, other processes, the driver — the message does "
                f"not split it): {shortfall_words(d)}, and {fmt_bytes(d.shortfall or 0)} less "
                "of it would have let it fit")


@kind("large_cache", "a large cache", "context", ())
@dataclass(frozen=True)
class LargeCache(Cause):
    """More than a fifth of reserved is cached but unallocated: a knob's target, not itself
    a reason an allocation failed (the verdict's sentence on it is `wording._cache_words`)."""


@kind("capacity_unknown", "memory outside PyTorch", "context", ("snapshot",))
@dataclass(frozen=True)
class CapacityUnknown(Cause):
    """The device capacity is not known: memory outside PyTorch cannot be computed."""

    @property
    def status(self) -> str:
        return "not measured"

    def reason(self, r: DeviceReport) -> str:
        return "not measured: the device capacity is unknown (pass --capacity, e.g. 80GiB)"

    def verdict(self, r: DeviceReport) -> str:
        return ("(Device capacity unknown: pass --capacity to measure memory held outside "
                "PyTorch.)")

    def short(self, r: DeviceReport) -> str:
        return ""


@kind("size_bug", "a size bug", "decisive", ("log",))
@dataclass(frozen=True)
class SizeBug(Cause):
    """A request larger than the whole card (or than an exabyte)."""

    def says(self, d: TextDiagnosis) -> str:
        if self.term("request") >= 1 << 60:
            return ("a request of more than an exabyte: a size bug (a negative or overflowed "
                    "size), not an OOM any setting can fix")
        return (f"the request ({fmt_bytes(self.term('request'))}) is larger than the whole "
                f"device ({fmt_bytes(self.term('capacity'))}): a size bug (a shape, a dtype, "
                "a mis-set batch); nothing else held on the card could have made it fit")


@kind("spill", "spilled figures", "decisive", ("log",))
@dataclass(frozen=True)
class Spill(Cause):
    """PyTorch's allocated is above the card's capacity: the figures are not the card's."""

    def says(self, d: TextDiagnosis) -> str:
        return (f"PyTorch's allocated {fmt_bytes(self.term('allocated'))} is above the "
                f"device's {fmt_bytes(self.term('capacity'))}: the driver spilled into system "
                "memory (Windows / WSL shared GPU memory); the figures do not describe the "
                "card alone")


@kind("other_limit", "another limit", "decisive", ("log",))
@dataclass(frozen=True)
class OtherLimit(Cause):
    """A limit other than the card's memory: a memory fraction, a driver refusal."""

    def says(self, d: TextDiagnosis) -> str:
        t = dict(self.terms)
        if len(t) == 1:
            return (f"the request ({fmt_bytes(t['request'])}) was refused before it was "
                    "tried: it would pass the per-process memory fraction "
                    "(torch.cuda.set_per_process_memory_fraction)")
        if "allowed" in t:
            return (f"a memory fraction capped this process at {fmt_bytes(t['allowed'])} "
                    f"(torch.cuda.set_per_process_memory_fraction); PyTorch reserved "
                    f"{fmt_bytes(t['reserved'])} and the request "
                    f"{fmt_bytes(t['request'])} went past the cap")
        return (f"the allocator asked the device for {fmt_bytes(t['segment asked for'])} "
                f"while {fmt_bytes(t['free'])} was free: another limit was hit (a memory "
                "fraction, a private pool, a driver refusal), not the device's capacity")


@kind("card_full", "a full card", "decisive", ("log",))
@dataclass(frozen=True)
class CardFull(Cause):
    """Free and the request within the card's last percent of each other."""

    def says(self, d: TextDiagnosis) -> str:
        return (f"the card is full: {fmt_bytes(self.term('free'))} free and a request of "
                f"{fmt_bytes(self.term('request'))} are within "
                f"{fmt_bytes(self.term('within'))} (1% of the card's "
                f"{fmt_bytes(self.term('capacity'))}) of each other, and the driver cannot "
                "hand out the last of what it reports free")


@kind("other_processes", "other processes", "counterfactual", ("log",),
      holder="other processes on the card (and the driver)")
@dataclass(frozen=True)
class OtherProcesses(Cause):
    """Other processes on the card held the shortfall."""

    def says(self, d: TextDiagnosis) -> str:
        return (f"other processes held {fmt_bytes(self.held)} of the card: "
                f"{shortfall_words(d)}, and with that much less held by them the request "
                "would have fit — nvidia-smi beside the log names them")


@kind("own_outside", "this process outside PyTorch", "counterfactual", ("log",),
      holder="this process's memory outside PyTorch's allocator")
@dataclass(frozen=True)
class OwnOutside(Cause):
    """This process's memory outside PyTorch's allocator (its CUDA context, NCCL...)."""

    def says(self, d: TextDiagnosis) -> str:
        return (f"this process's memory outside PyTorch's allocator ({fmt_bytes(self.held)}: "
                f"this process {fmt_bytes(self.term('this process'))} − reserved "
                f"{fmt_bytes(self.term('reserved'))}: the CUDA context, NCCL buffers, cuBLAS "
                f"workspaces, another allocator): {shortfall_words(d)}, and "
                f"{fmt_bytes(d.shortfall or 0)} less of it would have let it fit")


@kind("held_elsewhere", "held elsewhere", "counterfactual", ("log",),
      holder="memory outside this process's PyTorch cache (another process, a colocated "
             "engine, this process's other libraries)")
@dataclass(frozen=True)
class HeldElsewhere(Cause):
    """Half the card or more outside this process's cache: something else holds the GPU."""

    def says(self, d: TextDiagnosis) -> str:
        cap = self.term("capacity")
        return (f"something else holds this GPU: {fmt_bytes(self.held)} of its "
                f"{fmt_bytes(cap)} ({self.held / cap:.0%}) is outside this process's PyTorch "
                f"cache ({fmt_bytes(self.term('reserved'))} reserved), and "
                f"{shortfall_words(d)} — another process or a colocated engine (a rollout "
                "engine's gpu_memory_utilization or mem_fraction_static), or this process's "
                "other libraries; the message does not split it by process: look at "
                "`nvidia-smi --query-compute-apps=pid,process_name,used_memory` while the job "
                "runs, and at what shares the card")


@kind("undecided", "undecided", "context", ("log",))
@dataclass(frozen=True)
class Undecided(Cause):
    """A figure the causes need is missing from the text: no cause can be said to lead."""

    def says(self, d: TextDiagnosis) -> str:
        missing = " and ".join(f"'{w}'" for w in d.missing_words) or "a figure"
        opened = [o.holder for o in d.causes if o.undecided_by]
        return (f"not decided: the text lacks the {missing} figure (the paste is cut short), "
                f"and {shortfall_words(d)}; whether " + " or ".join(opened)
                + " leads depends on it")


#: The order a snapshot's OOM verdict says its causes in (`Cause.verdict`), and its headline
#: looks for the one that holds (`Cause.short`): every kind a snapshot builds is in both
#: (test_cause_kinds).
VERDICT_ORDER: tuple[type[Cause], ...] = (Demand, Fragmentation, OutsidePytorch,
                                          CapacityUnknown, PrivatePool)
HEADLINE_ORDER: tuple[type[Cause], ...] = (OutsidePytorch, Fragmentation, PrivatePool, Demand,
                                           CapacityUnknown)
