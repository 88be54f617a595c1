"""Why an OOM message's allocation failed, from its own figures (issue 44).

The message holds the request, the device's capacity and free bytes, what PyTorch's
allocator held (allocated, and reserved but unallocated) and, since 2.2, what this process
held in all. From those alone: the device's memory splits into free + PyTorch's reserved +
the rest (`outside`: this process's memory outside PyTorch's allocator, other processes, the
driver), and each cause is a comparison of printed figures, kept with its terms so that a
report can show the sum. Nothing the message does not print is assumed: the largest free
cached block is never in it, so fragmentation is "cached bytes larger than the request", said
with that caveat.
"""

from __future__ import annotations

from dataclasses import dataclass

from snapana.sources.oom_text import OomMessage

#: Memory outside PyTorch's allocator counts as a cause from this share of the device on
#: (a CUDA context alone takes 0.3-1 GiB of an 80 GiB card: about 1%).
OUTSIDE_SHARE = 0.05
#: The names of two cause terms renderers look up.
OUTSIDE = "outside PyTorch's allocator"
OTHERS = "other processes (the message's process lines)"
OWN_OUTSIDE = "this process outside PyTorch's allocator"
ELSEWHERE = "other processes and the driver"


@dataclass(frozen=True)
class TextCause:
    """One reason the request did not fit, with the figures it compares."""

    id: str  # fragmentation | outside_pytorch | other_processes | demand | size_bug |
    #          other_limit | spill
    terms: tuple[tuple[str, int], ...]


@dataclass(frozen=True)
class TextDiagnosis:
    """An OOM message's figures and what they say."""

    message: OomMessage
    #: the device's memory, split: (what, bytes), adding up to the capacity where it is known
    split: tuple[tuple[str, int], ...]
    causes: tuple[TextCause, ...]
    #: PYTORCH_CUDA_ALLOC_CONF / environment knobs the causes support, each with its reason
    knobs: tuple[tuple[str, str], ...]
    #: bytes the allocator would have asked the device for (the request's segment)
    segment: int | None


def diagnose(m: OomMessage) -> TextDiagnosis:
    req = m.request.bytes if m.request else None
    cap = m.capacity.bytes if m.capacity else None
    free = m.free.bytes if m.free else None
    reserved = m.reserved.bytes if m.reserved else None
    cached = m.unallocated.bytes if m.unallocated else (
        reserved - m.allocated.bytes if reserved is not None and m.allocated else None)
    # "Tried to allocate" prints what the allocator asked the device for (`alloc_size`,
    # the request's segment), not the tensor's size: compared with free as it is
    segment = req
    split: list[tuple[str, int]] = []
    outside = None
    if cap is not None and free is not None and reserved is not None:
        outside = cap - free - reserved
        split = [("free", free), ("reserved by PyTorch", reserved), (OUTSIDE, outside)]
        own = m.this_process.bytes if m.this_process is not None else 0
        if own:  # this process's figure (0: the driver could not see it) splits the rest
            split[2:] = [(OWN_OUTSIDE, own - reserved), (ELSEWHERE, cap - free - own)]
    causes: list[TextCause] = []
    if req is not None and cap is not None and req > cap + m.capacity.slack:  # type: ignore[union-attr]
        causes.append(TextCause("size_bug", (("request", req), ("capacity", cap))))
    if m.allocated is not None and cap is not None and m.allocated.bytes > cap:
        causes.append(TextCause("spill", (("allocated", m.allocated.bytes), ("capacity", cap))))
    if (segment is not None and free is not None and m.allowed is None and m.free is not None
            and segment < free - m.free.slack):
        causes.append(TextCause("other_limit", (("segment asked for", segment), ("free", free))))
    if m.wording == "2.12+ fraction" and req is not None:
        causes.append(TextCause("other_limit", (("request", req),)))
    if m.exabyte:
        causes.append(TextCause("size_bug", (("request", 1 << 60), ("capacity", cap or 0))))
    if m.allowed is not None and reserved is not None and req is not None:
        causes.append(TextCause("other_limit", (("allowed", m.allowed.bytes),
                                                ("reserved", reserved), ("request", req))))
    if cached is not None and req is not None and cached >= req:
        causes.append(TextCause("fragmentation", (("cached but unallocated", cached),
                                                  ("request", req))))
    if outside is not None and cap and req is not None and outside >= OUTSIDE_SHARE * cap:
        terms = [(OUTSIDE, outside), ("free", free or 0), ("request", req)]
        others = _other_processes(m)
        if others is not None:
            terms.append((OTHERS, others))
        causes.append(TextCause("outside_pytorch", tuple(terms)))
    if not any(c.id in ("size_bug", "spill", "other_limit", "fragmentation") for c in causes):
        if m.allocated is not None and req is not None:
            causes.append(TextCause("demand", (("allocated by PyTorch", m.allocated.bytes),
                                               ("request", req))))
    return TextDiagnosis(m, tuple(split), tuple(causes), _knobs(m, causes), segment)


def _other_processes(m: OomMessage) -> int | None:
    """Bytes of the other processes the message lists: PyTorch prints this process as the
    'this process has' sentence and every other one as a 'Process N' line; without that
    sentence one of the lines may be this process (a container), so no sum is made."""
    if not m.processes or m.this_process is None:
        return None
    return sum(s.bytes for _, s in m.processes)


def _knobs(m: OomMessage, causes: list[TextCause]) -> tuple[tuple[str, str], ...]:
    """Knobs the message's figures support, each with the figure that supports it."""
    ids = {c.id for c in causes}
    out: list[tuple[str, str]] = []
    env = "PYTORCH_HIP_ALLOC_CONF" if m.backend == "HIP" else "PYTORCH_CUDA_ALLOC_CONF"
    if "fragmentation" in ids and "size_bug" not in ids and not m.expandable_on:
        if m.wording == "2.1+":
            out.append((f"{env}=expandable_segments:True",
                        "the cached but unallocated bytes exceed the request: segments that "
                        "grow in place leave no gaps between them (unless it was already set: "
                        "the message does not say)"))
        else:
            out.append((f"{env}=max_split_size_mb:<size>",
                        "the cached but unallocated bytes exceed the request; this release "
                        "predates expandable segments (2.1): capping splits keeps large "
                        "blocks whole"))
    return tuple(out)
