"""``python -m snapana.synth.scenarios --all sample_snapshots/`` or ``NAME -o FILE``."""

from __future__ import annotations

import argparse
import sys

from . import MULTI_DEVICE, SCENARIOS, write_all, write_sample


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m snapana.synth.scenarios",
                                 description="write synthetic snapshot samples")
    names = [*SCENARIOS, *MULTI_DEVICE]
    ap.add_argument("name", nargs="?", help=f"one of: {', '.join(names)}")
    ap.add_argument("-o", "--output", help="pickle path for NAME")
    ap.add_argument("--all", metavar="DIR", help="write every sample into DIR")
    ap.add_argument("--list", action="store_true", help="list scenario names")
    args = ap.parse_args(argv)
    if args.list:
        print("\n".join(names))
        return 0
    if args.all:
        for p in write_all(args.all):
            print(p)
        return 0
    if not args.name or args.name not in names or not args.output:
        print("error: give --all DIR, or NAME -o FILE (see --list)", file=sys.stderr)
        return 2
    for p in write_sample(args.name, args.output):
        print(p)
    return 0


if __name__ == "__main__":
    sys.exit(main())
