"""Regenerate reports/ from sample_snapshots/: one HTML report and one markdown summary per
sample, so a visitor can open a real report without installing anything.

    python reports/regenerate.py          # rewrite what changed
    python reports/regenerate.py --check  # exit 1 if any report is stale

The device capacity passed to each report is the GPU the incident ran on (from the sample's
sidecar), as the engineer would pass --capacity. Files are rewritten only when what a
reader sees changes (`reader_view`): the text, each figure's data and layout, and the values
of the explorer's columns. The bytes of the inlined plotly.js, plotly's theme and how a JSON
library spells a float (5e-6 or 5e-06) differ between machines, and how the columns were
packed and deflated is a detail of the writer: none is content, so the check gives the same
answer everywhere.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import json
import re
import sys
from pathlib import Path
from typing import Any

import numpy as np
from snapana.io.output import write_atomic
from snapana.render import render
from snapana.render.views import capture_view
from snapana.session import analyse
from snapana.sources import load

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "sample_snapshots"
REPORTS = ROOT / "reports"


def expected(sample: Path) -> dict[Path, str]:
    """The report files a sample should have, with their content."""
    truth = json.loads(sample.with_suffix(".truth.json").read_text())
    reports = analyse(load(sample), capacity=truth.get("capacity_bytes"))
    view = capture_view(reports, title=sample.name)
    name = sample.stem
    return {
        REPORTS / f"{name}.html": render(view, "html"),
        REPORTS / f"{name}.md": render(view, "markdown"),
    }


_PLOTLY_JS = re.compile(r'(<script id="plotly-gz"[^>]*>)[^<]*(</script>)')
_PLOTLY_THEME = re.compile(r'(<script id="plotly-template"[^>]*>)[^<]*(</script>)')
_FIGURE = re.compile(r'(<script type="application/json" id="[^"]*">)(.*?)(</script>)', re.S)


def _plain(value: Any) -> Any:
    """A figure's JSON as plain values: typed arrays ({dtype, bdata}) decoded to lists."""
    if isinstance(value, dict):
        if "dtype" in value and "bdata" in value:
            arr = np.frombuffer(base64.b64decode(value["bdata"]), dtype=value["dtype"])
            shape = value.get("shape")
            if shape is not None:
                arr = arr.reshape([int(n) for n in str(shape).split(",")])
            return arr.tolist()
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def unpack_columns(specs: list[dict[str, Any]], packed: str) -> dict[str, np.ndarray]:
    """The explorer's packed columns read back as the page reads them (the template's
    `unpack`, render/explorer.py's `Column`), in Python: each column's values by name."""
    raw = np.frombuffer(gzip.decompress(base64.b64decode(packed)), dtype=np.uint8)
    out: dict[str, np.ndarray] = {}
    at = 0
    for c in specs:
        n = c["n"]
        v = np.zeros(n, dtype=np.int64)
        for k in range(c["width"]):
            v += raw[at:at + n].astype(np.int64) << (8 * k)
            at += n
        if c["zigzag"]:
            v = np.where(v % 2 == 1, -(v + 1) // 2, v // 2)
        if c["delta"]:
            v = np.cumsum(v)
        if "group" in c:  # a running sum within the rows of the same group value
            last: dict[int, int] = {}
            values = v.tolist()
            for i, g in enumerate(out[c["group"]].tolist()):
                values[i] += last.get(g, 0)
                last[g] = values[i]
            v = np.array(values, dtype=np.int64)
        v = v * c["factor"] + c["base"]
        out[c["name"]] = out[c["values"]][v] if "values" in c else v
    return out


def _column_digests(specs: list[dict[str, Any]], packed: str) -> dict[str, str]:
    """Each explorer column's values (`unpack_columns`) as a digest: how and in which order
    they were packed is not content."""
    return {name: hashlib.sha256(v.astype("<i8").tobytes()).hexdigest()
            for name, v in sorted(unpack_columns(specs, packed).items())
            if not name.endswith(".values")}


def _figure_view(match: re.Match[str]) -> str:
    fig = _plain(json.loads(match.group(2).replace("<\\/", "</")))
    if isinstance(fig, dict):
        fig.get("layout", {}).pop("template", None)
        if isinstance(fig.get("packed"), str):  # the explorer's columns: their values
            fig["packed"] = _column_digests(fig.pop("columns"), fig["packed"])
    return match.group(1) + json.dumps(fig, sort_keys=True) + match.group(3)


def reader_view(path: Path, text: str) -> str:
    """What a reader of the file sees, independent of the machine that wrote it."""
    if path.suffix != ".html":
        return text
    text = _PLOTLY_JS.sub(r"\1(plotly.js)\2", text)
    text = _PLOTLY_THEME.sub(r"\1(plotly's theme)\2", text)
    return _FIGURE.sub(_figure_view, text)


def is_current(path: Path, text: str) -> bool:
    return path.exists() and reader_view(path, path.read_text()) == reader_view(path, text)


def main(argv: list[str]) -> int:
    check = "--check" in argv
    stale = []
    for sample in sorted(SAMPLES.glob("*.pickle")):
        for path, text in expected(sample).items():
            if is_current(path, text):
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
