"""reports/ holds a current report of every sample: a changed sample (or a change in what
snapana says about it) without regenerated reports fails here."""

from __future__ import annotations

import importlib.util

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
        assert path.read_text() == text, f"{path.name} is stale: run python reports/regenerate.py"


def test_every_report_has_its_sample():
    samples = {p.stem for p in SAMPLES.glob("*.pickle")}
    reports = {p.stem for p in (ROOT / "reports").glob("*.html")}
    assert samples and reports == samples
