"""The wiring for text logs (issue 44), as `session` is for captures: read what each text
says about memory, diagnose every OOM message, weigh the tables and vLLM refusals beside
them. Kept apart from `session` so that a paste is answered without importing the capture
pipeline (polars, the rule engine): `snapana summary -` in well under a second."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from snapana.analysis.cause_knobs import cause_knobs
from snapana.analysis.framework_memory import (
    FrameworkEvidence,
    across_ranks,
    framework_evidence,
)
from snapana.analysis.knob_words import share_knobs, with_settings
from snapana.analysis.log_check import LogCheck, check, pick_message
from snapana.analysis.log_evidence import (
    KvEvidence,
    SmiEvidence,
    SummaryEvidence,
    budget_before,
    kv_evidence,
    smi_evidence,
    summary_evidence,
)
from snapana.analysis.prefix_knobs import prefix_knobs
from snapana.analysis.text_diagnosis import TextDiagnosis, diagnose
from snapana.log_model import OomMessage, Setting
from snapana.sources import log_text
from snapana.sources.traceback_text import ending_at, traceback_of

if TYPE_CHECKING:
    from snapana.analysis.diagnosis.findings import DeviceReport
    from snapana.analysis.traceback_request import RequestFinding


@dataclass(frozen=True)
class LogEvidence:
    """Everything read from the texts, diagnosed, in the texts' order."""

    logs: tuple[log_text.TextLog, ...]
    diagnoses: tuple[TextDiagnosis, ...]
    summaries: tuple[SummaryEvidence, ...]
    smi: tuple[SmiEvidence, ...]
    kv: tuple[KvEvidence, ...]
    #: for each diagnosis, the failing request named from its traceback (None: none read)
    requests: tuple[RequestFinding | None, ...] = ()
    #: frameworks' memory lines, per log, framework and rank, judged
    frameworks: tuple[FrameworkEvidence, ...] = ()
    #: what was read and not used: tracebacks that end at no OOM message (issue 69)
    not_read: tuple[str, ...] = ()
    #: the settings the texts' args dumps print, and the knobs whose words they changed
    settings: tuple[Setting, ...] = ()
    set_knobs: tuple[tuple[str, str], ...] = ()  # (knob text, setting id)


def read_logs(paths: list[Path] | None, ranks: dict[Path, int] | None = None) -> LogEvidence:
    """The logs (`None`: a paste on standard input) and what each says. `ranks`: a rank for
    each file whose name carries one, given to its messages whose lines name none."""
    logs = [log_text.read_stdin()] if paths is None else [  # several: an empty one is said
        _ranked(log_text.read(p, require=len(paths) == 1), (ranks or {}).get(p)) for p in paths]
    return weigh(logs)


def weigh(logs: list[log_text.TextLog]) -> LogEvidence:
    """Every message of `logs` diagnosed; each table and refusal weighed against the
    messages of its own log."""
    diagnoses, summaries, smi, kv = [], [], [], []
    requests: list[RequestFinding | None] = []
    frameworks: list[FrameworkEvidence] = []
    not_read: list[str] = []
    changed: list[tuple[str, str]] = []
    for log in logs:
        messages = list(log.messages)
        set_ = _Settings(log.settings, changed)
        diagnosed = list(map(diagnose, messages))
        prefixed = [prefix_knobs(d) for d in diagnosed]  # a worker's prefix names a knob
        own = [replace(d, knobs=set_(d.knobs + cause_knobs(d) + p))
               for d, p in zip(diagnosed, prefixed, strict=True)]
        named = _requests(log)
        requests += [None if r is None else replace(r, knobs=set_(r.knobs, m))
                     for r, m in zip(named, messages, strict=True)]
        not_read += _unused_tracebacks(log, named)
        judged = framework_evidence(log.memory_lines, messages, log.name)
        valued = frozenset(k.split(" ", 1)[0] for e in judged for k, _ in e.knobs
                           if "<" not in k)
        frameworks += [replace(e, knobs=set_(e.knobs)) for e in judged]
        summaries += [summary_evidence(s, messages, log.name) for s in log.summaries]
        tables = [smi_evidence(t, messages, log.name) for t in log.smi]
        smi += tables
        others = None if not log.smi else any(e.shared for e in tables)
        budgets = list(log.budgets)
        paired = [(r, budget_before(r, budgets)) for r in log.refusals]
        alone = [b for b in budgets if all(b is not p for _, p in paired)]
        budget = [replace(e, knobs=set_(e.knobs)) for e in
                  [kv_evidence(r, b, others, log.name, valued) for r, b in paired]
                  + [kv_evidence(None, b, others, log.name) for b in alone]]
        kv += budget
        given = [*(r.knobs for r in named if r is not None), *(e.knobs for e in judged),
                 *(e.knobs for e in budget), *prefixed]
        if not any(given):  # no traceback, framework line or refusal names a knob
            own = [replace(d, knobs=(*d.knobs, *set_(_settings_alone(log.settings, m))))
                   for d, m in zip(own, messages, strict=True)]
        diagnoses += own
    return LogEvidence(tuple(logs), tuple(diagnoses), tuple(summaries), tuple(smi), tuple(kv),
                       tuple(requests), tuple(across_ranks(frameworks)), tuple(not_read),
                       tuple(s for log in logs for s in log.settings), tuple(changed))


class _Settings:
    """One log's settings put into knobs (`knob_words.with_settings`), the knobs whose words
    they changed gathered in `changed`."""

    def __init__(self, settings: tuple[Setting, ...], changed: list[tuple[str, str]]) -> None:
        self.settings, self.changed = settings, changed

    def __call__(self, knobs: tuple[tuple[str, str], ...], m: OomMessage | None = None
                 ) -> tuple[tuple[str, str], ...]:
        if not self.settings or not knobs:
            return knobs
        out, changed = with_settings(
            knobs, self.settings, m.request.bytes if m and m.request else None,
            m.free.bytes if m and m.free else None)
        self.changed += changed
        return out


def _settings_alone(settings: tuple[Setting, ...], m: OomMessage
                    ) -> tuple[tuple[str, str], ...]:
    """The budget knobs the log's settings alone support for message `m` (issue 69): asked
    only where no traceback, framework line or refusal of the log gives a knob."""
    return share_knobs(settings, m.request.bytes if m.request else None,
                       m.free.bytes if m.free else None,
                       m.capacity.bytes if m.capacity else None)


def _unused_tracebacks(log: log_text.TextLog, named: list[RequestFinding | None]) -> list[str]:
    """The tracebacks of `log` with frames that no message's request was named from: read,
    and not used (another exception's, or one whose OOM message the text does not hold)."""
    used = {(r.traceback.first_line, r.traceback.rank) for r in named if r is not None}
    out = []
    for t in log.tracebacks:
        if not t.frames or (t.first_line, t.rank) in used:
            continue
        ends = (f"ends in {t.exception[:80]!r}" if t.exception else
                "is cut before its exception")
        out.append(f"{log.name} line {t.first_line}"
                   + (f" (rank {t.rank})" if t.rank is not None else "")
                   + f": a traceback of {len(t.frames)} frame(s) that {ends}: no OOM message's"
                   " request")
    return out


def _requests(log: log_text.TextLog) -> list[RequestFinding | None]:
    """Each message's failing request, named from its traceback by the rule packs. The rules
    engine is imported only for a log that has a traceback to read."""
    by_end = ending_at(log.tracebacks)
    stacks = [traceback_of(by_end, m.line, m.rank) for m in log.messages]
    if not any(t is not None and t.frames for t in stacks):
        return [None] * len(stacks)
    from snapana.analysis.attribution import load_rules
    from snapana.analysis.traceback_request import RequestNamer

    namer = RequestNamer(load_rules())
    return [None if t is None or not t.frames else
            namer.name(t, m.request.bytes if m.request else None, m.expandable_on)
            for m, t in zip(log.messages, stacks, strict=True)]


def _ranked(log: log_text.TextLog, rank: int | None) -> log_text.TextLog:
    if rank is None:
        return log
    return replace(log, messages=tuple(m if m.rank is not None else replace(m, rank=rank)
                                       for m in log.messages),
                   memory_lines=tuple(m if m.rank is not None else replace(m, rank=rank)
                                      for m in log.memory_lines))


def check_beside(paths: list[Path], reports: list[DeviceReport]) -> tuple[LogCheck, ...]:
    """The OOM messages of logs given beside a snapshot, each device's failure checked
    against the snapshot's figures at its OOM (GPU devices only; a log's message names the
    CUDA device)."""
    messages = [m for p in paths for m in log_text.read(p).messages]
    out = []
    for r in reports:
        if not r.has_segments:
            continue
        m = pick_message(messages, r.device)
        if m is not None:
            out.append(check(m, r))
    return tuple(out)
