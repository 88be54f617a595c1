"""What frameworks' own memory lines say (issue 57): SGLang's start-up budget, vLLM V1's,
torch_memory_saver's refusals, Megatron's and DeepSpeed's memory reports, per rank.

Each framework's lines of one rank are read together into its budget terms (weights, KV
pool, CUDA graphs, activations, what was left), and judged: which term the OOM of that rank
ate, and the knob that changes it with its figure, where the figures give one. A knob is
offered only when the term it shrinks alone covers what was short (counterfactual, as the
OOM message's causes are); its words are data (`framework_knobs.toml`).
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from snapana.analysis.knob_words import knob as _knob
from snapana.analysis.knob_words import named
from snapana.analysis.log_evidence import ACTIVATION_HALF, MAX_UTILIZATION, Finding
from snapana.analysis.text_diagnosis import ELSEWHERE_SHARE
from snapana.log_model import OomMessage
from snapana.sources.memory_lines import MemoryLine, framework_names
from snapana.units import fmt_bytes

#: vLLM 0.6's initial usage beyond its weights from this share of the card on: memory
#: another process (or another instance) held before profiling (a CUDA context is ~1%).
OTHERS_AT_START = 0.05
#: Megatron ranks whose peaks differ by this share of the highest are uneven.
UNEVEN_RANKS = 0.10


@dataclass(frozen=True)
class FrameworkEvidence:
    """One framework's memory lines on one rank of one log, judged."""

    framework: str
    rank: int | None
    lines: tuple[MemoryLine, ...]
    findings: tuple[Finding, ...]
    knobs: tuple[tuple[str, str], ...]  # (knob with its figure, why the figures support it)
    message: OomMessage | None  # the OOM of the same rank after the lines, if any
    source: str = ""


def framework_evidence(memory_lines: Sequence[MemoryLine], messages: Sequence[OomMessage],
                       source: str = "") -> list[FrameworkEvidence]:
    """Every (framework, rank) group of `memory_lines`, judged against the OOM message of
    the same rank that follows its first line."""
    groups: dict[tuple[str, int | None], list[MemoryLine]] = {}
    for m in memory_lines:
        groups.setdefault((m.framework, m.rank), []).append(m)
    _join_unranked(groups)
    after = _MessagesAfter(messages)
    out = []
    for (framework, rank), lines in groups.items():
        message = after.first(lines[0].line, rank)
        findings, knobs = _JUDGES[framework](lines, message)
        out.append(FrameworkEvidence(framework, rank, tuple(lines), tuple(findings),
                                     tuple(knobs), message, source))
    return out


def _join_unranked(groups: dict[tuple[str, int | None], list[MemoryLine]]) -> None:
    """A framework's lines that name no rank join its one ranked group, where it has just
    one: a traceback logged as one record carries the rank tag on its first line only
    (SGLang's 'Scheduler hit an exception: Traceback ...', the refusal lines below it)."""
    for framework in dict.fromkeys(f for f, _ in groups):  # in order (a set's: the hash seed's)
        ranked = [k for k in groups if k[0] == framework and k[1] is not None]
        if (framework, None) in groups and len(ranked) == 1:
            joined = groups.pop(ranked[0]) + groups.pop((framework, None))
            groups[ranked[0]] = sorted(joined, key=lambda m: m.line)


class _MessagesAfter:
    """The first OOM message after a line, of a rank (or naming none): a binary search in
    each rank's messages, so many groups and many messages stay cheap."""

    def __init__(self, messages: Sequence[OomMessage]) -> None:
        ordered = sorted(messages, key=lambda m: m.line)
        self.all = (ordered, [m.line for m in ordered])
        ranked: dict[int | None, list[OomMessage]] = {}
        for m in ordered:
            ranked.setdefault(m.rank, []).append(m)
        self.by_rank = {r: (ms, [m.line for m in ms]) for r, ms in ranked.items()}

    def first(self, line: int, rank: int | None) -> OomMessage | None:
        none: tuple[list[OomMessage], list[int]] = ([], [])
        pools = [self.all] if rank is None else [self.by_rank.get(rank, none),
                                                 self.by_rank.get(None, none)]
        found = [ms[k] for ms, lines in pools if (k := bisect_right(lines, line)) < len(ms)]
        return min(found, key=lambda m: m.line) if found else None


def across_ranks(evidence: list[FrameworkEvidence]) -> list[FrameworkEvidence]:
    """`evidence` of every log (a folder of per-rank logs), with a word on Megatron ranks
    whose reported peaks differ added to the first one's findings."""
    out = list(evidence)
    megatron = [k for k, e in enumerate(out) if e.framework == "megatron"]
    if megatron:
        out[megatron[0]] = _uneven_ranks([out[k] for k in megatron])
    return out


def _last(lines: Sequence[MemoryLine], fmt: str) -> MemoryLine | None:
    return next((m for m in reversed(lines) if m.format == fmt), None)


def _whole(line: MemoryLine, name: str) -> int:
    """A count the line's format reads as a number (tokens, a length)."""
    return int(line.number(name) or 0)


def _bytes(line: MemoryLine | None, name: str) -> int | None:
    s = line.size(name) if line is not None else None
    return s.bytes if s is not None else None


def _shortfall(message: OomMessage | None) -> int | None:
    if message is None or message.request is None or message.free is None:
        return None
    gap = message.request.bytes - message.free.bytes
    return gap if gap > 0 else None


# ----- SGLang ---------------------------------------------------------------------------

def _sglang(lines: Sequence[MemoryLine], message: OomMessage | None
            ) -> tuple[list[Finding], list[tuple[str, str]]]:
    before = _bytes(_last(lines, "sglang.load_weight_begin"), "avail")
    loaded = _last(lines, "sglang.load_weight_end")
    kv_line = _last(lines, "sglang.kv_allocated")
    k, v, kv = (_bytes(kv_line, n) for n in ("k", "v", "kv"))
    pool = kv if kv is not None else (k + v if k is not None and v is not None else None)
    end = max((m for m in lines if m.format in _GRAPH_ENDS), key=lambda m: m.line,
              default=None)
    graphs = _graphs(lines)
    budget = _last(lines, "sglang.budget")
    left = next((b for b in (_bytes(budget, "left"), _bytes(end, "avail"),
                             _bytes(_last(lines, "sglang.pool_end"), "avail")) if b is not None),
                None)
    fraction = _last(lines, "sglang.server_args")
    mfs = fraction.number("mem_fraction_static") if fraction is not None else None
    dist = _bytes(_last(lines, "sglang.dist_init_end"), "usage")
    terms = [(what, n) for what, n in (
        ("torch distributed init", dist if dist else None),
        ("free before the weights", before), ("weights", _bytes(loaded, "weights")),
        ("KV cache pool", pool), ("CUDA graphs", graphs), ("left after start-up", left))
        if n is not None]
    findings = [Finding("sglang_budget", tuple(terms))] if terms else []
    if kv_line is not None and kv_line.number("tokens") is not None:
        findings.append(Finding("sglang_kv_tokens", (("tokens", _whole(kv_line, "tokens")),
                                                      ("bytes", pool or 0))))
    if mfs is not None:
        findings.append(Finding(  # a fraction, which the text-log view prints as one
            "sglang_fraction", (("mem_fraction_static", mfs),)))  # type: ignore[arg-type]
    knobs: list[tuple[str, str]] = []
    refused = _last(lines, "sglang.not_enough")
    if refused is not None:  # last: the section's verdict is its last sentence
        said = refused.number("mem_fraction_static")
        share = said if said is not None else mfs
        said_terms: list[tuple[str, int]] = [("line", refused.line)]
        if share is not None:  # a fraction, which the text-log view prints as one
            said_terms.append(("mem_fraction_static", share))  # type: ignore[arg-type]
        findings.append(Finding("sglang_not_enough", tuple(said_terms)))
        knobs.append(_refused_fraction(before, _bytes(loaded, "avail")))
    gap = _shortfall(message)
    if gap is None or message is None:
        return _refusal_last(findings), knobs
    findings.append(Finding("sglang_oom", (("request", message.request.bytes),  # type: ignore[union-attr]
                                           ("free", message.free.bytes),  # type: ignore[union-attr]
                                           ("shortfall", gap))
                            + ((("left after start-up", left),) if left is not None else ())
                            + _last_avail(lines, message, left)))
    cap = message.capacity.bytes if message.capacity is not None else None
    if pool is not None and pool >= gap:
        if mfs is not None and cap:
            lower = math.ceil(gap * 100 / cap) / 100
            value = f"{max(mfs - lower, 0):.2f}"
            why = (f"the KV cache pool ({fmt_bytes(pool)}) alone covers the {fmt_bytes(gap)} the "
                   f"OOM lacked: {mfs:.2f} − {fmt_bytes(gap)} / {fmt_bytes(cap)} of the card "
                   f"(rounded up to {lower:.2f}) leaves it that much")
        else:
            value = "<lower>"
            why = (f"the KV cache pool ({fmt_bytes(pool)}) alone covers the {fmt_bytes(gap)} the "
                   "OOM lacked; the log does not print the fraction or the card's size to "
                   "say by how much")
        knobs.append(_knob("sglang_mem_fraction_static", value, why))
    if graphs is not None and graphs >= gap:
        knobs.append(_knob("sglang_cuda_graph_max_bs", "<smaller>",
                           f"the CUDA graphs took {fmt_bytes(graphs)}, at least the "
                           f"{fmt_bytes(gap)} the OOM lacked"))
    return _refusal_last(findings), knobs


def _last_avail(lines: Sequence[MemoryLine], message: OomMessage, left: int | None
                ) -> tuple[tuple[str, int], ...]:
    """SGLang's last 'avail mem' figure before the OOM, where it is lower than what start-up
    left: every load, pool and capture line prints the card's free memory
    (get_available_gpu_memory), and the sequence to the last one before the failure says
    what was taken after start-up (a reload, a colocated trainer's memory)."""
    seen = [m for m in lines if m.line < message.line and _bytes(m, "avail") is not None]
    if not seen or left is None:
        return ()
    last = seen[-1]
    avail = _bytes(last, "avail")
    assert avail is not None
    if avail >= left:
        return ()
    return (("last avail mem before the OOM", avail), ("at line", last.line))


def _refused_fraction(before: int | None, after: int | None) -> tuple[str, str]:
    """SGLang's refusal names --mem-fraction-static; its own start-up figures give the least
    share that leaves the KV pool anything. profile_max_num_token: rest_memory =
    available_gpu_memory (after the weights) − total_gpu_memory (free before them) × (1 −
    mem_fraction_static), refused when not positive: so the share must pass 1 − after /
    before."""
    if before is None or after is None or before <= 0:
        return named("sglang_not_enough")
    lower = math.ceil((1 - after / before) * 100) / 100
    return named("sglang_not_enough", f"{lower:.2f} or more",
                 f"SGLang's KV pool is avail mem after the weights ({fmt_bytes(after)}) − avail "
                 f"mem before them ({fmt_bytes(before)}) × (1 − mem_fraction_static) "
                 "(model_runner profile_max_num_token), positive only from 1 − "
                 f"{fmt_bytes(after)} / {fmt_bytes(before)} = {1 - after / before:.3f} on "
                 f"(rounded up); each 0.01 above it gives the pool {fmt_bytes(before // 100)}")


def _refusal_last(findings: list[Finding]) -> list[Finding]:
    """SGLang's own refusal to start, moved last: the section's verdict is its last
    sentence, and a refusal must never read as a healthy start-up."""
    return ([f for f in findings if f.id != "sglang_not_enough"]
            + [f for f in findings if f.id == "sglang_not_enough"])


_GRAPH_ENDS = ("sglang.graph_end", "sglang.graph_end_avail_first")


def _graphs(lines: Sequence[MemoryLine]) -> int | None:
    """What the CUDA graphs of the last start-up took: every capture's 'mem usage' after the
    last memory pool (a speculative engine captures the target's and the draft's)."""
    pool = _last(lines, "sglang.pool_end")
    since = pool.line if pool is not None else 0
    used = [_bytes(m, "usage") for m in lines if m.format in _GRAPH_ENDS and m.line > since]
    return sum(u for u in used if u is not None) if used else None


# ----- torch_memory_saver ---------------------------------------------------------------

def _memory_saver(lines: Sequence[MemoryLine], message: OomMessage | None
                  ) -> tuple[list[Finding], list[tuple[str, str]]]:
    last = lines[-1]
    size, free, margin = (_bytes(last, n) for n in ("size", "free", "margin"))
    assert size is not None and free is not None and margin is not None
    repeated = int(last.number("repeated") or 1) + len(lines) - 1
    findings = [Finding("saver_refused", (("size", size), ("free", free), ("margin", margin),
                                          ("times", repeated)))]
    knobs = []
    if size <= free:
        findings.append(Finding("saver_margin", (("size", size), ("free", free),
                                                 ("margin", margin))))
        knobs.append(_knob("memory_saver_margin", f"<= {free - size:,}",
                           f"the allocation ({fmt_bytes(size)}) fits the {fmt_bytes(free)} free; "
                           f"the margin ({fmt_bytes(margin)}) refused it: a margin of at most "
                           f"free − size = {fmt_bytes(free - size)} lets it through"))
    else:
        findings.append(Finding("saver_short", (("size", size), ("free", free),
                                                ("margin", margin))))
    return findings, knobs


# ----- vLLM V1 --------------------------------------------------------------------------

def _vllm(lines: Sequence[MemoryLine], message: OomMessage | None
          ) -> tuple[list[Finding], list[tuple[str, str]]]:
    profile = _last(lines, "vllm.profile_v1")
    weights = next((w for w in (_bytes(_last(lines, "vllm.model_loading"), "weights"),
                                _bytes(_last(lines, "vllm.model_weights_v0"), "weights"),
                                _bytes(profile, "weights")) if w is not None), None)
    kv = _bytes(_last(lines, "vllm.kv_available"), "kv")
    non_kv, activation = _bytes(profile, "non_kv"), _bytes(profile, "activation")
    tokens_line, conc = _last(lines, "vllm.kv_tokens"), _last(lines, "vllm.concurrency")
    budget = non_kv + kv if non_kv is not None and kv is not None else None
    old = _last(lines, "vllm.profile_v06")
    findings_v06: list[Finding] = []
    if old is not None:  # 0.6.x: the budget is total × utilisation, the peak its own figure
        total, util = _bytes(old, "total"), old.number("utilization")
        activation, kv = _bytes(old, "activation"), _bytes(old, "kv")
        budget = int(total * util) if total is not None and util is not None else None
        initial = _bytes(old, "initial")
        held = initial - weights if initial is not None and weights is not None else None
        if held is not None and total and held >= OTHERS_AT_START * total:
            findings_v06.append(Finding("vllm_held_at_start", (("held", held),
                                                               ("total", total))))
    card = _bytes(old, "total")
    terms = [(what, n) for what, n in (
        ("card (total_gpu_memory)", card),
        ("weights", weights), ("activation peak (profiling run)", activation),
        ("non-torch memory", _bytes(profile, "non_torch") if old is None
         else _bytes(old, "non_torch")), ("non-KV memory in all", non_kv),
        ("KV cache", kv),
        ("budget (total × utilisation)" if old is not None else "budget (non-KV + KV)", budget))
        if n is not None]
    findings = [Finding("vllm_budget", tuple(terms))] if terms else []
    findings += findings_v06
    knobs: list[tuple[str, str]] = []
    if kv is not None and kv < 0:
        findings.append(Finding("vllm_kv_negative", (("KV cache", kv),)))
        cap = message.capacity.bytes if message is not None and message.capacity else None
        if non_kv is None and old is None:  # what took the budget is not split: no value
            findings.append(Finding("vllm_unsplit", (("KV cache", kv),)))
        elif old is not None:
            knobs += _v06_utilization(old)
        elif cap:
            more = math.ceil(-kv * 100 / cap) / 100
            knobs.append(_knob("vllm_gpu_memory_utilization", f"+{more:.2f} or more",
                               f"the budget was {fmt_bytes(-kv)} short of its non-KV memory: "
                               f"{fmt_bytes(-kv)} / {fmt_bytes(cap)} of the card (the OOM "
                               "message's capacity), plus the KV cache one request needs — if "
                               "no other process holds that memory (a colocated trainer's "
                               "memory counts against vLLM's budget)"))
    if tokens_line is not None and conc is not None:
        tokens = _whole(tokens_line, "tokens")
        max_len, times = _whole(conc, "max_model_len"), float(conc.number("concurrency") or 0)
        findings.append(Finding("vllm_kv_tokens", (("tokens", tokens),
                                                   ("max_model_len", max_len))))
        if times < 1:
            knobs.append(_knob("vllm_max_model_len", f"{tokens:,}",
                               f"the KV cache holds {tokens:,} tokens, less than one request "
                               f"of {max_len:,} (concurrency {times:.2f}x)"))
    warmup = _last(lines, "vllm.warmup_oom")
    if warmup is not None:  # vLLM's own words name both knobs
        reqs = _whole(warmup, "num_reqs")
        findings.append(Finding("vllm_warmup_oom", (("line", warmup.line),
                                                    ("dummy requests", reqs))))
        knobs += [named("vllm_warmup_max_num_seqs", f"<fewer than {reqs:,}>",
                        f"it ran out warming up {reqs:,} dummy requests, as many as "
                        "max_num_seqs lets one step hold"),
                  named("vllm_warmup_utilization")]
    cumem = _last(lines, "vllm.cumem_oom")
    if cumem is not None:
        findings.append(Finding("vllm_cumem_oom", (("line", cumem.line),
                                                   ("source line", _whole(cumem,
                                                                          "source_line")))))
    if activation is not None and budget and activation >= ACTIVATION_HALF * budget:
        findings.append(Finding("vllm_activation_half", (("activation", activation),
                                                         ("budget", budget))))
        knobs.append(_knob("vllm_max_num_batched_tokens", "<fewer>",
                           f"the profiling run's activation peak ({fmt_bytes(activation)}) is "
                           f"{activation / budget:.0%} of the budget ({fmt_bytes(budget)}): "
                           "the KV cache gets what it leaves"))
    return findings, knobs


def _v06_utilization(old: MemoryLine) -> list[tuple[str, str]]:
    """vLLM 0.6's profiling results with no room for the cache: worker.
    determine_num_available_blocks sets kv_cache_size = total_gpu_memory ×
    gpu_memory_utilization − what the weights, the profiling run and non-torch memory took,
    so they took total × utilisation − kv_cache_size; the least utilisation that leaves the
    cache 1% of the card is (that + 1% of total) / total, rounded up to a hundredth."""
    total, util, kv = _bytes(old, "total"), old.number("utilization"), _bytes(old, "kv")
    if not total or util is None or kv is None:
        return []
    used = int(total * util) - kv
    at = math.ceil((used + total // 100) * 100 / total) / 100
    if at > MAX_UTILIZATION:
        return []
    return [named("vllm_no_blocks", f"{at:.2f}",
                  f"its profiling results: {util:.2f} × {fmt_bytes(total)} − kv_cache_size "
                  f"({fmt_bytes(kv)}) = {fmt_bytes(used)} taken before the cache; "
                  f"({fmt_bytes(used)} + 1% of the card) / {fmt_bytes(total)} = {at:.2f} "
                  "(rounded up) leaves the cache 1% of the card — size it for the longest "
                  "request; if no other process holds that memory")]


# ----- Megatron and DeepSpeed reports ---------------------------------------------------

def _megatron(lines: Sequence[MemoryLine], message: OomMessage | None
              ) -> tuple[list[Finding], list[tuple[str, str]]]:
    peak = max(lines, key=lambda m: _bytes(m, "max_reserved") or 0)
    findings = [Finding("report_peak", (("max reserved", _bytes(peak, "max_reserved") or 0),
                                        ("max allocated", _bytes(peak, "max_allocated") or 0),
                                        ("line", peak.line)))]
    findings += _against_message(_bytes(peak, "max_reserved"), message)
    return findings, []


def _deepspeed(lines: Sequence[MemoryLine], message: OomMessage | None
               ) -> tuple[list[Finding], list[tuple[str, str]]]:
    peak = max(lines, key=lambda m: _bytes(m, "max_ca") or 0)
    last = lines[-1]
    findings = [Finding("report_peak", (("max reserved", _bytes(peak, "max_ca") or 0),
                                        ("max allocated", _bytes(peak, "max_ma") or 0),
                                        ("line", peak.line))),
                Finding("report_cached", (("reserved", _bytes(last, "ca") or 0),
                                          ("allocated", _bytes(last, "ma") or 0),
                                          ("line", last.line)))]
    findings += _against_message(_bytes(peak, "max_ca"), message)
    return findings, []


def _against_message(peak: int | None, message: OomMessage | None) -> list[Finding]:
    """The failing step against the reported peak: what PyTorch held when it failed, and the
    request on top, beyond the highest peak a report printed."""
    if peak is None or message is None or message.reserved is None or message.request is None:
        return []
    return [Finding("report_vs_oom", (("reported peak", peak),
                                      ("reserved at the OOM", message.reserved.bytes),
                                      ("request", message.request.bytes)))]


def _uneven_ranks(evidence: list[FrameworkEvidence]) -> FrameworkEvidence:
    """The first rank's evidence, with a word on ranks whose reported peaks differ (an
    uneven pipeline stage, longer sequences on one rank)."""
    first = evidence[0]
    peaks = [(e.rank, e.findings[0].terms[0][1]) for e in evidence if e.rank is not None]
    if len(peaks) < 2:
        return first
    high, low = max(peaks, key=lambda p: p[1]), min(peaks, key=lambda p: p[1])
    if not high[1] or high[1] - low[1] < UNEVEN_RANKS * high[1]:
        return first
    return FrameworkEvidence(
        first.framework, first.rank, first.lines,
        (*first.findings, Finding("uneven_ranks", ((f"rank {high[0]}", high[1]),
                                                   (f"rank {low[0]}", low[1])))),
        first.knobs, first.message, first.source)


# ----- slime's Memory-Usage lines --------------------------------------------------------

def _slime(lines: Sequence[MemoryLine], message: OomMessage | None
           ) -> tuple[list[Finding], list[tuple[str, str]]]:
    """The last Memory-Usage line of a rank: the card's used memory, and of it what this
    process's PyTorch cache did not hold (used − reserved: other processes, a colocated
    engine, this process's CUDA context and libraries)."""
    last = lines[-1]
    total, free, used = (_bytes(last, n) for n in ("total", "free", "used"))
    assert total is not None and free is not None and used is not None
    terms = [("total", total), ("used", used), ("free", free), ("line", last.line)]
    reserved = _bytes(last, "reserved")
    if reserved is not None:
        terms += [("reserved", reserved), ("allocated", _bytes(last, "allocated") or 0)]
    findings = [Finding("memory_usage", tuple(terms))]
    if reserved is not None and total and used - reserved >= ELSEWHERE_SHARE * total:
        findings.append(Finding("usage_elsewhere", (("outside", used - reserved),
                                                    ("total", total))))
    return findings, []


# ----- out-of-memory errors raised outside PyTorch's caching allocator -------------------

def _nccl(lines: Sequence[MemoryLine], message: OomMessage | None
          ) -> tuple[list[Finding], list[tuple[str, str]]]:
    last = lines[-1]
    return [Finding("nccl_calloc", (("size", _bytes(last, "size") or 0),
                                    ("times", len(lines)), ("line", last.line)))], []


def _cuda(lines: Sequence[MemoryLine], message: OomMessage | None
          ) -> tuple[list[Finding], list[tuple[str, str]]]:
    by_format: dict[str, list[MemoryLine]] = {}  # 'CUDA error: out of memory', cuBLAS's
    for ln in lines:
        by_format.setdefault(ln.format, []).append(ln)
    return [Finding(fmt.replace(".", "_"), (("times", len(group)), ("line", group[0].line)))
            for fmt, group in by_format.items()], []


# ----- PyTorch's MPS allocator (Apple GPU) -----------------------------------------------

#: PYTORCH_MPS_HIGH_WATERMARK_RATIO's default and its upper bound on unified memory
#: (MPSAllocator.h default_high_watermark_ratio, default_high_watermark_upper_bound).
MPS_DEFAULT_RATIO = 1.7
MPS_MAX_RATIO = 2.0


def _mps(lines: Sequence[MemoryLine], message: OomMessage | None
         ) -> tuple[list[Finding], list[tuple[str, str]]]:
    """The last MPS refusal: this process's Metal memory (MPS allocated + other allocations)
    and the request against max allowed. With a limit printed, the ratio that lets the
    request through if the default 1.7 is in force (max allowed = ratio × the recommended
    working set), else the message's own 0.0; without one the device itself ran out."""
    last = lines[-1]
    allocated, request = _bytes(last, "allocated") or 0, _bytes(last, "request") or 0
    other, allowed = _bytes(last, "other") or 0, _bytes(last, "allowed")
    terms = [("MPS allocated", allocated), ("other allocations", other),
             ("request", request), ("line", last.line), ("times", len(lines))]
    if allowed is None:
        return [Finding("mps_oom", tuple(terms))], []
    findings = [Finding("mps_oom", (*terms, ("max allowed", allowed)))]
    needed = allocated + other + request
    ratio = math.ceil(MPS_DEFAULT_RATIO * needed / allowed * 100) / 100 if allowed else None
    if ratio is not None and MPS_DEFAULT_RATIO < ratio <= MPS_MAX_RATIO:
        how = (f"allocated {fmt_bytes(allocated)} + other allocations {fmt_bytes(other)} + "
               f"the request {fmt_bytes(request)} = {fmt_bytes(needed)} over max allowed "
               f"{fmt_bytes(allowed)}: {MPS_DEFAULT_RATIO} × {fmt_bytes(needed)} / "
               f"{fmt_bytes(allowed)}, rounded up, if the default ratio {MPS_DEFAULT_RATIO} "
               "made that limit (it may be at most 2.0)")
        return findings, [named("mps_high_watermark", f"{ratio:.2f}", how)]
    return findings, [named("mps_high_watermark")]


# ----- PyTorch's cudaMallocAsync backend ------------------------------------------------

def _cuda_async(lines: Sequence[MemoryLine], message: OomMessage | None
                ) -> tuple[list[Finding], list[tuple[str, str]]]:
    """The last refusal of the cudaMallocAsync backend, with the figure lines printed under
    it: what PyTorch's live allocations held, the request, the device's total and free, and
    the rest (total − free − allocated: memory the driver's pool keeps after frees, other
    processes, the CUDA context). Its figure lines are read only under it (memory_lines.toml
    `after`)."""
    heads = [m for m in lines if m.format == "cuda_async.oom"]
    head = heads[-1]
    below = {m.format: m for m in lines if m.line > head.line}
    figures = {name: b for fmt, name in (("cuda_async.allocated", "allocated"),
                                         ("cuda_async.requested", "request"),
                                         ("cuda_async.device_limit", "total"),
                                         ("cuda_async.free", "free"))
               if (b := _bytes(below.get(fmt), name)) is not None}
    terms = [("line", head.line), ("times", len(heads)), *figures.items()]
    if {"allocated", "total", "free"} <= figures.keys():
        terms.append(("elsewhere", max(0, figures["total"] - figures["free"]
                                       - figures["allocated"])))
    return [Finding("cuda_async_oom", tuple(terms))], []


_JUDGES: dict[str, Callable[[Sequence[MemoryLine], OomMessage | None],
                            tuple[list[Finding], list[tuple[str, str]]]]] = {
    "sglang": _sglang, "torch_memory_saver": _memory_saver, "vllm": _vllm,
    "megatron": _megatron, "deepspeed": _deepspeed, "slime": _slime, "nccl": _nccl,
    "cuda": _cuda, "mps": _mps, "cuda_async": _cuda_async}

#: Each framework's name as its section says it (memory_lines.toml [[framework]]).
FRAMEWORK_NAMES = framework_names()


def _check_registry() -> None:
    """A framework reader is one entry, tied by its id: its formats and name in
    memory_lines.toml and its judge here. Checked at import, so one without the other fails
    the test suite, not a user's log."""
    if set(_JUDGES) != set(FRAMEWORK_NAMES):
        raise ImportError(
            "framework readers: memory_lines.toml [[framework]] without a judge: "
            f"{sorted(set(FRAMEWORK_NAMES) - set(_JUDGES))}; judges without a [[framework]]: "
            f"{sorted(set(_JUDGES) - set(FRAMEWORK_NAMES))}")


_check_registry()
