"""The view of a text log's OOM messages (issue 44): for each message its figures as printed,
the device's memory split into parts that add up, the causes with the sums that show them,
the knobs those support, and what to record so that the next OOM comes with a snapshot.
Renderers (text, markdown, json, html) only lay these sentences and rows out."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from snapana.analysis.text_diagnosis import (
    OTHERS,
    OUTSIDE,
    OWN_OUTSIDE,
    TextCause,
    TextDiagnosis,
)
from snapana.render import ViewKind
from snapana.sources.oom_text import OomMessage, Size
from snapana.units import fmt_bytes

#: Commands that record history so the next OOM leaves a snapshot (`snapana record`, or the
#: two calls PyTorch documents). 100,000 entries hold a few training steps of a large model.
RECORD_ENTRIES = 100_000


@dataclass(frozen=True)
class MessageView:
    """One message, worded."""

    where: str  # "line 12 (rank 3)"
    rank: int | None
    device: int | None
    wording: str
    figures: tuple[tuple[str, str], ...]  # (what, as printed)
    split: str  # "79.15 GiB capacity = 14.81 MiB free + ... " or ""
    verdict: str
    causes: tuple[str, ...]
    knobs: tuple[tuple[str, str], ...]
    oddities: tuple[str, ...]
    diagnosis: TextDiagnosis


@dataclass(frozen=True)
class TextLogView:
    """Every OOM message of a text, worded; the ranks' spread when several ranks failed."""

    kind: ClassVar[ViewKind] = "text_log"
    title: str
    messages: tuple[MessageView, ...]
    rank_rows: tuple[tuple[str, ...], ...]
    rank_columns: tuple[str, ...]
    record: tuple[str, ...]
    unrecognised: tuple[str, ...]

    @property
    def lead(self) -> MessageView | None:
        """The message the verdict is about: the first one in the text (the first rank
        to fail is usually the one whose OOM the others then follow)."""
        return self.messages[0] if self.messages else None


def _shown(s: Size | None) -> str:
    return s.text if s is not None else "—"


def _reserved(m: OomMessage) -> str:
    """Reserved as printed (1.4 - 2.0) or as the sum it is (the other wordings print its
    two parts)."""
    if m.reserved is None:
        return "—"
    return fmt_bytes(m.reserved.bytes) if m.unallocated is not None else m.reserved.text


def _figures(m: OomMessage) -> tuple[tuple[str, str], ...]:
    rows = [("requested", _shown(m.request)), ("device capacity", _shown(m.capacity)),
            ("device free", _shown(m.free)), ("allocated by PyTorch", _shown(m.allocated))]
    if m.unallocated is not None:
        rows.append(("reserved but unallocated", _shown(m.unallocated)))
    rows.append(("reserved by PyTorch", _reserved(m) + (
        " (allocated + reserved but unallocated)" if m.unallocated is not None
        and m.reserved is not None else "")))
    if m.this_process is not None:
        rows.append(("this process in all", _shown(m.this_process)))
    if m.private_pools is not None:
        rows.append(("in private pools (CUDA graphs)", _shown(m.private_pools)))
    if m.allowed is not None:
        rows.append(("allowed (memory fraction)", _shown(m.allowed)))
    rows += [(f"process {pid}", s.text) for pid, s in m.processes]
    return tuple(rows)


def _split(d: TextDiagnosis) -> str:
    m = d.message
    if not d.split or m.capacity is None:
        return ""
    terms = " + ".join(f"{what} {fmt_bytes(n)}" for what, n in d.split)
    how = ("the last two: this process − reserved, and capacity − free − this process"
           if len(d.split) == 4 else "the last: capacity − free − reserved")
    return (f"capacity {fmt_bytes(m.capacity.bytes)} = {terms} ({how}; figures as printed, "
            "each rounded to 0.01 of its unit)")


def _t(c: TextCause, what: str) -> int:
    return dict(c.terms)[what]


def _cause_sentence(c: TextCause, d: TextDiagnosis) -> str:
    m = d.message
    if c.id == "size_bug" and _t(c, "request") >= 1 << 60:
        return ("a request of more than an exabyte: a size bug (a negative or overflowed "
                "size), not an OOM any setting can fix")
    if c.id == "size_bug":
        return (f"the request ({fmt_bytes(_t(c, 'request'))}) is larger than the whole device "
                f"({fmt_bytes(_t(c, 'capacity'))}): a size bug (a shape, a dtype, a "
                "mis-set batch), not an OOM any setting can fix")
    if c.id == "spill":
        return (f"PyTorch's allocated {fmt_bytes(_t(c, 'allocated'))} is above the device's "
                f"{fmt_bytes(_t(c, 'capacity'))}: the driver spilled into system memory "
                "(Windows / WSL shared GPU memory); the figures do not describe the card alone")
    if c.id == "other_limit":
        if len(c.terms) == 1:
            return (f"the request ({fmt_bytes(_t(c, 'request'))}) was refused before it was "
                    "tried: it would pass the per-process memory fraction "
                    "(torch.cuda.set_per_process_memory_fraction)")
        if "allowed" in dict(c.terms):
            return (f"a memory fraction capped this process at {fmt_bytes(_t(c, 'allowed'))} "
                    f"(torch.cuda.set_per_process_memory_fraction); PyTorch reserved "
                    f"{fmt_bytes(_t(c, 'reserved'))} and the request "
                    f"{fmt_bytes(_t(c, 'request'))} went past the cap")
        return (f"the allocator asked the device for {fmt_bytes(_t(c, 'segment asked for'))} "
                f"while {fmt_bytes(_t(c, 'free'))} was free: another limit was hit (a memory "
                "fraction, a private pool, a driver refusal), not the device's capacity")
    if c.id == "fragmentation":
        return (f"fragmentation: PyTorch held {fmt_bytes(_t(c, 'cached but unallocated'))} "
                "reserved but unallocated, at least the request "
                f"({fmt_bytes(_t(c, 'request'))}), and no free cached block was large enough "
                "(the message does not record the largest free block: a snapshot does)")
    if c.id == "outside_pytorch":
        terms = dict(c.terms)
        text = (f"memory outside PyTorch's allocator: {fmt_bytes(terms[OUTSIDE])} of the "
                "device was held by something PyTorch does not manage")
        if OTHERS in terms:
            text += f"; other processes held {fmt_bytes(terms[OTHERS])}"
        elif OWN_OUTSIDE in dict(d.split) and m.this_process is not None \
                and m.reserved is not None:
            own = dict(d.split)[OWN_OUTSIDE]
            text += (f"; of it this process {fmt_bytes(own)} (this process "
                     f"{fmt_bytes(m.this_process.bytes)} − reserved "
                     f"{fmt_bytes(m.reserved.bytes)}: the CUDA context, NCCL buffers, "
                     "cuBLAS workspaces, another allocator)")
        return text + " — a snapshot cannot see it; nvidia-smi beside the log can"
    if c.id == "demand":
        return (f"demand: PyTorch's live tensors held {fmt_bytes(_t(c, 'allocated by PyTorch'))}"
                f" and the request ({fmt_bytes(_t(c, 'request'))}) did not fit in what was "
                "left; which tensors those were, only a snapshot says")
    return c.id


def _verdict(d: TextDiagnosis, where: str) -> str:
    m = d.message
    dev = f"GPU {m.device}" if m.device is not None else "the GPU"
    req = f"a request of {m.request.text}" if m.request else "a request (size not in the text)"
    if not d.causes:
        return f"{where}: {m.backend} out of memory on {dev} for {req}."
    return f"{where}: {m.backend} out of memory on {dev} for {req}: " + \
        _cause_sentence(d.causes[0], d) + "."


def _where(m: OomMessage) -> str:
    return f"line {m.line}" + (f" (rank {m.rank})" if m.rank is not None else "")


def message_view(d: TextDiagnosis) -> MessageView:
    m = d.message
    where = _where(m)
    wording = (f"{m.wording} wording ({m.releases})" if m.wording != "unrecognised"
               else "not a wording PyTorch prints: only the clauses found are read")
    return MessageView(where, m.rank, m.device, wording, _figures(m), _split(d),
                       _verdict(d, where), tuple(_cause_sentence(c, d) for c in d.causes),
                       d.knobs, m.oddities, d)


def _rank_table(views: Sequence[MessageView]) -> tuple[tuple[str, ...],
                                                       tuple[tuple[str, ...], ...]]:
    ranked = [v for v in views if v.rank is not None]
    if len({v.rank for v in ranked}) < 2:
        return (), ()
    columns = ("rank", "line", "GPU", "requested", "free", "reserved", "first cause")
    rows = tuple((str(v.rank), str(v.diagnosis.message.line),
                  "—" if v.device is None else str(v.device),
                  _shown(v.diagnosis.message.request), _shown(v.diagnosis.message.free),
                  _reserved(v.diagnosis.message),
                  v.diagnosis.causes[0].id if v.diagnosis.causes else "—") for v in ranked)
    return columns, rows


def record_advice(views: Sequence[MessageView]) -> tuple[str, ...]:
    """What to record so that the next OOM comes with a snapshot: the allocator's history
    names the tensors these figures only count."""
    causes = Counter(c.id for v in views for c in v.diagnosis.causes)
    why = ("which tensors held the memory" if causes.get("demand") else
           "which blocks split the cache" if causes.get("fragmentation") else
           "what held the memory")
    return (f"Next time, record the allocator's history so the OOM leaves a snapshot that says "
            f"{why}:",
            "  snapana record -o oom-snapshots -- <the job's command>",
            "or, in the training script before the step:",
            f"  torch.cuda.memory._record_memory_history(max_entries={RECORD_ENTRIES})",
            "  … and in an `except torch.OutOfMemoryError:` around the step:",
            "  torch.cuda.memory._dump_snapshot('oom.pickle')",
            f"({RECORD_ENTRIES:,} entries hold a few steps of a large model; raise it if the "
            "snapshot's trace starts mid-step.)")


def text_log_view(title: str, diagnoses: Sequence[TextDiagnosis],
                  unrecognised: Sequence[str] = ()) -> TextLogView:
    views = tuple(message_view(d) for d in diagnoses)
    columns, rows = _rank_table(views)
    return TextLogView(title, views, rows, columns, record_advice(views), tuple(unrecognised))
