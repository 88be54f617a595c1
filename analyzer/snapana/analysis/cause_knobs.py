"""The packs' knobs for a log's leading cause (issue 69): a pasted OOM message's lead cause
(another process holds the GPU) is an instance of a snapshot's cause (memory outside
PyTorch's allocator), whose knobs the rule packs declare. Which log cause is which is data
(`cause_knobs.toml`), with the knobs of that cause its words support; the packs are read
only when a message's lead is one of them, so a paste led by anything else is answered
without them."""

from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING

from snapana import data_file

if TYPE_CHECKING:
    from snapana.analysis.text_diagnosis import TextDiagnosis


class CauseEntry(data_file.Table, frozen=True, kw_only=True):
    """``[[cause]]``: a log's cause id, the packs' vocabulary cause it is an instance of, and
    the ids of that cause's knobs (their packs' `[[knob]]` ids) its words support."""

    log: str
    acts_as: str
    knobs: list[str]


@data_file.schema("analysis/cause_knobs.toml")
class CauseKnobsFile(data_file.Table, frozen=True, kw_only=True):
    cause: list[CauseEntry]


@lru_cache(maxsize=1)
def entries() -> dict[str, CauseEntry]:
    """Each log cause id's entry."""
    return {c.log: c for c in
            data_file.packaged("analysis/cause_knobs.toml", CauseKnobsFile).cause}


def cause_knobs(d: TextDiagnosis) -> tuple[tuple[str, str], ...]:
    """(knob, why) for the message's leading cause: the knobs its entry names that act on
    its vocabulary cause and belong to no one framework (a message alone shows none)."""
    lead = next((c for c in d.causes if c.role == "lead"), None)
    entry = entries().get(lead.id) if lead is not None else None
    if lead is None or entry is None:
        return ()
    from snapana.analysis.knobs import knobs_for

    chosen = {k.id: k for k in knobs_for([], [entry.acts_as], set(), None)}
    return tuple((k.knob, f"{k.effect} — the lead cause: {lead.holder}")
                 for k in (chosen.get(i) for i in entry.knobs) if k is not None)
