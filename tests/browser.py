"""Open a report in real headless Chromium and collect what a person's browser would see."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from .conftest import require


def chromium_path() -> str:
    """Debian's chromium. Only a test marked `chromium` gets here (conftest skips or fails it
    where the judge is absent), so a missing browser is a failure."""
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    pytest.fail("chromium is not installed (apt-get install chromium)")


@dataclass
class PageVisit:
    console_errors: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)
    plots: int = 0
    figure_divs: int = 0
    text: str = ""
    probed: object = None  # what the page's `probe` expression evaluated to


def open_report(path: Path, timeout_ms: int = 30000, probe: str | None = None,
                act: Callable[[Any], None] | None = None,
                viewport: tuple[int, int] | None = None) -> PageVisit:
    """Open the report, wait until its figures are drawn, and collect what the page shows;
    `act`, given the playwright page, does what a person would (a click) before `probe`, a
    JavaScript expression, is evaluated in the drawn page (e.g. a plot's data). `viewport`:
    the window's (width, height) in CSS pixels (playwright's default is 1280 × 720)."""
    sync_playwright = require("playwright.sync_api").sync_playwright  # a `chromium` test
    visit = PageVisit()
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium_path(),
                                    args=["--no-sandbox", "--disable-gpu"])
        page = browser.new_page(**({"viewport": {"width": viewport[0], "height": viewport[1]}}
                                   if viewport else {}))
        page.on("console", lambda m: m.type == "error" and visit.console_errors.append(m.text))
        page.on("pageerror", lambda e: visit.console_errors.append(str(e)))
        page.on("request", lambda r: visit.requests.append(r.url))
        page.goto(path.resolve().as_uri())
        page.wait_for_function("document.body.dataset.rendered === 'yes'", timeout=timeout_ms)
        visit.plots = page.locator(".js-plotly-plot").count()
        visit.figure_divs = page.locator("div[data-figure]").count()
        if act is not None:
            act(page)
        visit.text = page.inner_text("body")
        if probe is not None:
            visit.probed = page.evaluate(probe)
        browser.close()
    return visit
