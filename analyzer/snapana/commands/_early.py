"""Start decoding a command's one input before the pipeline is imported.

`snapana report FILE` and `snapana summary FILE` spend a second or more importing the
pipeline (polars, plotly, jinja2, the rule packs) before they read FILE. When the command
line names exactly one input and it starts like a snapshot pickle, its bounded decode child
(`sources.pickle_child`) is started first, so the decode runs while the parent imports; the
reader takes that child when it gets to the file. This reads the command line the way the
commands will (their options that take a value are listed here, and a test holds the list to
the commands' real options); when in doubt, nothing is started and the command reads the
file as it always did.
"""

from __future__ import annotations

from pathlib import Path

#: The commands that read one capture first, and their options that take a value.
VALUE_OPTIONS: dict[str, frozenset[str]] = {
    "report": frozenset({"-o", "--output", "--device", "--rules", "--capacity", "--at",
                         "--workers", "-j", "--rank", "--trace", "--memray", "--log"}),
    "summary": frozenset({"--format", "-f", "--device", "--rules", "--capacity", "--at",
                          "--workers", "-j", "--log"}),
}
#: Options before the command (the app's own) that take no value.
_APP_FLAGS = frozenset({"--debug"})
_NO_WORK = frozenset({"-h", "--help", "-V", "--version"})


def one_input(argv: list[str]) -> Path | None:
    """The one input file `argv` (the command line after the program) names for a command
    of `VALUE_OPTIONS`, else None (several inputs, a folder, a glob, help, anything not
    understood)."""
    args = list(argv)
    while args and args[0] in _APP_FLAGS:
        args.pop(0)
    if not args or args[0] not in VALUE_OPTIONS or _NO_WORK & set(args):
        return None
    takes_value = VALUE_OPTIONS[args[0]]
    found: list[str] = []
    rest = iter(args[1:])
    for arg in rest:
        if arg == "--":
            found += list(rest)
            break
        if arg.startswith("-") and arg != "-":
            if arg in takes_value:
                next(rest, None)
            elif arg.split("=", 1)[0] not in takes_value and not (
                    arg[:2] in takes_value and len(arg) > 2 and not arg.startswith("--")):
                return None  # an option not known here: do not guess
            continue
        found.append(arg)
    if len(found) != 1 or any(c in found[0] for c in "*?["):
        return None
    path = Path(found[0])
    try:
        return path if path.is_file() else None
    except (OSError, ValueError):  # a name too long, a folder it cannot enter: the command
        return None  # itself says so, in one line


def start_reading(argv: list[str]) -> None:
    """Start the decode of the command line's one snapshot pickle, if it names one."""
    path = one_input(argv)
    if path is not None:
        from snapana.sources.pickle_child import start_early

        start_early(path)
