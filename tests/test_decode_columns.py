"""The trace columns the bounded child hands back (`torch_snapshot.load`) are the capture the
entry-by-entry path builds from an independent decode, and a value that path refuses is
still refused, naming the entry."""

from __future__ import annotations

import gc
import gzip
import mmap
import os
import pickle

import pytest
from snapana.errors import InputError
from snapana.sources import pickle_child, snapshot_decode, torch_snapshot
from snapana.sources.torch_snapshot import from_snapshot_dict, load

from .conftest import raw_load


@pytest.fixture(autouse=True, params=["whole", "split", "scan"])
def _split(request, monkeypatch):
    """Every test three times: the child making all columns itself, forking a process for
    the numbers from the first entry on (what it does from `SPLIT_ENTRIES` entries on), and
    reading the entries from the bytes (`pickle_scan`, from `SCAN_ENTRIES` entries on)."""
    monkeypatch.setattr(pickle_child, "SPLIT_ENTRIES",
                        0 if request.param == "split" else 1 << 62)
    monkeypatch.setenv("SNAPANA_SCAN_ENTRIES", "0" if request.param == "scan" else "")


def _snapshot() -> dict:
    frames_a = [{"filename": "train.py", "name": "step", "line": 10}]
    frames_b = [frames_a[0], {"filename": "model.py", "name": "forward", "line": 3}]
    seg = {"device": 1, "address": 4096, "total_size": 8192, "stream": 0,
           "segment_type": "large", "blocks": [
               {"address": 4096, "size": 1024, "state": "active_allocated",
                "requested_size": 1000, "frames": frames_b},
               {"address": 5120, "size": 7168, "state": "inactive"}]}
    trace = [
        {"action": "segment_alloc", "addr": 4096, "size": 8192, "stream": 0, "time_us": 1},
        {"action": "alloc", "addr": 4096, "size": 1024, "stream": 0, "time_us": 2,
         "frames": frames_a},
        {"action": "free_requested", "addr": 4096, "size": 1024, "stream": None,
         "time_us": None, "frames": frames_a},
        {"action": None, "addr": 4096, "size": 1024, "time_us": 4, "frames": []},
        {"action": "alloc", "addr": 4096, "size": 1024, "stream": 7, "time_us": 5,
         "frames": frames_b},
        {"action": "oom", "size": 1 << 20, "device_free": 0, "stream": 0, "time_us": 6},
        {"action": "made_up", "addr": 4096, "size": 1, "frames": None},
    ]
    return {"segments": [seg], "device_traces": [[], trace],
            "allocator_settings": {"expandable_segments": False}}


def _same(a, b) -> None:
    assert a.events.equals(b.events)
    assert a.blocks.equals(b.blocks) and a.segments.equals(b.segments)
    assert a.stacks.stacks == b.stacks.stacks and a.stacks.frames == b.stacks.frames
    assert a.warnings == b.warnings and a.devices == b.devices
    assert a.has_time == b.has_time and a.allocator_settings == b.allocator_settings


@pytest.mark.parametrize("compress", [False, True])
def test_columns_equal_the_entry_path(tmp_path, compress):
    path = tmp_path / "s.pickle"
    body = pickle.dumps(_snapshot(), protocol=4)
    path.write_bytes(gzip.compress(body) if compress else body)
    assert torch_snapshot._load_columns(path, None) is not None  # the one-decode path ran
    _same(load(path), from_snapshot_dict(raw_load(path), str(path)))


@pytest.mark.parametrize(("field", "value", "named"), [
    ("device_free", -(1 << 63), "device_traces[1][1].device_free"),  # the child's null marker
    ("size", True, "device_traces[1][1].size"),
    ("addr", False, "device_traces[1][1].addr"),  # a bool among ints, read as 0 by array()
    ("time_us", True, "device_traces[1][1].time_us"),
    ("addr", 1 << 62, "device_traces[1][1].addr"),
    ("action", "x" * 300, "device_traces[1][1].action"),
    ("frames", [{"filename": 3}], "device_traces[1][1].frames[0].filename"),
])
def test_values_the_entry_path_refuses_are_refused(tmp_path, field, value, named):
    data = _snapshot()
    data["device_traces"][1][1][field] = value
    path = tmp_path / "s.pickle"
    path.write_bytes(pickle.dumps(data, protocol=4))
    with pytest.raises(InputError, match=named.replace("[", r"\[").replace("]", r"\]")):
        load(path)


def test_a_time_out_of_range_is_dropped_alike_on_both_paths(tmp_path):
    """A trace time PyTorch can write (an int64) but outside ±2**62 is no clock: both paths
    drop it with a warning rather than refuse the capture (int64's minimum included, where
    polars' abs() wraps)."""
    data = _snapshot()
    data["device_traces"][1][1]["time_us"] = -(1 << 63)
    path = tmp_path / "s.pickle"
    path.write_bytes(pickle.dumps(data, protocol=4))
    got = load(path)
    _same(got, from_snapshot_dict(raw_load(path), str(path)))
    plain = from_snapshot_dict(_snapshot(), "plain")
    assert got.events["time_us"].null_count() == plain.events["time_us"].null_count() + 1
    assert len(got.warnings) == len(plain.warnings) + 1  # one more: the time dropped


def test_float_times_take_the_entry_path_and_read_alike(tmp_path):
    data = _snapshot()
    data["device_traces"][1][1]["time_us"] = 2.5
    path = tmp_path / "s.pickle"
    path.write_bytes(pickle.dumps(data, protocol=4))
    assert torch_snapshot._load_columns(path, None) is None
    _same(load(path), from_snapshot_dict(raw_load(path), str(path)))


def _full_entries() -> dict:
    """Every entry has every key and an int in each: the child's one-pass column path."""
    frames = [{"filename": "train.py", "name": "step", "line": 10}]
    trace = [{"action": "alloc", "addr": 4096 * (k + 1), "size": 512 * (k + 1),
              "stream": k % 2, "time_us": 10 + k, "frames": frames} for k in range(6)]
    return {"segments": [], "device_traces": [trace]}


@pytest.mark.parametrize("field", ["addr", "size", "stream", "time_us"])
@pytest.mark.parametrize("value", [True, False])
def test_a_bool_in_a_full_column_is_refused(tmp_path, field, value):
    """array() reads a bool as 0 or 1: the child must still see it among plain ints."""
    data = _full_entries()
    data["device_traces"][0][3][field] = value
    path = tmp_path / "s.pickle"
    path.write_bytes(pickle.dumps(data, protocol=4))
    with pytest.raises(InputError, match=rf"device_traces\[0\]\[3\]\.{field}"):
        load(path)


def test_full_columns_with_zeros_and_ones_equal_the_entry_path(tmp_path):
    """Genuine 0 and 1 values (stream 0/1, an address 1 would be refused elsewhere) read as
    the entry-by-entry path reads them."""
    data = _full_entries()
    data["device_traces"][0][2]["time_us"] = 1
    data["device_traces"][0][4]["time_us"] = 0
    path = tmp_path / "s.pickle"
    path.write_bytes(pickle.dumps(data, protocol=4))
    assert torch_snapshot._load_columns(path, None) is not None
    _same(load(path), from_snapshot_dict(raw_load(path), str(path)))


@pytest.mark.parametrize("extra", [None, "compile_context"])
def test_device_free_among_full_entries_is_read(tmp_path, extra):
    """Entries with the six usual keys and, on one, `device_free` (and on another, maybe a
    key snapana does not read): the child finds it although every entry has the usual keys."""
    data = _full_entries()
    data["device_traces"][0][4]["device_free"] = 123 * 512
    if extra:
        data["device_traces"][0][1][extra] = "x"
    path = tmp_path / "s.pickle"
    path.write_bytes(pickle.dumps(data, protocol=4))
    assert torch_snapshot._load_columns(path, None) is not None
    got = load(path)
    _same(got, from_snapshot_dict(raw_load(path), str(path)))
    assert got.events["device_free"].drop_nulls().to_list() == [123 * 512]


@pytest.mark.parametrize("distinct", [256, 257])
def test_many_distinct_actions_read_alike(tmp_path, distinct):
    """Up to 256 distinct action strings travel as a byte per entry, more as int32: both
    read as the entry-by-entry path reads them (made-up actions are kept, not guessed)."""
    data = _full_entries()
    entry = data["device_traces"][0][0]
    data["device_traces"][0] = [{**entry, "action": f"made_up_{k}", "addr": 4096 * (k + 1)}
                                for k in range(distinct)]
    path = tmp_path / "s.pickle"
    path.write_bytes(pickle.dumps(data, protocol=4))
    assert torch_snapshot._load_columns(path, None) is not None
    got = load(path)
    _same(got, from_snapshot_dict(raw_load(path), str(path)))
    assert got.events["action"].n_unique() == distinct


def test_equal_frame_lists_that_are_distinct_objects_read_alike(tmp_path):
    """The child keys a stack by the frame list object; equal lists pickled apart (no memo)
    are still one stack once interned, as on the entry-by-entry path."""
    data = _full_entries()
    for k, entry in enumerate(data["device_traces"][0]):
        entry["frames"] = [{"filename": "train.py", "name": "step", "line": 10 + k % 2}]
    path = tmp_path / "s.pickle"
    path.write_bytes(pickle.dumps(data, protocol=4))
    assert torch_snapshot._load_columns(path, None) is not None
    got = load(path)
    _same(got, from_snapshot_dict(raw_load(path), str(path)))
    assert got.events["stack_id"].n_unique() == 2


def _pytorch_layout() -> dict:
    """A trace as PyTorch pickles it: a new frame list per entry (one per captured
    traceback) of shared frame dicts. Five stacks are alike in length and in most frames
    and differ at one; one is a copy of another with frame dicts equal but not the same
    objects; some entries have an empty list, or none."""
    frame = [{"filename": f"f{k}.py", "name": f"fn{k}", "line": k} for k in range(12)]
    base = frame[:8]
    stacks = [base, base[:5] + [frame[9]] + base[6:], base[:7] + [frame[10]],
              base[:3] + [frame[11]] + base[4:], [frame[11]] + base[1:], frame[2:6],
              [dict(f) for f in base], [], None]
    data = _full_entries()
    entry = data["device_traces"][0][0]
    trace = []
    for k in range(630):
        stack = stacks[(k * 7) % len(stacks)]
        trace.append({**entry, "addr": 4096 * (k + 1),
                      "frames": None if stack is None else list(stack)})
    data["device_traces"][0] = trace
    return data


def test_a_new_frame_list_per_entry_goes_to_the_parent_once_per_stack(tmp_path):
    """PyTorch writes a list per entry: the child sends each stack once (the first list of
    the same frame dicts, the very objects, in the same order), and the capture is the
    entry-by-entry path's. The copy of a stack (equal dicts, other objects) goes apart and
    is interned as the same stack."""
    data = _pytorch_layout()
    path = tmp_path / "s.pickle"
    path.write_bytes(pickle.dumps(data, protocol=4))
    got = torch_snapshot._load_columns(path, None)
    assert got is not None
    sent = got[1][0].frames
    firsts: dict = {}  # the first list of each sequence of frame objects, the plain way
    for entry in data["device_traces"][0]:
        frames = entry["frames"]
        firsts.setdefault(None if frames is None else tuple(map(id, frames)), frames)
    assert len(sent) == len(firsts) == 9
    assert sent == list(firsts.values())
    capture = load(path)
    _same(capture, from_snapshot_dict(raw_load(path), str(path)))
    assert capture.events["stack_id"].n_unique() == 7  # the copy is its original's stack


def test_lists_alike_but_all_different_stay_apart(tmp_path):
    """Frame lists the child's first guess cannot tell apart: the entries it samples (the
    first 4,096) all hold one stack, so no place in a list tells stacks apart there; 200
    entries after them hold stacks alike in length and in all but one frame, all
    different. A round that matches too few ends the search, and every stack still reaches
    the parent as it is; the entries hold a list each, none empty (as PyTorch writes
    them)."""
    frame = [{"filename": f"f{k}.py", "name": f"fn{k}", "line": k} for k in range(300)]
    data = _full_entries()
    entry = data["device_traces"][0][0]
    data["device_traces"][0] = [
        {**entry, "addr": 4096 * (k + 1), "frames": frame[:8]} for k in range(4096)] + [
        {**entry, "addr": 4096 * (k + 4097), "frames": frame[:5] + [frame[10 + k]] + frame[6:8]}
        for k in range(200)]
    path = tmp_path / "s.pickle"
    path.write_bytes(pickle.dumps(data, protocol=4))
    raw = raw_load(path)
    assert len({id(e["frames"]) for e in raw["device_traces"][0]}) == 4296  # a list each
    got = torch_snapshot._load_columns(path, None)
    assert got is not None and len(got[1][0].frames) == 201
    capture = load(path)
    _same(capture, from_snapshot_dict(raw, str(path)))
    assert capture.events["stack_id"].n_unique() == 201


def _open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc (Linux)")
def test_columns_come_through_a_mapped_file_and_no_descriptor_is_left(tmp_path):
    """On POSIX the child writes its columns to an anonymous file the parent maps (not a
    pipe); the file is closed once the columns are read, and when the child is killed or
    never taken."""
    path = tmp_path / "s.pickle"
    path.write_bytes(pickle.dumps(_snapshot(), protocol=4))
    expected = from_snapshot_dict(raw_load(path), str(path))  # polars' own threads start
    before = _open_fds()
    got = snapshot_decode._decode_in_child(path, path.stat().st_size, False, columns=True)
    assert got is not None and isinstance(got[1], mmap.mmap)
    del got
    gc.collect()
    assert _open_fds() == before
    _same(load(path), expected)
    assert _open_fds() == before
    child = pickle_child.start(path, path.stat().st_size, False, True)
    assert child.fd is not None
    child.kill()
    assert _open_fds() == before
    pickle_child.start_early(path)
    pickle_child._end_untaken()
    assert _open_fds() == before


def test_columns_on_stdout_where_no_file_can_be_passed(tmp_path, monkeypatch):
    """Where no anonymous file can be made (not POSIX), the columns follow the reply on the
    child's stdout and read the same."""
    monkeypatch.setattr(pickle_child, "payload_file", lambda: None)
    path = tmp_path / "s.pickle"
    path.write_bytes(pickle.dumps(_snapshot(), protocol=4))
    got = snapshot_decode._decode_in_child(path, path.stat().st_size, False, columns=True)
    assert got is not None and isinstance(got[1], memoryview)
    _same(load(path), from_snapshot_dict(raw_load(path), str(path)))


def _child_running(monkeypatch, tmp_path, script: str) -> pickle_child.Child:
    monkeypatch.setattr(pickle_child, "CHILD", script)
    path = tmp_path / "s.pickle"
    path.write_bytes(pickle.dumps(_snapshot(), protocol=4))
    return pickle_child.start(path, path.stat().st_size, False, True)


def test_a_child_that_closed_its_output_after_a_whole_reply_is_taken_before_it_exits(
        monkeypatch, tmp_path):
    """The child closes its output once its reply line is whole: the parent takes it then,
    not after the child's exit (which frees gigabytes of decoded trace first)."""
    child = _child_running(monkeypatch, tmp_path, (
        "import os, sys, time; sys.stdout.write('{\"ok\": true}\\n'); sys.stdout.flush(); "
        "os.close(1); os.close(2); time.sleep(60)"))
    try:
        status, out = child.wait()
        assert (status, out) == (0, b'{"ok": true}\n')
        assert child.proc.poll() is None  # still there: its exit is not waited for
    finally:
        child.kill()


def test_a_child_that_dies_mid_reply_is_a_crash(monkeypatch, tmp_path):
    """Output that stops short of a whole line: the parent waits for the exit and says how
    the child ended."""
    child = _child_running(monkeypatch, tmp_path, (
        "import os, signal, sys; sys.stdout.write('{\"ok\": true'); sys.stdout.flush(); "
        "os.kill(os.getpid(), signal.SIGSEGV)"))
    status, out = child.wait()
    assert status == -11 and out == b'{"ok": true'
    with pytest.raises(InputError, match="signal 11"):  # the same child, under `load`
        load(tmp_path / "s.pickle")


def test_a_reply_on_stdout_with_the_payload_is_taken_at_the_exit(monkeypatch, tmp_path):
    """Without a payload file the columns follow the reply on stdout, where a whole line
    proves nothing (the payload may end in a newline by chance): the exit is waited for."""
    monkeypatch.setattr(pickle_child, "payload_file", lambda: None)
    child = _child_running(monkeypatch, tmp_path, (
        "import os, sys, time; sys.stdout.write('{\"ok\": true}\\n'); sys.stdout.flush(); "
        "os.close(1); os.close(2); time.sleep(1); os._exit(3)"))
    assert child.wait() == (3, b'{"ok": true}\n')


@pytest.mark.parametrize("raw, expected", [
    ("0", 0), ("250000", 250_000), (" 7 ", 7), ("", None), ("-1", None), ("1e6", None),
    ("²", None), ("9" * 5000, None)])
def test_the_split_threshold_comes_from_the_environment_when_whole(monkeypatch, raw,
                                                                   expected):
    """SNAPANA_SPLIT_ENTRIES sets from how many entries the child forks (0: always, as a
    fuzzing campaign runs it); anything but a whole number leaves the default."""
    monkeypatch.setenv("SNAPANA_SPLIT_ENTRIES", raw)
    default = pickle_child.SPLIT_ENTRIES
    assert pickle_child.split_entries() == (default if expected is None else expected)
