"""Settings snapana makes for its own process through the environment, before the libraries
that read them load (OpenBLAS's thread count, arrow's memory pool; `__main__`), a user's own
value kept. They are snapana's, not the user's: the job `snapana record` runs is given the
environment as the user gave it (`as_given`), so a training job's BLAS threads and memory
pool are its own."""

from __future__ import annotations

import os

#: The names `default` set (the user had not).
_SET_HERE: set[str] = set()


def default(name: str, value: str) -> None:
    """Set `name` for this process and the helpers it starts, unless the user has."""
    if name not in os.environ:
        os.environ[name] = value
        _SET_HERE.add(name)


def as_given() -> dict[str, str]:
    """The environment without what `default` set."""
    return {k: v for k, v in os.environ.items() if k not in _SET_HERE}
