"""Renderers: one protocol, one registry keyed by (view kind, format).

A view-model (`render/views.py`: a capture, a diff, the ranks of a job, explanations) is
built once from the findings; a renderer turns one into text and does nothing else. Each
format has one module (`text.py`, `markdown.py`, `json.py`, `html.py`) holding its renderer
for every kind of view. The table below is the only place formats and renderers are listed:
the CLI's ``--format`` choices and the API's formats come from it, so adding a renderer
means adding its function and one line here.

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
    "REPORT_FORMAT",
    "VIEW_KINDS",
    "Format",
    "Options",
    "Renderer",
    "UnknownFormat",
    "ViewKind",
    "format_for_path",
    "formats",
    "register",
    "registered",
    "render",
    "renderer",
    "unregister",
]

#: Every output format, in the order help texts list them (the first is the default).
Format = Literal["text", "markdown", "json", "html"]
FORMATS: tuple[Format, ...] = get_args(Format)
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
    """Formats one view-model; computes nothing new."""

    def __call__(self, view: Any, options: Options, /) -> str: ...


class UnknownFormat(ValueError):
    """No renderer is registered for this view kind and format."""


#: (view kind, format) -> "module:function" (imported on first use) or a renderer.
_REGISTRY: dict[tuple[str, str], str | Renderer] = {
    ("capture", "text"): "snapana.render.text:capture",
    ("capture", "markdown"): "snapana.render.markdown:capture",
    ("capture", "json"): "snapana.render.json:capture",
    ("capture", "html"): "snapana.render.html:capture",
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


def register(kind: str, fmt: str, renderer: Renderer | str) -> None:
    """Add (or replace) the renderer of `kind` views in `fmt`: a callable, or a
    ``"module:function"`` path imported on first use."""
    _REGISTRY[(kind, fmt)] = renderer


def unregister(kind: str, fmt: str) -> None:
    """Remove the renderer of `kind` views in `fmt` (KeyError when there is none)."""
    del _REGISTRY[(kind, fmt)]


def registered() -> list[tuple[str, str]]:
    """Every (view kind, format) pair with a renderer, in registration order."""
    return list(_REGISTRY)


def formats(kind: str | None = None) -> tuple[str, ...]:
    """The formats registered for `kind` (for any kind without one), in FORMATS order."""
    have = {f for k, f in _REGISTRY if kind is None or k == kind}
    return tuple(f for f in FORMATS if f in have) + tuple(sorted(have - set(FORMATS)))


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


def render(view: View, fmt: str, options: Options | None = None) -> str:
    """`view` as `fmt` text (UnknownFormat, a ValueError, when none is registered). Text,
    markdown and HTML come back inert: a control character or escape sequence from an input
    (a frame's file name, an annotation, a profiler's device name) is shown escaped
    (`\\x1b`), never sent to a terminal."""
    from snapana.units import inert, inert_styled

    options = options or Options()
    text = renderer(view, fmt)(view, options)
    if fmt not in _INERT_FORMATS:
        return text
    return inert_styled(text) if options.color and fmt != "html" else inert(text)


def format_for_path(path: Path, asked: str) -> str:
    """The format an output file gets: the one its suffix names (``.html``), else `asked`."""
    return _SUFFIX_FORMATS.get(path.suffix.lower(), asked)
