"""A pytest plugin for GPU memory budgets (issue 47), the habit pytest-memray's
`limit_memory` set for host memory:

    @pytest.mark.cuda_memory(limit="2 GiB", families={"kv_cache": "512 MiB"})
    def test_generate(): ...

A marked test runs with PyTorch's memory history recorded (through the same backend
`snapana record` uses); afterwards its snapshot and HTML report are written to
`--snapana-dir`, and the test fails when its peak allocated passes `limit`, a family held
more than its budget at any point of the recording, or it raised torch.OutOfMemoryError: the
message carries the verdict and the family table. Without PyTorch or CUDA a marked test is
skipped, saying which (or fails under `--snapana-require-cuda`); a marker it cannot read (a
family the vocabulary does not know, a positional argument, a size without its unit) fails
the test with one line, GPU or not. Unmarked tests are untouched, and nothing heavy is
imported until a marked test runs.
"""

from __future__ import annotations

import re
import reprlib
from collections.abc import Generator, Mapping
from pathlib import Path
from typing import Any

try:
    import pytest
except ImportError as exc:  # only pytest loads this module (its pytest11 entry point)
    raise ImportError("snapana.pytest_plugin is a pytest plugin: it runs inside pytest "
                      "(pip install pytest)") from exc

MARK = "cuda_memory"
DEFAULT_DIR = "snapana-memory"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("snapana", "GPU memory budgets (snapana)")
    group.addoption("--snapana-dir", default=DEFAULT_DIR, metavar="DIR",
                    help="where cuda_memory tests leave their snapshot and report")
    group.addoption("--snapana-require-cuda", action="store_true",
                    help="fail cuda_memory tests where CUDA is missing, instead of skipping")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", f"{MARK}(limit=None, families=None): record GPU memory around the test "
        "and fail it past the budget (peak allocated; bytes per family) or on an OOM")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, Any, None]:
    mark = item.get_closest_marker(MARK)
    if mark is None:
        yield
        return
    from snapana.record.cuda import AROUND_ONE_STEP, backend, unavailable

    cuda = backend()
    budget = _budget(mark)  # a marker it cannot read fails, GPU or not
    reason = unavailable(cuda)
    if reason:
        if item.config.getoption("--snapana-require-cuda"):
            pytest.fail(f"cuda_memory: {reason}: no GPU memory to record "
                        "(--snapana-require-cuda)", pytrace=False)
        pytest.skip(f"cuda_memory: {reason}: no GPU memory to record")
    cuda.start_history(AROUND_ONE_STEP, "python")
    try:
        outcome = yield
        snapshot = cuda.snapshot()
    finally:
        cuda.stop_history()  # the next test, marked or not, runs without recording
    raised = outcome.excinfo[1] if outcome.excinfo else None
    oom = raised is not None and type(raised).__name__ == "OutOfMemoryError"
    verdict = _judge(item, snapshot, budget, oom)
    if verdict:
        outcome.force_exception(pytest.fail.Exception(verdict, pytrace=False))


def _budget(mark: pytest.Mark) -> dict[str, Any]:
    """The marker's budget, sizes read with their units and families checked against the
    vocabulary (as `snapana check` reads a budget file): anything it cannot read fails the
    test with one line naming it, rather than a traceback or a budget silently met."""
    from snapana.analysis.budget import known_family
    from snapana.errors import InputError
    from snapana.units import parse_bytes

    def refused(message: str) -> BaseException:
        return pytest.fail.Exception(f"cuda_memory {message}", pytrace=False)

    def size(value: object, what: str) -> int:
        if isinstance(value, int) and not isinstance(value, bool):
            if value < 0:
                raise refused(f"{what}: {value} is not a size (0 or more bytes)")
            return value
        try:
            return parse_bytes(str(value).replace(" ", ""))
        except ValueError as exc:
            raise refused(f"{what}: {exc}") from None  # one line, no chained traceback

    if mark.args:
        raise refused("takes limit= and families= by name, not the positional "
                      + ", ".join(reprlib.repr(a) for a in mark.args))
    unknown = set(mark.kwargs) - {"limit", "families"}
    if unknown:
        raise refused(f"takes limit= and families=, not {'=, '.join(sorted(unknown))}=")
    limit = mark.kwargs.get("limit")
    families = mark.kwargs.get("families")
    families = {} if families is None else families  # None is the marker's default
    if not isinstance(families, Mapping):
        raise refused("families= is a mapping of family to size, e.g. {'kv_cache': '512 MiB'}, "
                      f"not a {type(families).__name__}: {reprlib.repr(families)}")
    budget = {}
    for family, most in families.items():
        if not isinstance(family, str):
            raise refused(f"families= {reprlib.repr(family)} is not a family name (a string)")
        try:
            known_family(family, "families=")
        except InputError as exc:
            raise refused(str(exc)) from None
        budget[family] = size(most, f"families[{family!r}]")
    return {"limit": None if limit is None else size(limit, "limit"), "families": budget}


def _judge(item: pytest.Item, snapshot: dict[str, Any], budget: dict[str, Any],
           oom: bool) -> str:
    """Write the snapshot and its report; the failure message ("" within budget)."""
    import pickle

    import polars as pl

    import snapana
    from snapana.io.output import OutputError, write_atomic
    from snapana.units import fmt_bytes

    folder = Path(item.config.getoption("--snapana-dir"))
    if folder.exists() and not folder.is_dir():
        raise OutputError(f"--snapana-dir {folder}: is not a folder")
    folder.mkdir(parents=True, exist_ok=True)
    stem = re.sub(r"[^A-Za-z0-9_.-]+", "_", item.nodeid)[-120:]
    path = folder / f"{stem}.pickle"
    write_atomic(path, pickle.dumps(snapshot, protocol=4))  # a FIFO there: refused, not waited on
    a = snapana.load(path)
    a.report(folder / f"{stem}.html")
    held = {g.name: g.bytes for g in a.device_report.groups}
    timeline = a.timeline  # each family's bytes over the window: its most is what counts
    if timeline.height:
        for family, most in timeline.group_by("family").agg(
                pl.col("bytes").max()).iter_rows():
            held[family] = max(held.get(family, 0), int(most))
    breaches = []
    if oom:
        breaches.append("the test ran out of GPU memory")
    peak = a.device_report.peak_allocated_bytes
    if budget["limit"] is not None and peak > budget["limit"]:
        breaches.append(f"peak allocated {fmt_bytes(peak)} > limit "
                        f"{fmt_bytes(budget['limit'])}")
    for family, most in budget["families"].items():
        if held.get(family, 0) > most:
            breaches.append(f"family {family} {fmt_bytes(held[family])} > "
                            f"{fmt_bytes(most)}")
    if not breaches:
        return ""
    table = "\n".join(f"  {name:<28} {fmt_bytes(n):>12}"
                      for name, n in sorted(held.items(), key=lambda kv: (-kv[1], kv[0])))
    return ("cuda_memory budget: " + "; ".join(breaches) + "\n" + a.verdict
            + "\nthe most each family held over the recording:\n" + table
            + f"\nsnapshot and report: {path} (.html beside it)")
