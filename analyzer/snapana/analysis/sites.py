"""Allocation sites: the first frame of a stack that is the user's code, not PyTorch's.

Grouping by site is what an engineer reads first ("model.py:54 forward"), and it is the
fallback grouping when no rule pack names a family.
"""

from __future__ import annotations

from snapana.limits import MAX_FRAME_TEXT
from snapana.model import PROFILER_FILES, Frame, is_python_frame
from snapana.units import shown_name

#: Path fragments of code that allocates on behalf of its caller.
_INTERNAL = ("/torch/", "/site-packages/torch/", "/dist-packages/torch/", "<frozen ",
             "/contextlib.py", "/functools.py", "/typing.py", "/threading.py")


#: Helpers that allocate for whoever calls them: a site named after one says nothing, so the
#: site is the first caller outside them.
GENERIC_HELPERS = frozenset({"allocate", "_allocate", "alloc", "_alloc", "empty", "zeros",
                             "ones", "full", "new_empty", "new_zeros", "empty_like",
                             "zeros_like", "make_tensor", "create_tensor"})


def short_path(path: str, keep: int = 3) -> str:
    """A readable path for messages and tables: what follows `site-packages/` or
    `dist-packages/` (the import path), else the last `keep` components."""
    path = path.replace("\\", "/")
    for marker in ("site-packages/", "dist-packages/"):
        i = path.rfind(marker)
        if i >= 0:
            return path[i + len(marker):]
    parts = path.split("/")
    return "/".join(parts[-keep:]) if len(parts) > keep else path



def is_internal(frame: Frame) -> bool:
    path = frame[0].replace("\\", "/")
    return any(part in path for part in _INTERNAL) or path.startswith("torch/")


def site_of(stack: tuple[Frame, ...]) -> str:
    """The innermost Python frame outside PyTorch internals and generic allocation helpers,
    as 'file:line function' (a helper when nothing else is outside PyTorch)."""
    if not stack:
        return "<no frames>"
    python = [f for f in stack if is_python_frame(f)]
    if not python:
        return "<C++ frames only>"
    user = [f for f in python if not is_internal(f)]
    informative = [f for f in user if f[1] not in GENERIC_HELPERS]
    return format_frame((informative or user or python)[0])


def code_site_of(stack: tuple[Frame, ...]) -> str:
    """`site_of` over the stack's code frames alone: a profiler trace's pseudo-frames
    (`<op>` aten::mul, `<python>` module instances) left out, since they name the op, not
    the line (every `aten::mul` of a model is one op frame; each layer's call of it is one
    line of its module's forward). A snapshot's stack has none, so its site is `site_of`'s;
    a stack of pseudo-frames only keeps `site_of`'s."""
    code = tuple(f for f in stack if f[0] not in PROFILER_FILES)
    return site_of(code if any(is_python_frame(f) for f in code) else stack)


def format_frame(frame: Frame) -> str:
    """'file:line function', each name bounded (`units.shown_name`): a site is shown, and
    named in every table, once per distinct site."""
    return (f"{shown_name(short_path(frame[0]), MAX_FRAME_TEXT)}:{frame[2]} "
            f"{shown_name(frame[1], MAX_FRAME_TEXT)}")

