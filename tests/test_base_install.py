"""A user's laptop: `pip install .` alone (no extras, no torch) in a brand-new virtual
environment, then every command and snippet the README shows, on the bundled samples."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import ROOT, SAMPLES

pytestmark = pytest.mark.slow

OOM = "sample_snapshots/slime-tp2-chunked-logprob-oom.pickle"
OK = "sample_snapshots/slime-tp2-recompute-loss-ok.pickle"
README = (ROOT / "README.md").read_text()


def _readme_blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", README, re.S)


@pytest.fixture(scope="module")
def laptop(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(venv bin folder, a working folder with the samples) after `pip install .`."""
    base = tmp_path_factory.mktemp("laptop")
    src = base / "src"  # a copy, so the build leaves nothing in the checkout
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(ROOT / "analyzer", src / "analyzer",
                    ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    venv = base / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    pip = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q",
                          "--disable-pip-version-check", str(src)],
                         capture_output=True, text=True, timeout=900)
    assert pip.returncode == 0, pip.stderr[-3000:]
    work = base / "work"
    work.mkdir()
    (work / "sample_snapshots").symlink_to(SAMPLES)
    return venv / "bin", work


def _env(bin_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    env["COLUMNS"] = "120"
    return env


def _run(laptop: tuple[Path, Path], *cmd: str) -> subprocess.CompletedProcess:
    bin_dir, work = laptop
    return subprocess.run(list(cmd), cwd=work, env=_env(bin_dir), capture_output=True,
                          text=True, timeout=600)


def _ok(laptop: tuple[Path, Path], command: str) -> subprocess.CompletedProcess:
    run = _run(laptop, "bash", "-c", command)
    assert run.returncode == 0, f"{command}\n{run.stderr[-3000:]}"
    return run


def test_base_install_has_no_torch_and_no_extras(laptop) -> None:
    bin_dir, _ = laptop
    for module in ("torch", "memray", "dask", "ray"):
        probe = _run(laptop, str(bin_dir / "python"), "-c", f"import {module}")
        assert probe.returncode != 0, f"{module} came with a base install"
    assert _ok(laptop, "snapana --version").stdout.startswith("snapana ")


def test_the_install_weighs_what_the_readme_says(laptop) -> None:
    """Issue 71: a new user found a plain install's environment far larger than expected and
    nothing said so. The README states its weight; the brand-new venv is measured here."""
    bin_dir, _ = laptop
    stated = re.search(r"environment weighs about ([\d,]+) MB", README)
    assert stated, "the README no longer states the install's weight"
    venv = bin_dir.parent
    size = sum(f.stat().st_size for f in venv.rglob("*") if f.is_file() and not f.is_symlink())
    mb = size / 1e6
    assert abs(mb - int(stated.group(1).replace(",", ""))) <= 0.15 * mb, mb


def test_readme_report_command(laptop) -> None:
    commands = [line.split("#")[0].strip() for block in _readme_blocks("bash")
                for line in block.splitlines()
                if line.startswith("snapana ") and "sample_snapshots/" in line]
    assert commands, "the README shows no command on a bundled sample"
    _, work = laptop
    for command in commands:
        _ok(laptop, command)
    html = work / "report.html"
    assert html.read_text().startswith("<!DOCTYPE html>")
    assert "saved_logprob_softmax" in html.read_text()


def test_every_command_on_a_sample(laptop) -> None:
    _, work = laptop
    text = _ok(laptop, f"snapana summary {OOM}").stdout
    assert "Out of memory" in text and "saved_logprob_softmax" in text
    md = _ok(laptop, f"snapana summary {OOM} --format markdown").stdout
    assert md.startswith("#") and "saved_logprob_softmax" in md
    data = json.loads(_ok(laptop, f"snapana summary {OOM} -f json").stdout)
    groups = data["devices"][0]["groups"]
    assert sum(g["bytes"] for g in groups) == data["devices"][0]["allocated_bytes"] > 0
    explained = _ok(laptop, f"snapana explain {OOM} --family saved_logprob_softmax").stdout
    assert "vocab_parallel_softmax" in explained
    diff = _ok(laptop, f"snapana diff {OOM} {OK}").stdout
    assert diff.startswith("before: ") and "saved_logprob_softmax" in diff
    _ok(laptop, f"snapana export {OOM} -o exported && snapana report exported -o exp.html")
    assert (work / "exported" / "snapana-export.json").is_file()
    assert "saved_logprob_softmax" in (work / "exp.html").read_text()
    whatif = _ok(laptop, f"snapana whatif {OOM} --set expandable_segments:True").stdout
    assert "The model reproduces this window" in whatif
    (work / "budget.toml").write_text('peak_reserved = "200 GiB"\n[chunks]\n'
                                      'saved_logprob_softmax = 100\n')
    assert "Within budget" in _ok(laptop, f"snapana check {OOM} --budget budget.toml").stdout
    _ok(laptop, "snapana synth --list")
    _ok(laptop, "snapana synth fsdp-train-step -o synth.pickle && snapana summary synth.pickle")
    ranks = work / "ranks"
    ranks.mkdir()
    for i, name in enumerate(sorted(p.name for p in SAMPLES.glob("slime-tp2-*.pickle"))):
        shutil.copy(SAMPLES / name, ranks / f"rank{i}-{name}")
    table = _ok(laptop, "snapana summary ranks/").stdout
    assert "rank" in table.lower()
    _ok(laptop, "snapana report ranks/ -o ranks.html")
    assert (work / "ranks.html").read_text().startswith("<!DOCTYPE html>")


def test_missing_extra_is_one_line(laptop) -> None:
    run = _run(laptop, "bash", "-c", f"snapana batch {OOM} -o ds --engine dask")
    assert run.returncode == 2 and "snapana[dask]" in run.stderr
    assert len(run.stderr.strip().splitlines()) == 1


def test_readme_python_snippet(laptop) -> None:
    bin_dir, work = laptop
    (snippet,) = [b for b in _readme_blocks("python") if "snapana.load" in b]
    script = work / "snippet.py"
    script.write_text(snippet + "\nprint(type(a.families.to_pandas()).__name__)\n")
    run = _run(laptop, str(bin_dir / "python"), str(script))
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.strip().endswith("DataFrame")
