"""Renderers: one protocol, one registry keyed by (view kind, format).

A view-model (`render/views.py`: a capture, a diff, the ranks of a job, explanations) is
built once from the findings; a renderer turns one into text (or bytes: a PNG) and does
nothing else. Each format has one module (`text.py`, `markdown.py`, `json.py`, `html.py`,
`card.py`) holding its renderer for every kind of view, and declares what it writes
(`OUTPUTS`: text or binary, a file's extension). The tables below are the only place
formats and renderers are listed: each command's ``--format`` choices (`formats` of its
view kinds), the API's formats and the refusal to print binary output to a terminal come
from them, so adding a renderer means adding its function and one line here.

This module imports nothing heavy (the CLI reads the formats for ``-h``); a renderer's module
is imported the first time it is asked for.

    from snapana.render import render
    from snapana.render.views import capture_view
    text = render(capture_view(reports, title="x.pickle"), "markdown")
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol, get_args

__all__ = [
    "FORMATS",
    "OUTPUTS",
    "REPORT_FORMAT",
    "VIEW_KINDS",
    "Format",
    "Options",
    "Output",
    "Renderer",
    "UnknownFormat",
    "ViewKind",
    "format_for_path",
    "formats",
    "register",
    "registered",
    "render",
    "render_output",
    "renderer",
    "unregister",
]

#: The text formats (what the API's `summary` returns), in the order help texts list them
#: (the first is the default).
Format = Literal["text", "markdown", "json", "html"]
FORMATS: tuple[Format, ...] = get_args(Format)


@dataclass(frozen=True)
class Output:
    """What a format writes: `binary` (bytes, never printed to a terminal) or text, and the
    extension of a file of it."""

    binary: bool
    extension: str


#: What each format writes: the text formats, then the binary ones (help lists them so).
OUTPUTS: dict[str, Output] = {
    "text": Output(binary=False, extension=".txt"),
    "markdown": Output(binary=False, extension=".md"),
    "json": Output(binary=False, extension=".json"),
    "html": Output(binary=False, extension=".html"),
    "png": Output(binary=True, extension=".png"),
}
DEFAULT_FORMAT: Format = FORMATS[0]
#: The format of a report file: one self-contained page.
REPORT_FORMAT: Format = "html"
#: Output file suffixes that choose their format (others take the one asked for).
_SUFFIX_FORMATS: dict[str, Format] = {".html": "html", ".htm": "html"}

#: What a view-model shows; each view class names its kind (`views.CaptureView.kind`).
ViewKind = Literal["capture", "diff", "ranks", "explain", "text_log", "whatif", "check",
                   "scale"]
VIEW_KINDS: tuple[ViewKind, ...] = get_args(ViewKind)


@dataclass(frozen=True)
class Options:
    """How text is laid out: terminal width, whether to style it (ANSI), and whether a
    capture's text shows every section (`full`) or the answer that fits one screen."""

    width: int = 120
    color: bool = False
    full: bool = True


class View(Protocol):
    """A view-model: built once from findings, read by renderers."""

    @property
    def kind(self) -> ViewKind: ...


class Renderer(Protocol):
    """Formats one view-model; computes nothing new. Text, or bytes for a binary format."""

    def __call__(self, view: Any, options: Options, /) -> str | bytes: ...


class UnknownFormat(ValueError):
    """No renderer is registered for this view kind and format."""


#: (view kind, format) -> "module:function" (imported on first use) or a renderer.
_REGISTRY: dict[tuple[str, str], str | Renderer] = {
    ("capture", "text"): "snapana.render.text:capture",
    ("capture", "markdown"): "snapana.render.markdown:capture",
    ("capture", "json"): "snapana.render.json:capture",
    ("capture", "html"): "snapana.render.html:capture",
    ("capture", "png"): "snapana.render.card:capture",
    ("diff", "text"): "snapana.render.text:diff",
    ("diff", "markdown"): "snapana.render.markdown:diff",
    ("diff", "json"): "snapana.render.json:diff",
    ("diff", "html"): "snapana.render.html:diff",
    ("ranks", "text"): "snapana.render.text:ranks",
    ("ranks", "markdown"): "snapana.render.markdown:ranks",
    ("ranks", "json"): "snapana.render.json:ranks",
    ("ranks", "html"): "snapana.render.html:ranks",
    ("explain", "text"): "snapana.render.text:explain",
    ("text_log", "text"): "snapana.render.text:text_log",
    ("text_log", "markdown"): "snapana.render.markdown:text_log",
    ("text_log", "json"): "snapana.render.json:text_log",
    ("text_log", "html"): "snapana.render.html:text_log",
    ("whatif", "text"): "snapana.render.text:whatif",
    ("whatif", "markdown"): "snapana.render.markdown:whatif",
    ("whatif", "json"): "snapana.render.json:whatif",
    ("check", "text"): "snapana.render.text:check",
    ("check", "markdown"): "snapana.render.markdown:check",
    ("check", "json"): "snapana.render.json:check",
    ("scale", "text"): "snapana.render.text:scale",
    ("scale", "markdown"): "snapana.render.markdown:scale",
    ("scale", "json"): "snapana.render.json:scale",
}


def register(kind: str, fmt: str, renderer: Renderer | str,
             output: Output | None = None) -> None:
    """Add (or replace) the renderer of `kind` views in `fmt`: a callable, or a
    ``"module:function"`` path imported on first use. A new format declares what it writes
    (`output`); one of `OUTPUTS` has it declared already."""
    if output is not None:
        OUTPUTS[fmt] = output
    elif fmt not in OUTPUTS:
        raise ValueError(f"format {fmt!r}: declare what it writes (output=Output(...))")
    _REGISTRY[(kind, fmt)] = renderer


def unregister(kind: str, fmt: str) -> None:
    """Remove the renderer of `kind` views in `fmt` (KeyError when there is none)."""
    del _REGISTRY[(kind, fmt)]


def registered() -> list[tuple[str, str]]:
    """Every (view kind, format) pair with a renderer, in registration order."""
    return list(_REGISTRY)


def formats(*kinds: str) -> tuple[str, ...]:
    """The formats registered for any of `kinds` (for any kind without one), in FORMATS
    order: a command's ``--format`` choices are those of the views it shows."""
    have = {f for k, f in _REGISTRY if not kinds or k in kinds}
    return tuple(f for f in OUTPUTS if f in have)


def _kind_of(view: View | type[View] | str) -> str:
    if isinstance(view, str):
        return view
    kind = getattr(view, "kind", None)
    if not isinstance(kind, str):
        raise TypeError(f"{view!r} is not a view-model (no `kind`)")
    return kind


def renderer(view: View | type[View] | str, fmt: str) -> Renderer:
    """The renderer for a view (a view-model, its class, or its kind) in `fmt`."""
    kind = _kind_of(view)
    entry = _REGISTRY.get((kind, fmt))
    if entry is None:
        known = ", ".join(formats(kind)) or "none"
        raise UnknownFormat(f"unknown format {fmt!r} for a {kind} view ({known})")
    if isinstance(entry, str):
        module, _, name = entry.partition(":")
        entry = _REGISTRY[(kind, fmt)] = getattr(importlib.import_module(module), name)
    return entry


#: Formats whose text reaches a terminal or a ticket as is: made inert here, once, for every
#: renderer. JSON escapes every control character itself; HTML's escaping (Jinja2) stops
#: markup, not a terminal's escape sequences (`summary -f html` prints to one), so HTML is
#: made inert too, and never keeps a colour sequence (its renderer styles with CSS).
_INERT_FORMATS = ("text", "markdown", "html")


def render_output(view: View, fmt: str, options: Options | None = None) -> str | bytes:
    """`view` in `fmt`: text, or bytes for a binary format (`OUTPUTS`; UnknownFormat, a
    ValueError, when no renderer is registered). Text, markdown and HTML come back inert: a
    control character or escape sequence from an input (a frame's file name, an
    annotation, a profiler's device name) is shown escaped (`\\x1b`), never sent to a
    terminal."""
    from snapana.units import inert, inert_styled

    options = options or Options()
    out = renderer(view, fmt)(view, options)
    if OUTPUTS[fmt].binary != isinstance(out, bytes):
        raise TypeError(f"the {fmt} renderer of a {_kind_of(view)} view returned "
                        f"{type(out).__name__}, not what OUTPUTS declares")
    if isinstance(out, bytes) or fmt not in _INERT_FORMATS:
        return out
    return inert_styled(out) if options.color and fmt != "html" else inert(out)


def render(view: View, fmt: str, options: Options | None = None) -> str:
    """`view` as `fmt` text (`render_output` of a text format; a binary one is UnknownFormat
    here: its bytes are never taken for text)."""
    out = render_output(view, fmt, options)
    if isinstance(out, bytes):
        raise UnknownFormat(f"{fmt} is binary output, not text")
    return out


def is_binary(fmt: str) -> bool:
    """Whether `fmt` writes bytes (a format not declared: no renderer writes it)."""
    return fmt in OUTPUTS and OUTPUTS[fmt].binary


def format_for_path(path: Path, asked: str) -> str:
    """The format an output file gets: the one its suffix names (``.html``), else `asked`."""
    return _SUFFIX_FORMATS.get(path.suffix.lower(), asked)
