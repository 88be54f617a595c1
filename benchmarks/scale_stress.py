"""Where `whatif --scale` breaks on shapes nobody tuned it for (issue 70): simulated jobs over
a grid of model dimensions (hidden, heads, layers, vocab), batch and sequence, fp32 and bf16
autocast (with its weight copies), a training step / a forward / an inference forward, the
program's modules / nn.Linear / hand-written functions (no torch.nn frame), unfused and fused
attention, a whole and a chunked loss (synth/scenarios/sized.py `Job`). For each, the larger
size's peak allocated is predicted from the smaller capture, uncalibrated
(`Session.open(path).resize(parse_sizes([...]))`), beside the simulator's own peak (its truth
sidecar), and the error; the band over the grid, and the confidence share each prediction
carries. `measure(..., calibrate=True)` adds the prediction calibrated (`--calibrate`) on a
third simulated size, neither the recorded nor the predicted one (`Case.third`);
benchmarks/how_big_fits.py prints both.

    python benchmarks/scale_stress.py          # the whole grid
    python benchmarks/scale_stress.py --quick  # the subset tests/test_scale_stress.py runs
"""

from __future__ import annotations

import json
import sys
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "analyzer"))

from snapana.synth.scenarios.sized import Job  # noqa: E402

#: The bar every prediction is held to.
BAR = 0.10
B = Job()


@dataclass(frozen=True)
class Case:
    """One job at two sizes: (batch, seq) recorded and (batch, seq) predicted."""

    job: Job
    small: tuple[int, int]
    large: tuple[int, int]

    def scale(self) -> list[str]:
        return [f"{k}={a}:{b}" for k, a, b in zip(("batch", "seq"), self.small, self.large,
                                                  strict=True) if a != b]

    def name(self) -> str:
        (b0, s0), (b1, s1) = self.small, self.large
        return f"{self.job.label()} b{b0}s{s0}->b{b1}s{s1}"

    def third(self) -> tuple[str, tuple[int, int]]:
        """The knob a calibrating capture differs in (--calibrate-size names one: seq where
        both change) and that capture's (batch, seq): the recorded size with the knob at
        the geometric middle of its two sizes (a multiple of 8), neither end."""
        knob = "seq" if self.small[1] != self.large[1] else "batch"
        i = ("batch", "seq").index(knob)
        a, b = self.small[i], self.large[i]
        mid = round((a * b) ** 0.5 / 8) * 8 if knob == "seq" else round((a * b) ** 0.5)
        mid = mid if a < mid < b else a + 1
        return knob, (mid, self.small[1]) if knob == "batch" else (self.small[0], mid)


def _axes() -> list[Case]:
    """Each axis of the grid varied from the default step, seq ×4 (and batch ×4)."""
    seq = ((2, 256), (2, 1024))
    out = [Case(B, *seq), Case(B, (1, 256), (4, 256)), Case(B, (1, 64), (1, 1024))]
    for hidden, heads in ((256, 4), (512, 8), (2048, 16), (4096, 32)):
        out.append(Case(replace(B, hidden=hidden, heads=heads), *seq))
    for layers in (2, 24):
        out.append(Case(replace(B, layers=layers), *seq))
    for vocab in (1000, 128_000):
        out.append(Case(replace(B, vocab=vocab), *seq))
    out.append(Case(replace(B, heads=32), *seq))
    out.append(Case(replace(B, hidden=512, heads=8), (1, 2048), (1, 8192)))
    out.append(Case(B, (4, 128), (16, 128)))
    return out


def _kinds() -> list[Case]:
    """Precision × mode × frames × attention × loss, at two shapes."""
    out = []
    for shape, small, large, chunked_at in (
            (B, (2, 256), (2, 1024), ((2, 1400), (2, 4200))),
            (replace(B, hidden=512, heads=8, vocab=50_000), (1, 512), (4, 2048),
             ((1, 2800), (3, 2800)))):
        for autocast in (False, True):
            for mode in ("train", "forward", "inference"):
                for frames in ("module", "linear", "handwritten"):
                    out.append(Case(replace(shape, autocast=autocast, mode=mode,
                                            frames=frames), small, large))
        # a chunked loss recorded over more tokens than a chunk, the last chunk the rest:
        # equal chunks alone are no evidence of a loop (L layers make L equal blocks at one
        # site too)
        for fused, chunked in ((True, False), (False, True), (True, True)):
            at = chunked_at if chunked else (small, large)
            for more in ({}, {"autocast": True, "frames": "handwritten"}):
                out.append(Case(replace(shape, fused=fused, chunked_loss=chunked, **more), *at))
    # one chunk at the recorded size: nothing says it is a loop (see the report)
    out.append(Case(replace(B, chunked_loss=True), (2, 256), (2, 1024)))
    return out


def _head_dim() -> list[Case]:
    """Seq at the head dimension and around it (head dim = hidden / heads), where the scores
    [b, h, s, s] have the bytes of a [b, s, hidden] activation in some dtype: under autocast
    (bf16 scores and output, an fp32 softmax: aten autocast_mode.cpp), in a forward whose
    weights no window names (the hidden size unknown), and at tokens = hidden. Errors before
    their fixes in the comments."""
    small = replace(B, vocab=8192)
    return [
        # seq = head dim under autocast: the fp32 softmax, the one block of the largest size,
        # made at one line, was taken for a fused attention's output
        Case(replace(B, autocast=True), (1, 64), (1, 1024)),  # -15.84%
        Case(replace(small, autocast=True), (2, 64), (2, 512)),  # -10.50%
        Case(replace(small, hidden=512, heads=8, autocast=True), (2, 64), (2, 512)),  # -14.80%
        Case(replace(small, autocast=True, mode="forward"), (2, 64), (2, 512)),  # +10.10%
        # a forward's weights unnamed (their sizes shared by activations): no hidden size, so
        # the output was never looked for and grew with seq² with the scores
        Case(replace(small, hidden=512, heads=8, mode="forward"), (2, 64), (2, 512)),  # +20.59%
        Case(replace(small, mode="inference"), (16, 64), (16, 512)),  # tokens = hidden: +21.21%
        # ... and a fused attention's output, with no scores beside it, grown as scores
        Case(replace(small, hidden=512, heads=8, mode="forward", fused=True), (2, 64),
             (2, 512)),  # +26.90%
        Case(replace(small, autocast=True, mode="forward", fused=True), (2, 128),
             (2, 1024)),  # +19.52%
        # seq = 2 × head dim under autocast: the fp32 softmax is 4 × the bf16 output, the
        # ratio of a bool mask, and the output grew with seq²
        Case(replace(small, hidden=256, heads=4, autocast=True, mode="forward"), (2, 128),
             (2, 1024)),  # +10.41%
        Case(replace(small, hidden=4096, heads=32, autocast=True), (2, 256),
             (2, 2048)),  # +12.25%
        # seq = head dim / 2 (below it, as the assumption says) under autocast: the fp32
        # softmax has the bf16 output's bytes, the bf16 scores half of them
        Case(replace(small, hidden=1024, heads=8, autocast=True), (16, 64),
             (16, 512)),  # +12.38%
        Case(replace(small, hidden=2048, heads=16, autocast=True, mode="inference"),
             (32, 64), (32, 512)),  # +13.15%
        Case(replace(small, hidden=1024, heads=8), (16, 64), (16, 512)),  # fp32: -13.38%
    ]


def _small_seq() -> list[Case]:
    """Seq below the head dim (benchmarks/scale_fuzz.py's draws): the scores [b, h, s, s]
    are then smaller than the output [b, s, hidden], the largest block under the attention
    function is the output, and the scores were grown linearly as their family (an
    under-prediction, with nothing held: --fit would have over-promised). Found by their
    order in each call (`_scores_before_softmax`). Errors before the fix in the comments."""
    return [
        Case(Job(layers=16, hidden=1536, heads=6, vocab=3777, frames="linear", mode="forward"),
             (4, 116), (12, 696)),  # fuzz seed 2 case 45: -12.44%
        Case(Job(layers=17, hidden=1760, heads=22, vocab=2048, frames="handwritten"),
             (8, 32), (24, 256)),  # seed 3 case 35: -10.11%
        Case(Job(layers=32, hidden=768, heads=12, vocab=53_501, frames="handwritten"),
             (1, 27), (3, 432)),  # seed 3 case 142: -12.06%
        # the weights held before the window have no family here: held 95%, no fit given
        Case(Job(layers=3, hidden=768, heads=8, vocab=2048, frames="linear",
                 mode="inference"), (3, 32), (3, 512)),  # seed 1 case 133: -12.26%
    ]


def grid() -> list[Case]:
    return _axes() + _kinds() + _head_dim() + _small_seq()


#: Scores whose bytes are the attention output's (seq = head dim): told apart by their
#: order within the attention's call (+15.44% before, every block of the size grown with seq²).
HEAD_DIM = Case(B, (1, 64), (1, 1024))
#: A small, fixed, fast subset (tests/test_scale_stress.py): each kind the grid found failing
#: before its fix, and the default step. Errors before the fixes: autocast's copies in a
#: training step +14.10% (decided only where the backward had freed them) and +12.66% (the
#: optimizer's unnamed moments counted as weights), a fused attention's output grown as
#: scores +5.44% and +22.97%, a chunked loss over batch × seq tokens +40% and more, the
#: output at seq = head dim grown as scores +15.44%.
S2 = replace(B, hidden=512, heads=8, vocab=50_000)
QUICK = [
    Case(B, (2, 256), (2, 1024)),
    Case(replace(B, autocast=True), (2, 256), (2, 1024)),
    Case(replace(S2, autocast=True, frames="linear"), (1, 512), (4, 2048)),
    Case(replace(B, fused=True), (2, 256), (2, 1024)),
    Case(replace(S2, fused=True, autocast=True, frames="handwritten"), (1, 512), (4, 2048)),
    Case(replace(B, chunked_loss=True), (2, 1400), (2, 4200)),
    Case(replace(B, fused=True, chunked_loss=True, autocast=True, frames="handwritten"),
         (2, 1400), (2, 4200)),
    # a chunked loss scaled by batch alone (its tokens unknown): +34.96% and +45.14% when
    # each chunk grew with the batch, +87.03% when autocast's cast of the lm_head (made at
    # the chunk's call site in the first iteration) hid the loop at that site
    Case(replace(S2, fused=True, chunked_loss=True), (1, 2800), (3, 2800)),
    Case(replace(S2, fused=True, chunked_loss=True, autocast=True, frames="handwritten"),
         (1, 2800), (3, 2800)),
    HEAD_DIM,
    # seq = head dim under autocast (the fp32 softmax taken for a fused attention's output):
    # -15.84%, -14.80%; a forward's unnamed weights (no hidden size): +20.59%, and both:
    # +10.10%; seq = 2 × head dim under autocast (the output grown as a mask): +10.41%
    Case(replace(B, autocast=True), (1, 64), (1, 1024)),
    Case(replace(B, hidden=512, heads=8, vocab=8192, autocast=True), (2, 64), (2, 512)),
    Case(replace(B, hidden=512, heads=8, vocab=8192, mode="forward"), (2, 64), (2, 512)),
    Case(replace(B, vocab=8192, autocast=True, mode="forward"), (2, 64), (2, 512)),
    Case(replace(B, hidden=256, heads=4, vocab=8192, autocast=True, mode="forward"), (2, 128),
         (2, 1024)),
]


@dataclass(frozen=True)
class Row:
    case: Case
    predicted: int
    actual: int
    held: float  # the share of the recorded peak held fixed
    refused: bool  # --fit would give no largest size (the held share is past [confidence])
    calibrated: int | None = None  # calibrated on the capture at `case.third()`

    @property
    def error(self) -> float:
        return self.predicted / self.actual - 1


def measure(case: Case, folder: Path, tag: str = "", calibrate: bool = False) -> Row | None:
    """The case's prediction and truth (and, if asked, the prediction calibrated on a third
    size); None when the simulator ran out of memory (an A800's 80 GB) at the larger size."""
    from snapana.analysis.scaled_replay import withheld
    from snapana.analysis.scaling import parse_sizes
    from snapana.session import Session
    from snapana.synth.scenarios import write_snapshot
    from snapana.synth.scenarios.sized import sized_job

    (b0, s0), (b1, s1) = case.small, case.large
    small, t0 = write_snapshot(*sized_job(b0, s0, job=case.job), folder / f"{tag}small.pickle")
    _, t1 = write_snapshot(*sized_job(b1, s1, job=case.job), folder / f"{tag}large.pickle")
    truth = json.loads(t1.read_text())
    if truth.get("oom") or json.loads(t0.read_text()).get("oom"):
        return None
    p = Session.open(small).resize(parse_sizes(case.scale()))
    assert p.target is not None
    held, ambiguous = p.shares.share("held fixed"), p.shares.share("ambiguous")
    # as --fit would judge a largest size found at the larger one
    knob, n, r = max((("batch", b1, b0), ("seq", s1, s0)), key=lambda k: k[1] / k[2])
    refused = bool(withheld(held, n, r, knob, ambiguous))
    calibrated = None
    if calibrate:
        knob, (b2, s2) = case.third()
        other, _ = write_snapshot(*sized_job(b2, s2, job=case.job), folder / f"{tag}third.pickle")
        c = Session.open(small).resize(parse_sizes(case.scale()),
                                       calibrate=(Session.open(other), knob, (b2, s2)[
                                           ("batch", "seq").index(knob)]))
        assert c.target is not None
        calibrated = c.target.replay.peak_allocated
    return Row(case, p.target.replay.peak_allocated, int(truth["peak_allocated_bytes"]),
               held + ambiguous, refused, calibrated)


def rows(cases: list[Case], calibrate: bool = False) -> list[Row]:
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, case in enumerate(cases):
            r = measure(case, Path(tmp), f"{i}-", calibrate)
            if r is not None:
                out.append(r)
    return out


def main(argv: list[str]) -> int:
    cases = QUICK if "--quick" in argv else grid()
    found = rows(cases)
    print(f"{'job':72} {'--scale':22} {'predicted':>15} {'actual':>15} {'error':>8} "
          f"{'held':>6}")
    for r in found:
        mark = "  FAIL" if abs(r.error) > BAR else ""
        mark += " (no fit given)" if r.refused else ""
        print(f"{r.case.name():72} {' '.join(r.case.scale()):22} {r.predicted:15,} "
              f"{r.actual:15,} {r.error:+8.2%} {r.held:6.1%}{mark}")
    errors = [r.error for r in found]
    failed = [r for r in found if abs(r.error) > BAR]
    print(f"\n{len(found)} jobs ({len(cases) - len(found)} out of memory at the larger size, "
          f"left out); band {min(errors):+.2%} … {max(errors):+.2%}; "
          f"{len(failed)} past ±{BAR:.0%}"
          + (f", of which {sum(r.refused for r in failed)} refuse a largest fit" if failed
             else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
