"""Fidelity of the allocator model on real traces (issue 45): each capture's recorded requests
re-run under the settings it records, the model's segment events set against PyTorch's.

    python benchmarks/allocator_fidelity.py            # samples and ../shared/corpus
    python benchmarks/allocator_fidelity.py FILE ...   # given captures

One row per device with segment events: recorded and simulated segment events, the first
divergence (position, trace index, why), whether the final segments are equal, whether each
recorded OOM is reproduced at its request, and what stopped the model (if anything).
"""

from __future__ import annotations

import sys
from pathlib import Path

from snapana.analysis.allocator_replay import Setting, before_window, rerun
from snapana.analysis.replay import Moment
from snapana.errors import SnapanaError
from snapana.session import Session
from snapana.sources import load

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT.parent / "shared" / "corpus" / "torch_snapshots"


def captures(argv: list[str]) -> list[Path]:
    if argv:
        return [Path(a) for a in argv]
    files = sorted((ROOT / "sample_snapshots").glob("*.pickle"))
    return files + (sorted(CORPUS.glob("*.pickle*")) if CORPUS.is_dir() else [])


def rows(path: Path) -> list[dict[str, object]]:
    try:
        capture = load(path)
    except SnapanaError as exc:
        return [{"file": path.name, "device": "-", "note": f"not read: {exc}"}]
    settings = capture.allocator_settings or {}
    expandable = bool(settings.get("expandable_segments"))
    out = []
    for device in capture.devices:
        events = capture.device_events(device).to_dicts()
        if not any(e["action"].startswith("segment_") for e in events):
            continue
        state = Session(capture, device).replay
        start = Moment("event", -1)
        before = before_window(state.segments_at(start).to_dicts(),
                               state.blocks_at(start).to_dicts())
        r = rerun(events, device, Setting(expandable), before)
        final = sorted(capture.segments.filter(capture.segments["device"] == device)
                       ["total_size"].to_list())
        out.append({
            "file": path.name, "device": device, "recorded": len(r.recorded),
            "simulated": len(r.simulated), "exact": r.exact,
            "divergence": "" if r.divergence is None else
            f"#{r.divergence[0]} at event {r.divergence[1]}: {r.divergence[2]}",
            "final_equal": r.final_segments == final if not r.stopped else None,
            "oom": "-" if r.oom_reproduced is None else
            ("reproduced" if r.oom_reproduced else "not reproduced"),
            "note": r.stopped})
    return out


def main(argv: list[str]) -> int:
    table = [row for path in captures(argv) for row in rows(path)]
    for row in table:
        print(" | ".join(str(row.get(k, "")) for k in (
            "file", "device", "recorded", "simulated", "exact", "final_equal", "oom",
            "divergence", "note")))
    measured = [r for r in table if "recorded" in r]
    exact = sum(bool(r["exact"]) for r in measured)
    print(f"{exact} of {len(measured)} devices with segment events reproduced exactly")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
