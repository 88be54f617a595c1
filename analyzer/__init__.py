"""snapana: offline analyzer for GPU memory incidents in PyTorch jobs.

`snapana.load(path)` is the notebook entry point (see `snapana.api`). It is imported lazily so
that `import snapana` (the CLI's first step) does not pay for polars, plotly and the rules.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from snapana.api import Analysis, Comparison, State, load
    from snapana.diff import CaptureDiff
    from snapana.export import export

__all__ = ["Analysis", "CaptureDiff", "Comparison", "State", "export", "load"]

_LAZY = {"load": "snapana.api", "Analysis": "snapana.api", "Comparison": "snapana.api",
         "State": "snapana.api", "CaptureDiff": "snapana.diff", "export": "snapana.export"}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'snapana' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
