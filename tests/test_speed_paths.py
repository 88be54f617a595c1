"""The faster paths of issue 55 give exactly what the slower ones gave: sorting by a table
(`snapana.arrays`) against numpy's own `unique` / stable `argsort`, the built-in packs read
from the user's cache against the packs read from their TOML, and the process settings made
before numpy loads."""

from __future__ import annotations

import numpy as np
import pytest
from snapana import arrays


def _columns() -> list[np.ndarray]:
    """Integer columns of the shapes a trace gives (few values over a small or a huge span,
    a common factor, negatives, sorted and reversed runs, every value distinct) and edge
    cases (empty, one row, int64's ends, small unsigned and signed types)."""
    rng = np.random.default_rng(55)
    out = []
    for distinct in (1, 3, 25, 1706, 70_000, 900_000):
        for step in (1, 512, 10**9, 2**40 + 7):
            for rows in (100, 70_000, 300_000):
                v = rng.integers(0, distinct, rows) * step + int(rng.integers(-10**6, 10**6))
                out.append(v.astype(np.int64))
    out += [np.zeros(0, np.int64), np.array([5]), np.array([-7, -21, 0, -21]),
            np.array([2**63 - 1, -(2**63), 0]), np.array([2**63 - 1, 2**63 - 1 - 512 * 3]),
            np.arange(300_000), np.arange(300_000)[::-1].copy(),
            np.repeat(np.arange(1000), 300), rng.integers(0, 5, 100_000).astype(np.uint8),
            rng.integers(-3, 5, 100_000).astype(np.int16),
            rng.integers(0, 2**31, 100_000).astype(np.uint32),
            np.array([0, 2**64 - 1, 2**63], dtype=np.uint64),
            rng.integers(-(2**62), 2**62, 1000)]
    return out


@pytest.mark.parametrize("v", _columns(), ids=lambda v: f"{v.dtype}-{v.size}")
def test_unique_inverse_and_stable_order_are_numpys(v):
    expected = np.unique(v, return_inverse=True)
    got = arrays.unique_inverse(v)
    assert got[0].dtype == expected[0].dtype and got[1].dtype == expected[1].dtype
    assert np.array_equal(got[0], expected[0]) and np.array_equal(got[1], expected[1])
    assert np.array_equal(arrays.stable_order(v), np.argsort(v, kind="stable"))


def test_a_small_span_is_sorted_by_table_not_by_numpy(monkeypatch):
    """The table is what answers where the span allows (else the test above compares numpy
    with itself): numpy's unique is not called for sizes in 512 B steps over 1.6 M steps."""
    rng = np.random.default_rng(1)
    sizes = rng.integers(1, 25, 400_000) * 512 * 65_000
    called = []
    monkeypatch.setattr(arrays.np, "unique", lambda *a, **k: called.append(1))
    distinct, index = arrays.unique_inverse(sizes)
    assert not called
    assert np.array_equal(distinct[index], sizes)


def test_builtin_packs_read_back_from_the_cache_are_the_packs(tmp_path, monkeypatch):
    """The first run keeps the packs' TOML as JSON in the user's cache; a run that reads it
    back gets the same packs, rule for rule; a damaged or truncated file, one changed since
    it was written (valid JSON, other packs), or a cache that cannot be written, costs the
    TOML read and changes nothing."""
    import json

    from snapana.analysis.attribution import engine, pack_parser

    def packs():
        engine.builtin_packs.cache_clear()
        return engine.builtin_packs()

    def toml_reads(monkeypatch) -> list[str]:
        seen: list[str] = []
        real = pack_parser._load_toml
        monkeypatch.setattr(pack_parser, "_load_toml",
                            lambda text, source, packaged: seen.append(source)
                            or real(text, source, packaged))
        return seen

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    reads = toml_reads(monkeypatch)
    first = packs()
    kept = list((tmp_path / "snapana" / "sealed").glob("packs-*.json"))
    assert len(kept) == 1 and len(reads) == len(first)
    reads.clear()
    again = packs()
    assert reads == [], "the TOML was read again"
    assert again == first
    written = kept[0].read_text()
    changed = json.dumps([{} for _ in first])  # valid JSON, as many packs, no rules
    for damage in ("[]", written[:1000], "{not json", "\udcff", changed,
                   written.partition("\n")[0] + "\n" + changed):
        kept[0].write_text(damage, errors="surrogateescape")
        reads.clear()
        assert packs() == first
        assert len(reads) == len(first)
    blocked = tmp_path / "a-file"
    blocked.write_text("x")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocked))
    assert packs() == first
    engine.builtin_packs.cache_clear()


def test_one_blas_thread_unless_the_user_chose(monkeypatch):
    """The command line asks OpenBLAS for one thread before numpy loads (its threads only
    spin: snapana does no floating-point linear algebra), keeps a user's own setting, and
    the decode child is started with one too where it imports numpy (for the scan:
    `pickle_child._scan_env`; it imports none otherwise)."""
    import snapana.__main__ as entry
    from snapana.sources import pickle_child

    monkeypatch.delenv(entry.BLAS_THREADS, raising=False)
    entry._one_blas_thread()
    import os

    assert os.environ[entry.BLAS_THREADS] == "1"
    monkeypatch.setenv(entry.BLAS_THREADS, "8")
    entry._one_blas_thread()
    assert os.environ[entry.BLAS_THREADS] == "8"
    seen = {}

    class Stop(Exception):
        pass

    def popen(cmd, **kw):
        seen.update(kw["env"])
        raise Stop

    monkeypatch.setattr(pickle_child.subprocess, "Popen", popen)
    with pytest.raises(Stop):
        pickle_child.start(pickle_child.Path(__file__), 10, False, True)
    assert "SNAPANA_CHILD_NUMPY" in seen and seen[entry.BLAS_THREADS] == "1"


def test_a_new_plotly_copy_replaces_the_stale_ones(tmp_path, monkeypatch):
    """The compressed plotly.js is kept once: a copy another plotly install left (another
    name) goes when the current one is written; what is kept inflates to plotly.min.js."""
    import base64
    import gzip

    from snapana import user_cache
    from snapana.render import assets

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    folder = tmp_path / "snapana" / "sealed"
    folder.mkdir(parents=True)
    (folder / "plotly-1-2.js.gz.b64").write_text("stale")
    assets.plotly_js_gzip_b64.cache_clear()
    text = assets.plotly_js_gzip_b64()
    assets.plotly_js_gzip_b64.cache_clear()
    kept = sorted(p.name for p in folder.glob("plotly-*"))
    assert kept == [assets.cache_name()]
    plotly_js = (assets._plotly_data("plotly.min.js")).read_bytes()
    assert gzip.decompress(base64.b64decode(user_cache.read_text(kept[0]))) == plotly_js
    assert gzip.decompress(base64.b64decode(text)) == plotly_js


#: The modules that read and show text logs: a snapshot's report has no use for them.
LOG_MODULES = ("snapana.log_session", "snapana.render.text_log", "snapana.analysis.log_evidence",
               "snapana.sources.log_tables", "snapana.analysis.text_diagnosis")


@pytest.mark.parametrize("kind", ["snapshot", "log"])
def test_a_snapshots_report_imports_no_log_reader(kind, tmp_path):
    """`snapana report` in a fresh interpreter: on a snapshot, none of the text-log modules
    is imported (~20 ms of every report); on a log, they are (the check can fail)."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    samples = Path(__file__).resolve().parent.parent / "sample_snapshots"
    source = min(samples.glob("*.pickle"), key=lambda p: p.stat().st_size)
    if kind == "log":
        source = tmp_path / "job.log"
        source.write_text("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate "
                          "2.00 GiB. GPU 0 has a total capacity of 79.15 GiB of which "
                          "1.02 GiB is free.\n")
    out = tmp_path / "r.html"
    code = ("import json, sys\nfrom snapana.cli import main\n"
            f"sys.argv = ['snapana', 'report', {str(source)!r}, '-o', {str(out)!r}]\n"
            "try:\n    main()\nexcept SystemExit as e:\n    assert not e.code, e.code\n"
            "print(json.dumps(sorted(m for m in sys.modules if m.startswith('snapana'))))\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=dict(os.environ, COLUMNS="200"), timeout=600)
    assert run.returncode == 0, run.stderr
    loaded = set(json.loads(run.stdout.strip().splitlines()[-1]))
    assert out.is_file()
    if kind == "snapshot":
        assert not loaded & set(LOG_MODULES), sorted(loaded & set(LOG_MODULES))
    else:
        assert set(LOG_MODULES) <= loaded


def test_a_report_runs_where_the_user_has_no_home(tmp_path):
    """No XDG_CACHE_HOME, no HOME and no account entry (a container under a bare uid:
    `Path.home()` raises): the report is made as before, only nothing is kept between runs."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    samples = Path(__file__).resolve().parent.parent / "sample_snapshots"
    source = min(samples.glob("*.pickle"), key=lambda p: p.stat().st_size)
    out = tmp_path / "r.html"
    code = ("import pathlib, sys\n"
            "def no_home(cls):\n    raise RuntimeError('Could not determine home directory.')\n"
            "pathlib.Path.home = classmethod(no_home)\n"
            "from snapana.__main__ import run\n"
            f"sys.argv = ['snapana', 'report', {str(source)!r}, '-o', {str(out)!r}]\n"
            "run()\n")
    env = {k: v for k, v in os.environ.items() if k not in ("HOME", "XDG_CACHE_HOME")}
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=env, cwd=tmp_path, timeout=600)
    assert run.returncode == 0, run.stderr
    assert "Traceback" not in run.stderr
    assert out.read_text().count("<html") == 1


def test_a_fifo_in_the_cache_is_passed_over_not_waited_on(tmp_path):
    """A FIFO where a kept file's name is (or any file that is not regular) is not read:
    opening it for reading would wait for a writer that never comes, on every run."""
    import os
    import subprocess
    import sys

    (tmp_path / "snapana" / "sealed").mkdir(parents=True)
    os.mkfifo(tmp_path / "snapana" / "sealed" / "kept.json")
    code = "from snapana import user_cache\nprint(user_cache.read_text('kept.json'))\n"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=dict(os.environ, XDG_CACHE_HOME=str(tmp_path)), timeout=30)
    assert (run.returncode, run.stdout) == (0, "None\n"), run.stderr
