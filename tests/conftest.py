"""Shared test helpers: the real corpus (skipped when absent) and an independent raw loader."""

from __future__ import annotations

import importlib
import importlib.util
import os
import pickle
import shutil
import subprocess
import sys
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import tomllib

#: pytester runs the plugin's own tests (snapana.pytest_plugin) in a sandboxed pytest.
pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parent.parent
#: ../shared/corpus next to the checkout; SNAPANA_CORPUS points elsewhere (a git worktree)
CORPUS = Path(os.environ.get("SNAPANA_CORPUS") or ROOT.parent / "shared" / "corpus")
SNAPSHOTS = CORPUS / "torch_snapshots"
SAMPLES = ROOT / "sample_snapshots"


# The outside judges a test may need. Each is a pytest marker of the same name: a test that
# needs one says so (`@pytest.mark.torch`), is skipped with the judge's name where it is absent,
# and fails where the run demands it (SNAPANA_JUDGES, set by .ci/run's second phase).
# A test with no judge marker must pass on the README's install alone.
JUDGES: dict[str, str] = {
    "torch": "the CPU build of PyTorch (pip install torch==2.13.0)",
    "chromium": "Debian's headless chromium (apt-get install chromium) driven by playwright "
                "(pip install -e '.[judges]')",
    "memray": "memray (in the dev extra)",
    "ray": "Ray (pip install -e '.[ray]')",
    "dask": "Dask (in the dev extra)",
    # real Hugging Face models built from a small config (no download), profiled on the CPU
    "transformers": "Hugging Face transformers (pip install transformers==5.25.0)",
    # older memray releases, each pip-installed into a venv of its own by the test (minutes
    # the first time): built only where a run demands them (.ci/run's second phase)
    "memray_releases": "memray 1.10.0, 1.18.0 and 1.19.3 in venvs of their own",
}
_current: list[pytest.Item] = []  # the test being run, for require()'s marker check


def judge_present(name: str) -> bool:
    """Whether the judge `name` can be used here (imports nothing but the module finder)."""
    if name == "memray_releases":  # present once built, and built only where demanded
        return name in demanded_judges()
    if name == "chromium":
        return (importlib.util.find_spec("playwright") is not None
                and any(shutil.which(b) for b in ("chromium", "chromium-browser",
                                                    "google-chrome")))
    return importlib.util.find_spec(name) is not None


def demanded_judges() -> set[str]:
    """Judges whose absence is a failure in this run, not a skip (.ci/run sets them)."""
    return {j.strip() for j in os.environ.get("SNAPANA_JUDGES", "").split(",") if j.strip()}


def judge_of(module: str) -> str | None:
    top = module.split(".")[0]
    if top == "playwright":
        return "chromium"
    return top if top in JUDGES else None


def pytest_configure(config: pytest.Config) -> None:
    for name, what in JUDGES.items():
        config.addinivalue_line("markers", f"{name}: needs {what}; skipped, naming it, "
                                           "where absent")
    unknown = demanded_judges() - set(JUDGES)
    if unknown:
        raise pytest.UsageError(f"SNAPANA_JUDGES names unknown judges: {sorted(unknown)}")


def _reads_the_corpus(item: pytest.Item) -> bool:
    """A test parametrized over files of the real corpus."""
    params = getattr(getattr(item, "callspec", None), "params", {})
    return any(isinstance(v, Path) and v.is_relative_to(CORPUS) for v in params.values())


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Each test parametrized over the real corpus is marked `corpus`: the README's quick
    run leaves those (and `slow` ones) to CI's second phase (pyproject's addopts)."""
    for item in items:
        if _reads_the_corpus(item):
            item.add_marker(pytest.mark.corpus)


def pytest_runtest_setup(item: pytest.Item) -> None:
    """A marked test whose judge is absent: skipped with its name, or failed where demanded."""
    _current[:] = [item]
    for name in JUDGES:
        if item.get_closest_marker(name) is None or judge_present(name):
            continue
        if name in demanded_judges():
            pytest.fail(f"judge {name} is missing but this run demands it "
                        f"(SNAPANA_JUDGES): {JUDGES[name]}")
        pytest.skip(f"judge {name} not installed: {JUDGES[name]}")


def judge_missing(name: str, why: str) -> None:
    """A judge that turned out absent while a test ran (a release pip could not install):
    a skip naming it, or a failure where the run demands it."""
    if name in demanded_judges():
        pytest.fail(f"judge {name} is missing but this run demands it (SNAPANA_JUDGES): {why}")
    pytest.skip(f"judge {name} not installed: {why}")


def require(module: str) -> Any:
    """Import what a test needs. A judge's module (torch, memray, ...) may only be required by
    a test marked with that judge — so no test can skip itself into green for want of a
    marker; anything else is part of the install its run needs (the README's for the quick
    run; the `judges` extra, as CI's second phase installs, for the slow ones) and must
    import."""
    judge = judge_of(module)
    item = _current[0] if _current else None
    if judge is not None and item is not None and item.get_closest_marker(judge) is None:
        pytest.fail(f"{item.nodeid} needs {judge} but is not marked @pytest.mark.{judge}")
    return importlib.import_module(module)


def corpus_files(folder: str, pattern: str = "*") -> list[Path]:
    base = CORPUS / folder
    return sorted(base.glob(pattern)) if base.is_dir() else []


def corpus_params(folder: str, pattern: str = "*") -> list:
    """Parametrize over corpus files; a single skipped param when the corpus is absent."""
    files = corpus_files(folder, pattern)
    if not files:
        return [pytest.param(None, marks=pytest.mark.skip(reason="../shared/corpus absent"))]
    return [pytest.param(f, id=f.name) for f in files]


class _NoGlobals(pickle.Unpickler):
    def find_class(self, module, name):  # pragma: no cover - corpus is pure data
        raise AssertionError(f"test loader refused {module}.{name}")


PACKS = ROOT / "analyzer" / "snapana" / "analysis" / "attribution" / "packs"
VOCABULARY = PACKS / "vocabulary.toml"


@cache
def vocabulary() -> dict[str, Any]:
    """The vocabulary's data file as TOML reads it, without snapana: the expectation a test
    holds snapana's families, colours and lifetimes to."""
    return tomllib.loads(VOCABULARY.read_text(encoding="utf-8"))


def vocabulary_colours() -> dict[str, str]:
    """Each family's colour as the data file writes it (lower case)."""
    return {f["id"]: f["colour"].lower() for f in vocabulary()["family"]}


def raw_load(path: Path):
    """Decode a snapshot independently of snapana, for recomputing expected numbers."""
    import gzip

    with path.open("rb") as fh:
        head = fh.read(2)
        fh.seek(0)
        src = gzip.GzipFile(fileobj=fh) if head == b"\x1f\x8b" else fh
        return _NoGlobals(src).load()


def oom_entry(path: Path) -> dict | None:
    """The last `oom` entry of the pickle's traces, read without snapana."""
    snap = raw_load(path)
    entries = [e for trace in snap.get("device_traces") or [] for e in trace or []
               if isinstance(e, dict) and e.get("action") == "oom"]
    return entries[-1] if entries else None


def corpus_ooms() -> list:
    """Parametrize over the corpus's captures of an OOM: an `oom` entry in a trace, or a file
    named for one; a single skipped param when the corpus is absent."""
    out = []
    for f in corpus_files("torch_snapshots") + corpus_files("not_snapshots"):
        if "oom" in f.name.lower():
            out.append(f)
            continue
        try:
            if f.suffix in (".pickle", ".pkl") and oom_entry(f) is not None:
                out.append(f)
        except Exception:  # not a pickle this loader reads: not a capture of an OOM
            continue
    return [pytest.param(f, id=f.name) for f in out] or [
        pytest.param(None, marks=pytest.mark.skip(reason="../shared/corpus absent"))]


def invoke(*args: str, cwd: Path | None = None,
           columns: int = 200) -> subprocess.CompletedProcess:
    """Run the CLI inside this process (typer's CliRunner): the same commands, streams and
    exit codes as the console script, without a Python start-up per call, in a terminal of
    `columns`. An unexpected exception propagates, so a test shows its traceback."""
    from snapana.cli import app
    from typer.testing import CliRunner

    old = Path.cwd()
    if cwd is not None:
        os.chdir(cwd)
    try:
        result = CliRunner(env={"COLUMNS": str(columns)}).invoke(app, list(args),
                                                          catch_exceptions=False)
    finally:
        os.chdir(old)
    return subprocess.CompletedProcess(["snapana", *args], result.exit_code, result.stdout,
                                       result.stderr)


def run_cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """Run `python -m snapana` as a real process: for exit codes and the console script."""
    env = dict(os.environ, COLUMNS="200")
    return subprocess.run([sys.executable, "-m", "snapana", *args], capture_output=True,
                          text=True, cwd=cwd, env=env, timeout=600)


def regenerate_module():
    """reports/regenerate.py, loaded as a module (it is a script, not part of the package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("regenerate", ROOT / "reports" / "regenerate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def literal_collections_naming(path: Path, names: set[str],
                               at_least: int = 2) -> list[tuple[int, list[str]]]:
    """(line, names) of each literal collection (tuple, list, set, dict keys) in the Python
    file `path` that names `at_least` of `names`: a second list of what one table holds."""
    import ast

    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Tuple | ast.List | ast.Set):
            items = node.elts
        elif isinstance(node, ast.Dict):
            items = [k for k in node.keys if k is not None]
        else:
            continue
        named = [e.value for e in items if isinstance(e, ast.Constant) and e.value in names]
        if len(set(named)) >= at_least:
            found.append((node.lineno, named))
    return found


def benchmark(name: str) -> ModuleType:
    """benchmarks/<name>.py as a module, loaded once per process: its dataclasses look their
    module up in sys.modules, and it imports its neighbours from its own folder."""
    if name not in sys.modules:
        folder = str(ROOT / "benchmarks")
        if folder not in sys.path:
            sys.path.insert(0, folder)
        spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]
