"""The figures are plain dict specs (issue 29: plotly's objects and validators cost the
report a third of a second and more): each spec must be exactly what plotly would make of
it — plotly's validation accepts it and, less the template it adds, changes nothing — and
the report's path must never import plotly's figure classes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import plotly.graph_objects as go
import pytest
import snapana
from snapana.analysis.ranks.aggregate import aggregate
from snapana.render import figures
from snapana.render.html import _figure_json
from snapana.render.views import ranks_view
from snapana.session import summarize_many

from .conftest import SAMPLES, corpus_params

SAMPLE_FILES = sorted(SAMPLES.glob("*.pickle"))


def _as_plotly_made_it(spec: figures.Figure) -> None:
    """`go.Figure(spec)` validates the spec (an unknown property or a bad value raises) and,
    written out by plotly less its default template, is the spec as the page writes it."""
    fig = go.Figure(spec)
    mine = json.loads(_figure_json(spec))
    theirs = json.loads(fig.to_json(engine="json"))
    template = theirs["layout"].pop("template")
    assert template["layout"]["font"]  # plotly added its default template...
    assert "template" not in mine["layout"]  # ...which the page adds once for all figures
    assert mine == theirs


def _device_figures(path: Path) -> int:
    """Every figure of every device of `path`, held to plotly; how many."""
    first = snapana.load(path)
    n = 0
    for device in [d.report.device for d in first.view.devices]:
        view = snapana.load(path, device=device)._device_view
        for name in figures.FIGURE_NAMES:
            _as_plotly_made_it(figures.figure(name, view))
            n += 1
    return n


@pytest.mark.parametrize("path", SAMPLE_FILES, ids=lambda p: p.name)
def test_every_sample_figure_is_what_plotly_makes_of_it(path: Path) -> None:
    assert _device_figures(path) >= len(figures.FIGURE_NAMES)


@pytest.mark.parametrize("path", corpus_params("torch_snapshots"))
def test_every_corpus_figure_is_what_plotly_makes_of_it(path: Path) -> None:
    assert _device_figures(path) >= len(figures.FIGURE_NAMES)


def test_diff_ranks_and_together_figures_are_what_plotly_makes_of_them() -> None:
    before, after = (snapana.load(p) for p in SAMPLE_FILES[:2])
    cmp = before.diff(after)
    for name in figures.DIFF_FIGURES:
        _as_plotly_made_it(figures.diff_figure(name, cmp.view))
    _as_plotly_made_it(figures.together([before._device_view, after._device_view]))
    ranks = ranks_view(aggregate(summarize_many(SAMPLE_FILES[:3], workers=1)))
    _as_plotly_made_it(figures.heatmap(ranks))


def test_api_figures_are_plotly_figures_with_the_default_template() -> None:
    """A notebook still gets `go.Figure`s, numpy arrays where the spec has them."""
    a = snapana.load(SAMPLE_FILES[0])
    fig = a.figure("families_over_time")
    assert isinstance(fig, go.Figure) and fig.layout.template.layout.font.color
    spec = figures.figure("families_over_time", a._device_view)
    assert len(fig.data) == len(spec["data"])
    assert list(fig.data[0].y) == pytest.approx(list(spec["data"][0]["y"]))


def test_nan_is_written_as_null_as_plotly_writes_it() -> None:
    import numpy as np

    spec: dict[str, Any] = {"data": [{"type": "scatter", "x": [0.0, float("nan"), 2.0],
                                      "y": np.array([1.0, np.inf, 3.0]),
                                      "name": "</script><!--"}], "layout": {}}
    text = _figure_json(spec)
    assert "</" not in text and "<!--" not in text  # cannot end or confuse its <script>
    assert json.loads(text)["data"][0]["x"] == [0.0, None, 2.0]
    assert json.loads(text) == json.loads(go.Figure(spec).to_json(engine="json")) | {
        "layout": {}}


def test_the_report_path_imports_no_plotly_figure_classes(tmp_path: Path) -> None:
    """`snapana report` on a sample, in a fresh interpreter: the page draws its charts, and
    neither plotly.graph_objects nor plotly's validators were imported."""
    out = tmp_path / "r.html"
    code = ("import json, sys\n"
            "from snapana.cli import main\n"
            f"sys.argv = ['snapana', 'report', {str(SAMPLE_FILES[0])!r}, '-o', {str(out)!r}]\n"
            "try:\n    main()\nexcept SystemExit as e:\n    assert not e.code, e.code\n"
            "print(json.dumps(sorted(m for m in sys.modules if m.startswith(('plotly', "
            "'_plotly_utils')))))\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=dict(os.environ, COLUMNS="200"), timeout=600)
    assert run.returncode == 0, run.stderr
    loaded = json.loads(run.stdout.strip().splitlines()[-1])
    assert not [m for m in loaded if m.startswith(("plotly.graph_objs", "plotly.graph_objects",
                                                   "plotly.subplots", "plotly.validators",
                                                   "_plotly_utils.basevalidators"))], loaded
    page = out.read_text()
    assert page.count('data-figure="') >= 4 and page.count('id="plotly-template"') == 1
    assert '"template"' not in page.split('id="plotly-template"')[0]  # not once per figure


#: Per drawn figure: what plotly.js made of the layout's theme.
THEME_PROBE = """[...document.querySelectorAll("div[data-figure]")].map(div => ({
  figure: div.dataset.figure, template: !!(div.layout && div.layout.template),
  paper: div._fullLayout.paper_bgcolor, plot: div._fullLayout.plot_bgcolor,
  font: div._fullLayout.font.color,
  colorway: div._fullLayout.colorway}))"""


@pytest.mark.chromium
@pytest.mark.parametrize("page", ["report", "diff"])
def test_pages_draw_every_figure_in_plotlys_default_template(page: str, tmp_path: Path
                                                             ) -> None:
    """The template the page embeds once is applied to each figure, as plotly's per-figure
    copy was: the drawn layouts carry its backgrounds, font and colour cycle (plotly.js's
    own defaults differ: #fff paper, #444 font)."""
    from snapana.render.assets import plotly_template_json

    from .browser import open_report
    from .conftest import invoke

    theme = json.loads(plotly_template_json())["layout"]
    out = tmp_path / f"{page}.html"
    args = [str(p) for p in SAMPLE_FILES[:2 if page == "diff" else 1]]
    assert invoke(page, *args, "-o", str(out)).returncode == 0
    visit = open_report(out, probe=THEME_PROBE)
    assert visit.console_errors == []
    drawn = visit.probed
    assert isinstance(drawn, list) and len(drawn) == visit.plots == visit.figure_divs >= 2
    for fig in drawn:
        assert fig["template"], fig["figure"]
        assert (fig["paper"], fig["font"], fig["colorway"]) == (
            theme["paper_bgcolor"], theme["font"]["color"], theme["colorway"]), fig["figure"]
        assert fig["plot"] in (theme["plot_bgcolor"], None), fig["figure"]  # None: a treemap
    assert sum(fig["plot"] == theme["plot_bgcolor"] for fig in drawn) >= 1
