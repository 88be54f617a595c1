"""`python -m snapana`."""

from snapana.cli import main

main()
