"""The view of a what-if (issue 45): for each device, whether the allocator model reproduces
the recorded window (the proof any prediction rests on), and the changed run's figures
beside the recorded run's. Renderers (text, markdown, json) only lay these out."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from snapana.analysis.allocator_replay import Prediction, Replay
from snapana.render import ViewKind
from snapana.units import fmt_bytes, ordinal

COLUMNS = ("figure", "as recorded (model)", "with the change")


@dataclass(frozen=True)
class DeviceWhatIf:
    device: int
    proof: str  # whether the model reproduces the window, with its figures
    verdict: str  # what the change does, or why nothing is predicted
    rows: tuple[tuple[str, str, str], ...]
    prediction: Prediction


@dataclass(frozen=True)
class WhatIfView:
    kind: ClassVar[ViewKind] = "whatif"
    title: str
    change: str  # the change, in words
    devices: tuple[DeviceWhatIf, ...]
    not_simulated: tuple[str, ...]  # asked changes the model has no rule for

    @property
    def footer(self) -> str:
        """What the figures are; what no file holds, when a recorded OOM ended the job."""
        oom = any(d.prediction.recorded.recorded_ooms for d in self.devices)
        return ("A simulation of the recorded window through the allocator model"
                + ("; what the job did after its OOM is in no file." if oom else "."))


def _ooms(r: Replay) -> str:
    if not r.simulated_ooms:
        return "none"
    idx, size = r.simulated_ooms[0]
    more = f" (+{len(r.simulated_ooms) - 1} more)" if len(r.simulated_ooms) > 1 else ""
    return f"at event {idx}, a request of {fmt_bytes(size)}{more}"


def _proof(p: Prediction) -> str:
    r = p.recorded
    if r.stopped:
        return f"The model cannot run this window: {r.stopped} (event {r.stopped_at})."
    if r.divergence is not None:
        k, idx, why = r.divergence
        return (f"The model does not reproduce this window: its segment events part from the "
                f"recorded ones at the {ordinal(k + 1)}, event {idx} ({why}).")
    where = "at the recorded request" if r.oom_reproduced else "NOT at the recorded request"
    if not r.recorded:
        if r.recorded_ooms:
            return ("The window records no segment events (cudaMalloc / cudaFree / map / "
                    "unmap) and the model made none: only the OOM is checked against the "
                    f"recording, and the model fails {where}.")
        return ("The window records no segment events (cudaMalloc / cudaFree / map / unmap) "
                "and the model made none, so its replay is not checked against the recording: "
                "what follows is the model's alone.")
    oom = f", and the OOM {where}" if r.recorded_ooms else ""
    head = (f"The model reproduces this window: all {len(r.recorded):,} recorded segment "
            "events (cudaMalloc / cudaFree / map / unmap), size for size, in order")
    return head + oom + "."


def _capacity(p: Prediction, changed: bool) -> str:
    n = p.capacity if changed else p.recorded_capacity
    if n is None:
        return "not known (no OOM recorded): unbounded"
    if not changed or p.capacity == p.recorded_capacity:
        return fmt_bytes(n) + " (reserved + free at the OOM)"
    if p.outside is not None:
        return (fmt_bytes(n) + f" (the card asked less the {fmt_bytes(p.outside)} that "
                "other memory held on the recorded card)")
    return (fmt_bytes(n) + " (the whole card asked: the capture does not record its card's "
            "total, so memory outside PyTorch is not subtracted)")


def _smallest(p: Prediction) -> str:
    if p.smallest is None:
        return p.smallest_note
    card = f"; a card of {fmt_bytes(p.smallest + p.outside)} with the recorded card's other " \
        "memory" if p.outside is not None else ""
    return f"{fmt_bytes(p.smallest)} (by bisection, to 20 MiB{card})"


def _verdict(p: Prediction) -> str:
    if p.changed is None:
        return "No prediction: a model that does not reproduce the job predicts nothing about it."
    r, c = p.recorded, p.changed
    if r.recorded_ooms:
        if not c.simulated_ooms:
            return (f"The recorded OOM goes away: the window runs to its end, peak reserved "
                    f"{fmt_bytes(c.peak_reserved)} (as recorded, the model's peak was "
                    f"{fmt_bytes(r.peak_reserved)}).")
        idx = c.simulated_ooms[0][0]
        where = ("at the recorded request" if idx == r.recorded_ooms[0] else
                 f"at event {idx}, before the recorded one ({r.recorded_ooms[0]})"
                 if idx < r.recorded_ooms[0] else f"at event {idx}")
        return f"The job still runs out of memory, {where}: the change does not make it fit."
    if c.simulated_ooms:
        return (f"With the change the job runs out of memory at event "
                f"{c.simulated_ooms[0][0]}, where it did not.")
    return (f"No OOM either way; peak reserved {fmt_bytes(c.peak_reserved)} with the change, "
            f"{fmt_bytes(r.peak_reserved)} as recorded.")


def whatif_view(title: str, change: str, predictions: list[Prediction],
                not_simulated: tuple[str, ...] = ()) -> WhatIfView:
    devices = []
    for p in predictions:
        rows: list[tuple[str, str, str]] = []
        c = p.changed
        if c is not None:
            rows = [("peak reserved", fmt_bytes(p.recorded.peak_reserved),
                     fmt_bytes(c.peak_reserved)),
                    ("peak allocated", fmt_bytes(p.recorded.peak_allocated),
                     fmt_bytes(c.peak_allocated)),
                    ("segment events", f"{len(p.recorded.simulated):,}",
                     f"{len(c.simulated):,}"),
                    ("OOM", _ooms(p.recorded), _ooms(c))]
            rows.append(("memory PyTorch could hold", _capacity(p, False),
                         _capacity(p, True)))
            rows.append(("least memory with no OOM", "", _smallest(p)))
        devices.append(DeviceWhatIf(p.device, _proof(p), _verdict(p), tuple(rows), p))
    return WhatIfView(title, change, tuple(devices), not_simulated)
