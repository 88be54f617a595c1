"""Delta reduction of a failing case: smaller inputs that fail the same way.

Structure-aware cases (a tree and its encoder) shrink their tree: halve lists, drop list
items and dict keys, breadth first. Byte cases shrink their file: cut the end, then drop
chunks. A candidate is kept when its outcome has the same signature (class, and the failing
site for tracebacks). Bounded by a number of runs and a time budget.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

from .cases import Case
from .runner import Outcome, Runner


def _tree_edits(tree: Any) -> Iterator[Callable[[], Callable[[], None]]]:
    """Edits of the tree, each applied in place and returning its undo; breadth first."""
    queue = [tree]
    seen: set[int] = set()
    while queue:
        node = queue.pop(0)
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, list):
            yield from _list_edits(node)
            queue.extend(v for v in node if isinstance(v, (list, dict)))
        elif isinstance(node, dict):
            for key in list(node):
                yield _dict_drop(node, key)
            queue.extend(v for v in node.values() if isinstance(v, (list, dict)))


def _list_edits(lst: list) -> Iterator[Callable[[], Callable[[], None]]]:
    def keep(lo_frac: float, hi_frac: float) -> Callable[[], Callable[[], None]]:
        def apply() -> Callable[[], None]:
            saved = lst[:]
            n = len(saved)
            lst[:] = saved[int(n * lo_frac):int(n * hi_frac)]
            return lambda: lst.__setitem__(slice(None), saved)
        return apply

    n = len(lst)
    while n > 1:
        yield keep(0, 0.5)
        yield keep(0.5, 1)
        n //= 2
    if len(lst) <= 16:
        for i in range(len(lst) - 1, -1, -1):
            def drop(i: int = i) -> Callable[[], None]:
                if i >= len(lst):
                    return lambda: None
                saved = lst[:]
                del lst[i]
                return lambda: lst.__setitem__(slice(None), saved)
            yield drop


def _dict_drop(d: dict, key: Any) -> Callable[[], Callable[[], None]]:
    def apply() -> Callable[[], None]:
        if key not in d:
            return lambda: None
        saved = dict(d)
        del d[key]

        def undo() -> None:
            d.clear()
            d.update(saved)
        return undo
    return apply


def minimize(runner: Runner, case: Case, outcome: Outcome, max_runs: int = 80,
             max_seconds: float = 40.0) -> tuple[Case, Outcome]:
    """The smallest case found that fails like `case`."""
    target = outcome.signature
    deadline = time.monotonic() + max_seconds
    runs = 0
    best, best_out = case, outcome

    def tries(candidate: Case) -> Outcome | None:
        nonlocal runs
        runs += 1
        out = runner.run(candidate)
        return out if out.signature == target else None

    if case.tree is not None and case.encode is not None:
        tree = case.tree
        for edit in _tree_edits(tree):
            if runs >= max_runs or time.monotonic() > deadline:
                break
            undo = edit()
            try:
                files = case.encode(tree)
            except Exception:  # noqa: BLE001 - an edit the encoder cannot write
                undo()
                continue
            if sum(map(len, files.values())) >= best.size:
                undo()
                continue
            cand = replace(case, files=files, tree=None, encode=None)
            got = tries(cand)
            if got is None:
                undo()
            else:
                best, best_out = cand, got
        best = replace(best, tree=None, encode=None)
    if len(best.files) > 1:  # a folder (an export): shrink its tables and its JSON
        best, best_out = _shrink_files(best, best_out, tries, lambda: runs < max_runs
                                       and time.monotonic() < deadline)
    if len(best.files) == 1 and not best.setup:
        name, data = next(iter(best.files.items()))
        chunk = len(data) // 2
        while chunk >= 1 and runs < max_runs and time.monotonic() < deadline:
            progressed = False
            at = 0
            while at < len(data) and runs < max_runs and time.monotonic() < deadline:
                cand_data = data[:at] + data[at + chunk:]
                if not cand_data:
                    at += chunk
                    continue
                got = tries(replace(best, files={name: cand_data}))
                if got is not None:
                    data, best_out, progressed = cand_data, got, True
                    best = replace(best, files={name: data})
                else:
                    at += chunk
            if not progressed:
                chunk //= 2
    return best, best_out


def _shrink_files(case: Case, outcome: Outcome, tries: Callable[[Case], Outcome | None],
                  budget: Callable[[], bool]) -> tuple[Case, Outcome]:
    """Multi-file cases: halve each Parquet table's rows and shrink each JSON file's tree,
    one file at a time, keeping what still fails the same way."""
    import io
    import json

    import polars as pl

    for name in sorted(case.files):
        if name.endswith(".parquet"):
            while budget():
                try:
                    df = pl.read_parquet(io.BytesIO(case.files[name]))
                except Exception:  # noqa: BLE001 - a corrupt table stays as it is
                    break
                if df.height <= 1:
                    break
                progressed = False
                for part in (df.head(df.height // 2), df.tail(df.height // 2)):
                    buf = io.BytesIO()
                    part.write_parquet(buf)
                    cand = replace(case, files={**case.files, name: buf.getvalue()})
                    got = tries(cand)
                    if got is not None:
                        case, outcome, progressed = cand, got, True
                        break
                if not progressed:
                    break
        elif name.endswith(".json"):
            try:
                tree = json.loads(case.files[name])
            except (ValueError, RecursionError):
                continue
            for edit in _tree_edits(tree):
                if not budget():
                    break
                undo = edit()
                cand = replace(case, files={**case.files, name: json.dumps(tree).encode()})
                got = tries(cand)
                if got is None:
                    undo()
                else:
                    case, outcome = cand, got
    return case, outcome
