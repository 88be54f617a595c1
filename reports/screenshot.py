"""Redraw `reports/screenshot.png`, the README's picture of a report, from the committed
sample report in headless Chromium: the top of the page in a laptop's window (1,366 px wide,
as the layout test measures it), so the picture shows what the page shows today.

    python reports/screenshot.py     # needs the judges extra (playwright) and chromium
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

REPORTS = Path(__file__).resolve().parent
PAGE = REPORTS / "slime-tp2-chunked-logprob-oom.html"
WINDOW = {"width": 1366, "height": 1500}


def main() -> int:
    from playwright.sync_api import sync_playwright

    browser_path = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser_path is None:
        print("screenshot: chromium is not installed (apt-get install chromium)",
              file=sys.stderr)
        return 2
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=browser_path,
                                    args=["--no-sandbox", "--disable-gpu"])
        page = browser.new_page(viewport=WINDOW)
        page.goto(PAGE.as_uri())
        page.wait_for_function("document.body.dataset.rendered === 'yes'", timeout=60000)
        page.screenshot(path=str(REPORTS / "screenshot.png"))
        browser.close()
    print(f"wrote {REPORTS / 'screenshot.png'} from {PAGE.name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
