"""The stable tensor-family ids, with a display label and a one-line description.

The table is data (``packs/families.toml``) so that documentation, renderers and rule
validation read one source; ids are stable API (reports, JSON output and user rule files
refer to them), labels may be reworded.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

try:  # Python 3.11+
    import tomllib
except ImportError:  # pragma: no cover - Python 3.10 needs the ``tomli`` backport
    import tomli as tomllib  # type: ignore[no-redef]

FAMILIES_FILE = "families.toml"

UNKNOWN = "unknown"


@dataclass(frozen=True)
class Family:
    """One tensor family: ``id`` is stable, ``label`` is for display."""

    id: str
    label: str
    description: str


@lru_cache(maxsize=1)
def _load() -> tuple[Family, ...]:
    text = (resources.files(__package__) / "packs" / FAMILIES_FILE).read_text(encoding="utf-8")
    data = tomllib.loads(text)
    return tuple(Family(f["id"], f["label"], f["description"]) for f in data["family"])


def families() -> tuple[Family, ...]:
    """All families in display order."""
    return _load()


def family_ids() -> tuple[str, ...]:
    """The stable family ids in display order."""
    return tuple(f.id for f in _load())


def get_family(family_id: str) -> Family:
    """The :class:`Family` for ``family_id``; ``KeyError`` if it is not a known id."""
    for f in _load():
        if f.id == family_id:
            return f
    raise KeyError(family_id)


def family_label(family_id: str) -> str:
    """The display label of ``family_id`` (the id itself if unknown)."""
    try:
        return get_family(family_id).label
    except KeyError:
        return family_id
