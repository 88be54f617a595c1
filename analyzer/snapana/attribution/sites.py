"""Allocation sites: the first frame of a stack that is the user's code, not PyTorch's.

Grouping by site is what an engineer reads first ("model.py:54 forward"), and it is the
fallback grouping when no rule pack names a family.
"""

from __future__ import annotations

from snapana.attribution.stack import short_path
from snapana.model import Frame, StackTable, is_python_frame

#: Path fragments of code that allocates on behalf of its caller.
_INTERNAL = ("/torch/", "/site-packages/torch/", "/dist-packages/torch/", "<frozen ",
             "/contextlib.py", "/functools.py", "/typing.py", "/threading.py")


def is_internal(frame: Frame) -> bool:
    path = frame[0].replace("\\", "/")
    return any(part in path for part in _INTERNAL) or path.startswith("torch/")


def site_of(stack: tuple[Frame, ...]) -> str:
    """The innermost Python frame outside PyTorch internals, as 'file:line function'."""
    if not stack:
        return "<no frames>"
    python = [f for f in stack if is_python_frame(f)]
    if not python:
        return "<C++ frames only>"
    for frame in python:
        if not is_internal(frame):
            return format_frame(frame)
    return format_frame(python[0])


def format_frame(frame: Frame) -> str:
    return f"{short_path(frame[0])}:{frame[2]} {frame[1]}"


def sites_for(table: StackTable, stack_ids: list[int]) -> dict[int, str]:
    """Site of each distinct stack id, computed once per stack."""
    return {sid: site_of(table.stack(sid)) for sid in set(stack_ids)}
