"""`python -m snapana`: a snapshot the command line names starts decoding first (in its
bounded child, `commands._early`), then the CLI is imported and runs."""

import sys

from snapana.commands._early import start_reading

start_reading(sys.argv[1:])

from snapana.cli import main  # noqa: E402  (after the decode has started)

main()
