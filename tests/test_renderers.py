"""The renderer contract: every registered (view kind, format) renderer turns each bundled
sample's view into non-empty text, and the registry is the only place formats are listed."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path
from typing import Any

import pytest
import snapana
from snapana import render as registry
from snapana.analysis.budget import check as check_budget
from snapana.analysis.budget import read_budget
from snapana.analysis.compare import diff_reports
from snapana.analysis.ranks.aggregate import aggregate
from snapana.analysis.scaling import parse_sizes
from snapana.render import FORMATS, Options, formats, registered, render
from snapana.render.check import CheckView
from snapana.render.scale import ScaleView, scale_view
from snapana.render.text_log import TextLogView, text_log_view
from snapana.render.views import (
    CaptureView,
    DiffView,
    ExplainView,
    RanksView,
    capture_view,
    diff_view,
    explain_view,
    ranks_view,
)
from snapana.render.whatif import WhatIfView, whatif_view
from snapana.session import Session, open_capture, summarize_many

from .conftest import SAMPLES, invoke, literal_collections_naming

SAMPLE_FILES = sorted(SAMPLES.glob("*.pickle"))
PACKAGE = Path(snapana.__file__).parent
VIEW_TYPES: dict[str, Any] = {"capture": CaptureView, "diff": DiffView, "ranks": RanksView,
              "explain": ExplainView, "text_log": TextLogView, "whatif": WhatIfView,
              "check": CheckView, "scale": ScaleView}


def _text_logs() -> list[tuple[str, object]]:
    """Text-log views: one message of each wording, four ranks in one log, and a log whose
    message comes with memory_summary(), nvidia-smi and a vLLM refusal."""
    from snapana.log_session import weigh
    from snapana.sources.log_text import read_text

    from .test_log_texts import OLD_SUMMARY, _budget, _smi, _v1_too_long
    from .test_oom_text import GIB, Oom

    oom = Oom(request=2 * GIB, device=1, capacity=80 * GIB, free=GIB // 2,
              allocated=70 * GIB, unallocated=6 * GIB, this_process=77 * GIB)
    budget, _, kv = _budget(79.11, 0.80, 14.99, 0.35, 1.24)
    texts = {"2.1+": oom.v2(), "1.4-2.0": oom.v14(), "1.0-1.3": oom.v10(),
             "ranks": "\n".join(f"[rank{k}]: torch.OutOfMemoryError: {oom.v2()}"
                                 for k in range(4)),
             "beside": "\n".join((oom.v2(), OLD_SUMMARY, _smi(
                 [(1, "NVIDIA H100 80GB HBM3", 80000, 81559)],
                 [(1, 100, "python3", 64000), (1, 200, "python3", 15000)]))),
             "vllm": budget + _v1_too_long(131072, kv + 2, kv, 100000)}
    return [(name, text_log_view(name, weigh([read_text(t, name)])))
            for name, t in texts.items()]


@pytest.fixture(scope="module")
def views() -> dict[str, list[tuple[str, object]]]:
    """Each sample's views, by kind: its capture, its diff against the next sample, its
    ranks (alone, and all samples as one job) and the explanation of its top family."""
    sessions = {p: Session(open_capture(p)) for p in SAMPLE_FILES}
    reports = {p: s.report for p, s in sessions.items()}
    summaries = dict(zip(SAMPLE_FILES, summarize_many(SAMPLE_FILES, workers=1), strict=True))
    out: dict[str, list[tuple[str, object]]] = {k: [] for k in VIEW_TYPES}
    for i, p in enumerate(SAMPLE_FILES):
        r = reports[p]
        nxt = reports[SAMPLE_FILES[(i + 1) % len(SAMPLE_FILES)]]
        out["capture"].append((p.name, capture_view([r], title=p.name)))
        out["diff"].append((p.name, diff_view(diff_reports(r, nxt))))
        out["ranks"].append((p.name, ranks_view(aggregate([summaries[p]]))))
        items = sessions[p].explain(family=r.groups[0].name, limit=2)
        out["explain"].append((p.name, explain_view(items)))
        out["whatif"].append((p.name, whatif_view(p.name, "expandable_segments:True",
                                                  [sessions[p].whatif("expandable_segments:True")])))
        sizes = parse_sizes(["seq=4096:8192"])
        out["scale"].append((p.name, scale_view(p.name, "seq 4,096 → 8,192", [
            sessions[p].resize(sizes, "80GiB", "seq" if i == 0 else None)])))
        limits = read_budget('no_oom = true\npeak_reserved = "70 GiB"\n[families]\n'
                             f'{r.groups[0].name} = "1 GiB"\n', "budget.toml")
        out["check"].append((p.name, CheckView(p.name, "budget.toml", "the moment", tuple(
            check_budget(limits, r, [r])))))
    out["ranks"].append(("all samples", ranks_view(aggregate(list(summaries.values())))))
    out["text_log"] += _text_logs()
    last = SAMPLE_FILES[-1]
    out["capture"].append(("under a rank table", capture_view(
        [reports[last]], title="all", ranks=aggregate(list(summaries.values())))))
    return out


@pytest.mark.parametrize(("kind", "fmt"), registered(), ids=lambda x: str(x))
def test_every_renderer_formats_every_sample(views, kind: str, fmt: str) -> None:
    assert views[kind], f"no view of kind {kind!r} to render"
    for name, view in views[kind]:
        assert isinstance(view, VIEW_TYPES[kind])
        if registry.OUTPUTS[fmt].binary:
            data = registry.render_output(view, fmt, Options(width=100))
            assert isinstance(data, bytes)
            if fmt == "png":
                assert data.startswith(b"\x89PNG\r\n\x1a\n"), f"{kind}/png: {name}"
            continue
        text = render(view, fmt, Options(width=100))
        assert isinstance(text, str) and text.strip(), f"{kind}/{fmt}: empty for {name}"
        if fmt == "json":
            json.loads(text)
        if fmt == "html":
            assert text.lstrip().startswith("<!DOCTYPE html>")
            assert not re.search(r"""(src|href)\s*=\s*["']?\s*(https?:)?//""", text, re.I)


def test_every_kind_has_a_view_type_and_text() -> None:
    kinds = {k for k, _ in registered()}
    assert kinds == set(VIEW_TYPES) == set(registry.VIEW_KINDS)
    for kind, cls in VIEW_TYPES.items():
        assert cls.kind == kind
        assert "text" in formats(kind)
    # the formats are the output table's (no list of them here to pin): the text ones are
    # FORMATS, every view that compares or summarises has each, a capture every output
    text = tuple(f for f, out in registry.OUTPUTS.items() if not out.binary)
    assert FORMATS == text
    for kind in ("diff", "ranks"):
        assert formats(kind) == text
    assert formats("capture") == tuple(registry.OUTPUTS)
    assert set(formats()) == set(registry.OUTPUTS)


def test_unknown_format_is_a_value_error(views) -> None:
    _, view = views["capture"][0]
    with pytest.raises(ValueError, match="xml"):
        render(view, "xml")
    with pytest.raises(registry.UnknownFormat):
        render(views["explain"][0][1], "html")


def test_adding_a_renderer_touches_only_the_registry(views) -> None:
    _, view = views["diff"][0]
    with pytest.raises(ValueError, match="declare what it writes"):
        registry.register("diff", "csv", lambda v, options: f"verdict,{v.verdict}\n")
    registry.register("diff", "csv", lambda v, options: f"verdict,{v.verdict}\n",
                      registry.Output(binary=False, extension=".csv"))
    try:
        assert "csv" in formats("diff")
        assert render(view, "csv").startswith("verdict,")
    finally:
        registry.unregister("diff", "csv")
    assert "csv" not in formats("diff")


def _choices(command: str) -> tuple[str, ...]:
    """The --format choices a command's help lists."""
    run = invoke(command, "-h")
    (choices,) = re.findall(r"--format <([^>]*)>", run.stdout)
    return tuple(choices.split("|"))


def test_cli_format_choices_come_from_the_registry() -> None:
    """Each command offers the formats its views have, read from the registry (`summary -f
    png`: a capture's card; no `check -f html` while no check renderer writes html), in
    the output table's order."""
    views = {"summary": ("capture", "ranks", "text_log"), "diff": ("diff",),
             "check": ("check",), "whatif": ("whatif", "scale")}
    for command, kinds in views.items():
        have = {fmt for kind, fmt in registered() if kind in kinds}
        assert _choices(command) == tuple(f for f in registry.OUTPUTS if f in have), command


def test_binary_output_is_refused_on_a_terminal_and_written_elsewhere(tmp_path: Path) -> None:
    """`summary -f png` prints no bytes to a terminal: one line, exit 2, before any work;
    redirected to a file it is the card, a PNG."""
    import os
    import pty
    import subprocess
    import sys

    sample = str(SAMPLE_FILES[0])
    main, tty = pty.openpty()
    try:
        run = subprocess.run([sys.executable, "-m", "snapana", "summary", sample, "-f", "png"],
                             stdout=tty, stderr=subprocess.PIPE, text=True, timeout=120)
    finally:
        os.close(tty)
    try:
        printed = os.read(main, 4096)
    except OSError:  # nothing was written: the pty's other end reads as closed
        printed = b""
    os.close(main)
    assert run.returncode == 2 and printed == b""
    assert run.stderr.count("\n") == 1 and "binary output" in run.stderr, run.stderr
    out = tmp_path / "card.png"
    with out.open("wb") as fh:
        run = subprocess.run([sys.executable, "-m", "snapana", "summary", sample, "-f", "png"],
                             stdout=fh, stderr=subprocess.PIPE, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert out.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    assert invoke("summary", sample, "-f", "png", "--full").returncode == 0  # piped: written


def _format_lists(path: Path) -> list[int]:
    """Lines where a literal collection (tuple, list, set, dict keys) names two or more
    formats."""
    return [line for line, _ in literal_collections_naming(path, set(FORMATS))]


def test_the_registry_is_the_only_place_formats_are_listed() -> None:
    listed = {str(p.relative_to(PACKAGE)): _format_lists(p)
              for p in sorted(PACKAGE.rglob("*.py"))}
    listed = {p: lines for p, lines in listed.items() if lines}
    assert set(listed) == {"render/__init__.py"}, listed


def test_render_imports_no_face_or_driver() -> None:
    banned = {"snapana.cli", "snapana.api", "snapana.session", "snapana.analysis.ranks.runner",
              "snapana.io.export", "snapana.__main__"}
    for path in sorted((PACKAGE / "render").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                names = {node.module, *(f"{node.module}.{a.name}" for a in node.names)}
            elif isinstance(node, ast.Import):
                names = {a.name for a in node.names}
            else:
                continue
            assert not names & banned, f"{path.name} imports {names & banned}"


def test_the_api_renders_every_registered_format() -> None:
    a = snapana.load(SAMPLE_FILES[0])
    for fmt in (f for f in formats("capture") if not registry.OUTPUTS[f].binary):
        assert a.summary(fmt).strip()  # type: ignore[arg-type]
    cmp = a.diff(a)
    for fmt in formats("diff"):
        assert cmp.summary(fmt).strip()  # type: ignore[arg-type]


def test_prepare_warms_the_html_renderer_before_any_data():
    """`snapana report` prepares its renderer while the decode child runs: the report
    template is compiled then, not after the capture is read."""
    from snapana.commands import _policy
    from snapana.render import html

    html._template.cache_clear()
    _policy.prepare("html")
    assert html._template.cache_info().currsize == 1
    _policy.prepare("no-such-format")  # left for render_view to refuse
