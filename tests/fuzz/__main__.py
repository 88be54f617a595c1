"""`python -m tests.fuzz --minutes N [--seed S] [--jobs J] [--save]`: run a campaign.

Prints the count per outcome class (and per format), then each distinct finding minimised;
with --save, each finding is written into tests/fuzz/findings/<class>-<n>.<ext>.
`--replay` runs the saved corpus (and the hand-made hostile cases) instead.
"""

from __future__ import annotations

import argparse
import sys

from .campaign import corpus_cases, minimise_and_save, run_cases
from .hostile import hostile_cases
from .mutators import FORMATS


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.fuzz", description=__doc__)
    ap.add_argument("--minutes", type=float, default=None, help="campaign length")
    ap.add_argument("--cases", type=int, default=None, help="number of cases instead")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--jobs", type=int, default=2, help="parallel workers")
    ap.add_argument("--timeout", type=float, default=60.0,
                    help="seconds a case may take (its time budget; over it is a hang)")
    ap.add_argument("--formats", default=",".join(FORMATS),
                    help=f"comma-separated subset of {','.join(FORMATS)}")
    ap.add_argument("--no-corpus", action="store_true",
                    help="seed only from files in the repository (as the test does)")
    ap.add_argument("--save", action="store_true",
                    help="write minimised findings to tests/fuzz/findings/")
    ap.add_argument("--no-minimize", action="store_true")
    ap.add_argument("--replay", action="store_true",
                    help="run tests/fuzz/findings/ and the hand-made hostile cases")
    ap.add_argument("-v", "--verbose", action="store_true", help="print each failure")
    ap.add_argument("--snapana", metavar="DIR", default=None,
                    help="run the snapana package found in DIR (e.g. an older commit's "
                    "analyzer/ folder); with --save, only findings this tree handles are saved")
    args = ap.parse_args(argv)

    if args.replay:
        cases = corpus_cases() + hostile_cases()
        result = run_cases(cases, jobs=args.jobs, timeout=args.timeout, progress=args.verbose,
                           snapana_path=args.snapana)
    else:
        minutes = args.minutes if args.minutes is not None or args.cases else 5.0
        result = run_cases(None, count=args.cases, seed=args.seed, minutes=minutes,
                           jobs=args.jobs, timeout=args.timeout,
                           formats=tuple(args.formats.split(",")),
                           corpus=not args.no_corpus, progress=args.verbose,
                           snapana_path=args.snapana)
    print(result.table(), flush=True)
    if result.findings:
        print(f"{len(result.findings)} distinct findings:", flush=True)
        if args.no_minimize:
            for (cls, where), f in sorted(result.findings.items()):
                print(f"{cls:10s} x{f.count:<4d} {where[:100]}  [{f.case.name[:70]}]")
        else:
            minimise_and_save(result, save=args.save and not args.replay,
                              timeout=args.timeout, snapana_path=args.snapana)
    failed = sum(n for c, n in result.counts.items() if c not in ("ok", "refused"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
