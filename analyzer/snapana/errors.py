"""Domain errors that carry the exit code the CLI returns, so bad input never shows a traceback."""

from __future__ import annotations


class SnapanaError(Exception):
    """Base for every error that is the input's fault, not snapana's."""

    exit_code = 2


class InputError(SnapanaError):
    """The file is missing, unreadable, of the wrong format, truncated or unsafe."""


class UnsafePickleError(InputError):
    """The pickle asks to import or call something; nothing from it was executed."""
