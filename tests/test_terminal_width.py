"""Issue 46: every terminal table and paragraph fits the terminal. `summary` (one capture and a
folder of them, whose rank table is wide), `diff`, `report`, `whatif` and `check` at 60, 80 and
120 columns: no line is wider than the terminal, and nothing is lost by folding (each family
the wide layout shows is still there, whole or split where a name splits)."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from .conftest import ROOT, SAMPLES, invoke

OOM = SAMPLES / "slime-tp2-chunked-logprob-oom.pickle"
OK = SAMPLES / "slime-tp2-recompute-loss-ok.pickle"
SWIFT = SAMPLES / "swift-vllm-colocate-oom.pickle"
WIDTHS = (60, 80, 120)


def _budget(tmp_path: Path) -> Path:
    """The README's budget file, as the README shows it."""
    (toml,) = re.findall(r"```toml\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    path = tmp_path / "budget.toml"
    path.write_text(toml)
    return path


def _commands(tmp_path: Path) -> dict[str, tuple[str, ...]]:
    folder = tmp_path / "incident"
    folder.mkdir()
    for p in sorted(SAMPLES.glob("*.pickle")):
        shutil.copy(p, folder / p.name)
    return {
        "summary": ("summary", str(OOM)),
        "summary-swift": ("summary", str(SWIFT)),
        "summary-folder": ("summary", str(folder)),
        "diff": ("diff", str(OOM), str(OK)),
        "report": ("report", str(OOM), "-o", "r.html"),
        "whatif": ("whatif", str(OOM), "--set", "expandable_segments:True"),
        "check": ("check", str(OOM), "--budget", str(_budget(tmp_path))),
    }


@pytest.mark.parametrize("width", WIDTHS)
def test_no_line_is_wider_than_the_terminal(tmp_path: Path, width: int) -> None:
    for name, args in _commands(tmp_path).items():
        run = invoke(*args, cwd=tmp_path, columns=width)
        assert run.returncode in (0, 1), (name, run.stdout, run.stderr)
        said = run.stdout + run.stderr
        wide = [ln for ln in said.splitlines() if len(ln) > width]
        assert not wide, f"{name} at {width} columns: {wide[:3]}"
        assert said.strip(), name


def _words(text: str) -> str:
    """The text with line breaks and layout spaces gone: what a fold may not lose."""
    return re.sub(r"\s+", "", text)


def test_folding_keeps_every_family_and_figure(tmp_path: Path) -> None:
    """The family table at 60 columns holds what it holds at 200: every family name and
    figure, whole once the layout's spaces are gone."""
    narrow = invoke("diff", str(OOM), str(OK), columns=60).stdout
    wide = invoke("diff", str(OOM), str(OK), columns=200).stdout
    families = re.findall(r"^(\w+)\s+[\d.]+ [KMG]?i?B", wide, re.M)
    assert len(families) >= 4
    for family in families:
        assert family in _words(narrow), family
    figures = set(re.findall(r"[-+]?\d+\.\d\d [KMGT]iB", wide))
    assert figures and all(f.replace(" ", "") in _words(narrow) for f in figures)


def test_the_readme_failure_is_what_check_prints(tmp_path: Path) -> None:
    """The README's "a failure looks like this": the chunked-logprob sample against the README
    budget's no_oom, peak_reserved, saved_logprob_softmax and [chunks] lines, 100 columns."""
    readme = (ROOT / "README.md").read_text()
    (shown,) = re.findall(r"```\n(Budget check: .*?)```", readme, re.S)
    keep = ("no_oom", "peak_reserved", "[families]", "[chunks]", "saved_logprob_softmax")
    lines = [ln for ln in _budget(tmp_path).read_text().splitlines() if ln.startswith(keep)]
    (tmp_path / "budget.toml").write_text("\n".join(lines) + "\n")
    shutil.copy(OOM, tmp_path / OOM.name)
    run = invoke("check", OOM.name, "--budget", "budget.toml", cwd=tmp_path, columns=100)
    assert run.returncode == 1
    assert run.stdout == shown


def test_diff_at_80_columns_keeps_sites_and_families_whole() -> None:
    """Issue 60: the changed sites were squeezed into 10-character columns (one path over 5
    lines). At 80 columns each site now has a line of its own, whole where it fits, and every
    family name in the tables is whole: no cell of the site table is under 20 characters."""
    import json

    run = invoke("diff", str(OOM), str(OK), columns=80)
    data = json.loads(invoke("diff", str(OOM), str(OK), "-f", "json").stdout)
    lines = run.stdout.splitlines()
    assert all(len(ln) <= 80 for ln in lines)
    changed = [s for s in data["sites"] if s["status"] != "same"][:20]  # the text shows 20
    sites = [s for s in changed if len(s["site"]) <= 60]
    assert sites
    for s in sites:
        assert any(ln.startswith(s["site"]) for ln in lines), s["site"]
    start = lines.index("site, what became of it")
    header = lines[start + 1]
    assert header.index("before") - header.index("family") >= 20
    for s in changed:
        assert any(ln.strip().startswith(s["family"] + " ") for ln in lines[start:]), s
