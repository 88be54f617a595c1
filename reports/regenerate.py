"""Regenerate reports/ from sample_snapshots/: one HTML report and one markdown summary per
sample, so a visitor can open a real report without installing anything.

    python reports/regenerate.py          # rewrite what changed
    python reports/regenerate.py --check  # exit 1 if any report is stale

The device capacity passed to each report is the GPU the incident ran on (from the sample's
sidecar), as the engineer would pass --capacity. Files are rewritten only when their
content changes, so the repository does not grow with identical copies.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from snapana.diagnosis import analyse
from snapana.output import write_atomic
from snapana.render import html, markdown
from snapana.sources import load

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "sample_snapshots"
REPORTS = ROOT / "reports"


def expected(sample: Path) -> dict[Path, str]:
    """The report files a sample should have, with their content."""
    truth = json.loads(sample.with_suffix(".truth.json").read_text())
    reports = analyse(load(sample), capacity=truth.get("capacity_bytes"))
    name = sample.stem
    return {
        REPORTS / f"{name}.html": html.render(reports, title=sample.name),
        REPORTS / f"{name}.md": markdown.render(reports),
    }


def main(argv: list[str]) -> int:
    check = "--check" in argv
    stale = []
    for sample in sorted(SAMPLES.glob("*.pickle")):
        for path, text in expected(sample).items():
            if path.exists() and path.read_text() == text:
                continue
            stale.append(path)
            if not check:
                write_atomic(path, text)
                print(f"wrote {path.relative_to(ROOT)}")
    if check and stale:
        print("stale: " + ", ".join(str(p.relative_to(ROOT)) for p in stale))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
