"""The view of `snapana whatif --scale` (issue 61): per device, the resized run at the recorded
sizes beside the recorded peaks (the proof), the run at the asked sizes, the largest size that
fits with the runs that prove it, what is assumed and which blocks were held fixed. Renderers
(text, markdown, json) only lay these out."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

import polars as pl

from snapana.analysis.scaled_replay import Fit, ScaledRun, SizePrediction
from snapana.analysis.scaling import HELD_HOWS, load_rules
from snapana.render import ViewKind
from snapana.units import fmt_bytes

COLUMNS = ("figure", "at the recorded size (model)", "at the asked size")
HELD_COLUMNS = ("site", "family", "blocks", "bytes", "why held fixed")
#: Sites listed as held fixed, at most (the rest are counted).
HELD_SHOWN = 8


@dataclass(frozen=True)
class DeviceScale:
    device: int
    head: tuple[str, ...]  # which seq the sizes were made at; how sure the answer is
    proof: str
    verdict: str
    rows: tuple[tuple[str, str, str], ...]
    fit: tuple[str, ...]
    assumptions: tuple[str, ...]
    held_fixed: tuple[tuple[str, str, str, str, str], ...]
    prediction: SizePrediction


@dataclass(frozen=True)
class ScaleView:
    kind: ClassVar[ViewKind] = "scale"
    title: str
    change: str
    devices: tuple[DeviceScale, ...]

    @property
    def footer(self) -> str:
        return ("A simulation: the recorded requests resized by the rules above and replayed "
                "through the allocator model, started fresh (the blocks held before the "
                "window first, in address order).")


def sizes_text(sizes: Mapping[str, int]) -> str:
    return ", ".join(f"{k}={v:,}" for k, v in sizes.items())


def _where(p: SizePrediction, run: ScaledRun) -> str:
    """Where a run first ran out, in words."""
    idx, size = run.replay.simulated_ooms[0]
    if idx < 0:
        return (f"while placing the blocks held before the window (a request of "
                f"{fmt_bytes(size)})")
    row = p.growth.blocks.filter(pl.col("alloc_idx") == idx)
    held = ("; held at its recorded size: its growth is not known"
            if row.height and row["how"][0] in HELD_HOWS else "")
    what = f" ({row['family'][0]}, {row['site'][0]}{held})" if row.height else ""
    return f"at event {idx:,}, a request of {fmt_bytes(size)}{what}"


def _outcome(p: SizePrediction, run: ScaledRun) -> str:
    if run.replay.stopped and not run.replay.simulated_ooms:
        return f"the model stopped: {run.replay.stopped}"
    if run.fits:
        card = f" in {fmt_bytes(run.capacity)}" if run.capacity else ""
        return f"no OOM{card}"
    return "runs out " + _where(p, run)


def _proof(p: SizePrediction) -> str:
    r = p.proof.replay
    oom = ""
    if p.recorded_oom is not None:
        first = r.simulated_ooms[0][0] if r.simulated_ooms else None
        oom = (f"; it runs out at the recorded request (event {p.recorded_oom:,})"
               if first == p.recorded_oom else
               f"; it does NOT run out at the recorded request (event {p.recorded_oom:,}): "
               + ("no OOM" if first is None else f"it runs out at event {first:,}"))
    recorded = ("the capture recorded" if p.traced else
                "the capture has no trace (only its snapshot's blocks are resized) and holds")
    return (f"At the recorded size ({sizes_text(p.proof.sizes)}) the resized model peaks at "
            f"{fmt_bytes(r.peak_allocated)} allocated and {fmt_bytes(r.peak_reserved)} reserved;"
            f" {recorded} {fmt_bytes(p.recorded_peak_allocated)} and "
            f"{fmt_bytes(p.recorded_peak_reserved)}{oom}.")


def _verdict(p: SizePrediction) -> str:
    t = p.target
    if t is None:
        return "No size asked beyond the recorded one."
    r = t.replay
    return (f"At {sizes_text(t.sizes)}: peak allocated {fmt_bytes(r.peak_allocated)}, peak "
            f"reserved {fmt_bytes(r.peak_reserved)}; {_outcome(p, t)}.")


def _fit(p: SizePrediction) -> tuple[str, ...]:
    f: Fit | None = p.fit
    if f is None:
        return ()
    recorded = p.growth.sizes[f.knob].recorded
    if f.withheld:
        return (f"Largest {f.knob} that fits {fmt_bytes(f.capacity)}: {f.withheld} "
                f"({f.replays} replays).",)
    if f.largest is None or f.proof is None:
        sized = ([f"knob {' / '.join(f'{name} ({k})' for k, name in f.knobs)}: no {f.knob} "
                  "fits, so a smaller one alone cannot make it fit."] if f.knobs else [])
        return (f"Largest {f.knob} on {fmt_bytes(f.capacity)}: none found — {f.note} "
                f"({f.replays} replays).", *sized, *_steps(p, f))
    r = f.proof.replay
    out = [f"Largest {f.knob} that fits {fmt_bytes(f.capacity)}: {f.largest:,} (by bisection "
           f"on the replay from the recorded {recorded:,}, {f.replays} replays).",
           f"Proof: at {f.knob}={f.largest:,} peak allocated {fmt_bytes(r.peak_allocated)}, "
           f"peak reserved {fmt_bytes(r.peak_reserved)}, no OOM."]
    if f.knobs:
        out.append(f"knob {' / '.join(f'{name} ({k})' for k, name in f.knobs)}: a "
                   f"{f.knob} of at most {f.largest:,}.")
    if f.past is not None:
        out.append(f"At {f.knob}={f.past.sizes[f.knob]:,}: peak allocated "
                   f"{fmt_bytes(f.past.replay.peak_allocated)}; {_outcome(p, f.past)}.")
    return (*out, *_steps(p, f))


def _steps(p: SizePrediction, f: Fit) -> tuple[str, ...]:
    """Each next-step knob, by the name the summary gives it, replayed one size past the
    largest that fits (or at the smallest, where none does)."""
    out = []
    for k in f.steps:
        n = k.at_next.sizes[f.knob]
        gain = (f"with it the largest is {k.largest:,}" if k.largest is not None else
                f"the largest with it {k.note}" if k.note else "with it no largest is found")
        fits = ("it fits" + (" as replayed (it leaves part out: not a proof)"
                             if k.caveat else "")) if k.at_next.fits else \
            _outcome(p, k.at_next)
        named = k.id if k.step in ("", k.id) else f"{k.id}, replayed as {k.step}"
        out.append(f"knob {k.text} ({named}): at {f.knob}={n:,} {fits}; {gain}.")
    return tuple(out)


def _rows(p: SizePrediction) -> tuple[tuple[str, str, str], ...]:
    a, t = p.proof, p.target
    asked = (lambda f: f(t)) if t is not None else (lambda f: "")
    return (("sizes", sizes_text(a.sizes), asked(lambda r: sizes_text(r.sizes))),
            ("peak allocated", fmt_bytes(a.replay.peak_allocated),
             asked(lambda r: fmt_bytes(r.replay.peak_allocated))),
            ("peak reserved", fmt_bytes(a.replay.peak_reserved),
             asked(lambda r: fmt_bytes(r.replay.peak_reserved))),
            ("OOM", _outcome(p, a), asked(lambda r: _outcome(p, r))),
            ("memory PyTorch may hold", "unbounded" if p.capacity is None else
             f"{fmt_bytes(p.capacity)} ({p.capacity_note})", ""))


def _assumptions(p: SizePrediction) -> tuple[str, ...]:
    blocks = p.growth.blocks
    state = (pl.col("how") == "family") & (pl.col("e_batch") == 0) & (pl.col("e_seq") == 0)
    by_how = (blocks.with_columns(pl.when(state).then(pl.lit("state"))
                                  .otherwise(pl.col("how")).alias("how"))
              .group_by("how").agg(pl.len().alias("n"), pl.col("requested").sum().alias("bytes"))
              .sort(["bytes", "how"], descending=[True, False]))  # ties by name
    words = {"state": "are model state, held at their recorded size",
             "family": "grow by their family's rule", "scores": "are score matrices (seq²)",
             "calibrated": "were measured against the other capture",
             "factored": "have no family rule and grow linearly because their size is a "
                         "multiple of the stated size (derived from the size, not a rule)",
             "unclassified": "have no rule and are held fixed",
             "indivisible": "do not divide by the stated size and are held fixed",
             "loss chunk": "are a loss's blocks freed before the backward starts (one chunk "
                           "of a fixed size or the whole loss, not known) and are held fixed",
             "ambiguous": "have the bytes of score matrices and of the attention's output "
                          "alike (seq = head dim): grown with seq², an upper bound"}
    if p.growth.padded_seq():
        words["padded"] = "are " + load_rules().padding.block.format(
            padded=p.growth.padded, seq=p.growth.sizes["seq"].recorded)
    # with no batch or seq asked (a parallel layout alone) nothing grows: its own words say
    out = ["Model state (parameters, gradients, optimizer state, buffers) is held at its "
           "recorded size; activations, logits and the KV cache grow linearly with batch and "
           "sequence; vocabulary-sized logits with batch × sequence (the vocabulary is the "
           "model's).",
           "Of the window's blocks: " + "; ".join(
               f"{n:,} ({fmt_bytes(b)}) {words.get(h, h)}"
               for h, n, b in by_how.iter_rows()) + "."] if p.growth.sizes else []
    out += p.growth.assumptions
    if not p.growth.held_fixed().is_empty():
        out.append("A block held fixed keeps its recorded size and its count: where it is one "
                   "chunk of a loop over chunks of a fixed size (a chunked log-prob), a larger "
                   "size makes more chunks, which the replay does not add.")
    if p.growth.calibration:
        out.append(p.growth.calibration.capitalize() + ".")
    if p.fit is not None:
        out.append("The largest size is found by bisection: a larger size is taken never to "
                   "need less memory.")
    return tuple(out)


def _held(p: SizePrediction) -> tuple[tuple[str, str, str, str, str], ...]:
    held = p.growth.held_fixed()
    rows = [(str(s), str(f or "unknown"), f"{n:,}", fmt_bytes(int(b)), str(w))
            for s, f, w, n, b in held.head(HELD_SHOWN).select(
                "site", "family", "why", "blocks", "bytes").iter_rows()]
    if held.height > HELD_SHOWN:
        rest = held.slice(HELD_SHOWN)
        rows.append((f"+{rest.height:,} more sites", "", f"{int(rest['blocks'].sum()):,}",
                     fmt_bytes(int(rest["bytes"].sum())), ""))
    return tuple(rows)


def _head(p: SizePrediction) -> tuple[str, ...]:
    """The first lines: the seq the sizes were made at where it is not the one typed, and
    how sure the answer is: the recorded peak's shares whose growth is derived (a rule, a
    shape, a second capture), assumed (its size alone) or held fixed, and the error band of
    an uncalibrated answer."""
    s = p.shares
    out = [t for t in (p.growth.sized_for, p.growth.padded_for()) if t]
    padded = load_rules().padding.share.format(padded=p.growth.padded) \
        if p.growth.padded_seq() else ""
    if not p.growth.sizes:  # a parallel layout alone: its assumptions say how sure
        return tuple(out)
    if s.peak:
        out.append(f"How sure: of the {fmt_bytes(s.peak)} live at the recorded peak, "
                   f"{s.share('derived'):.0%} grows by a rule, a shape or a measurement "
                   f"(derived), {s.share('assumed'):.0%} is assumed to grow because its size "
                   f"is a multiple of the stated size{padded}, and "
                   f"{s.share('held fixed'):.0%} is "
                   "held at its recorded size (its growth is not known)"
                   + (f"; blocks of {s.share('ambiguous'):.1%} of it (the most live at once, "
                      "wherever) have a shape their size cannot tell (score matrices or the "
                      "attention's output: grown with seq², an upper bound)"
                      if s.share("ambiguous") else "") + ".")
    if not p.growth.calibration:
        rules = load_rules()
        low, high = rules.band
        out.append(f"Uncalibrated: on the corpus size pairs such predictions were {low:+.2f}% "
                   f"… {high:+.2f}% off the captured peak ({rules.band_source}); held-fixed "
                   "blocks that do grow add to that.")
    return tuple(out)


def scale_view(title: str, change: str, predictions: list[SizePrediction]) -> ScaleView:
    return ScaleView(title, change, tuple(
        DeviceScale(p.device, _head(p), _proof(p), _verdict(p), _rows(p), _fit(p),
                    _assumptions(p), _held(p), p) for p in predictions))
