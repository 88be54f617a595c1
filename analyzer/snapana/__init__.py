"""snapana: offline analyzer for GPU memory incidents in PyTorch jobs.

The public surface is `load`, `diff` and `export` (functions defined here, so no submodule
import can shadow them) and the classes they return. Heavy modules are imported on first use,
so `import snapana` (the CLI's first step) does not pay for polars, plotly and the rules.
"""

from __future__ import annotations

TYPE_CHECKING = False  # (not `typing`'s: this module imports nothing, see `__main__`)
if TYPE_CHECKING:
    from pathlib import Path
    from typing import Any

    from snapana.analysis.compare import CaptureDiff
    from snapana.api import Analysis, Comparison, State

__all__ = ["Analysis", "CaptureDiff", "Comparison", "State", "__version__", "diff", "export",
           "load"]

__version__ = "0.1.0"

_LAZY = {"Analysis": "snapana.api", "Comparison": "snapana.api", "State": "snapana.api",
         "CaptureDiff": "snapana.analysis.compare"}


def load(path: str | Path, **options: Any) -> Analysis:
    """Read any supported artefact and analyse one device of it (see `snapana.api.load`)."""
    from snapana.api import load as _load

    return _load(path, **options)


def diff(before: str | Path | Analysis, after: str | Path | Analysis,
         **options: Any) -> Comparison:
    """What changed from `before` (e.g. the OOM) to `after` (e.g. the fix), family by family;
    paths are loaded with `options` (device, rules, capacity)."""
    from snapana.api import Analysis as _Analysis
    from snapana.api import load as _load

    a = before if isinstance(before, _Analysis) else _load(before, **options)
    b = after if isinstance(after, _Analysis) else _load(after, **options)
    return a.diff(b)


def export(source: str | Path | Analysis, out_dir: str | Path, **options: Any) -> Path:
    """Write a capture (a path, or an `Analysis`) as a folder of Parquet tables that
    `snapana.load(out_dir)` and `snapana report DIR` read back."""
    from snapana.api import Analysis as _Analysis

    if isinstance(source, _Analysis):
        return source.export(out_dir)
    from pathlib import Path as _Path

    from snapana.io.export import export_capture

    return export_capture(_Path(source), _Path(out_dir), **options)


def load_ipython_extension(ipython: Any) -> None:
    """`%load_ext snapana`: the `%%snapana` cell magic (see `snapana.cell_magic`)."""
    from snapana.cell_magic import load_ipython_extension as _load_extension

    _load_extension(ipython)


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'snapana' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
