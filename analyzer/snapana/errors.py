"""Domain errors that carry the exit code the CLI returns, so bad input never shows a traceback."""

from __future__ import annotations


class SnapanaError(Exception):
    """Base for every error that is the input's fault, not snapana's."""

    exit_code = 2

    def __init__(self, *args: object, detail: str | None = None) -> None:
        super().__init__(*args)
        #: What a child process or library said in full (a traceback): shown with --debug.
        self.detail = detail


#: Exit code of a run over several inputs where some could not be read: the others were
#: analysed and the output lists each failure with its reason (none analysed: 2).
SOME_INPUTS_FAILED = 5


class InputError(SnapanaError):
    """The file is missing, unreadable, of the wrong format, truncated or unsafe."""


class OutputError(SnapanaError):
    """The output could not be written: a full disk, a closed or broken stream, an output
    encoding that cannot show the report. The environment's fault, not the input's and not
    snapana's: exit code 4."""

    exit_code = 4


class UnsafePickleError(InputError):
    """The pickle asks to import or call something; nothing from it was executed."""
