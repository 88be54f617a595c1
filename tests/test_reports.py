"""reports/ holds a current report of every sample: a changed sample (or a change in what
snapana says about it) without regenerated reports fails here."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from .conftest import ROOT, SAMPLES


def _regenerate_module():
    spec = importlib.util.spec_from_file_location("regenerate", ROOT / "reports" / "regenerate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("sample", sorted(p.name for p in SAMPLES.glob("*.pickle")))
def test_report_is_current(sample):
    regenerate = _regenerate_module()
    for path, text in regenerate.expected(SAMPLES / sample).items():
        assert path.exists(), f"{path.name} missing: run python reports/regenerate.py"
        assert regenerate.reader_view(path, path.read_text()) == \
            regenerate.reader_view(path, text), \
            f"{path.name} is stale: run python reports/regenerate.py"


def test_reader_view_ignores_float_spelling_and_bundle_but_not_data():
    """The golden check must not depend on orjson or plotly's bundle, yet see any data change."""
    regenerate = _regenerate_module()
    html = Path("r.html")

    def page(numbers: str, bundle: str = "AAAA") -> str:
        return (f'<script type="application/json" id="data-x-0">{{"data":[{{"y":[{numbers}]}}],'
                f'"layout":{{"template":{{"t":"{bundle}"}}}}}}</script>'
                f'<script id="plotly-gz" type="application/octet-stream">{bundle}</script>')

    view = regenerate.reader_view
    assert view(html, page("5e-6, 1.5")) == view(html, page("5e-06, 1.5", bundle="BBBB"))
    assert view(html, page("5e-6, 1.5")) != view(html, page("6e-06, 1.5"))


def test_reader_view_reads_the_explorers_columns_inflated():
    """How the explorer's columns were deflated (one stream, or columns apart) is not
    content; the bytes they inflate to are."""
    import base64
    import gzip
    import json
    import zlib

    regenerate = _regenerate_module()
    html = Path("r.html")
    data = bytes(range(256)) * 40

    def page(blob: bytes) -> str:
        packed = json.dumps({"columns": [], "packed": base64.b64encode(blob).decode()})
        return f'<script type="application/json" id="explore-data-0">{packed}</script>'

    apart = zlib.compressobj(9, zlib.DEFLATED, -15)
    body = apart.compress(data[:5000]) + apart.flush(zlib.Z_FULL_FLUSH)
    rest = zlib.compressobj(1, zlib.DEFLATED, -15)
    body += rest.compress(data[5000:]) + rest.flush(zlib.Z_FINISH)
    two_ways = gzip.compress(data, mtime=0)[:10] + body + gzip.compress(data, mtime=0)[-8:]
    assert two_ways != gzip.compress(data, mtime=0)
    assert gzip.decompress(two_ways) == data
    view = regenerate.reader_view
    assert view(html, page(gzip.compress(data, mtime=0))) == view(html, page(two_ways))
    assert view(html, page(gzip.compress(data, mtime=0))) != \
        view(html, page(gzip.compress(data[:-1] + b"x", mtime=0)))


def test_every_report_has_its_sample():
    samples = {p.stem for p in SAMPLES.glob("*.pickle")}
    reports = {p.stem for p in (ROOT / "reports").glob("*.html")}
    assert samples and reports == samples
