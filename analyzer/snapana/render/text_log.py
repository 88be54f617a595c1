"""The view of a text log's OOM messages (issue 44): for each message its figures as printed,
the device's memory split into parts that add up, the causes with the sums that show them,
the knobs those support, and what to record so that the next OOM comes with a snapshot.
Renderers (text, markdown, json, html) only lay these sentences and rows out."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from snapana.analysis.diagnosis.causes import Cause, Demand, Fragmentation, Role, Undecided
from snapana.analysis.framework_memory import FRAMEWORK_NAMES, FrameworkEvidence
from snapana.analysis.log_evidence import Finding, KvEvidence, SmiEvidence, SummaryEvidence
from snapana.analysis.text_diagnosis import TextDiagnosis
from snapana.log_model import SUMMARY_COLUMNS, SUMMARY_ROWS, KvBudget, OomMessage
from snapana.printed import Size
from snapana.render import ViewKind
from snapana.units import fmt_bytes

if TYPE_CHECKING:
    from snapana.analysis.traceback_request import RequestFinding
    from snapana.log_model import Setting
    from snapana.log_session import LogEvidence

#: A finding's terms, by what they are.
Terms = dict[str, int]

#: What every statement from a traceback is limited to.
TRACEBACK_SCOPE = "from the traceback: one request, not what held the rest"

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
    #: the failing request named from its traceback (issue 57), and the knobs acting on it
    request: tuple[str, ...] = ()
    request_knobs: tuple[tuple[str, str], ...] = ()
    finding: RequestFinding | None = None


@dataclass(frozen=True)
class EvidenceSection:
    """A table or a refusal beside the messages (memory_summary, nvidia-smi, vLLM), worded:
    what it says, its rows, the knobs it supports."""

    id: str  # memory_summary | nvidia_smi | vllm
    title: str
    verdict: str  # one sentence; the page's verdict when the text has no OOM message
    sentences: tuple[str, ...]
    columns: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    knobs: tuple[tuple[str, str], ...]
    numeric_from: int = 1  # columns from this one on hold figures (right-aligned)
    #: it holds a finding that says what is wrong with the card (`LEADING_FINDINGS`): without
    #: an OOM message, its verdict is the page's before a table that only reads its lines
    leads: bool = False


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
    sections: tuple[EvidenceSection, ...] = ()
    #: the settings the text's args dumps print; the knobs whose words they changed
    settings: tuple[Setting, ...] = ()
    set_knobs: tuple[tuple[str, str], ...] = ()  # (knob text, setting id)

    @property
    def lead(self) -> MessageView | None:
        """The message the verdict is about: the first one in the text (the first rank
        to fail is usually the one whose OOM the others then follow)."""
        return self.messages[0] if self.messages else None

    @property
    def best_knobs(self) -> tuple[tuple[str, str], ...]:
        """Every knob the text supports, once each, in the order the lead message gives
        them: its causes' first, then its failing request's, then the tables' and refusals'
        (the lead's own evidence before what stands beside it)."""
        seen: dict[str, str] = {}
        lead = self.lead
        for knob, why in (*(lead.knobs if lead else ()), *(lead.request_knobs if lead else ()),
                          *(k for s in self.sections for k in s.knobs)):
            seen.setdefault(knob, why)
        return tuple(seen.items())

    @property
    def verdict(self) -> str | None:
        """The first OOM message's verdict; without one, a vLLM refusal's, else a table's."""
        if self.lead is not None:
            return self.lead.verdict
        ranked = sorted(self.sections, key=lambda s: (not s.leads, s.id != "vllm"))
        return ranked[0].verdict if ranked else None


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


def _open(c: Cause, d: TextDiagnosis) -> str:
    return f"open: {c.holder} — the text lacks a figure it needs"


def _candidate(c: Cause, d: TextDiagnosis) -> str:
    return (f"candidate: {c.holder} held {fmt_bytes(c.held)}, enough alone for the "
            f"{fmt_bytes(d.shortfall or 0)} shortfall; it leads unless the missing figure says "
            "an open cause before it does")


def _contributor(c: Cause, d: TextDiagnosis) -> str:
    """A holder beside the lead, as its row of the counterfactual table says: 'also enough
    alone' only where removing it alone would have let the request fit (`covers`)."""
    what, held = c.holder, fmt_bytes(c.held)
    if c.share is None:
        return f"also held: {what}, {held}"
    gap = fmt_bytes(d.shortfall or 0)
    part = f"{c.share:.0%} of the {gap} shortfall"
    after = ("which one leads depends on the missing figure" if isinstance(d.lead, Undecided)
             else
             "the lead comes first by the order causes are weighed in")
    if isinstance(c, Fragmentation) and d.covers(Fragmentation):
        return (f"also enough alone: {what} held {held}, at least the request "
                f"({fmt_bytes(c.term('request'))}): one free block of it would have served "
                f"it ({after})")
    if isinstance(c, Fragmentation) and c.share >= 1:
        return (f"contributor: {what} held {held}, at least the {gap} shortfall but less than "
                "the request: no one block of it could have served it, and before failing "
                "the allocator gives back every cached block it can (whole free segments), "
                "so it was not free to take")
    if isinstance(c, Fragmentation):
        return (f"contributor: {what} held {held}, less than the request: no one block of it "
                f"could have served it; given back to the device it would have covered {part}")
    if d.covers(type(c)):
        return f"also enough alone: {what} held {held}, at least the {gap} shortfall ({after})"
    return f"contributor: {what} held {held}: {part}"


def _lead(c: Cause, d: TextDiagnosis) -> str:
    return c.says(d)


#: A log's cause in words, by its role (the lead in its kind's own words: `Cause.says`).
ROLE_WORDS: dict[Role, Callable[[Cause, TextDiagnosis], str]] = {
    "lead": _lead, "open": _open, "candidate": _candidate, "contributor": _contributor}


def _cause_sentence(c: Cause, d: TextDiagnosis) -> str:
    return ROLE_WORDS[c.role](c, d)


def _verdict(d: TextDiagnosis, where: str) -> str:
    m = d.message
    unit = "NPU" if m.backend == "NPU" else "GPU"  # torch_npu numbers its NPUs
    dev = f"{unit} {m.device}" if m.device is not None else f"the {unit}"
    req = f"a request of {m.request.text}" if m.request else "a request (size not in the text)"
    if d.lead is None:
        return f"{where}: {m.backend} out of memory on {dev} for {req}."
    return f"{where}: {m.backend} out of memory on {dev} for {req}: " + \
        _cause_sentence(d.lead, d) + "."


def _where(m: OomMessage, named: bool = False) -> str:
    head = f"{base_name(m.source)} line {m.line}" if named else f"line {m.line}"
    return head + (f" (rank {m.rank})" if m.rank is not None else "")


def base_name(source: str) -> str:
    """A log's file name without its folders (a rank table names the file, not the path)."""
    return source.replace("\\", "/").rsplit("/", 1)[-1]


def message_view(d: TextDiagnosis, named: bool = False,
                 request: RequestFinding | None = None) -> MessageView:
    m = d.message
    where = _where(m, named)
    wording = (f"{m.wording} wording ({m.releases})" if m.recognised
               else "not a wording PyTorch prints: only the clauses found are read")
    verdict = _verdict(d, where)
    if request is not None:
        verdict += " " + _request_headline(request)
    return MessageView(where, m.rank, m.device, wording, _figures(m), _split(d), verdict,
                       tuple(_cause_sentence(c, d) for c in d.causes), d.knobs, m.oddities, d,
                       _request_sentences(request) if request is not None else (),
                       request.knobs if request is not None else (), request)


def _request_headline(r: RequestFinding) -> str:
    """The verdict's sentence on the failing request, limited to what a traceback shows."""
    if r.rule_id is None:
        return (f"The failing request ({TRACEBACK_SCOPE}): no rule of the packs names its "
                "frames.")
    return (f"The failing request ({TRACEBACK_SCOPE}) is {r.family} — {r.label} — made at "
            f"{r.site}" + (f" (`{r.code}`)" if r.code else "")
            + (f", called from {r.called_from}" + (f" (`{r.called_code}`)" if r.called_code
                                                   else "") if r.called_from else "") + ".")


def _request_sentences(r: RequestFinding) -> tuple[str, ...]:
    t = r.traceback
    out = [f"{TRACEBACK_SCOPE.capitalize()}: {len(t.frames)} frame(s) from line "
           f"{t.first_line}" + (f" (rank {t.rank})" if t.rank is not None else "") + "."]
    out.append(f"family: {r.family} ({r.label}); phase {r.phase}; {r.reason}"
               if r.rule_id is not None else f"family: {r.family}; {r.reason}")
    if r.owners:
        out.append("owned by " + ", ".join(f"{fw} ({where})" for fw, where in r.owners)
                   + " — the first framework frames walking out from the allocation")
    out.append(r.workload)
    if r.forward_only:
        out.append(f"This request's pass: {r.forward_only}.")
    return tuple(out)


def _rank_table(views: Sequence[MessageView], named: bool = False
                ) -> tuple[tuple[str, ...], tuple[tuple[str, ...], ...]]:
    ranked = [v for v in views if v.rank is not None]
    if len({v.rank for v in ranked}) < 2:
        return (), ()
    columns = ("rank", "line", "GPU", "requested", "free", "reserved", "first cause")
    rows = tuple((str(v.rank), (f"{base_name(v.diagnosis.message.source)}:" if named else "")
                  + str(v.diagnosis.message.line),
                  "—" if v.device is None else str(v.device),
                  _shown(v.diagnosis.message.request), _shown(v.diagnosis.message.free),
                  _reserved(v.diagnosis.message),
                  v.diagnosis.lead.id if v.diagnosis.lead else "—") for v in ranked)
    return columns, rows


#: Framework lines of a backend whose allocator records no history (torch.mps has no
#: _record_memory_history; cudaMallocAsync's recordHistory raises 'does not yet support
#: recordHistory'): nothing to advise recording.
NO_HISTORY_FRAMEWORKS = frozenset({"mps", "cuda_async"})
#: Lines of a library that does not allocate through PyTorch at all (CTranslate2).
NO_HISTORY_FORMATS = frozenset({"ctranslate2.cuda_oom"})


def record_advice(views: Sequence[MessageView]) -> tuple[str, ...]:
    """What to record so that the next OOM comes with a snapshot: the allocator's history
    names the tensors these figures only count."""
    causes = Counter(type(v.diagnosis.lead) for v in views if v.diagnosis.lead is not None)
    why = ("which tensors held the memory" if causes.get(Demand) else
           "which blocks split the cache" if causes.get(Fragmentation) else
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


def record_hint(views: Sequence[MessageView]) -> tuple[str, ...]:
    """`record_advice` in three lines, for the one-screen text."""
    why = record_advice(views)[0].rsplit(" says ", 1)[-1].rstrip(":")
    return ("Next time, record the allocator's history (snapana record -o oom-snapshots -- "
            f"<command>, or _record_memory_history(max_entries={RECORD_ENTRIES}) then "
            f"_dump_snapshot on the OOM): the snapshot says {why}.",)


def text_log_view(title: str, evidence: LogEvidence,
                  unrecognised: Sequence[str] = ()) -> TextLogView:
    named = len(evidence.logs) > 1
    requests = evidence.requests or (None,) * len(evidence.diagnoses)
    views = tuple(message_view(d, named, r)
                  for d, r in zip(evidence.diagnoses, requests, strict=True))
    columns, rows = _rank_table(views, named)
    sections = (*(summary_section(e, named) for e in evidence.summaries),
                *(smi_section(e, named) for e in evidence.smi),
                *(kv_section(e, named) for e in evidence.kv),
                *(framework_section(e, named) for e in evidence.frameworks))
    # a log whose only OOM is an allocator's that keeps no history gets no advice to
    # record one
    no_history = not views and bool(evidence.frameworks) and all(
        e.framework in NO_HISTORY_FRAMEWORKS
        or all(ln.format in NO_HISTORY_FORMATS for ln in e.lines) for e in evidence.frameworks)
    return TextLogView(title, views, rows, columns, () if no_history else record_advice(views),
                       (*unrecognised, *evidence.not_read), sections, evidence.settings,
                       evidence.set_knobs)


def settings_line(view: TextLogView) -> str:
    """One line naming the settings that gave the first knob its words (issue 69), or ""."""
    if not view.best_knobs:
        return ""
    first = view.best_knobs[0][0]
    ids = {sid for k, sid in view.set_knobs if k == first}
    used = [s for s in view.settings if s.id in ids]
    return ("the first knob's value is from the log's settings: " + ", ".join(
        f"{s.name} = {s.printed} (line {s.line}, {s.format})" for s in used)) if used else ""


def _at(source: str, line: int, named: bool) -> str:
    return f"{base_name(source)} line {line}" if named else f"line {line}"


def summary_section(e: SummaryEvidence, named: bool = False) -> EvidenceSection:
    s = e.summary
    where = _at(e.source, s.line, named)
    rows = []
    for name, (key, is_size) in SUMMARY_ROWS.items():
        if is_size and key in s.sizes:
            rows.append((name, *(x.text for x in s.sizes[key])))
        elif not is_size and key in s.counts:
            rows.append((name, *(f"{n:,}" if not slack else f"{n - slack:,}–{n + slack:,}"
                                 for n, slack in s.counts[key])))
    sentences = [_summary_sentence(f) for f in e.findings]
    if s.ooms is not None:
        sentences.insert(0, f"{s.ooms} CUDA OOM(s) and {s.retries} cudaMalloc retry(ies) "
                            "counted by the allocator since the process started (or its "
                            "statistics were reset).")
    sentences.append("Figures are memory_summary()'s, rounded down to their unit; printed in "
                     "an except handler, they are the state after the failed step unwound "
                     "(its temporaries freed), not at the failure.")
    for c in e.checks:
        sentences.append(
            f"{c.what}: the OOM message at line {e.message.line if e.message else '?'} "
            f"printed {c.message.text}, the table {c.table.text}: "
            + ("they agree within their rounding." if c.agrees else
               f"they differ by {fmt_bytes(abs(c.message.bytes - c.table.bytes))}: the table "
               "was printed at another moment (after the step unwound, or before it)."))
    verdict = (f"{where}: memory_summary() of GPU {s.device}: "
               + (_summary_sentence(e.findings[0]) if e.findings else "no figure read."))
    return EvidenceSection("memory_summary", f"memory_summary() at {where} — GPU {s.device}",
                           verdict, tuple(sentences), ("metric", *SUMMARY_COLUMNS),
                           tuple(rows), e.knobs)


def _summary_sentence(f: Finding) -> str:
    words = SUMMARY_WORDS.get(f.id)
    return words(dict(f.terms)) if words is not None else f.id


#: Each memory_summary() finding's words, by its id.
SUMMARY_WORDS: dict[str, Callable[[Terms], str]] = {
    "cached": lambda t: (
        f"reserved {fmt_bytes(t['reserved'])} − allocated {fmt_bytes(t['allocated'])}"
        f" = {fmt_bytes(t['reserved'] - t['allocated'])} cached but unallocated"),
    "non_releasable": lambda t: (
        f"non-releasable memory {fmt_bytes(t['non-releasable'])} = "
        f"{t['non-releasable'] / t['reserved']:.0%} of reserved "
        f"{fmt_bytes(t['reserved'])}: free pieces of blocks that are split and partly "
        "in use, which neither a larger request nor the device can have "
        "(fragmentation)"),
    "rounding": lambda t: (
        f"allocated {fmt_bytes(t['allocated'])} − requested "
        f"{fmt_bytes(t['requested'])} = {fmt_bytes(t['allocated'] - t['requested'])} "
        "of rounding (requests rounded up to 512 bytes, or to the block size)"),
    "retries": lambda t: (
        f"{t['retries']} cudaMalloc retries: the allocator freed its cache and tried "
        "again that many times (each a device synchronisation): the process ran at "
        "the edge of the card before it failed"),
    "oversize": lambda t: (
        f"{t['oversize segments']} oversize segment(s) now: max_split_size_mb is set "
        "and larger blocks are kept whole"),
}


def smi_section(e: SmiEvidence, named: bool = False) -> EvidenceSection:
    t = e.table
    where = _at(e.source, t.line, named)
    rows = [(f"GPU {g.index}", g.name, g.used.text, g.total.text, "", "") for g in t.gpus]
    rows += [(f"GPU {p.gpu}", p.name, p.used.text if p.used else "N/A", "",
              str(p.pid) if p.pid is not None else "hidden", p.kind) for p in t.processes]
    sentences = []
    for gpu, procs in e.shared:
        known = [n for _, _, n in procs if n is not None]
        sentences.append(
            f"GPU {gpu} is shared by {len(procs)} processes ("
            + ", ".join((f"pid {pid} {name}" if pid is not None else "a hidden pid")
                        + (f" {fmt_bytes(n)}" if n is not None else "")
                        for pid, name, n in procs)
            + (f"; {fmt_bytes(sum(known))} in all" if known else "") + ")")
    for line, gpu in e.matched:
        sentences.append(f"the OOM message at line {line} names processes nvidia-smi lists "
                         f"on its GPU {gpu}")
    hidden = sum(p.pid is None or p.used is None for p in t.processes)
    if hidden:
        sentences.append(f"{hidden} process row(s) show no pid or no usage (hidden in the "
                         "paste, or N/A where the driver does not report it): not read as "
                         "figures")
    sentences.append("nvidia-smi numbers GPUs by PCI bus, the job by CUDA_VISIBLE_DEVICES: "
                     "GPU N here need not be the message's GPU N; and 'used' leaves out what "
                     "the driver reserves, so total − used is not the free memory CUDA saw.")
    verdict = (f"{where}: nvidia-smi: " + sentences[0] + "." if e.shared else
               f"{where}: nvidia-smi: no GPU shared by two processes.")
    return EvidenceSection("nvidia_smi", f"nvidia-smi at {where} (driver {t.driver})",
                           verdict, tuple(sentences),
                           ("GPU", "name / process", "used", "total", "pid", "type"),
                           tuple(rows), (), numeric_from=2)


def kv_section(e: KvEvidence, named: bool = False) -> EvidenceSection:
    r, b = e.refusal, e.budget
    line = r.line if r is not None else b.line if b is not None else 0
    where = _at(e.source, line, named)
    sentences = []
    if r is None:
        head = "vLLM's memory budget: " + (
            f"{b.kv.text} left for the KV cache" if b is not None and b.kv is not None
            else "how it was spent")
    elif r.kind == "no_blocks":
        head = ("vLLM refused to start: no memory was left for the KV cache after the model's "
                "weights and its profiling run")
    elif r.needed is not None and r.available is not None:
        head = (f"vLLM refused to start: one request of max_model_len {r.max_model_len:,} "
                f"needs {r.needed.text} of KV cache and {r.available.text} was available "
                f"({fmt_bytes(r.needed.bytes - r.available.bytes)} short)")
    else:
        head = (f"vLLM refused to start: max_model_len {r.max_model_len:,} is longer than "
                f"the {r.tokens:,} tokens its KV cache holds")
    if r is not None:
        sentences.append(head + ". This is not a CUDA OOM: vLLM sized its cache from what "
                         "the weights and a profiling run left and stopped before allocating "
                         "it.")
    rows: list[tuple[str, ...]] = []
    if b is not None:
        rows = [(w, s) for w, s in (
            ("total GPU memory", b.total.text if b.total else None),
            ("gpu_memory_utilization",
             f"{b.utilization:.2f}" if b.utilization is not None else None),
            ("budget (total × utilization)", b.budget.text if b.budget else None),
            ("model weights", b.weights.text if b.weights else None),
            ("non-torch memory", b.non_torch.text if b.non_torch else None),
            ("activation peak (profiling run)", b.activation.text if b.activation else None),
            ("left for the KV cache", b.kv.text if b.kv else None)) if s is not None]
        sentences += _budget_sum(b)
        sentences += [KV_WORDS[f.id](dict(f.terms)) for f in e.findings if f.id in KV_WORDS]
    for a in r.available_lines if r is not None else ():
        rows.append(("'Available KV cache memory' logged", a.text))
    return EvidenceSection("vllm", f"vLLM at {where}", f"{where}: {head}.", tuple(sentences),
                           ("figure", "as printed") if rows else (), tuple(rows), e.knobs)


#: The vLLM budget findings a section says in a sentence, by id (the others are its rows).
KV_WORDS: dict[str, Callable[[Terms], str]] = {
    "activation_half": lambda t: (
        f"the profiling run's activation peak ({fmt_bytes(t['activation peak'])}) "
        f"takes {t['activation peak'] / t['budget']:.0%} of the budget "
        f"({fmt_bytes(t['budget'])}): half or more of what vLLM may use goes to "
        "one step's activations, not to the KV cache"),
}


def _budget_sum(b: KvBudget) -> list[str]:
    """The budget as the sum vLLM computed: weights + non-torch + activations + the cache;
    without its first line (a paste cut short) the parts alone."""
    if b.weights is None or b.non_torch is None or b.activation is None or b.kv is None:
        return []
    parts = (b.weights, b.non_torch, b.activation, b.kv)
    total = sum(s.bytes for s in parts)
    terms = (f"weights {b.weights.text} + non-torch {b.non_torch.text} + activations "
             f"{b.activation.text} + KV cache {b.kv.text}")
    if b.budget is None:
        return [f"{terms} = {fmt_bytes(total)} (the message's first line, with the total and "
                "the utilisation, is not in the text)"]
    return [f"budget {b.budget.text} = {terms} (sum {fmt_bytes(total)}, each rounded to "
            "0.01 GiB)"]


#: Findings of a framework's lines that say what is wrong with the card (something else holds
#: it, the framework refused to start), not only what its lines read: a section holding one
#: gives the page its verdict where no OOM message does.
LEADING_FINDINGS = frozenset({"usage_elsewhere", "sglang_not_enough"})

def framework_section(e: FrameworkEvidence, named: bool = False) -> EvidenceSection:
    """A framework's memory lines on one rank: each line's figures as printed, the budget
    they add up to, which term the OOM ate, the knob with its figure."""
    first = e.lines[0]
    where = _at(e.source, first.line, named)
    who = FRAMEWORK_NAMES.get(e.framework, e.framework)
    rank = f" (rank {e.rank})" if e.rank is not None else ""
    rows = tuple((str(m.line), m.format.split(".", 1)[1], m.label or "—",
                  ", ".join(f"{k}={v.text if isinstance(v, Size) else v}"
                            for k, v in m.figures.items())) for m in e.lines)
    sentences = tuple(_framework_sentence(f, e) for f in e.findings)
    verdict = f"{where}: {who}{rank}: " + (sentences[-1] if sentences else "its lines read.")
    return EvidenceSection("framework", f"{who} memory lines{rank} from {where}", verdict,
                           sentences, ("line", "format", "label", "figures as printed"),
                           rows, e.knobs, numeric_from=4,
                           leads=any(f.id in LEADING_FINDINGS for f in e.findings))


def _framework_sentence(f: Finding, e: FrameworkEvidence) -> str:
    """A framework finding in its words (`FRAMEWORK_WORDS`; a finding without words is
    a failing test, test_cause_kinds)."""
    return FRAMEWORK_WORDS[f.id](dict(f.terms), f, e)


b = fmt_bytes


def _budget(f: Finding) -> str:
    return ", ".join(f"{what} {b(n)}" for what, n in f.terms) + \
        " (figures as the framework printed them)"


def _sglang_oom(t: Terms, f: Finding, e: FrameworkEvidence) -> str:
    left = t.get("left after start-up")
    return (f"the OOM at line {e.message.line if e.message else '?'} asked "
            f"{b(t['request'])} with {b(t['free'])} free: {b(t['shortfall'])} short"
            + (f"; SGLang's start-up left {b(left)} of the card" if left is not None else "")
            + (f", and its last 'avail mem' before the OOM (line {t['at line']}) was "
               f"{b(t['last avail mem before the OOM'])}: "
               f"{b(left - t['last avail mem before the OOM'])} taken after start-up"
               if left is not None and "last avail mem before the OOM" in t else "")
            + " — the knobs below are the budget terms that alone held that much")


def _times(t: Terms) -> str:
    return f" ({t['times']} times)" if t["times"] > 1 else ""


def _cuda_async_oom(t: Terms, f: Finding, e: FrameworkEvidence) -> str:
    head = (f"PyTorch's cudaMallocAsync allocator refused an allocation at line {t['line']}"
            f"{_times(t)}")
    if "request" not in t or "allocated" not in t:
        return (head + ": the paste holds none of the figures it prints under that line "
                "(currently allocated, requested, the device's total and free)")
    out = (f"{head}: {b(t['request'])} requested with {b(t['allocated'])} allocated by "
           "PyTorch")
    if "elsewhere" not in t:
        return out
    short = t["request"] - t["free"]
    return (out + f"; the device's {b(t['total'])} had {b(t['free'])} free" +
            (f", {b(short)} short" if short > 0 else "") +
            f", and {b(t['elsewhere'])} was neither PyTorch's live allocations nor free "
            "(memory the driver's pool keeps after frees, other processes, the CUDA "
            "context)")


def _saver_refused(t: Terms, f: Finding, e: FrameworkEvidence) -> str:
    return (f"torch_memory_saver refused an allocation of {b(t['size'])}{_times(t)}: "
            f"{b(t['free'])} free less its margin {b(t['margin'])} leaves "
            f"{b(t['free'] - t['margin'])}")


def _report_vs_oom(t: Terms, f: Finding, e: FrameworkEvidence) -> str:
    over = t["reserved at the OOM"] + t["request"] - t["reported peak"]
    return (f"the OOM came with {b(t['reserved at the OOM'])} reserved and a request of "
            f"{b(t['request'])}: " + (f"{b(over)} beyond the highest reported peak — "
                                      "the failing step needed more than any reported one"
                                      if over > 0 else "within the highest reported peak"))


def _sglang_not_enough(t: Terms, f: Finding, e: FrameworkEvidence) -> str:
    said = (f" (mem_fraction_static = {t['mem_fraction_static']:.2f})"
            if "mem_fraction_static" in t else "")
    return (f"SGLang refused to start at line {t['line']}: 'Not enough memory' — after the "
            f"weights, its static share of the card{said} left nothing for the KV cache "
            "pool; raise --mem-fraction-static, or free the card of what else holds it "
            "(another engine or process: SGLang takes its share of the card's free memory "
            "at start-up)")


def _memory_usage(t: Terms, f: Finding, e: FrameworkEvidence) -> str:
    held = (f"; reserved {b(t['reserved'])} (allocated {b(t['allocated'])}), so "
            f"{b(t['used'] - t['reserved'])} of the used memory is outside this "
            "process's PyTorch cache" if "reserved" in t else "")
    return (f"last Memory-Usage (line {t['line']}): {b(t['used'])} of {b(t['total'])} "
            f"used, {b(t['free'])} free{held}")


def _uneven_ranks(t: Terms, f: Finding, e: FrameworkEvidence) -> str:
    (high, hb), (low, lb) = f.terms
    return (f"{high} peaks at {b(hb)}, {low} at {b(lb)}: the ranks are uneven "
            f"({b(hb - lb)} apart: a heavier pipeline stage, longer sequences on one rank)")


#: Each framework finding's words, by its id.
FRAMEWORK_WORDS: dict[str, Callable[[Terms, Finding, FrameworkEvidence], str]] = {
    "sglang_budget": lambda t, f, e: "start-up budget: " + _budget(f),
    "vllm_budget": lambda t, f, e: "budget: " + _budget(f),
    "sglang_kv_tokens": lambda t, f, e: f"the KV cache pool holds {t['tokens']:,} tokens",
    "sglang_fraction": lambda t, f, e: (
        f"mem_fraction_static = {t['mem_fraction_static']:.2f} (its ServerArgs line)"),
    "sglang_oom": _sglang_oom,
    "saver_refused": _saver_refused,
    "saver_margin": lambda t, f, e: (
        f"the allocation fits the free memory; the margin ({b(t['margin'])}) is what "
        "refused it"),
    "saver_short": lambda t, f, e: (
        f"the allocation ({b(t['size'])}) is {b(t['size'] - t['free'])} more than the "
        f"card's free {b(t['free'])}: no margin would let it through — what holds the "
        "card (a colocated engine, this process's own tensors) must give it back"),
    "vllm_kv_negative": lambda t, f, e: (
        f"Available KV cache memory is {b(t['KV cache'])}: the weights, the profiling "
        "run's activations and the memory outside torch took more than vLLM's budget"),
    "vllm_held_at_start": lambda t, f, e: (
        f"{b(t['held'])} of the card ({t['held'] / t['total']:.0%}) was in use before "
        "profiling besides the weights (initial_memory_usage − weights): another "
        "process or vLLM instance on the card, which the budget counts against itself"),
    "vllm_unsplit": lambda t, f, e: (
        "the log does not split what took it (vLLM's 'Total non KV cache memory' "
        "line is debug-level): a colocated trainer's memory, another process's, or "
        "vLLM's own weights and activations — no utilisation is offered without it"),
    "vllm_kv_tokens": lambda t, f, e: (
        f"the KV cache holds {t['tokens']:,} tokens; a request may be "
        f"{t['max_model_len']:,} long"),
    "vllm_activation_half": lambda t, f, e: (
        f"the profiling run's activation peak {b(t['activation'])} takes "
        f"{t['activation'] / t['budget']:.0%} of the budget {b(t['budget'])}: at least "
        "half of it goes to one step's activations, not the KV cache"),
    "report_peak": lambda t, f, e: (
        f"highest reported peak: {b(t['max reserved'])} reserved, "
        f"{b(t['max allocated'])} allocated (line {t['line']})"),
    "report_cached": lambda t, f, e: (
        f"last report (line {t['line']}): {b(t['reserved'])} reserved − "
        f"{b(t['allocated'])} allocated = {b(t['reserved'] - t['allocated'])} cached"),
    "report_vs_oom": _report_vs_oom,
    "sglang_not_enough": _sglang_not_enough,
    "vllm_warmup_oom": lambda t, f, e: (
        f"vLLM ran out warming up with {t['dummy requests']:,} dummy requests at line "
        f"{t['line']}: after the KV cache took its share of the budget, one step over "
        "max_num_seqs requests (the sampler's logits, a pooler's outputs) found no room"),
    "vllm_cumem_oom": lambda t, f, e: (
        f"vLLM's sleep-mode allocator (CuMemAllocator, cumem_allocator.cpp:"
        f"{t['source line']}) ran out at line {t['line']}: memory created or mapped "
        "outside PyTorch's caching allocator (the KV cache or weights a wake_up maps "
        "back) — no allocator figures; what the trainer or another engine holds on "
        "the card at wake-up is what it lacked (torch.cuda.empty_cache() before "
        "wake_up, a lower gpu_memory_utilization)"),
    "memory_usage": _memory_usage,
    "usage_elsewhere": lambda t, f, e: (
        f"something else holds this GPU: {b(t['outside'])} of {b(t['total'])} "
        f"({t['outside'] / t['total']:.0%}) is used outside this process's PyTorch "
        "cache — a colocated rollout engine (its gpu_memory_utilization / "
        "mem_fraction_static), another process, this process's other libraries; "
        "`nvidia-smi --query-compute-apps=pid,process_name,used_memory` names them"),
    "nccl_calloc": lambda t, f, e: (
        f"NCCL could not allocate {b(t['size'])} ({t['size']:,} bytes) on the device "
        f"(line {t['line']}){_times(t)}: its own cudaMalloc for communicator buffers, "
        "outside PyTorch's caching allocator, found the card full — no allocator "
        "figures; what PyTorch caches (torch.cuda.empty_cache() before the "
        "collective) or another engine holds left it no room (NCCL_BUFFSIZE / "
        "NCCL_MAX_NCHANNELS lower what NCCL asks)"),
    "cuda_error_oom": lambda t, f, e: (
        f"'CUDA error: out of memory' at line {t['line']}{_times(t)}: raised outside "
        "PyTorch's caching allocator (a cuBLAS / cuDNN workspace, a kernel launch, "
        "a library's own cudaMalloc, a CUDA context), so the error carries no "
        "allocator figures — no request, free or reserved to split; CUDA reports "
        "errors asynchronously, so the frame it names may not be the call that "
        "failed (CUDA_LAUNCH_BLOCKING=1 pins it down)"),
    "mps_oom": lambda t, f, e: (
        f"PyTorch's MPS allocator refused {b(t['request'])} at line {t['line']}"
        f"{_times(t)}: this process held {b(t['MPS allocated'])} in its MPS heaps and "
        f"{b(t['other allocations'])} in other Metal allocations"
        + (f", {b(t['MPS allocated'] + t['other allocations'] + t['request'])} with the "
           f"request, over the {b(t['max allowed'])} it allows (its high watermark: "
           "PYTORCH_MPS_HIGH_WATERMARK_RATIO × the device's recommended working set)"
           if "max allowed" in t else
           ", with no watermark limit set: Metal itself could not give the memory")),
    "cuda_async_oom": _cuda_async_oom,
    "cuda_driver_oom": lambda t, f, e: (
        f"'CUDA driver error: out of memory' at line {t['line']}{_times(t)}: a CUDA driver "
        "call ran out (cuMemCreate / cuMemMap, loading or launching a Triton kernel) "
        "outside the caching allocator's own OOM message, so it carries no allocator "
        "figures — no request, free or reserved to split"),
    "ctranslate2_cuda_oom": lambda t, f, e: (
        f"CTranslate2 ran out of device memory at line {t['line']}{_times(t)} ('CUDA failed "
        "with error out of memory'): its own allocator, not PyTorch's, so the error carries "
        "no figures and PyTorch's allocator settings do not act on it — what else holds "
        "the card, and CTranslate2's own compute_type and batch size, do"),
    "cublas_alloc_failed": lambda t, f, e: (
        f"cuBLAS could not allocate (CUBLAS_STATUS_ALLOC_FAILED) at line {t['line']}"
        f"{_times(t)}: its handle or workspace is device memory cuBLAS takes itself, "
        "outside PyTorch's caching allocator, so the error carries no allocator "
        "figures; the card had no room when cuBLAS first ran on this device and "
        "thread (what PyTorch caches, another process, a second job on the GPU)"),
    "uneven_ranks": _uneven_ranks,
}
