"""How renderers show the families findings name: each family's one colour, the same in
every report, figure and diff (a vocabulary family's own `Family.colour`; any other, a user
pack's, one of those by a hash of its name; `unknown` always grey, so an unattributed share
never looks like a family). Findings name families by id; this is the part of the
attribution vocabulary renderers read, so that no renderer imports attribution."""

from __future__ import annotations

import zlib

from snapana.analysis.attribution.families import UNKNOWN, UNKNOWN_PHASE, get_family, vocabulary

__all__ = ["UNKNOWN", "UNKNOWN_COLOUR", "UNKNOWN_PHASE", "family_colour"]

UNKNOWN_COLOUR = get_family(UNKNOWN).colour


def family_colour(family: str) -> str:
    """The one colour of a family, whatever the report (see `UNKNOWN_COLOUR`)."""
    try:
        return get_family(family).colour
    except KeyError:
        palette = [f.colour for f in vocabulary().families if f.id != UNKNOWN]
        return palette[zlib.crc32(family.encode()) % len(palette)]
