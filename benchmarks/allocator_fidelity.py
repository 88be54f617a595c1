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

from snapana.analysis.allocator_replay import SEGMENT_ACTIONS, Setting, rerun
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
        r = rerun(events, device, Setting(expandable), Session(capture, device).window_start)
        final = sorted(capture.segments.filter(capture.segments["device"] == device)
                       ["total_size"].to_list())
        recorded = sum(e["action"] in SEGMENT_ACTIONS for e in events)
        out.append({
            "file": path.name, "corpus": path.parent == CORPUS,
            "device": device, "recorded": recorded,
            "simulated": len(r.simulated), "exact": r.exact,
            "divergence": "" if r.divergence is None else
            f"#{r.divergence[0]} at event {r.divergence[1]}: {r.divergence[2]}",
            "final_equal": r.final_segments == final if not r.stopped else None,
            "oom": "not run" if r.stopped_at == -1 else "-" if r.oom_reproduced is None else
            ("reproduced" if r.oom_reproduced else "not reproduced"),
            "note": r.stopped})
    return out


def main(argv: list[str]) -> int:
    table = [row for path in captures(argv) for row in rows(path)]
    for row in table:
        print(" | ".join(str(row.get(k, "")) for k in (
            "file", "device", "recorded", "simulated", "exact", "final_equal", "oom",
            "divergence", "note")))
    for label, corpus in (("samples", False), ("corpus", True)):
        measured = [r for r in table if "recorded" in r and r["corpus"] == corpus]
        exact = sum(bool(r["exact"]) for r in measured)
        files = {r["file"] for r in measured}
        whole = sum(all(r["exact"] for r in measured if r["file"] == f) for f in files)
        print(f"{label}: {exact} of {len(measured)} devices with segment events reproduced "
              f"exactly ({whole} of {len(files)} files)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
