"""The `snapana` command: the typer app, its guard (an input's fault is one line and exit 2,
anything else one line and exit 3) and the commands, each a small module of
`snapana.commands` over one input/output policy."""

from __future__ import annotations

import errno
from typing import Annotated, Any

import typer
from typer.core import TyperGroup

from snapana.commands import (
    batch,
    check,
    convert,
    diff,
    explain,
    export,
    record,
    report,
    summary,
    synth,
    ticket,
    whatif,
)
from snapana.commands._policy import err
from snapana.errors import SnapanaError

#: Exit code of an error that is snapana's fault, not the input's (which exits 2).
INTERNAL_ERROR = 3
_DEBUG = False


class _Guarded(TyperGroup):
    """Every command runs inside this, in a process or in a test's CliRunner: an error that
    is the input's fault (SnapanaError) becomes one line on stderr and its exit code; any
    other exception one line naming the inputs and exit 3 (the traceback with --debug)."""

    def resolve_command(self, ctx: Any, args: list[str]) -> tuple[str | None, Any, list[str]]:
        """Help shows an argument by its metavar alone (FILE...), not by its Python type."""
        name, command, rest = super().resolve_command(ctx, args)
        self._inputs = [a for a in rest if not a.startswith("-")]  # for the error line
        for param in command.params if command is not None else ():
            if param.param_type_name == "argument" and param.metavar:
                param.display_type_rich = lambda ctx: None  # type: ignore[attr-defined]
        return name, command, rest

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except SnapanaError as exc:
            from snapana.units import inert

            if _DEBUG and exc.detail:
                err.print(inert(exc.detail.rstrip()), markup=False, highlight=False,
                          soft_wrap=True)
            # one line, inert: an error may quote text from the input
            err.print(f"snapana: error: {inert(str(exc), lines=False)}", markup=False,
                      highlight=False, soft_wrap=True)
            raise typer.Exit(exc.exit_code) from None
        except (typer.Exit, typer.Abort, KeyboardInterrupt):
            raise
        except (OSError, UnicodeEncodeError) as exc:
            problem = environment_problem(exc)
            if problem is None:
                raise
            code, words = problem
            err.print(f"snapana: error: {words}", markup=False, highlight=False,
                      soft_wrap=True)
            raise typer.Exit(code) from None
        except Exception as exc:
            if type(exc).__module__.split(".")[0] in ("click", "typer"):
                raise  # usage errors: the CLI framework prints them itself
            if _DEBUG:
                import traceback

                traceback.print_exc()
            inputs = " ".join(getattr(self, "_inputs", []))
            from snapana.units import inert

            first = inert(str(exc).splitlines()[0][:200], lines=False) if str(exc) else ""
            err.print(f"snapana: internal error on {inputs or 'this command'}: "
                      f"{type(exc).__name__}: {first} — please report this with the file "
                      "(--debug shows the traceback)", markup=False, highlight=False,
                      soft_wrap=True)
            raise typer.Exit(INTERNAL_ERROR) from None


#: errno values of a path the command was given that cannot be read (exit 2, the input's)
_PATH_ERRNOS = frozenset({errno.ENAMETOOLONG, errno.ENOENT, errno.EACCES, errno.EPERM,
                          errno.ENOTDIR, errno.ELOOP, errno.EISDIR})
#: errno values of an output that cannot be written (exit 4, the environment's)
_OUTPUT_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EPIPE, errno.EBADF, errno.EIO,
                            errno.EROFS, errno.EFBIG})


def environment_problem(exc: BaseException) -> tuple[int, str] | None:
    """(exit code, one line) for a failure of the file system or the output stream rather
    than of snapana: a path it cannot read (2), an output it cannot write (4). None: a bug
    (an unpaired surrogate reaching a UTF-8 file is snapana's, not the stream's)."""
    from snapana.errors import OutputError
    from snapana.units import inert

    if isinstance(exc, UnicodeEncodeError):
        if exc.encoding.replace("-", "").lower() == "utf8":
            return None
        return (OutputError.exit_code,
                f"the output's encoding ({exc.encoding}) cannot show this report: set "
                "PYTHONIOENCODING=utf-8, or write it to a file (-o)")
    if not isinstance(exc, OSError) or exc.errno is None:
        return None
    reason = inert(exc.strerror or str(exc), lines=False)
    if exc.errno in _OUTPUT_ERRNOS:
        where = f" ({inert(str(exc.filename), lines=False)[:200]})" if exc.filename else ""
        return OutputError.exit_code, f"could not write the output{where}: {reason}"
    if exc.errno in _PATH_ERRNOS and exc.filename is not None:
        name = inert(str(exc.filename), lines=False)
        shown = name if len(name) <= 120 else f"{name[:60]}...{name[-40:]}"
        return 2, f"{shown}: {reason}"
    return None


app = typer.Typer(
    cls=_Guarded,
    rich_markup_mode=None,
    add_completion=False,
    no_args_is_help=True,
    help="Explain GPU out-of-memory incidents from PyTorch memory snapshots.",
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        from snapana import __version__

        typer.echo(f"snapana {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    version: Annotated[bool, typer.Option(
        "--version", "-V", callback=_version, is_eager=True, help="print the version and exit")
    ] = False,
    debug: Annotated[bool, typer.Option(
        "--debug", help="on an internal error, print the traceback (and a reader child's "
        "own output when it fails)")] = False,
) -> None:
    """Explain GPU out-of-memory incidents from PyTorch memory snapshots."""
    global _DEBUG
    _DEBUG = debug


# ----- the commands: one module each under snapana/commands/ ----------------------------------
for _command in (report.report, summary.summary, batch.batch, explain.explain, synth.synth,
                 convert.convert, export.export, diff.diff, whatif.whatif, check.check,
                 ticket.ticket):
    app.command()(_command)
app.command(context_settings=record.CONTEXT_SETTINGS)(record.record)


def main() -> None:
    """Run the CLI. The `snapana` script and `python -m snapana` come here through
    `snapana.__main__.run`, which has started the decode already; a caller of this one
    directly has it started here."""
    import sys

    from snapana.commands._early import start_reading

    start_reading(sys.argv[1:])  # a snapshot named alone starts decoding now
    try:
        app()
    except KeyboardInterrupt:
        raise SystemExit(130) from None
