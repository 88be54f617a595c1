"""Every like-for-like size pair in the corpus (issue 70): the same model, mode, precision and
card at several sequence lengths (RELEASED-2026-12-06.md), each larger member's peak
allocated predicted by `whatif --scale` from the set's smallest, uncalibrated, beside that
capture's own peak from tests/raw_replay.py (an independent replay of the raw pickle, which
never imports snapana), and the error. `rows(calibrate=True)` adds each pair's prediction
calibrated (`--calibrate`) on a third member of the set, neither the recorded nor the predicted
one (`third`; none in a set of two: calibrating on the target itself would be no test);
benchmarks/how_big_fits.py prints both.

    python benchmarks/size_pairs.py     # SNAPANA_CORPUS=... when the corpus is elsewhere
"""

from __future__ import annotations

import importlib.util
import os
import pickle
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CORPUS = Path(os.environ.get("SNAPANA_CORPUS") or ROOT.parent / "shared" / "corpus")
SNAPS = CORPUS / "torch_snapshots"
KK = "kkaitlyn111+cs336-a2-systems__memory_files_memory_ctx{}_{}.pickle"
SG = "sungdk0822+CS336-assignment2-systems__memory_snapshots_attn_dmodel32_seqlen{}{}.pickle"
BO = ("bolongcheng+assignment2-systems__benchmarks_memory_snapshot_xl_fwd_cl{}_dtypetorch."
      "float32.pickle")


@dataclass(frozen=True)
class SizeSet:
    """One job at several sequence lengths: `files[seq]` is its capture at that length."""

    name: str
    files: dict[int, str]


SETS = (
    SizeSet("kk forward fp32", {s: KK.format(s, "forward_") for s in (128, 256, 512)}),
    SizeSet("kk forward bf16 autocast", {s: KK.format(s, "forward_mixed")
                                         for s in (128, 256, 512)}),
    SizeSet("kk full step fp32", {s: KK.format(s, "fullstep_") for s in (256, 512)}),
    SizeSet("sungdk attention fwd+bwd", {s: SG.format(s, "")
                                         for s in (256, 1024, 4096, 8192, 16384)}),
    SizeSet("sungdk attention fwd only", {s: SG.format(s, "_forwardpassonly")
                                          for s in (256, 1024, 4096, 8192, 16384)}),
    SizeSet("bolongcheng xl forward fp32", {s: BO.format(s) for s in (128, 2048)}),
)


@dataclass(frozen=True)
class Row:
    set: str
    small: int
    big: int
    predicted: int
    captured: int
    calibrated: int | None = None  # calibrated on the member at seq `calibrated_on`
    calibrated_on: int | None = None

    @property
    def error(self) -> float:
        return self.predicted / self.captured - 1


def _judge():
    """tests/raw_replay.py, loaded by path: the independent replay."""
    spec = importlib.util.spec_from_file_location("raw_replay", ROOT / "tests" / "raw_replay.py")
    assert spec is not None and spec.loader is not None
    module = sys.modules.get("raw_replay") or importlib.util.module_from_spec(spec)
    if "raw_replay" not in sys.modules:
        sys.modules["raw_replay"] = module  # dataclasses look their module up there
        spec.loader.exec_module(module)
    return module


class _Builtins(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> object:
        raise pickle.UnpicklingError(f"{module}.{name} refused")


def captured_peak(path: Path) -> int:
    """The capture's peak allocated bytes on device 0, by the independent replay."""
    with path.open("rb") as fh:
        return int(_judge().raw_replay(_Builtins(fh).load(), 0).peak)


def pairs(size_set: SizeSet) -> list[tuple[int, int]]:
    """(smallest, larger) for each larger member present, the smallest present first."""
    present = sorted(s for s, f in size_set.files.items() if (SNAPS / f).exists())
    return [(present[0], s) for s in present[1:]]


def third(size_set: SizeSet, small: int, big: int) -> int | None:
    """The member that calibrates `small` → `big` honestly: the largest present strictly
    between them, else the smallest present above `big`; None in a set of two."""
    present = sorted(s for s, f in size_set.files.items() if (SNAPS / f).exists())
    between = [s for s in present if small < s < big]
    above = [s for s in present if s > big]
    return between[-1] if between else above[0] if above else None


def predicted_peak(size_set: SizeSet, small: int, big: int, other: int | None = None) -> int:
    """`whatif --scale seq=small:big` on the set's capture at `small`, as the Session API
    runs it, calibrated (`--calibrate ... --calibrate-size seq=other`) when `other` is given."""
    from snapana.analysis.scaling import parse_sizes
    from snapana.session import Session

    calibrate = None if other is None else (
        Session.open(SNAPS / size_set.files[other]), "seq", other)
    session = Session.open(SNAPS / size_set.files[small])
    p = session.resize(parse_sizes([f"seq={small}:{big}"]), calibrate=calibrate)
    assert p.target is not None
    return p.target.replay.peak_allocated


def rows(sets: tuple[SizeSet, ...] = SETS, calibrate: bool = False) -> list[Row]:
    """A row per pair of every set whose files are present, calibrated too if asked."""
    out = []
    for size_set in sets:
        for small, big in pairs(size_set):
            other = third(size_set, small, big) if calibrate else None
            out.append(Row(size_set.name, small, big, predicted_peak(size_set, small, big),
                           captured_peak(SNAPS / size_set.files[big]),
                           None if other is None else
                           predicted_peak(size_set, small, big, other), other))
    return out


def table(found: list[Row]) -> str:
    """The rows as a markdown table, with the error band."""
    lines = ["| set | seq | predicted peak allocated | captured (raw replay) | error |",
             "|---|---|---:|---:|---:|"]
    lines += [f"| {r.set} | {r.small:,} → {r.big:,} | {r.predicted:,} | {r.captured:,} | "
              f"{r.error:+.2%} |" for r in found]
    if found:
        lo, hi = min(r.error for r in found), max(r.error for r in found)
        lines.append(f"\n{len(found)} pairs, uncalibrated; error from {lo:+.2%} to {hi:+.2%}.")
    return "\n".join(lines)


def main() -> int:
    found = rows()
    if not found:
        print(f"no size set found under {SNAPS}", file=sys.stderr)
        return 2
    print(table(found))
    return 0 if all(abs(r.error) <= 0.10 for r in found) else 1


if __name__ == "__main__":
    sys.exit(main())
