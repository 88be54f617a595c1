"""Injected by `snapana record` (this folder is put first on PYTHONPATH): in every Python
process of the job, arm snapana's recorder as soon as `torch` has been imported. A process
that never imports torch is untouched. Any site customisation this one shadows still runs.
"""

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
_armed = False


def _arm() -> None:
    global _armed
    if _armed:
        return
    _armed = True
    package_root = os.environ.get("SNAPANA_RECORD_PACKAGE_ROOT")
    if package_root and package_root not in sys.path:
        sys.path.append(package_root)  # after the job's own paths: nothing else is shadowed
    try:
        import snapana.record

        snapana.record.start_from_env()
    except Exception as exc:  # noqa: BLE001 - recording must never break the job
        print(f"snapana record: not recording: {type(exc).__name__}: {exc}", file=sys.stderr)


class _AfterTorch(importlib.abc.MetaPathFinder):
    """Finds nothing itself; wraps torch's loader so that arming runs right after it."""

    def find_spec(self, name, path, target=None):
        if name != "torch" or _armed:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return None
        exec_module = spec.loader.exec_module

        def exec_then_arm(module):
            exec_module(module)
            _arm()

        spec.loader.exec_module = exec_then_arm  # type: ignore[method-assign]
        return spec


def _chain() -> None:
    """Run the sitecustomize this file shadows (a distribution's or a virtualenv's)."""
    rest = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None and spec.origin != __file__:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)


if os.environ.get("SNAPANA_RECORD_DIR"):
    if "torch" in sys.modules:
        _arm()
    else:
        sys.meta_path.insert(0, _AfterTorch())
_chain()
