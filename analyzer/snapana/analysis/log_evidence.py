"""What the texts beside an OOM message add to it (issue 44): `memory_summary()` (the
allocator's cache split further: non-releasable pieces of split blocks, retries),
`nvidia-smi` (which processes shared the card) and vLLM's KV-cache refusals (the budget its
cache did not fit in). Each finding keeps the printed figures it compares, as
`text_diagnosis` does for the message; knobs come with the figure that supports them and are
offered only when it is in the text.
"""

from __future__ import annotations

from dataclasses import dataclass

from snapana.analysis.knob_words import flag, named
from snapana.log_model import KvBudget, KvRefusal, OomMessage
from snapana.printed import Size
from snapana.sources.log_tables import MemorySummary, SmiTable

#: Non-releasable bytes count as fragmentation from this share of what is reserved on.
NON_RELEASABLE_SHARE = 0.05
#: Weights from this share of vLLM's budget on are what leaves the cache no room.
WEIGHTS_SHARE = 0.8
#: The activation peak from this share of the budget on is worth batching fewer tokens.
ACTIVATION_SHARE = 0.2
#: From this share of the budget on, the activation peak gets a word of its own (issue 57).
ACTIVATION_HALF = 0.5
#: vLLM's gpu_memory_utilization above which raising it is not offered: the rest of the card
#: is the CUDA context, NCCL and the sampler's buffers.
MAX_UTILIZATION = 0.95


@dataclass(frozen=True)
class Finding:
    """One thing a text says, with the figures it compares: (what, bytes)."""

    id: str
    terms: tuple[tuple[str, int], ...]


@dataclass(frozen=True)
class Agreement:
    """A figure printed twice (an OOM message and a table): whether the two agree within
    their printed rounding."""

    what: str
    message: Size
    table: Size

    @property
    def agrees(self) -> bool:
        return abs(self.message.bytes - self.table.bytes) <= self.message.slack + self.table.slack


@dataclass(frozen=True)
class SummaryEvidence:
    summary: MemorySummary
    findings: tuple[Finding, ...]
    knobs: tuple[tuple[str, str], ...]
    message: OomMessage | None  # the OOM message of the same device it is checked against
    checks: tuple[Agreement, ...]
    source: str = ""  # the log it was read from


def _cur(s: MemorySummary, key: str) -> Size | None:
    row = s.sizes.get(key)
    return row[0] if row else None


def _nearest(messages: list[OomMessage], line: int, device: int | None) -> OomMessage | None:
    """The OOM message a table was printed for: the same device's last message before it
    (an except handler prints the table after the error), else its first one after."""
    same = [m for m in messages if device is None or m.device in (None, device)]
    before = [m for m in same if m.line <= line]
    after = [m for m in same if m.line > line]
    return before[-1] if before else after[0] if after else None


def summary_evidence(s: MemorySummary, messages: list[OomMessage], source: str = ""
                     ) -> SummaryEvidence:
    allocated, reserved = _cur(s, "allocated"), _cur(s, "reserved")
    non_releasable, requested = _cur(s, "non_releasable"), _cur(s, "requested")
    findings: list[Finding] = []
    if allocated is not None and reserved is not None:
        findings.append(Finding("cached", (("reserved", reserved.bytes),
                                           ("allocated", allocated.bytes))))
    fragmented = False
    if non_releasable is not None and reserved is not None and reserved.bytes:
        fragmented = non_releasable.bytes >= NON_RELEASABLE_SHARE * reserved.bytes
        if fragmented:
            findings.append(Finding("non_releasable", (("non-releasable", non_releasable.bytes),
                                                       ("reserved", reserved.bytes))))
    if requested is not None and allocated is not None and allocated.bytes > requested.bytes:
        findings.append(Finding("rounding", (("allocated", allocated.bytes),
                                             ("requested", requested.bytes))))
    if s.retries:
        findings.append(Finding("retries", (("retries", s.retries),)))
    oversize = s.counts.get("oversize_segments")
    if oversize and oversize[0][0]:
        findings.append(Finding("oversize", (("oversize segments", oversize[0][0]),)))
    message = _nearest(messages, s.line, s.device)
    knobs: list[tuple[str, str]] = []
    if fragmented and not (message is not None and message.expandable_on):
        env = f"PYTORCH_{message.backend if message is not None else 'CUDA'}_ALLOC_CONF"
        knobs.append((f"{env}=expandable_segments:True",
                      "memory_summary()'s non-releasable memory (free pieces of blocks split "
                      "and partly in use) is at least "
                      f"{NON_RELEASABLE_SHARE:.0%} of what is reserved: segments that grow "
                      "in place are not split that way (unless it was already set: the "
                      "table does not say)"))
    checks: list[Agreement] = []
    if message is not None:
        for what, printed, table in (("allocated by PyTorch", message.allocated, allocated),
                                     ("reserved by PyTorch", message.reserved, reserved)):
            if printed is not None and table is not None:
                checks.append(Agreement(what, printed, table))
    return SummaryEvidence(s, tuple(findings), tuple(knobs), message, tuple(checks), source)


@dataclass(frozen=True)
class SmiEvidence:
    table: SmiTable
    #: GPUs with more than one process: (index, ((pid or None, name, bytes or None), ...))
    shared: tuple[tuple[int, tuple[tuple[int | None, str, int | None], ...]], ...]
    #: the OOM messages' GPUs found by their 'Process N' pids: (message line, smi GPU index)
    matched: tuple[tuple[int, int], ...]
    source: str = ""


def smi_evidence(t: SmiTable, messages: list[OomMessage], source: str = "") -> SmiEvidence:
    by_gpu: dict[int, list[tuple[int | None, str, int | None]]] = {}
    for p in t.processes:
        by_gpu.setdefault(p.gpu, []).append((p.pid, p.name,
                                             p.used.bytes if p.used is not None else None))
    shared = tuple((g, tuple(ps)) for g, ps in sorted(by_gpu.items()) if len(ps) > 1)
    pid_gpu = {p.pid: p.gpu for p in t.processes if p.pid is not None}
    matched = []
    for m in messages:
        gpus = {pid_gpu[pid] for pid, _ in m.processes if pid in pid_gpu}
        if len(gpus) == 1:
            matched.append((m.line, gpus.pop()))
    return SmiEvidence(t, shared, tuple(matched), source)


@dataclass(frozen=True)
class KvEvidence:
    """A vLLM refusal with the budget message logged before it, or a budget alone (an
    engine that started, or a log cut before its refusal)."""

    refusal: KvRefusal | None
    budget: KvBudget | None
    findings: tuple[Finding, ...]
    knobs: tuple[tuple[str, str], ...]
    source: str = ""


def budget_before(r: KvRefusal, budgets: list[KvBudget]) -> KvBudget | None:
    before = [b for b in budgets if b.line <= r.line]
    return before[-1] if before else None


def kv_evidence(r: KvRefusal | None, budget: KvBudget | None, others_on_gpu: bool | None,
                source: str = "", valued: frozenset[str] = frozenset()) -> KvEvidence:
    """`others_on_gpu`: whether nvidia-smi beside the log shows another process sharing a
    GPU (None: no table), which is what a higher utilisation would take from. `valued`: the
    knobs other lines of the log already offer with a value (the refusal's own direction
    is then not repeated)."""
    findings: list[Finding] = []
    knobs: list[tuple[str, str]] = []
    if r is not None and r.kind == "too_long":
        if r.needed is not None and r.available is not None:
            findings.append(Finding("kv_short", (("needed", r.needed.bytes),
                                                 ("available", r.available.bytes))))
        if r.tokens is not None and r.max_model_len is not None:
            findings.append(Finding("kv_tokens", (("max_model_len", r.max_model_len),
                                                  ("tokens the cache holds", r.tokens))))
        longest = r.estimated_len if r.estimated_len is not None else r.tokens
        if longest and r.max_model_len is not None:
            knobs.append((f"--max-model-len {longest}",
                          f"vLLM's own count: the KV cache it could allocate holds "
                          f"{longest:,} tokens, the model's max_model_len is "
                          f"{r.max_model_len:,}; requests longer than that are refused "
                          "instead"))
    if budget is not None:
        spent = [(w, s.bytes) for w, s in (("model weights", budget.weights),
                                           ("non-torch memory", budget.non_torch),
                                           ("activation peak", budget.activation))
                 if s is not None]
        findings.append(Finding("budget", tuple((w, s.bytes) for w, s in (
            ("total", budget.total), ("budget", budget.budget), ("KV cache", budget.kv))
            if s is not None) + tuple(spent)))
        whole, peak = budget.budget, budget.activation
        if whole is not None and peak is not None and whole.bytes > 0 \
                and peak.bytes >= ACTIVATION_HALF * whole.bytes:
            findings.append(Finding("activation_half", (("activation peak", peak.bytes),
                                                        ("budget", whole.bytes))))
        if r is not None:
            knobs += _budget_knobs(r, budget, sum(n for _, n in spent), others_on_gpu)
        elif any(f.id == "activation_half" for f in findings):
            knobs.append(("--max-num-batched-tokens <fewer>",
                          f"the profiling run's activation peak ({peak.text}) is "  # type: ignore[union-attr]
                          f"{peak.bytes / whole.bytes:.0%} of the budget; it grows with the "  # type: ignore[union-attr]
                          "tokens one step batches, and the KV cache gets what it leaves"))
    utilization = flag("vllm_gpu_memory_utilization")
    if r is not None and r.kind == "no_blocks" and others_on_gpu is not True \
            and utilization not in valued and not any(k.startswith(utilization) for k, _ in knobs):
        knobs.insert(0, named("vllm_no_blocks"))  # its own message names it, without a figure
    return KvEvidence(r, budget, tuple(findings), tuple(knobs), source)


def _budget_knobs(r: KvRefusal, budget: KvBudget, used: int, others_on_gpu: bool | None
                  ) -> list[tuple[str, str]]:
    """What the budget message supports for a refusal: a higher utilisation (the least
    that holds the cache), more GPUs for the weights, fewer batched tokens for the
    activations; each with its share of the budget."""
    knobs: list[tuple[str, str]] = []
    at = _utilization(r, budget, used)
    if at is not None and others_on_gpu is not True:
        knobs.append((f"--gpu-memory-utilization {at:.2f}",
                      _utilization_why(r, budget, used, at, others_on_gpu)))
    whole = budget.budget.bytes if budget.budget is not None else None
    weights, activation = budget.weights, budget.activation
    if whole and weights is not None and weights.bytes >= WEIGHTS_SHARE * whole:
        knobs.append(("--tensor-parallel-size <more GPUs> (or a quantized checkpoint)",
                      f"the model's weights ({weights.text}) take {weights.bytes / whole:.0%} "
                      "of the budget: splitting them over more GPUs, or fewer bytes per "
                      "weight, is what leaves the cache room"))
    if whole and activation is not None and activation.bytes >= ACTIVATION_SHARE * whole:
        knobs.append(("--max-num-batched-tokens <fewer>",
                      f"the profiling run's activation peak ({activation.text}) is "
                      f"{activation.bytes / whole:.0%} of the budget; it grows with the "
                      "tokens one step batches"))
    return knobs


def _utilization(r: KvRefusal, budget: KvBudget, used: int) -> float | None:
    """The least gpu_memory_utilization the budget message says would have held the cache:
    for a cache too short, the budget plus what it lacked; for none at all, what the
    weights, non-torch memory and activations took, plus 1% of the card. None when the
    message is cut before its total, when it is no higher than the one set, or above
    MAX_UTILIZATION."""
    if budget.total is None or budget.budget is None or budget.utilization is None:
        return None
    total = budget.total.bytes
    if not total:
        return None
    if r.needed is not None and r.available is not None:
        need = budget.budget.bytes + max(r.needed.bytes - r.available.bytes, 0)
    elif r.kind == "no_blocks":
        need = used + total // 100
    else:
        return None
    at = -(-need * 100 // total) / 100  # rounded up to the hundredth
    return at if budget.utilization < at <= MAX_UTILIZATION else None


def _utilization_why(r: KvRefusal, budget: KvBudget, used: int, at: float,
                     others_on_gpu: bool | None) -> str:
    gib = 1 << 30
    assert budget.total is not None and budget.budget is not None  # (_utilization's terms)
    why = (f"vLLM's budget message: {budget.utilization:.2f} × {budget.total.text} = "
           f"{budget.budget.text}, of which the weights, non-torch memory and the activation "
           f"peak took {used / gib:.2f} GiB")
    if r.needed is not None and r.available is not None:
        why += (f"; the cache got {r.available.text} and needs {r.needed.text}, so "
                f"{at:.2f} × {budget.total.text} is the least budget that holds it")
    else:
        why += (f"; nothing was left for the cache: {at:.2f} × {budget.total.text} leaves it "
                "1% of the card (size it for the longest request)")
    return why + (" — nvidia-smi shows no other process sharing the card"
                  if others_on_gpu is False else
                  " — if no other process shares the card (the log has no nvidia-smi "
                  "table)")
