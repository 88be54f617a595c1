"""The command line's entry point, for `python -m snapana` and the `snapana` script alike:
a snapshot the command line names starts decoding first (in its bounded child,
`commands._early`), then the CLI (typer, rich and every command, 0.2 s of imports) is
imported and runs while it decodes. So this module imports nothing else at the top."""

import sys


def run() -> None:
    """Start reading the command line's one snapshot, then run the CLI."""
    from snapana.commands._early import start_reading

    start_reading(sys.argv[1:])
    from snapana.cli import main

    main()


if __name__ == "__main__":
    run()
