"""Seeded random search for where `whatif --scale` breaks (issue 70): benchmarks/scale_stress.py's
grid was written by the people who tuned the rules; this draws jobs nobody chose. Each job
(synth/scenarios/sized.py `Job`) is drawn over wider ranges than the grid: hidden 128–8192 as
heads × a head dim of 32–256, 1–32 layers, a vocabulary of 500–256k, batch 1–32, seq 16–16k,
every mode / precision / frames / fused / chunked combination; then seq, batch or both scaled
×2…×16, up or down. Each is predicted from its recorded size, uncalibrated, beside the
simulator's own peak (`scale_stress.measure`). Jobs whose weights and optimizer state alone
cannot fit an 80 GB card are drawn again with a smaller model; those the simulator runs out
of memory on at either size are left out and counted.

Prints every case past ±10% with its error, the share held fixed, and the command that
reproduces it; then the band. Case `i` of seed `s` depends on (s, i) alone, so
`--case i` reruns one, and `--blocks` with it prints its growth table beside the
simulator's own family for each block (what the root cause is read from).

    python benchmarks/scale_fuzz.py --seed 1 -n 200
    python benchmarks/scale_fuzz.py --seed 1 --case 17 --blocks
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from scale_stress import BAR, Case, Row, measure  # noqa: E402
from snapana.synth.scenarios.common import A800_CAPACITY  # noqa: E402
from snapana.synth.scenarios.sized import FRAMES, MODES, Job  # noqa: E402

HEAD_DIMS = (32, 64, 80, 96, 128, 256)
FACTORS = (2, 3, 4, 6, 8, 16)
SEQ, BATCH = (16, 16384), (1, 32)


def _log_int(rng: random.Random, lo: int, hi: int) -> int:
    """Log-uniform in [lo, hi]; half the time a power of two (as most configs are)."""
    x = rng.uniform(*(v.bit_length() - 1 if v & (v - 1) == 0 else v.bit_length()
                      for v in (lo, hi)))
    if rng.random() < 0.5:
        return min(max(lo, 1 << round(x)), hi)
    return min(max(lo, round(2 ** x)), hi)


def _static(job: Job) -> int:
    """Bytes held before the window: fp32 weights, and AdamW's two moments in training
    (gradients and the update's temporary of the largest weight on top)."""
    params = job.vocab * job.hidden + job.layers * sum(job.weights)
    return 4 * params * (4 if job.mode == "train" else 1)


def _draw_job(rng: random.Random) -> Job:
    """A model whose weights (and, training, gradients and AdamW moments) fit the card."""
    while True:
        head_dim = rng.choice(HEAD_DIMS)
        heads = rng.randint(max(1, -(-128 // head_dim)), 8192 // head_dim)
        job = Job(layers=rng.randint(1, 32), hidden=heads * head_dim, heads=heads,
                  vocab=_log_int(rng, 500, 256_000), autocast=rng.random() < 0.5,
                  mode=rng.choice(MODES), frames=rng.choice(FRAMES),
                  fused=rng.random() < 0.5, chunked_loss=rng.random() < 0.3)
        if _static(job) < 0.8 * A800_CAPACITY:
            return job


def _draw_sizes(rng: random.Random) -> tuple[tuple[int, int], tuple[int, int]]:
    """(batch, seq) recorded and predicted: seq, batch or both by ×2…×16, up or down, both
    ends within the ranges."""
    which = rng.choice(("seq", "batch", "both"))
    while True:
        b, s = _log_int(rng, *BATCH), _log_int(rng, *SEQ)
        fb = rng.choice(FACTORS) if which != "seq" else 1
        fs = rng.choice(FACTORS) if which != "batch" else 1
        down = rng.random() < 0.4
        big = (b * fb, s * fs)
        if big[0] <= BATCH[1] and big[1] <= SEQ[1]:
            return ((big, (b, s)) if down else ((b, s), big))


def _activations(job: Job, batch: int, seq: int) -> int:
    """A rough upper bound of the window's bytes (saved activations, scores, logits), to
    draw again rather than simulate a job sure to run out of memory."""
    t, h, act = batch * seq, job.hidden, job.act
    layer = t * h * (4 + 3 * act + act + 2 * 4 * act) + batch * job.heads * seq * 4 * (
        1 if job.fused else seq * (2 + act))
    kept = job.layers if job.mode != "inference" else 1
    logits = (min(t, 1024) if job.chunked_loss else t) * job.vocab * (act + 8)
    return kept * layer + logits


def draw(seed: int, i: int) -> Case:
    """Case `i` of `seed`: a job and its two sizes, redrawn (the same way each time) while
    its rough peak would not fit an 80 GB card."""
    rng = random.Random(f"scale-fuzz:{seed}:{i}")
    while True:
        job = _draw_job(rng)
        small, large = _draw_sizes(rng)
        peak = max(_activations(job, *small), _activations(job, *large))
        if _static(job) + peak < A800_CAPACITY:
            return Case(job, small, large)


def command(seed: int, i: int) -> str:
    return f"python benchmarks/scale_fuzz.py --seed {seed} --case {i} --blocks"


def _line(r: Row) -> str:
    return (f"{r.case.name():78} {' '.join(r.case.scale()):24} {r.error:+8.2%} "
            f"held {r.held:6.1%}" + (" (no fit given)" if r.refused else ""))


def blocks(case: Case) -> None:
    """The case's growth table, each block beside the family the simulator gave it."""
    import polars as pl
    from snapana.allocator_model.simulator import CachingAllocatorSim
    from snapana.analysis.scaling import parse_sizes
    from snapana.session import Session
    from snapana.synth.scenarios import write_snapshot
    from snapana.synth.scenarios.sized import sized_job

    families: list[str] = []
    malloc = CachingAllocatorSim.malloc

    def tagged(self: CachingAllocatorSim, size: int, *a: object, **k: object) -> int:
        families.append(str(k.get("family", "unknown")))
        return malloc(self, size, *a, **k)  # type: ignore[arg-type]

    CachingAllocatorSim.malloc = tagged  # type: ignore[method-assign]
    try:
        snap, truth = sized_job(*case.small, job=case.job)
    finally:
        CachingAllocatorSim.malloc = malloc  # type: ignore[method-assign]
    with tempfile.TemporaryDirectory() as tmp:
        path, _ = write_snapshot(snap, truth, Path(tmp) / "small.pickle")
        g = Session.open(path).scaling(parse_sizes(case.scale())).growth.blocks
    window = families[len(families) - int((g["alloc_idx"] >= 0).sum()):]
    g = g.sort("alloc_idx").with_columns(pl.Series("truth", [
        *(["(held before)"] * int((g["alloc_idx"] < 0).sum())), *window]))
    with pl.Config(tbl_rows=-1, tbl_width_chars=220, fmt_str_lengths=60):
        print(g.group_by("family", "truth", "how", "why", "e_batch", "e_seq", "requested")
              .agg(pl.len().alias("n")).sort("requested", descending=True)
              .select("n", "requested", "truth", "family", "how", "e_batch", "e_seq", "why"))


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("-n", type=int, default=200, help="jobs to draw")
    ap.add_argument("--case", type=int, help="rerun case CASE of the seed alone")
    ap.add_argument("--blocks", action="store_true", help="with --case: its growth table")
    args = ap.parse_args(argv)
    picked = [args.case] if args.case is not None else range(args.n)
    found: list[tuple[int, Row]] = []
    began = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        for i in picked:
            case = draw(args.seed, i)
            r = measure(case, Path(tmp), f"{i}-")
            if r is not None:
                found.append((i, r))
            if r is not None and (abs(r.error) > BAR or args.case is not None):
                print(f"#{i:<4} {_line(r)}\n      {command(args.seed, i)}", flush=True)
            elif r is None and args.case is not None:
                print(f"#{i}: the simulator ran out of memory at one of the sizes")
    if args.blocks and args.case is not None:
        blocks(draw(args.seed, args.case))
    errors = [r.error for _, r in found]
    failed = [r for _, r in found if abs(r.error) > BAR]
    band = f"band {min(errors):+.2%} … {max(errors):+.2%}" if errors else "no jobs"
    print(f"\nseed {args.seed}: {len(found)} jobs ({len(picked) - len(found)} out of memory, "
          f"left out); {band}; {len(failed)} past ±{BAR:.0%}"
          + (f", of which {sum(r.refused for r in failed)} refuse a largest fit" if failed
             else "") + f" ({time.monotonic() - began:.0f} s)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
