"""An OOM message checked against the snapshot of the same failure (issue 44): the figures
the message printed (what the allocator asked the device for, the device's free memory,
what PyTorch reserved and allocated) against the snapshot's own at its OOM. They are two
records of one moment; a disagreement beyond the message's printed rounding says they are
not (another rank's log, another step, a snapshot dumped later) and is said, never smoothed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from snapana.allocator_model.rules import segment_size_for
from snapana.log_model import OomMessage
from snapana.printed import Size

if TYPE_CHECKING:
    from snapana.analysis.diagnosis.findings import DeviceReport


@dataclass(frozen=True)
class FigureCheck:
    what: str
    printed: Size
    snapshot: int
    how: str  # what the snapshot's figure is

    @property
    def agrees(self) -> bool:
        return abs(self.printed.bytes - self.snapshot) <= self.printed.slack


@dataclass(frozen=True)
class LogCheck:
    """One message against one device's report: the figures both hold."""

    message: OomMessage
    device: int
    path: str  # the snapshot's
    figures: tuple[FigureCheck, ...]
    snapshot_oom: bool  # the snapshot records an OOM (else it was taken at another moment)


def pick_message(messages: list[OomMessage], device: int) -> OomMessage | None:
    """The message of the device's failure: its last one (the one that ended the job)."""
    same = [m for m in messages if m.device is None or m.device == device]
    return same[-1] if same else None


def check(message: OomMessage, report: DeviceReport) -> LogCheck:
    oom = report.oom
    figures: list[FigureCheck] = []
    if oom is not None:
        if message.request is not None:
            figures.append(FigureCheck(
                "asked of the device", message.request, segment_size_for(oom.requested_bytes),
                f"the segment for the OOM's request of {oom.requested_bytes:,} bytes "
                "('Tried to allocate' prints that segment)"))
        if message.free is not None and oom.device_free_bytes is not None:
            figures.append(FigureCheck("device free", message.free, oom.device_free_bytes,
                                       "the OOM entry's device_free"))
        if message.reserved is not None:
            figures.append(FigureCheck("reserved by PyTorch", message.reserved,
                                       report.reserved_bytes, "segments at the OOM"))
        if message.allocated is not None:
            figures.append(FigureCheck("allocated by PyTorch", message.allocated,
                                       report.allocated_bytes, "live blocks at the OOM"))
    return LogCheck(message, report.device, report.path, tuple(figures), oom is not None)
