"""The shape of the code, checked: data flows one way (no import cycle between modules),
each stage imports only the stages before it, and the faces are imported by nobody."""

from __future__ import annotations

import ast
import pkgutil
from pathlib import Path

import pytest
import snapana

PACKAGE = Path(snapana.__file__).parent


def _modules() -> dict[str, Path]:
    out = {"snapana": PACKAGE / "__init__.py"}
    for info in pkgutil.walk_packages([str(PACKAGE)], "snapana."):
        rel = info.name.split(".")[1:]
        path = PACKAGE.joinpath(*rel)
        out[info.name] = path / "__init__.py" if info.ispkg else path.with_suffix(".py")
    return out


MODULES = _modules()


def _imports(name: str) -> set[str]:
    """Every snapana module `name` imports, at the top or inside a function (a lazy import
    is still a dependency), resolved to the longest module name that exists."""
    tree = ast.parse(MODULES[name].read_text())
    package = name if MODULES[name].name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[: len(parts) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            # `from pkg import mod` depends on pkg.mod; `from mod import name`, on mod
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base
                       for a in node.names]
        for t in targets:
            while t and t not in MODULES:
                t = t.rpartition(".")[0]
            if t and t != name and t.startswith("snapana"):
                found.add(t)
    return found


GRAPH = {m: _imports(m) for m in MODULES}


def _reaches(start: str, goal: str) -> bool:
    seen, todo = set(), [start]
    while todo:
        m = todo.pop()
        for n in GRAPH[m]:
            if n == goal:
                return True
            if n not in seen:
                seen.add(n)
                todo.append(n)
    return False


def _is_package_init(a: str, b: str) -> bool:
    """A package's __init__ re-exporting its own submodules is not a cycle between stages."""
    return b.startswith(a + ".") or a.startswith(b + ".")


def test_no_import_cycle() -> None:
    cycles = sorted((a, b) for a in GRAPH for b in GRAPH[a]
                    if not _is_package_init(a, b) and a != "snapana" and b != "snapana"
                    and _reaches(b, a))
    assert not cycles, f"import cycles: {cycles}"


FACES = {"snapana.cli", "snapana.api", "snapana.__main__", "snapana.pytest_plugin",
         "snapana.cell_magic"} | {
    m for m in MODULES if m.startswith("snapana.commands")}
DRIVERS = {"snapana.session", "snapana.analysis.ranks.runner", "snapana.io.export"}
#: The command line: the typer app and the commands it registers.
CLI = {"snapana.cli"} | {m for m in MODULES if m.startswith("snapana.commands")}
#: The faces that record as well as analyse: the command line, the pytest plugin and the
#: notebook cell magic.
RECORDING_FACES = CLI | {"snapana.pytest_plugin", "snapana.cell_magic"}


@pytest.mark.parametrize("name", sorted(MODULES))
def test_stages_import_only_earlier_stages(name: str) -> None:
    deps = GRAPH[name]
    if name.startswith("snapana.render"):
        assert not deps & (FACES | DRIVERS), f"{name} imports {deps & (FACES | DRIVERS)}"
        # renderers read findings only: no source type, no attribution module (the family
        # colours they print are `diagnosis.palette`'s, a stack's site `analysis.sites`',
        # the text-log figures `log_model`'s) (#59)
        upstream = {d for d in deps if d.startswith(("snapana.sources",
                                                     "snapana.analysis.attribution"))}
        assert not upstream, f"a renderer imports a source or attribution: {upstream}"
        # nor writes a file through the output layer above it (an atomic write of its own
        # cache comes from `snapana.atomic`, below) (#59)
        assert not {d for d in deps if d.startswith("snapana.io")}, \
            f"a renderer imports the output layer: {deps}"
    if name.startswith("snapana.analysis"):
        # the analysis runs below the wiring: the rank runner is given its per-input worker
        # (`session.summarize`) by the caller, never imports the session (#59)
        above = {d for d in deps if d in {"snapana.session", "snapana.log_session",
                                          "snapana.api"}
                 or d.startswith(("snapana.io", "snapana.render", "snapana.commands"))}
        assert not above, f"an analysis module imports a later stage: {above}"
    if name in ("snapana.inputs", "snapana.capture_kinds", "snapana.atomic"):
        # low modules that analysis and render read: nothing of the pipeline above sources
        low = ("snapana.sources", "snapana.capture_kinds", "snapana.caching_allocator",
               "snapana.allocator_model.rules",
               "snapana.errors", "snapana.units", "snapana.limits", "snapana.model")
        assert all(d.startswith(low) for d in deps), f"{name} imports a later stage: {deps}"
    if name.startswith("snapana.sources"):
        later = {d for d in deps if d.startswith((
            "snapana.render",
            "snapana.analysis.attribution",
            "snapana.analysis.diagnosis.diagnose",
            "snapana.analysis.diagnosis.findings",
            "snapana.analysis.replay",
            "snapana.session",
            "snapana.analysis.knobs",
            "snapana.analysis.compare",
        ))}
        assert not later, f"a source imports a later stage: {later}"
    if not name.startswith("snapana.synth") and name not in CLI:
        assert not {d for d in deps if d.startswith("snapana.synth")}, \
            f"{name}: the pipeline never imports the simulator"
    if name not in ("snapana.__main__", "snapana.cli"):
        assert "snapana.cli" not in deps, f"{name} imports the CLI"
    if name not in FACES and name != "snapana":
        assert "snapana.api" not in deps, f"{name} imports the Jupyter face"
    if name.startswith("snapana.record"):  # runs inside the user's job: stdlib and torch
        assert all(d.startswith("snapana.record") for d in deps), \
            f"the capture side imports the analyzer: {deps}"
    elif name not in RECORDING_FACES:
        assert not {d for d in deps if d.startswith("snapana.record")}, \
            f"{name}: the analyzer never imports the capture code"


# ----- one home per idea: findings apart from the algorithm, one wiring ---------------------------
#: The algorithm of the diagnosis and the stage entry points only the session may call.
DIAGNOSIS_ALGORITHM = "snapana.analysis.diagnosis.diagnose"
#: Modules whose code runs an analysis stage; a renderer imports none of them.
ALGORITHMS = {
    DIAGNOSIS_ALGORITHM,
    "snapana.analysis.replay",
    "snapana.analysis.replay_pairs",
    "snapana.analysis.replay_segments",
    "snapana.analysis.replay_sizes",
    "snapana.analysis.placement",
    "snapana.session",
    "snapana.analysis.ranks.runner",
} | {m for m in MODULES if m.startswith("snapana.analysis.attribution")}
#: Modules that hold types beside the code that makes them: a renderer imports their types and
#: constants (capitalised names) only, never a function.
TYPES_BESIDE_CODE = {
    "snapana.analysis.compare",
    "snapana.analysis.explain",
    "snapana.analysis.family_timeline",
    "snapana.analysis.knobs",
    "snapana.analysis.log_check",
    "snapana.analysis.log_evidence",
    "snapana.analysis.ranks.aggregate",
}
#: The calls that run a stage: replay, attribution, diagnosis.
STAGE_CALLS = {"replay", "Attributor", "device_report", "diagnose"}
#: Who may make them: the session (the one wiring) and the stages themselves.
STAGE_CALLERS = {
    "snapana.session",
    "snapana.log_session",  # the same wiring for text logs (no capture pipeline imported)
    DIAGNOSIS_ALGORITHM,
    "snapana.analysis.replay",
} | {m for m in MODULES if m.startswith("snapana.analysis.attribution")}


def _imported_names(name: str) -> list[tuple[str, str]]:
    """(module, name) for every `from snapana... import name` in a module, resolved."""
    tree = ast.parse(MODULES[name].read_text())
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out += [(node.module, a.name) for a in node.names]
    return out


@pytest.mark.parametrize("name", sorted(m for m in MODULES if m.startswith("snapana.render")))
def test_no_renderer_imports_an_algorithm(name: str) -> None:
    algorithms = GRAPH[name] & ALGORITHMS
    assert not algorithms, f"{name} imports the algorithm module(s) {sorted(algorithms)}"
    functions = [f"{module}.{n}" for module, n in _imported_names(name)
                 if module in TYPES_BESIDE_CODE and not n[:1].isupper()]
    assert not functions, f"{name} imports code, not types: {functions}"


@pytest.mark.parametrize("name", sorted(MODULES))
def test_only_the_session_runs_the_stages(name: str) -> None:
    if name in STAGE_CALLERS:
        return
    tree = ast.parse(MODULES[name].read_text())
    calls = sorted({
        f.id if isinstance(f, ast.Name) else f.attr
        for node in ast.walk(tree) if isinstance(node, ast.Call)
        for f in [node.func]
        if (isinstance(f, ast.Name) and f.id in STAGE_CALLS)
        or (isinstance(f, ast.Attribute) and f.attr in STAGE_CALLS)})
    assert not calls, f"{name} runs a stage itself ({calls}); go through snapana.session"
    assert DIAGNOSIS_ALGORITHM not in GRAPH[name], \
        f"{name} imports the diagnosis algorithm; the session is its only caller"


def test_what_a_family_is_lives_in_the_vocabulary_not_in_python_sets() -> None:
    """A family's behaviour (a loop's copies, mirroring the parameters, refining another) is
    a field of its entry in packs/vocabulary.toml, read through `families`' queries; a
    literal collection of two or more family ids in the package's code is a second list of
    the same knowledge, and a new family would be missed by it."""

    from snapana.analysis.attribution.families import family_ids

    from .conftest import literal_collections_naming

    ids = set(family_ids())
    found = [f"{path.relative_to(PACKAGE)}:{line} {named}"
             for path in sorted(PACKAGE.rglob("*.py"))
             for line, named in literal_collections_naming(path, ids)]
    assert not found, found
