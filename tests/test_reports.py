"""reports/ holds a current report of every sample: a changed sample (or a change in what
snapana says about it) without regenerated reports fails here."""

from __future__ import annotations

from pathlib import Path

import pytest

from .conftest import ROOT, SAMPLES, regenerate_module


@pytest.mark.parametrize("sample", sorted(p.name for p in SAMPLES.glob("*.pickle")))
def test_report_is_current(sample):
    regenerate = regenerate_module()
    for path, text in regenerate.expected(SAMPLES / sample).items():
        assert path.exists(), f"{path.name} missing: run python reports/regenerate.py"
        assert regenerate.reader_view(path, path.read_text()) == \
            regenerate.reader_view(path, text), \
            f"{path.name} is stale: run python reports/regenerate.py"


def test_reader_view_ignores_float_spelling_and_bundle_but_not_data():
    """The golden check must not depend on orjson or plotly's bundle, yet see any data change."""
    regenerate = regenerate_module()
    html = Path("r.html")

    def page(numbers: str, bundle: str = "AAAA") -> str:
        return (f'<script type="application/json" id="data-x-0">{{"data":[{{"y":[{numbers}]}}],'
                f'"layout":{{"template":{{"t":"{bundle}"}}}}}}</script>'
                f'<script id="plotly-gz" type="application/octet-stream">{bundle}</script>')

    view = regenerate.reader_view
    assert view(html, page("5e-6, 1.5")) == view(html, page("5e-06, 1.5", bundle="BBBB"))
    assert view(html, page("5e-6, 1.5")) != view(html, page("6e-06, 1.5"))


def test_reader_view_reads_the_explorers_column_values():
    """How the explorer's columns were packed (their order, one deflate stream or parts) is
    not content; their values are."""
    import base64
    import gzip
    import json
    import zlib

    import numpy as np
    from snapana.render.explorer import pack

    regenerate = regenerate_module()
    html = Path("r.html")

    def page(specs: list, packed: str) -> str:
        data = json.dumps({"columns": specs, "packed": packed})
        return f'<script type="application/json" id="explore-data-0">{data}</script>'

    rng = np.random.default_rng(1)
    size = rng.choice(np.array([512, 4096]), 5000)
    address = (1 << 40) + size * rng.integers(0, 50, 5000)
    one = pack({"size": size, "address": address}, group={"address": "size"})
    other_order = pack({"alloc": np.arange(5000), "size": size, "address": address},
                       delta=frozenset({"alloc"}), group={"address": "size"})
    reordered = pack({"size": size, "alloc": np.arange(5000), "address": address},
                     delta=frozenset({"alloc"}), group={"address": "size"})
    assert other_order != reordered
    view = regenerate.reader_view
    assert view(html, page(*other_order)) == view(html, page(*reordered))
    # the same bytes deflated in one stream rather than in parts
    raw = gzip.decompress(base64.b64decode(one[1]))
    z = zlib.compressobj(9, zlib.DEFLATED, 31)
    whole = base64.b64encode(z.compress(raw) + z.flush()).decode()
    assert whole != one[1]
    assert view(html, page(one[0], whole)) == view(html, page(*one))
    moved = address.copy()
    moved[-1] += 512
    assert view(html, page(*one)) != view(html, page(*pack(
        {"size": size, "address": moved}, group={"address": "size"})))


def test_every_report_has_its_sample():
    samples = {p.stem for p in SAMPLES.glob("*.pickle")}
    reports = {p.stem for p in (ROOT / "reports").glob("*.html")}
    assert samples and reports == samples
