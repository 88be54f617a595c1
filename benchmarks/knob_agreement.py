"""Does `summary`'s first knob agree with the knobs `whatif --scale … --fit` names (issue 67)?

    python benchmarks/knob_agreement.py [FILE_OR_FOLDER ...]   (default: the corpus snapshots)

Per device of each capture: the summary's first knob; the knobs --fit names, for each --scale
key the window grows with (the next steps that act on something in the resized window,
`scaled_replay._changes`, and the knobs whose setting the largest size is, scaling.toml
`[fit_size]`); whether they agree, and when not, why (the route `scaling.replay_route` gives
the knob: the same words the knob table's "predicted by replay" column says). The recorded
size is taken as 1 for each key: 1 divides every block, so none is held fixed as
indivisible and the set is the widest --fit can name; which knobs --fit names does not
depend on the size or the card, only on what the window holds. --fit names them only once a
size runs out: a window in which nothing grows with the key never does. In-process, through
the session, as tests/test_corpus_knob_agreement.py does. Prints one row per device and the
count per category.
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

from snapana.analysis.scaled_replay import _changes
from snapana.analysis.scaling import KNOBS, Size, load_rules, replay_route
from snapana.errors import InputError
from snapana.session import sessions
from snapana.sources import load

CORPUS = Path(__file__).resolve().parent.parent.parent / "shared" / "corpus" / "torch_snapshots"

#: the reason category, by the first knob's route, where whatif --fit does not name it
WHY = {
    "flag": "first knob changes when memory is freed or returned (empty_cache, zero_grad): "
            "whatif replays it under a flag of its own, not --fit",
    "set": "first knob is an allocator setting: whatif replays it under --set, not --fit",
    "none": "no mechanical model of the knob",
}


def fit_names(sess) -> tuple[list[str], str]:  # noqa: ANN001 - a snapana Session
    """The knobs `whatif --scale KEY=1 --fit` names on this device, over the keys the window
    grows with, and why none where it names none."""
    rules = load_rules()
    names: list[str] = []
    grows_with = []
    for key in KNOBS:
        window = sess.scaling({key: Size(key, 1)})
        if not (window.growth.blocks[f"e_{key}"] > 0).any():
            continue
        grows_with.append(key)
        names += [*rules.fit_size.get(key, ()), *(s.id for s, _ in _changes(window))]
    if not grows_with:
        return [], ("nothing the window holds grows with batch or seq (the blocks' families "
                    "are model state or have no scaling rule): no size runs out")
    return list(dict.fromkeys(names)), ""


def row(path: Path, sess) -> tuple[str, str, list[str], bool, str]:  # noqa: ANN001
    """(file:device, first knob, whatif's knobs, agree, reason category)."""
    d = sess.report.diagnosis
    names, why_none = fit_names(sess)
    name = f"{path.name}:{sess.device}"
    if not d.knobs:
        return name, "-", names, True, "summary offers no knob"
    first = d.knobs[0]
    route = replay_route(first.id, first.simulate)
    if first.id in names or (route.step and route.step in names):
        return name, first.id, names, True, "agree"
    if route.how in WHY:
        return name, first.id, names, False, WHY[route.how]
    if why_none:
        return name, first.id, names, False, f"whatif --fit cannot scale this capture: {why_none}"
    return name, first.id, names, False, (f"disagree: --fit replays {route.how} knobs, but "
                                          "not this one on this window")


def main(argv: list[str]) -> int:
    paths = [Path(a) for a in argv] or [CORPUS]
    files = sorted(f for p in paths for f in ([p] if p.is_file() else p.glob("*.p*")))
    counts: Counter[str] = Counter()
    for path in files:
        try:
            devices = sessions(load(path))
        except InputError as exc:
            print(f"{path.name}\trefused: {exc}")
            counts["refused"] += 1
            continue
        for sess in devices:
            name, first, names, agree, why = row(path, sess)
            counts[why] += 1
            print(f"{name}\t{first}\t{','.join(names) or '-'}\t{'yes' if agree else 'no'}\t"
                  f"{'' if agree and why == 'agree' else why}", flush=True)
    print()
    for why, n in counts.most_common():
        print(f"{n:4d}  {why}")
    print(f"{sum(counts.values()):4d}  devices")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
