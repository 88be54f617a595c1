"""Stacks and block contexts as the rules engine sees them.

A snapshot frame is ``{filename, line, name}``; the engine takes it as a plain tuple
``(filename, name, line)`` so that stacks are hashable and can be interned and memoised by
the caller. Stacks are innermost first, exactly as ``torch.cuda.memory._snapshot()`` writes
them. With ``stacks="all"`` the C++ frames (``??``, ``''``, ``RegisterCUDA_0.cpp``, names like
``at::native::...``) are interleaved with the Python frames; rules address the two kinds
separately, so the interleaving never shifts what "innermost Python frame" means.

Normalisation (path separators, ``..`` segments, which frames are Python) is done once per
distinct stack and cached, because a snapshot references a few hundred distinct stacks
millions of times.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass, field
from functools import lru_cache
from typing import NamedTuple

from snapana.caching_allocator import ACTIVE_ALLOCATED

Frame = tuple[str, str, int]
"""(filename, function name, line) — one frame as recorded by the allocator."""

Stack = tuple[Frame, ...]
"""Frames innermost first (index 0 is the frame closest to the allocation)."""

@dataclass(frozen=True)
class BlockContext:
    """Everything about a block, other than its stack, that a rule may test.

    Kept small and hashable: the engine memoises decisions by (stack, context key), where
    the key keeps only what rules can distinguish (for example the size *band*, not the
    exact size), so thousands of same-site blocks share one decision.
    """

    pool_id: tuple[int, int] = (0, 0)
    """``segment_pool_id``: (0,0) default pool, (0,n) user MemPool / graph_pool_handle,
    (n,0) a pool a CUDA-graph capture made itself."""
    stream: int = 0
    """Stream handle of the segment; 0 is the default (legacy) stream."""
    state: str = ACTIVE_ALLOCATED
    size: int = 0
    has_alloc_event: bool | None = None
    """True: an ``alloc`` trace event exists for the block; False: the block predates
    recording; None: no trace was recorded at all."""
    annotations: tuple[str, ...] = ()
    """Names of ``external_annotations`` windows open when the block was allocated."""
    phase_hint: str | None = None
    """A phase the caller already knows (from a timeline); wins over stack inference."""

    @property
    def pool_kind(self) -> str:
        """``default``, ``mempool`` ((0,n): user MemPool or graph_pool_handle) or ``graph``
        ((n,0): a pool made by a CUDA-graph capture)."""
        a, b = self.pool_id
        if a == 0 and b == 0:
            return "default"
        if a == 0:
            return "mempool"
        return "graph"


class NormFrame(NamedTuple):
    """A frame after normalisation; ``path`` uses ``/`` and has ``..`` resolved.

    A NamedTuple rather than a dataclass: stacks run to hundreds of frames and are
    normalised once each, so construction cost matters.
    """

    path: str
    name: str
    line: int
    is_python: bool
    py_rank: int
    """Position among the stack's Python frames (0 = innermost); -1 for C++ frames."""


@dataclass(frozen=True)
class NormStack:
    """A stack normalised once for matching; built by :func:`normalize_stack`."""

    frames: tuple[NormFrame, ...]
    python: tuple[int, ...]
    """Indices of Python frames, innermost first."""
    cpp: tuple[int, ...]
    """Indices of C++ (non-Python) frames, innermost first."""
    by_name: dict[str, tuple[int, ...]] = field(hash=False, compare=False)
    """Python function name -> indices (innermost first): literal-name patterns look up
    their candidates here instead of scanning the stack."""
    by_key: dict[tuple[str, str], tuple[int, ...]] = field(hash=False, compare=False)
    """(path, name) -> indices: deep stacks repeat the same frames (``_call_impl``,
    ``forward``), so path-only patterns test each distinct frame once."""

    @property
    def empty(self) -> bool:
        return not self.frames

    @property
    def has_python(self) -> bool:
        return bool(self.python)


@lru_cache(maxsize=16384)
def normalize_path(filename: str) -> str:
    """Use ``/`` everywhere and resolve ``.``/``..`` so suffix matching is reliable.

    ``/a/scripts/../pkg/x.py`` becomes ``/a/pkg/x.py``; Windows paths become POSIX-like.
    """
    p = filename.replace("\\", "/")
    if "/." in p or p.startswith("."):
        p = posixpath.normpath(p)
    return p


def normalize_stack(stack: Stack) -> NormStack:
    """Normalise every frame of ``stack`` once; see :class:`NormStack`."""
    frames: list[NormFrame] = []
    python: list[int] = []
    cpp: list[int] = []
    by_name: dict[str, list[int]] = {}
    by_key: dict[tuple[str, str], list[int]] = {}
    for i, (filename, name, line) in enumerate(stack):
        if filename.endswith(".py") or filename.startswith("<"):  # model.is_python_file, inlined
            path = normalize_path(filename)
            python.append(i)
            by_name.setdefault(name, []).append(i)
            by_key.setdefault((path, name), []).append(i)
            frames.append(NormFrame(path, name, int(line), True, len(python) - 1))
        else:
            cpp.append(i)
            frames.append(NormFrame(filename, name, int(line), False, -1))
    return NormStack(
        frames=tuple(frames),
        python=tuple(python),
        cpp=tuple(cpp),
        by_name={k: tuple(v) for k, v in by_name.items()},
        by_key={k: tuple(v) for k, v in by_key.items()},
    )


def path_has_suffix(path: str, suffix: str) -> bool:
    """Suffix match on whole path components: ``torch/optim/optimizer.py`` matches
    ``/venv/lib/site-packages/torch/optim/optimizer.py`` but not ``mytorch/optim/optimizer.py``.
    """
    if path == suffix:
        return True
    return path.endswith(suffix) and path[-len(suffix) - 1] == "/"


def import_path(path: str) -> str:
    """What follows `site-packages/` or `dist-packages/` (the package a frame is in), else
    the path: a framework's marker is looked for there, so that an environment named after
    a framework (`/envs/ms-swift/lib/.../torch/storage.py`) does not make torch's frames
    that framework's."""
    for marker in ("site-packages/", "dist-packages/"):
        i = path.rfind(marker)
        if i >= 0:
            return path[i + len(marker):]
    return path


def cpp_symbol(name: str, limit: int = 80) -> str:
    """A C++ frame's qualified name without return type, template arguments or argument
    list, for messages: ``void a::B::f<std::function<...> >(x)`` -> ``a::B::f``."""
    out: list[str] = []
    depth = 0
    for ch in name:
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth = max(0, depth - 1)
        elif depth == 0:
            if ch == "(" and out:
                break
            out.append(ch)
    text = "".join(out).strip()
    first, sep, rest = text.partition(" ")
    if sep and "::" in rest:
        text = rest.strip()  # drop a leading return type such as ``void `` or ``at::Tensor ``
    return text if len(text) <= limit else text[: limit - 1] + "…"
