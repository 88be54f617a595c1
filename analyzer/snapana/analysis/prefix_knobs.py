"""A framework's knob from the prefix its worker process puts before an OOM message
(issue 69): vLLM's '(VllmWorker rank=N pid=P)' says the message is a vLLM step's; with the
message's own figures showing when it came (memory in CUDA-graph private pools: after the
KV cache was allocated), the framework's knob for that moment applies. The prefixes, the
clauses each needs and the knob are data (`prefix_knobs.toml`)."""

from __future__ import annotations

import re
from functools import lru_cache
from typing import TYPE_CHECKING

from snapana import data_file
from snapana.analysis.knob_words import knob
from snapana.printed import Size
from snapana.units import fmt_bytes

if TYPE_CHECKING:
    from snapana.analysis.text_diagnosis import TextDiagnosis


class PrefixEntry(data_file.Table, frozen=True, kw_only=True):
    """``[[prefix]]``: a framework's worker prefix, the clauses it needs, its knob."""

    framework: str
    pattern: str
    needs: list[str]
    knob: str
    value: str
    why: str


@data_file.schema("analysis/prefix_knobs.toml")
class PrefixKnobsFile(data_file.Table, frozen=True, kw_only=True):
    prefix: list[PrefixEntry]


@lru_cache(maxsize=1)
def entries() -> tuple[tuple[re.Pattern[str], PrefixEntry], ...]:
    return tuple((re.compile(e.pattern), e) for e in
                 data_file.packaged("analysis/prefix_knobs.toml", PrefixKnobsFile).prefix)


def prefix_knobs(d: TextDiagnosis) -> tuple[tuple[str, str], ...]:
    """(knob, why) for each framework prefix the message stands behind whose clauses it
    prints (above zero)."""
    m = d.message
    out = []
    for pattern, e in entries():
        if not m.prefix or pattern.match(m.prefix) is None:
            continue
        sizes = {n: getattr(m, n, None) for n in e.needs}
        if all(isinstance(s, Size) and s.bytes > 0 for s in sizes.values()):
            out.append(knob(e.knob, e.value, e.why.format(
                **{n: fmt_bytes(s.bytes) for n, s in sizes.items() if isinstance(s, Size)})))
    return tuple(out)
