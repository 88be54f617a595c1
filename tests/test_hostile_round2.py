"""Hostile inputs, second round (issue #27): amplification through the memo and through
repeated keys stays within 2 GB, impossible allocator states are refused or flagged (never
a negative or impossible figure), strings from an input reach no terminal raw, command-line
values have one strict parser, and outputs never replace a device, FIFO or socket."""

from __future__ import annotations

import json
import os
import pickle
import re
import socket
import stat
import subprocess
import sys

import pytest
from snapana.errors import InputError
from snapana.sources.torch_snapshot import from_snapshot_dict

from .conftest import ROOT, SAMPLES, invoke, run_cli
from .fuzz.invariants import summary_violations

MiB = 1 << 20
GiB = 1 << 30
BASE = 1 << 30
FRAMES = [{"filename": "/app/train.py", "line": 10, "name": "step"}]
RAW_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")
SAMPLE = SAMPLES / "fsdp-train-step.pickle"


def _segment(blocks, address=BASE, size=2 * MiB):
    return {"device": 0, "address": address, "total_size": size, "stream": 0,
            "segment_type": "large", "segment_pool_id": (0, 0), "is_expandable": False,
            "blocks": blocks}


def _entry(action, addr, size, t, frames=FRAMES):
    return {"action": action, "addr": addr, "size": size, "stream": 0, "time_us": t,
            "frames": frames}


def _snap(segments, trace=(), **more):
    return {"segments": list(segments), "device_traces": [list(trace)],
            "allocator_settings": {}, **more}


# ----- amplification: analysed or refused within 2 GB -----------------------------------------

def _memo_blocks(n: int) -> bytes:
    """One zero-size active block dict referenced n times (5,000 in 10 KB)."""
    block = {"address": BASE, "size": 0, "requested_size": 0, "state": "active_allocated",
             "frames": FRAMES}
    return pickle.dumps(_snap([_segment([block] * n)]), protocol=4)


def _memo_trace(n: int) -> bytes:
    """n trace entries that are references to two dicts (an alloc and its free)."""
    pair = [_entry("alloc", BASE, 512, 5), _entry("free_completed", BASE, 512, 6)]
    block = {"address": BASE, "size": 2 * MiB, "state": "inactive", "frames": []}
    return pickle.dumps(_snap([_segment([block])], pair * (n // 2)), protocol=4)


#: Measures the whole process tree: ru_maxrss of the children includes the decode child,
#: which snapana waits for. A generous hang guard only; no timed assertion.
_MEASURE = """
import json, resource, subprocess, sys
p = subprocess.run([sys.executable, "-m", "snapana", *sys.argv[1:]], capture_output=True,
                   text=True, timeout=600)
print(json.dumps({"code": p.returncode, "stderr": p.stderr[-2000:], "stdout": p.stdout,
                  "maxrss": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024}))
"""


def _measured(*args: str) -> dict:
    out = subprocess.run([sys.executable, "-c", _MEASURE, *args], capture_output=True,
                         text=True, timeout=900, env=dict(os.environ, COLUMNS="200"))
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("shape,n", [("blocks", 5_000), ("blocks", 200_000),
                                     ("trace", 4_000_000)])
def test_amplified_pickles_are_analysed_or_refused_within_2_gb(tmp_path, shape, n):
    data = _memo_blocks(n) if shape == "blocks" else _memo_trace(n)
    if shape == "blocks":
        assert len(data) <= 1 << 20  # the bound: any pickle of at most 1 MB
    path = tmp_path / f"{shape}-{n}.pickle"
    path.write_bytes(data)
    for cmd in (["summary", str(path), "-f", "json"], ["report", str(path), "-o",
                                                       str(tmp_path / "r.html")]):
        got = _measured(*cmd)
        assert got["code"] in (0, 2), got["stderr"]
        if got["code"] == 2:
            lines = got["stderr"].strip().splitlines()
            assert len(lines) == 1 and lines[0].startswith("snapana: error: "), lines
        else:
            assert not summary_violations(got["stdout"]) or cmd[0] == "report"
        assert got["maxrss"] < 2 * GiB, f"{cmd[0]}: peak RSS {got['maxrss'] >> 20} MiB"


def test_rows_beyond_the_pickles_size_are_refused_before_any_work(tmp_path):
    path = tmp_path / "memo.pickle"
    path.write_bytes(_memo_trace(200_000))
    with pytest.raises(InputError, match="decode to 200,002 .*SNAPANA_MAX_ROWS"):
        from snapana.sources import load

        load(path)


def test_every_real_snapshot_holds_far_fewer_rows_than_the_bound():
    """The bound is far from what PyTorch writes: the corpus and the samples hold 40+ bytes
    of pickle per row, five times the least the bound allows."""
    import gzip

    from snapana.limits import MIN_ROW_BYTES

    from .conftest import SNAPSHOTS
    files = sorted(SNAPSHOTS.glob("*.p*")) + sorted(SAMPLES.glob("*.pickle"))
    for path in files:
        raw = path.read_bytes()
        raw = gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw
        data = pickle.loads(raw) if path.parent == SAMPLES else None
        if data is None:
            from .conftest import raw_load
            data = raw_load(path)
        segs = data if isinstance(data, list) else data.get("segments", [])
        traces = [] if isinstance(data, list) else data.get("device_traces") or []
        rows = len(segs) + sum(len(s.get("blocks", [])) for s in segs) + sum(map(len, traces))
        assert rows * MIN_ROW_BYTES * 4 < len(raw) + 4096, path.name


def test_one_frame_repeated_a_million_times_is_one_bounded_stack():
    """A frames list of one dict referenced 10^6 times (2 MB of pickle): validated once,
    the stack cut to its innermost MAX_STACK_FRAMES frames, and the capture says so."""
    from snapana.limits import MAX_STACK_FRAMES

    frames = [FRAMES[0]] * 1_000_000
    cap = from_snapshot_dict(_snap([_segment([_block(BASE, 2 * MiB) | {"frames": frames}])],
                                   [_entry("alloc", BASE, 2 * MiB, 5, frames)]), "deep")
    (stack,) = {cap.stacks.stack(sid) for sid in cap.blocks["stack_id"]}
    assert len(stack) == MAX_STACK_FRAMES and len(cap.stacks.frames) == 1
    assert any(f"deeper than {MAX_STACK_FRAMES} frames" in w for w in cap.warnings)


def test_devices_beyond_one_nodes_are_refused():
    """Each device is a full report: 1,024 devices of one block each (128 KB) would take
    minutes; a capture holds at most MAX_DEVICES (one process sees one node's devices)."""
    from snapana.limits import MAX_DEVICES

    segs = [_segment([_block(BASE, MiB)]) | {"device": d} for d in range(MAX_DEVICES + 1)]
    with pytest.raises(InputError, match=f"more than {MAX_DEVICES} devices"):
        from_snapshot_dict(_snap(segs), "many")
    assert len(from_snapshot_dict(_snap(segs[:MAX_DEVICES]), "ok").devices) == MAX_DEVICES


def test_repeated_addresses_in_a_trace_do_not_multiply_rows():
    """Thousands of distinct allocs at one address (each ends the one before): one live
    block at the end, the report built without a join that multiplies them."""
    from snapana.session import sessions

    n = 3000
    cap = from_snapshot_dict(_snap([_segment([{"address": BASE, "size": 2 * MiB,
                                                "state": "inactive", "frames": []}])],
                                   [_entry("alloc", BASE, 512, i) for i in range(n)]), "rep")
    (s,) = sessions(cap, None)
    r = s.report
    assert r.live_blocks.height <= 1
    assert any("already live" in w for w in r.warnings)
    assert r.allocated_bytes == r.peak_allocated_bytes == 512  # one block at a time


# ----- impossible allocator states ------------------------------------------------------------

def _block(address, size, state="active_allocated"):
    return {"address": address, "size": size, "requested_size": size, "state": state,
            "frames": FRAMES}


@pytest.mark.parametrize("segments,words", [
    ([_segment([_block(BASE, 2 * MiB)]),
      _segment([_block(BASE + MiB, 2 * MiB)], address=BASE + MiB)], r"overlaps segments\[0\]"),
    ([_segment([_block(BASE, MiB), _block(BASE + 512, 512)])], "overlaps the block before"),
    ([_segment([_block(BASE, 512), _block(BASE, 512)])], "overlaps the block before"),
    ([_segment([_block(BASE, 0)])], "of 0 bytes"),
    ([_segment([_block(BASE + 2 * MiB - 256, 512)])], "outside its segment"),
])
def test_impossible_snapshot_states_are_refused(segments, words):
    with pytest.raises(InputError, match=words):
        from_snapshot_dict(_snap(segments), "impossible")


def test_overlapping_segments_are_refused_in_one_line(tmp_path):
    """The 242-byte file of the issue: two segments overlapping in address space."""
    path = tmp_path / "overlap.pickle"
    path.write_bytes(pickle.dumps(_snap([_segment([], size=3 * GiB),
                                         _segment([], address=BASE + GiB, size=GiB)])))
    result = run_cli("summary", str(path))
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and "overlaps" in lines[0], lines


def _trace_only(entries):
    return from_snapshot_dict({"segments": [], "device_traces": [[
        {"stream": 0, "frames": [], **e} for e in entries]]}, "trace-only")


def _report(capture, at=None):
    from snapana.session import sessions

    (s,) = sessions(capture, None, at=at)
    return s.report


def test_segments_a_trace_overlaps_make_cached_figures_not_computable():
    r = _report(_trace_only([
        {"action": "segment_alloc", "addr": BASE, "size": 4 * MiB},
        {"action": "segment_alloc", "addr": BASE + MiB, "size": 4 * MiB},
        {"action": "alloc", "addr": BASE, "size": MiB},
    ]), at="end")
    assert r.cached_unallocated_bytes is None and r.largest_free_block_bytes is None
    assert any("segments overlap" in w and "not computable" in w for w in r.warnings)
    from snapana.render import render
    from snapana.render.views import capture_view

    text = render(capture_view([r], title="x"), "text")
    assert "not computable" in text
    doc = json.loads(render(capture_view([r], title="x"), "json"))
    assert doc["devices"][0]["cached_unallocated_bytes"] is None
    assert not summary_violations(json.dumps(doc))


def test_a_reversed_trace_never_prints_a_negative_figure():
    data = pickle.loads(SAMPLE.read_bytes())
    data["device_traces"] = [list(reversed(t)) for t in data["device_traces"]]
    capture = from_snapshot_dict(data, "reversed")
    from snapana.render import render
    from snapana.render.views import capture_view
    from snapana.session import sessions

    reports = [s.report for s in sessions(capture, None)]
    doc = render(capture_view(reports, title="reversed"), "json")
    assert not summary_violations(doc), summary_violations(doc)
    for r in reports:
        cached = r.cached_unallocated_bytes
        assert cached is None or cached >= 0


def test_one_address_allocated_twice_shows_the_peak_it_counts(tmp_path):
    """The second alloc ends the first (a mismatch, warned): the allocated timeline and the
    blocks at the peak count the same blocks."""
    events = [{"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]", "pid": 1,
               "tid": 1, "ts": 10 * (k + 1),
               "args": {"Device Type": 1, "Device Id": 0, "Addr": BASE, "Bytes": 1024,
                        "Total Allocated": 1024 * (k + 1), "Total Reserved": 2 * MiB}}
              for k in range(2)]
    path = tmp_path / "twice.json"
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": events}))
    result = invoke("summary", str(path), "-f", "json")
    assert result.returncode == 0, result.stderr
    assert not summary_violations(result.stdout), summary_violations(result.stdout)
    dev = json.loads(result.stdout)["devices"][0]
    assert dev["allocated_bytes"] == dev["peak_allocated_bytes"]


def test_a_free_of_another_size_is_flagged():
    r = _report(_trace_only([
        {"action": "segment_alloc", "addr": BASE, "size": 4 * MiB},
        {"action": "alloc", "addr": BASE, "size": MiB},
        {"action": "free_completed", "addr": BASE, "size": 3 * MiB},
    ]))
    assert any("free at 0x40000000 of 3145728 bytes, allocated as 1048576" in w
               for w in r.warnings), r.warnings


def test_time_at_the_int64_minimum_is_dropped_with_a_warning(tmp_path):
    """-2**63 fits the int64 PyTorch writes, so it is no reason to refuse the capture, but it
    is no clock either (polars' abs() wraps there): the time is dropped and said, and the
    report computes nothing on it (no numpy overflow warning on stderr)."""
    snap = _snap([_segment([_block(BASE, 2 * MiB)])], [_entry("alloc", BASE, 2 * MiB, -2**63)])
    capture = from_snapshot_dict(snap, "tmin")
    assert capture.events["time_us"].null_count() == capture.events.height
    assert any("time" in w for w in capture.warnings), capture.warnings
    path = tmp_path / "tmin.pickle"
    path.write_bytes(pickle.dumps(_snap([_segment([_block(BASE, 2 * MiB)])],
                                        [_entry("alloc", BASE, 2 * MiB, -2**63)])))
    run = run_cli("report", str(path), "-o", str(tmp_path / "r.html"))
    assert run.returncode == 0 and "Warning" not in run.stderr, run.stderr


# ----- inert text -----------------------------------------------------------------------------

HOSTILE = "train\ud800\x1b[2J\x1b]52;c;SGVsbG8=\x07\u202e\x9b31m\n.py"


@pytest.fixture(scope="module")
def hostile_snapshot(tmp_path_factory):
    frames = [{"filename": HOSTILE, "line": 10, "name": "step\x1b[31m"}]
    data = _snap([_segment([_block(BASE, 2 * MiB) | {"frames": frames}])],
                 [_entry("alloc", BASE, 2 * MiB, 5, frames),
                  _entry("weird\x1b[2J", BASE, 2 * MiB, 6, frames)],
                 external_annotations=[{"device": 0, "time_us": 5, "stage": "START",
                                        "name": "step\x1b]52;c;QQ==\x07\ud800"}],
                 user_metadata={"k\x1b": "v\ud800"})
    path = tmp_path_factory.mktemp("inert") / "hostile.pickle"
    path.write_bytes(pickle.dumps(data, protocol=4))
    return path


@pytest.mark.parametrize("args", [("summary",), ("summary", "-f", "markdown"),
                                  ("summary", "-f", "json"),
                                  ("explain", "--site", "step"),
                                  ("explain", "--family", "user_tensors")])
def test_strings_from_the_input_reach_the_terminal_inert(hostile_snapshot, args):
    result = run_cli(args[0], str(hostile_snapshot), *args[1:])
    assert result.returncode == 0, result.stderr
    assert not RAW_CONTROL.search(result.stdout + result.stderr)
    if "json" in args:
        json.loads(result.stdout)


def test_the_frame_is_escaped_where_it_is_shown(hostile_snapshot):
    from snapana.sources import load

    cap = load(hostile_snapshot)
    (frame,) = cap.stacks.frames
    assert frame[0] == ("train\\ud800\\x1b[2J\\x1b]52;c;SGVsbG8=\\x07\\u202e\\x9b31m\\x0a.py")
    result = invoke("explain", str(hostile_snapshot), "--site", "step")
    assert "\\x1b[2J" in result.stdout and "\x1b" not in result.stdout


def test_files_written_from_hostile_strings(hostile_snapshot, tmp_path):
    for args in (("report", str(hostile_snapshot), "-o", str(tmp_path / "r.html")),
                 ("export", str(hostile_snapshot), "-o", str(tmp_path / "exp"))):
        result = invoke(*args)
        assert result.returncode == 0, result.stderr
    html = (tmp_path / "r.html").read_text(encoding="utf-8")
    assert "\x1b" not in html and "\ud800" not in html
    assert invoke("summary", str(tmp_path / "exp"), "-f", "json").returncode == 0


def test_the_atomic_writer_escapes_unpaired_surrogates(tmp_path):
    from snapana.io.output import write_atomic

    write_atomic(tmp_path / "x.txt", "a\ud800b")
    assert (tmp_path / "x.txt").read_bytes() == b"a\\ud800b"


def test_an_error_line_quoting_the_input_is_inert(tmp_path):
    path = tmp_path / "bad.pickle"
    path.write_bytes(pickle.dumps(_snap([_segment([_block(BASE, 512) | {
        "state": "x" * 300 + "\x1b[2J"}])])))
    result = run_cli("summary", str(path))
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1
    assert not RAW_CONTROL.search(result.stderr)


# ----- command-line values --------------------------------------------------------------------

@pytest.mark.parametrize("args", [
    ("--at", "event:²"), ("--at", "event:--1"), ("--at", "time:99999999999999999999"),
    ("--at", "time:١٢"), ("--at", "event:1_0"), ("--at", "event: 1"),
    ("--at", "time:-9223372036854775808"), ("--at", "event:\x1b[2J"),
    ("--capacity", "9" * 5000 + "GiB"), ("--capacity", "٨٠GiB"), ("--capacity", "80GiB\x1b"),
    ("--device", "١"), ("--device", "--1"), ("--device", "9" * 5000), ("--device", "0x1"),
])
def test_command_line_values_have_one_strict_parser(args):
    result = invoke("summary", str(SAMPLE), "-f", "json", *args)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, result.stdout[:300]
    assert len(lines) == 1 and lines[0].startswith("snapana: error: "), lines
    assert len(lines[0]) < 300 and not RAW_CONTROL.search(lines[0])


def test_arabic_digits_are_not_read_as_a_time():
    """`int()` reads '١٢' as 12; the command line's parser takes ASCII digits only."""
    from snapana.units import parse_int

    with pytest.raises(ValueError, match="not an integer"):
        parse_int("١٢", "--at time:", 0, 100)
    assert parse_int("-12", "x", -100, 100) == -12 and parse_int("+3", "x", 0, 3) == 3


@pytest.mark.parametrize("args", [("explain", str(SAMPLE), "--block", "١٢"),
                                  ("report", str(SAMPLE), str(SAMPLE), "--rank", "²"),
                                  ("summary", str(SAMPLE), str(SAMPLE), "--workers", "0")])
def test_count_options_refuse_in_one_line(args, tmp_path):
    result = invoke(*args, "-o", str(tmp_path / "o.html")) if args[0] == "report" \
        else invoke(*args)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, lines


# ----- outputs are regular files or folders ---------------------------------------------------

def _chardev(path):
    """A copy of /dev/null where this user may mknod; a link to it elsewhere."""
    try:
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    except PermissionError:
        os.symlink(os.devnull, path)


def _socket(path):
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(path))
    s.close()


@pytest.mark.parametrize("make", ["fifo", "chardev", "socket", "devnull", "stdout"])
def test_an_output_that_is_not_a_regular_file_is_refused(tmp_path, make):
    out = tmp_path / "out.html"
    {"fifo": os.mkfifo, "chardev": _chardev, "socket": _socket,
     "devnull": lambda p: os.symlink(os.devnull, p),
     "stdout": lambda p: os.symlink("/proc/self/fd/1", p)}[make](out)
    before = (os.lstat(out).st_mode, os.lstat(out).st_ino)
    # stdout of the process is a pipe here: /proc/self/fd/1 leads to a FIFO
    result = run_cli("report", str(SAMPLE), "-o", str(out))
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    assert "not a regular file" in lines[0]
    assert (os.lstat(out).st_mode, os.lstat(out).st_ino) == before


def test_diff_and_synth_outputs_are_checked_too(tmp_path):
    out = tmp_path / "node"
    os.mkfifo(out)
    for args in (("diff", str(SAMPLE), str(SAMPLE), "-o", str(out)),
                 ("synth", "--entries", "1000", "-o", str(out))):
        result = invoke(*args)
        assert result.returncode == 2, result.stdout[-500:]
        assert stat.S_ISFIFO(os.lstat(out).st_mode)


def test_the_repository_is_untouched():
    """The tests above write only under their tmp_path."""
    assert not list(ROOT.glob("out.html"))


def test_a_profilers_device_name_reaches_html_inert(tmp_path):
    """A kineto trace's GPU name (deviceProperties) is shown in the HTML's device switch and
    headings: `summary -f html` prints that page to a terminal, so an escape sequence in
    the name must arrive escaped there and in the report file (a fuzz finding)."""
    osc = "\x1b]52;c;SGVsbG8gY2xpcGJvYXJk\x07"
    events = [{"ph": "i", "s": "t", "cat": "cpu_instant_event", "name": "[memory]", "pid": 1,
               "tid": 1, "ts": 10 + k, "args": {"Device Type": 1, "Device Id": 0,
                                                 "Bytes": 4096, "Addr": 0x1000 * (k + 1),
                                                 "Total Allocated": 4096 * (k + 1),
                                                 "Total Reserved": 1 << 20}}
              for k in range(4)]
    trace = {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": f"GPU {osc}",
                                                       "totalGlobalMem": 1 << 34}],
             "traceEvents": events}
    path = tmp_path / "trace.json"
    path.write_text(json.dumps(trace))
    page = run_cli("summary", str(path), "-f", "html")
    assert page.returncode == 0, page.stderr
    assert "GPU" in page.stdout and "\\x1b]52" in page.stdout
    assert not RAW_CONTROL.search(page.stdout + page.stderr)
    report = run_cli("report", str(path), "-o", str(tmp_path / "r.html"))
    assert report.returncode == 0, report.stderr
    assert not RAW_CONTROL.search((tmp_path / "r.html").read_text(encoding="utf-8"))
