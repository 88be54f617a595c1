"""Issue 43, the third fuzzing round: each class it broke, rebuilt here by the project's own
means (the bundled samples, files written by the test), must give one line and the
documented exit code: 2 for an input, 4 for an output the environment cannot take, never 3.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from snapana.errors import InputError
from snapana.sources.memray_capture import _records_frame

from .conftest import ROOT, invoke

SAMPLE = ROOT / "sample_snapshots" / "fsdp-train-step.pickle"
OUTPUT_ERROR = 4


def _cli(*args: str, cwd: Path, **kw) -> subprocess.CompletedProcess:
    """The real process (its own streams), as a user runs it."""
    env = {**os.environ, "PYTHONIOENCODING": kw.pop("encoding", "utf-8")}
    return subprocess.run([sys.executable, "-m", "snapana", *args], cwd=cwd, env=env,
                          stderr=subprocess.PIPE, text=True, timeout=120, **kw)


def _one_line(stderr: str) -> str:
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("snapana: error: "), stderr
    assert "Traceback" not in stderr and "internal error" not in stderr
    return lines[0]


def test_none_of_several_inputs_analysed_exits_2(tmp_path: Path) -> None:
    for name in ("a.pickle", "b.pickle", "c.pickle"):
        (tmp_path / name).write_bytes(b"not a snapshot")
    result = invoke("summary", str(tmp_path))
    assert result.returncode == 2
    assert "none of the 3 inputs could be analysed" in result.stderr
    assert "unrecognised format" in result.stdout  # each one's reason is still listed
    out = tmp_path / "out.html"
    result = invoke("report", str(tmp_path / "a.pickle"), str(tmp_path / "b.pickle"),
                    "-o", str(out))
    assert result.returncode == 2 and "none of the 2 inputs" in result.stderr
    assert f"each one's reason is in {out}, written" in _one_line(result.stderr)
    assert out.is_file()
    result = invoke("batch", str(tmp_path / "a.pickle"), str(tmp_path / "b.pickle"),
                    "-o", str(tmp_path / "dataset"))
    assert result.returncode == 2 and "reason is in" in _one_line(result.stderr)


def _file_size_limit(limit: int):
    """A disk that fills after `limit` bytes of any file: writes past it fail (EFBIG)."""
    import resource
    import signal

    def prepare() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return prepare


@pytest.mark.parametrize("stdout", ["full", "closed", "ascii", "filling"])
def test_an_output_the_environment_cannot_take_exits_4(tmp_path: Path, stdout: str) -> None:
    shutil.copy(SAMPLE, tmp_path / "s.pickle")
    if stdout == "full":
        if not Path("/dev/full").exists():
            pytest.skip("no /dev/full on this system")
        with open("/dev/full", "w") as full:
            result = _cli("summary", "s.pickle", cwd=tmp_path, stdout=full)
        assert "No space left" in _one_line(result.stderr)
    elif stdout == "closed":
        result = _cli("summary", "s.pickle", cwd=tmp_path, stdout=subprocess.DEVNULL,
                      preexec_fn=lambda: os.close(1))
        assert "standard output is closed" in _one_line(result.stderr)
    elif stdout == "filling":  # the text stream would keep 2,000 bytes and exit 0
        with (tmp_path / "out.html").open("wb") as out:
            result = _cli("summary", "-f", "html", "s.pickle", cwd=tmp_path, stdout=out,
                          preexec_fn=_file_size_limit(2000))
        assert "File too large" in _one_line(result.stderr)
    else:
        result = _cli("summary", "s.pickle", cwd=tmp_path, stdout=subprocess.DEVNULL,
                      encoding="ascii")
        assert "PYTHONIOENCODING=utf-8" in _one_line(result.stderr)
    assert result.returncode == OUTPUT_ERROR


def test_a_full_temporary_folder_is_not_blamed_on_the_input(tmp_path: Path) -> None:
    """The decode child hands its columns over in a temporary file; where that cannot be
    written (a full /tmp), the snapshot is still analysed, not called corrupt. (The
    fuzzer's small snapshot: its payload is written after its numbers, past 4 KB.)"""
    from .fuzz.seeds import small_snapshot

    (tmp_path / "s.pickle").write_bytes(small_snapshot())
    result = _cli("summary", "s.pickle", cwd=tmp_path, stdout=subprocess.PIPE,
                  preexec_fn=_file_size_limit(4096))
    assert result.returncode == 0, result.stderr
    assert "Verdict." in result.stdout


def test_names_the_file_system_cannot_hold(tmp_path: Path) -> None:
    """A name over the file system's limit is one line and exit 2; a valid snapshot whose
    name leaves no room for `.meta.json` has no sidecar, and is read."""
    result = _cli("summary", "a" * 300 + ".pickle", cwd=tmp_path, stdout=subprocess.PIPE)
    assert result.returncode == 2 and "File name too long" in _one_line(result.stderr)
    long = tmp_path / ("b" * 245 + ".pickle")
    shutil.copy(SAMPLE, long)
    result = invoke("summary", str(long))
    assert result.returncode == 0 and "Verdict." in result.stdout


def test_an_unpaired_surrogate_in_a_sidecar_is_shown_inert(tmp_path: Path) -> None:
    snap = tmp_path / "s.pickle"
    shutil.copy(SAMPLE, snap)
    with SAMPLE.open("rb") as fh:
        block = pickle.load(fh)["segments"][0]["blocks"][0]
    tensor = {"ptr": block["address"], "nbytes": block["size"], "role": "parameter",
              "name": "w\udc80\x1b[31m", "shape": [4], "dtype": "float32"}
    side = {"format": "snapana.record.sidecar", "version": 1, "reason": "step", "device": 0,
            "inventory": {"tensors": [tensor]}}
    (tmp_path / "s.pickle.meta.json").write_text(json.dumps(side))
    for fmt in ("text", "json", "markdown", "html"):
        result = invoke("summary", "--format", fmt, str(snap))
        assert result.returncode == 0, (fmt, result.stderr)
        assert "\udc80" not in result.stdout and "\x1b[31m" not in result.stdout
    from snapana.sources import sidecar

    (read,) = sidecar.read(tmp_path / "s.pickle.meta.json")["inventory"]["tensors"]
    assert read["name"] == "w\\udc80\\x1b[31m"  # escaped, still readable


def test_control_characters_of_an_output_name_are_not_printed(tmp_path: Path) -> None:
    out = tmp_path / "r\x1b]0;owned\x07\n.html"
    result = invoke("report", str(SAMPLE), "-o", str(out))
    assert result.returncode == 0 and out.is_file()
    assert "\x1b" not in result.stderr and "\x07" not in result.stderr
    assert "\\x1b]0;owned\\x07\\x0a.html" in result.stderr


def test_a_memray_value_past_int64_is_refused() -> None:
    cols = {"size": [2**64 + 5], "n_allocations": [1], "allocator": ["malloc"], "tid": [1],
            "thread_name": ["main"], "frames": [[["a.py", "f", 1]]]}
    with pytest.raises(InputError, match="`size` holds a value that is not a 64-bit integer"):
        _records_frame(Path("x.bin"), cols)
    cols["size"], cols["frames"] = [8], [[["a.py", "f", 2**64 - 1]]]
    with pytest.raises(InputError, match="line is not a 64-bit integer"):
        _records_frame(Path("x.bin"), cols)


#: standard-library modules every interpreter imports early: planted beside the inputs, each
#: writes a canary if an interpreter snapana starts imports it
PLANTED = ("json", "inspect", "types", "typing", "enum", "functools", "threading")


@pytest.mark.parametrize("command", [
    ("summary", "-j", "2", "a.pickle", "b.pickle"),  # spawned rank workers
    ("report", "-j", "2", "a.pickle", "b.pickle", "-o", "r.html"),
    ("summary", "a.pickle"),  # the decode child
    ("report", "a.pickle", "-o", "one.html"),
])
def test_no_helper_interpreter_imports_from_the_working_directory(tmp_path: Path,
                                                                  command: tuple) -> None:
    """An incident folder may carry anything: analysing it from inside must run none of it.
    The console script (as a user runs it; `python -m` would import from the folder in
    Python itself, before snapana runs)."""
    script = Path(sys.executable).with_name("snapana")
    assert script.is_file(), "the install provides the snapana console script"
    for name in ("a.pickle", "b.pickle"):
        shutil.copy(SAMPLE, tmp_path / name)
    for module in PLANTED:
        (tmp_path / f"{module}.py").write_text(
            f"open({str(tmp_path / ('CANARY-' + module))!r}, 'w').write('ran')\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONSAFEPATH")}
    result = subprocess.run([str(script), *command], cwd=tmp_path, env=env, text=True,
                            capture_output=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert not list(tmp_path.glob("CANARY-*")), result.stderr


def _children(pid: int) -> list[int]:
    """Live processes whose parent is `pid` (from /proc)."""
    out = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                fields = (p / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid and fields[0] != "Z":
                out.append(int(p.name))
    return out


def _alive(pid: int) -> bool:
    try:
        return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0] \
            != "Z"
    except OSError:
        return False


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM", "SIGHUP"])
def test_children_die_with_snapana(tmp_path: Path, sig: str) -> None:
    """Stopped while its children decode (two inputs: two workers, each with a decode
    child), snapana leaves no process behind: each is gone within a second."""
    import signal
    import time

    from .fuzz.environment import slow_snapshot

    (tmp_path / "a.pickle").write_bytes(slow_snapshot(3000))  # 600,000 blocks: seconds
    shutil.copy(tmp_path / "a.pickle", tmp_path / "b.pickle")
    script = Path(sys.executable).with_name("snapana")
    # Ctrl-C as a terminal's foreground job gets it (a test run started in the background
    # inherits SIGINT ignored, and Python then installs no KeyboardInterrupt)
    proc = subprocess.Popen([str(script), "summary", "-j", "2", "a.pickle", "b.pickle"],
                            cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    family: list[int] = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not any(_children(k) for k in family):
        family = _children(proc.pid)  # the workers, and then their decode children
        time.sleep(0.05)
    family += [g for k in family for g in _children(k)]
    assert len(family) >= 3, "the workers and a decode child were running"
    os.kill(proc.pid, getattr(signal, sig))
    _, stderr = proc.communicate(timeout=30)
    assert b"Traceback" not in stderr, stderr.decode()  # a half-started worker's neither
    gone = time.monotonic() + 1
    while time.monotonic() < gone and any(_alive(k) for k in family):
        time.sleep(0.02)
    assert not [k for k in family if _alive(k)]


def test_one_long_name_shared_by_many_stacks_stays_bounded(tmp_path: Path) -> None:
    """A 4,000-character function name stored once (the pickle's memo) and referenced by
    8,000 distinct stacks: under a MiB of file. Reports show names cut to MAX_FRAME_TEXT, so
    every output stays proportional to the blocks, not to name × references (the API keeps
    the whole name)."""
    from snapana.limits import MAX_FRAME_TEXT

    long = "f" * 4000
    blocks = [{"address": (1 << 40) + 512 * i, "size": 512, "requested_size": 500,
               "state": "active_allocated",
               "frames": [{"filename": "/app/a.py", "name": long, "line": i},
                          {"filename": "/app/m.py", "name": "main", "line": 1}]}
              for i in range(8000)]
    trace = [{"action": "alloc", "addr": b["address"], "size": 500, "stream": 0,
              "frames": b["frames"]} for b in blocks]
    snap = {"segments": [{"device": 0, "address": 1 << 40, "total_size": 512 * 8000,
                          "stream": 0, "segment_type": "large", "blocks": blocks}],
            "device_traces": [trace]}
    path = tmp_path / "amp.pickle"
    path.write_bytes(pickle.dumps(snap, protocol=4))
    assert path.stat().st_size < 1 << 20
    out = tmp_path / "amp.html"
    # a process of its own runs the report, so its children's peak memory is this run's
    measure = ("import resource, subprocess, sys; r = subprocess.run(sys.argv[1:]); "
               "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr); "
               "sys.exit(r.returncode)")
    result = subprocess.run([sys.executable, "-c", measure, sys.executable, "-m", "snapana",
                             "report", str(path), "-o", str(out)], cwd=tmp_path,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert out.stat().st_size <= 3 << 20
    peak_kib = int(result.stderr.strip().splitlines()[-1])
    assert peak_kib < 2 << 20  # 2 GiB
    text = invoke("summary", "--format", "json", str(path)).stdout
    assert len(text) < 16 << 20
    assert long not in text and f"[{len(long)} chars]" in text
    assert max(len(m) for m in text.split('"')) <= 2 * MAX_FRAME_TEXT


@pytest.mark.parametrize("bomb", ["rows", "text"])
def test_an_export_table_that_inflates_is_refused(tmp_path: Path, bomb: str) -> None:
    """A Parquet table of an export folder whose run-length / dictionary encoding spells out
    to GiBs from a file of KBs: refused from its metadata and dictionary before it is
    spelled out (not a Rust allocation failure that aborts the process)."""
    import random

    import pyarrow as pa
    import pyarrow.parquet as pq

    out = tmp_path / "export"
    result = invoke("export", str(SAMPLE), "-o", str(out))
    assert result.returncode == 0, result.stderr
    frames = pq.read_table(out / "frames.parquet")
    if bomb == "rows":  # 5M rows of one repeated value: ~150 KB of file
        n = 5_000_000
        table = frames.slice(0, 1).take(pa.array([0] * n, pa.int32()))
    else:  # 100,000 rows of one random 60 KB name: 6 GB spelled out
        name = "".join(random.choice("abcdefghij") for _ in range(60_000))
        n = 100_000
        table = pa.table({
            "frame_id": pa.array(range(n), pa.int64()),
            "filename": pa.DictionaryArray.from_arrays(pa.array([0] * n, pa.int32()),
                                                       pa.array(["a.py"])),
            "name": pa.DictionaryArray.from_arrays(pa.array([0] * n, pa.int32()),
                                                   pa.array([name])),
            "line": pa.array([1] * n, pa.int64()),
            "is_python": pa.array([True] * n)})
    pq.write_table(table, out / "frames.parquet", compression="zstd", row_group_size=n)
    assert (out / "frames.parquet").stat().st_size < 1 << 20
    result = _cli("summary", str(out), cwd=tmp_path, stdout=subprocess.PIPE)
    assert result.returncode == 2
    line = _one_line(result.stderr)
    assert "refused" in line and "frames.parquet" in line


def _address_space(limit: int):
    def limit_it() -> None:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    return limit_it


def test_a_plain_table_of_millions_of_rows_is_refused_under_an_address_space_limit(
        tmp_path: Path) -> None:
    """2M rows of plain pages (32 MB of snappy), within the rows bound for its size: read
    under `ulimit -v 2.5G` (the fuzzer runs under 3G), where pyarrow's mimalloc pool and
    glibc's per-thread arenas used to take the address space and polars aborted (SIGABRT)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    out = tmp_path / "export"
    assert invoke("export", str(SAMPLE), "-o", str(out)).returncode == 0
    blocks = pq.read_table(out / "blocks.parquet")
    table = blocks.slice(0, 1).take(pa.array([0] * 2_000_000, pa.int32()))
    pq.write_table(table, out / "blocks.parquet", compression="snappy", use_dictionary=False)
    result = _cli("summary", str(out), cwd=tmp_path, stdout=subprocess.PIPE,
                  preexec_fn=_address_space(5 << 29))
    assert result.returncode == 2, result.stderr[-2000:]
    assert "blocks.parquet" in _one_line(result.stderr)


@pytest.mark.parametrize("command", ["summary", "report"])
def test_an_export_is_analysed_under_a_tight_address_space_limit(tmp_path: Path,
                                                                  command: str) -> None:
    """A genuine export analysed under `ulimit -v 1G`: it took 2.6 GB of address space
    (mostly allocator reservations) and aborted under 2 GiB."""
    out = tmp_path / "export"
    assert invoke("export", str(SAMPLE), "-o", str(out)).returncode == 0
    args = ["-o", str(tmp_path / "r.html")] if command == "report" else []
    result = _cli(command, str(out), *args, cwd=tmp_path, stdout=subprocess.PIPE,
                  preexec_fn=_address_space(1 << 30))
    assert result.returncode == 0, result.stderr[-2000:]


def test_a_trace_allocation_overlapping_a_final_block_is_an_impossible_state(
        tmp_path: Path) -> None:
    """A trace that allocates over a block the final segments hold: the state cannot exist,
    so no cached figure is computed from it, and the report says why."""
    base = 1 << 40
    final = [{"address": base, "size": 4096, "requested_size": 4096,
              "state": "active_allocated", "frames": []},
             {"address": base + 4096, "size": (2 << 20) - 4096, "requested_size": 0,
              "state": "inactive", "frames": []}]
    trace = [{"action": "alloc", "addr": base + 2048, "size": 8192, "stream": 0,
              "frames": []}]
    snap = {"segments": [{"device": 0, "address": base, "total_size": 2 << 20, "stream": 0,
                          "segment_type": "small", "blocks": final}],
            "device_traces": [trace]}
    path = tmp_path / "overlap.pickle"
    path.write_bytes(pickle.dumps(snap, protocol=4))
    result = invoke("summary", "--format", "json", "--at", "event:0", str(path))
    assert result.returncode == 0, result.stderr
    (dev,) = json.loads(result.stdout)["devices"]
    assert any("cannot exist (live blocks overlap)" in w for w in dev["warnings"])
    assert dev["cached_unallocated_bytes"] is None
    # at an OOM on that state, no request is placed on it: no shortfall, no what-if spare
    trace.append({"action": "oom", "addr": 0, "size": 1 << 30, "stream": 0,
                  "device_free": 0, "frames": []})
    path.write_bytes(pickle.dumps(snap, protocol=4))
    result = invoke("summary", "--format", "json", str(path))
    assert result.returncode == 0, result.stderr
    (dev,) = json.loads(result.stdout)["devices"]
    assert dev["moment"]["kind"] == "oom"
    assert any("cannot exist" in w for w in dev["warnings"])
    assert dev["diagnosis"]["what_ifs"] == [] and dev["diagnosis"]["shortfall_bytes"] is None


def test_a_non_finite_setting_from_an_export_stays_valid_json(tmp_path: Path) -> None:
    """An export marker is input too: an allocator setting of Infinity it carries is shown
    as text, never as a bare `Infinity` that no strict JSON parser reads."""
    out = tmp_path / "export"
    assert invoke("export", str(SAMPLE), "-o", str(out)).returncode == 0
    marker = out / "snapana-export.json"
    meta = json.loads(marker.read_text())
    meta["allocator_settings"]["source"] = [float("inf"), float("nan")]
    marker.write_text(json.dumps(meta))  # Python writes Infinity / NaN bare

    def strict(name: str) -> None:
        raise ValueError(f"bare {name} in the JSON")

    result = invoke("summary", "--format", "json", str(out))
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout, parse_constant=strict)
    (dev,) = doc["devices"]
    assert dev["diagnosis"]["allocator_settings"]["source"] == ["inf", "nan"]


def test_an_export_onto_a_filling_disk_is_an_output_failure(tmp_path: Path) -> None:
    """Polars wraps a failed Parquet write in its own error: said as the output's failure
    (exit 4, one line), and no partial folder is left."""
    result = _cli("export", str(SAMPLE), "-o", "out", cwd=tmp_path, stdout=subprocess.PIPE,
                  preexec_fn=_file_size_limit(4096))
    assert result.returncode == OUTPUT_ERROR
    assert "could not write" in _one_line(result.stderr)
    assert not list(tmp_path.iterdir())  # neither the folder nor its temporary one


def test_memory_headroom_reads_the_address_space_limit() -> None:
    """What a process under `ulimit -v` may still take is at most its limit less what it
    maps: the figure an export table's read is admitted against."""
    code = ("import resource; resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30)); "
            "from snapana.limits import memory_headroom; "
            "vm = [int(l.split()[1]) << 10 for l in open('/proc/self/status') "
            "if l.startswith('VmSize:')][0]; print(memory_headroom(), vm)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=True).stdout.split()
    room, vm = int(out[0]), int(out[1])
    assert 0 < room <= (3 << 30) - vm + (1 << 20)


def test_a_truncated_gzip_with_a_huge_memo_index_is_refused_by_the_bounded_decode(tmp_path):
    """A truncated gzip whose pickle puts a value at memo index 795,351,912: the bounded
    child once gave up counting the truncated stream, so the unbounded in-process decode ran
    and CPython's unpickler sized its memo for that index (12 GB resident) before failing.
    The child now decodes a truncated stream as far as it goes, under its memory limit, and
    the file is refused for its memory. Run under a 2 GiB address-space limit: the
    unbounded decode would meet it as a MemoryError inside the pickle reader instead."""
    import gzip
    import random
    import resource
    import struct

    text = "".join(random.Random(5).choices("abcdefghij", k=2 << 20)).encode()
    body = (b"\x80\x02}r" + struct.pack("<I", 795_351_912)  # {} put at that memo index
            + b"X" + struct.pack("<I", len(text)) + text + b"0.")  # 2 MB of text, POP, STOP
    (tmp_path / "s.pickle").write_bytes(gzip.compress(body)[:-8])  # no CRC, no length

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))

    result = _cli("summary", "s.pickle", cwd=tmp_path, stdout=subprocess.DEVNULL,
                  preexec_fn=limit)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "needs far more memory than a snapshot" in lines[0], lines
