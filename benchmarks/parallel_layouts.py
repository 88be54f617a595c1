"""Simulated jobs at several parallel layouts (issue 70): each layout's peak allocated
predicted by `whatif --scale tp= / dp= / sp= --zero` from another layout's capture (a replay
through the allocator model), beside the simulator's own peak at that layout
(synth/scenarios/parallel.py, which writes the papers' shapes without the analyzer's scaling
rules) and, where a paper gives one, the formula:

- ZeRO (Rajbhandari et al. 2020, Figure 1): (2 + 2 + K)Ψ per device, optimizer state /
  gradients / parameters divided by Nd at stages 1 / 2 / 3; Ψ = 7.5B, K = 12, Nd = 64:
  120 / 31.4 / 16.6 / 1.9 GB.
- Megatron (Korthikanti et al. 2022, eq. 1-4): saved activations per layer sbh(34 + 5as/h);
  with tensor parallelism sbh(10 + 24/t + 5as/(ht)); with sequence parallelism too
  sbh(34 + 5as/h)/t (GPT-3 175B: s 2048, b 1, h 12288, a 96).
- The slime / Megatron step of the TP=2 sample's model at tp 1 / 4 / 8 (no formula).

    python benchmarks/parallel_layouts.py    # prints the markdown table; exit 1 if a row
                                             # is off (10% vs simulated, 1% vs a formula)
"""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PSI, K, ND = 7_500_000_000, 12, 64
S, B, H, A, LAYERS = 2048, 1, 12288, 96, 2
PAPER_ZERO = {0: "120", 1: "31.4", 2: "16.6", 3: "1.9"}


@dataclass(frozen=True)
class Row:
    job: str
    change: str
    predicted: int
    simulated: int
    formula: int | None = None
    paper: str = ""
    per: int = 1  # the figures are per this many layers (Megatron: per layer)

    @property
    def error(self) -> float:
        return self.predicted / self.simulated - 1

    @property
    def formula_error(self) -> float | None:
        return None if self.formula is None else self.predicted / self.formula - 1

    @property
    def ok(self) -> bool:
        fe = self.formula_error
        return abs(self.error) <= 0.10 and (fe is None or abs(fe) <= 0.01)


def zero_formula(stage: int, psi: int = PSI, k: int = K, nd: int = ND) -> int:
    """Rajbhandari et al.'s per-device model state at a stage: (2 + 2 + K)Ψ with the
    optimizer state (stage ≥ 1), gradients (≥ 2) and parameters (3) divided by Nd."""
    return round(2 * psi / (nd if stage >= 3 else 1) + 2 * psi / (nd if stage >= 2 else 1)
                 + k * psi / (nd if stage >= 1 else 1))


def megatron_formula(t: int, sp: bool, s: int = S, b: int = B, h: int = H, a: int = A) -> int:
    """Korthikanti et al.'s activation bytes per layer on one of t tensor-parallel ranks."""
    if sp:
        return round(s * b * h * (34 + 5 * a * s / h) / t)
    return round(s * b * h * (10 + 24 / t + 5 * a * s / (h * t)))


def predict(path: Path, items: list[str], zero: str | None = None) -> int:
    """The replay's peak allocated at the layout `items` / `zero` ask for."""
    from snapana.session import Session

    session = Session.open(path)
    p = session.resize({}, layout=session.parallel_layout(items, zero))
    assert p.target is not None
    return p.target.replay.peak_allocated


def _written(tmp: Path, name: str, job: Callable[..., tuple[dict[str, Any], dict[str, Any]]],
             *args: Any, **kwargs: Any) -> tuple[Path, int]:
    """`job(*args, **kwargs)` written under `tmp`, with its simulated peak allocated."""
    from snapana.synth.scenarios import write_snapshot

    snapshot, truth = job(*args, **kwargs)
    path, _ = write_snapshot(snapshot, truth, tmp / f"{name}.pickle")
    return path, int(truth["peak_allocated_bytes"])


def zero_rows(tmp: Path) -> list[Row]:
    from snapana.synth.scenarios.parallel import zero_job

    base, _ = _written(tmp, "zero0", zero_job, 0, ND)
    one, _ = _written(tmp, "zero1", zero_job, 1, ND)
    dp8, _ = _written(tmp, "zero2-dp8", zero_job, 2, 8)
    sim = {stage: _written(tmp, f"zero{stage}-truth", zero_job, stage, ND)[1]
           for stage in range(4)}
    out = [Row("ZeRO Ψ=7.5B K=12", f"dp=64, stage 0 → {stage}",
               predict(base, [f"dp={ND}"], f"0:{stage}"), sim[stage], zero_formula(stage),
               PAPER_ZERO[stage]) for stage in range(4)]
    out.append(Row("ZeRO Ψ=7.5B K=12", "dp=64, stage 1 (read from frames) → 3",
                   predict(one, [f"dp={ND}"], "3"), sim[3], zero_formula(3), PAPER_ZERO[3]))
    out.append(Row("ZeRO Ψ=7.5B K=12", "stage 2 (--zero 2:2), dp 8 → 64",
                   predict(dp8, ["dp=8:64"], "2:2"), sim[2], zero_formula(2)))
    return out


def megatron_rows(tmp: Path) -> list[Row]:
    from snapana.synth.scenarios.parallel import megatron_layers_job

    base, _ = _written(tmp, "meg-tp1", megatron_layers_job, 1, layers=LAYERS)
    out = []
    for t, sp in ((1, False), (2, False), (4, False), (8, False), (2, True), (4, True),
                  (8, True)):
        _, sim = _written(tmp, f"meg-tp{t}-{sp}", megatron_layers_job, t, sp,
                          layers=LAYERS)
        items = [f"tp=1:{t}", *(["sp=0:1"] if sp else [])]
        out.append(Row("Megatron GPT-3 layer", f"tp 1 → {t}" + (", sp" if sp else ""),
                       predict(base, items) // LAYERS, sim // LAYERS, megatron_formula(t, sp),
                       per=LAYERS))
    return out


def step_rows(tmp: Path) -> list[Row]:
    from snapana.synth.scenarios.parallel import megatron_step_job

    base, _ = _written(tmp, "step-tp2", megatron_step_job, 2)
    out = []
    for t in (1, 4, 8):
        _, sim = _written(tmp, f"step-tp{t}", megatron_step_job, t)
        out.append(Row("slime/Megatron step (sample's model)", f"tp 2 → {t}",
                       predict(base, [f"tp=2:{t}"]), sim))
    return out


def table(rows: list[Row]) -> str:
    """The rows as a markdown table."""
    lines = ["| job | layout | predicted (replay) | simulated capture | error | formula | "
             "vs formula | paper |", "|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        unit = " /layer" if r.per > 1 else ""
        fe = r.formula_error
        lines.append(f"| {r.job} | {r.change} | {r.predicted:,}{unit} | {r.simulated:,} | "
                     f"{r.error:+.3%} | {'' if r.formula is None else f'{r.formula:,}'} | "
                     f"{'' if fe is None else f'{fe:+.3%}'} | "
                     f"{r.paper + ' GB' if r.paper else ''} |")
    return "\n".join(lines)


def rows() -> list[Row]:
    with tempfile.TemporaryDirectory() as tmp:
        return [*zero_rows(Path(tmp)), *megatron_rows(Path(tmp)), *step_rows(Path(tmp))]


def main() -> int:
    found = rows()
    print(table(found))
    return 0 if all(r.ok for r in found) else 1


if __name__ == "__main__":
    sys.exit(main())
