"""The judge markers hold: a test that needs an outside judge says so, is skipped naming it
where the judge is absent, fails where the run demands the judge, and fails when it uses a
judge without the marker (so nothing can skip itself into green)."""

from __future__ import annotations

import pytest

from .conftest import ROOT

pytest_plugins = ["pytester"]

ABSENT = "snapana_no_such_judge"  # a judge whose module cannot be imported anywhere


@pytest.fixture()
def suite(pytester: pytest.Pytester) -> pytest.Pytester:
    """A throwaway suite with this project's conftest and one extra judge that is absent."""
    conftest = (ROOT / "tests" / "conftest.py").read_text()
    marker = "JUDGES: dict[str, str] = {\n"
    assert marker in conftest
    pytester.makeconftest(conftest.replace(marker, f"{marker}    {ABSENT!r}: 'a judge "
                                                   "that is never installed',\n"))
    pytester.makepyfile(test_uses=f"""
        import pytest
        from conftest import require

        @pytest.mark.{ABSENT}
        def test_marked():
            require({ABSENT!r})

        def test_unmarked():
            require({ABSENT!r})
    """)
    return pytester


def test_absent_judge_skips_with_its_name_and_unmarked_use_fails(suite, monkeypatch) -> None:
    monkeypatch.delenv("SNAPANA_JUDGES", raising=False)
    result = suite.runpytest("-rs", "-p", "no:cacheprovider")
    result.assert_outcomes(skipped=1, failed=1)
    result.stdout.fnmatch_lines([f"*needs {ABSENT} but is not marked @pytest.mark.{ABSENT}*",
                                 f"*judge {ABSENT} not installed*"])


def test_absent_judge_that_the_run_demands_fails(suite, monkeypatch) -> None:
    monkeypatch.setenv("SNAPANA_JUDGES", ABSENT)
    result = suite.runpytest("-p", "no:cacheprovider", "-k", "test_marked")
    result.assert_outcomes(errors=1)  # failed in setup: the run is red
    result.stdout.fnmatch_lines([f"*judge {ABSENT} is missing but this run demands it*"])
