"""Trace entries read from a snapshot pickle's bytes (`pickle_scan`) are the entries the
unpickler makes: every column equals the one read from an independent decode of the same
file; and a file that reader does not take, or takes only in part, loads exactly as it
loads without it (the same capture, or the same refusal)."""

from __future__ import annotations

import io
import json
import pickle
from pathlib import Path

import numpy as np
import pytest
from snapana.errors import InputError
from snapana.sources import pickle_child, pickle_scan, torch_snapshot
from snapana.sources.snapshot_decode import _RestrictedUnpickler
from snapana.sources.torch_snapshot import from_snapshot_dict, load
from snapana.synth.scale import scale_snapshot

from .conftest import ROOT, SNAPSHOTS, raw_load
from .test_decode_columns import _same

NULL = -(1 << 63)
SAMPLES = sorted((ROOT / "sample_snapshots").glob("*.pickle"))
CORPUS = sorted(SNAPSHOTS.glob("*")) if SNAPSHOTS.is_dir() else []


def _numbers(entries: list[dict], name: str) -> list[int]:
    """A number column as the decode child writes it, read from decoded entries: None (or
    no such key) as NULL in time_us and device_free, else as 0."""
    empty = NULL if name in ("time_us", "device_free") else 0
    return [empty if e.get(name) is None else e[name] for e in entries]


def _others(entries: list[dict], n: int, name: str) -> np.ndarray:
    return np.array(_numbers(entries, name), np.int64)


def _check_scan(buf: bytes, truth: dict) -> bool:
    """Whether `scan` takes `buf`; where it does, every trace read back equals `truth`'s."""
    plan = pickle_scan.scan(io.BytesIO(buf), len(buf), 0)
    if plan is None:
        return False
    got = plan.traces(_RestrictedUnpickler(io.BytesIO(plan.stream)).load())
    assert got is not None
    data, traces = got
    assert {k: v for k, v in data.items() if k != "device_traces"} == {
        k: v for k, v in truth.items() if k != "device_traces"}
    assert len(traces) == len(truth["device_traces"])
    for trace, entries in zip(traces, truth["device_traces"], strict=True):
        if isinstance(trace, list):
            assert trace == entries
            continue
        assert len(trace) == len(entries) and trace.plain()
        actions = [e.get("action", "") for e in entries]
        table, codes = trace.distinct("action", "")
        assert table == list(dict.fromkeys(actions))
        assert [table[c] for c in codes.tolist()] == actions
        assert trace.column("frames", None) == [e.get("frames") for e in entries]
        keys, places, stacks = trace.first_places("frames")
        # entries that share a frame list object in the independent decode share it here
        first: dict[int, int] = {}
        expect = [first.setdefault(id(e.get("frames")), i) for i, e in enumerate(entries)]
        assert keys.tolist() == expect and places == list(first.values())
        assert stacks == [entries[p].get("frames") for p in places]
        for name in ("addr", "size", "stream", "time_us", "device_free"):
            assert list(trace.column_of(name, _others)) == _numbers(entries, name)
    return True


@pytest.fixture
def _unbudgeted(monkeypatch):
    """The walk over opcodes outside entries without its budget (which keeps the reader
    off files where it would cost more than the unpickler, not a matter of what it reads):
    real captures that mix entries it takes with entries it leaves are read in full."""
    monkeypatch.setattr(pickle_scan, "WALK_FREE", 1 << 40)


@pytest.mark.parametrize("path", CORPUS + SAMPLES, ids=lambda p: p.name)
def test_entries_read_from_the_bytes_equal_an_independent_decode(path, _unbudgeted):
    buf = path.read_bytes()
    _check_scan(buf, raw_load(path))


def test_the_corpus_and_samples_are_read_in_part_at_least(_unbudgeted):
    """Real captures mix entries this reader takes (a frame list shared by reference) with
    ones it leaves to the unpickler (a new frame list): most files have both."""
    taken = [p for p in CORPUS + SAMPLES if _takes(p.read_bytes())]
    assert len(taken) >= len(SAMPLES) + (12 if CORPUS else 0)


def _takes(buf: bytes, limit: int | None = None) -> bool:
    return pickle_scan.scan(io.BytesIO(buf), len(buf) if limit is None else limit,
                            0) is not None


def test_a_long_string_written_outside_the_frames_or_a_file_past_its_limit_is_left_whole():
    """CPython writes a string of 64 KB or more outside protocol 4's frames: this reader
    takes only framed pickles, and reads no more than the child's limit."""
    data = scale_snapshot(2000, seed=1)
    framed = pickle.dumps(data, protocol=4)
    assert _takes(framed) and not _takes(framed, len(framed) - 1)
    data["note"] = "x" * (1 << 16)
    assert not _takes(pickle.dumps(data, protocol=4))


@pytest.mark.parametrize("list_per_entry", [False, True])
@pytest.mark.parametrize("protocol", [2, 4, 5])
def test_synthesized_traces_read_alike(list_per_entry, protocol):
    data = scale_snapshot(3000, seed=3, list_per_entry=list_per_entry)
    buf = pickle.dumps(data, protocol=protocol)
    taken = _check_scan(buf, pickle.loads(buf))
    # shared frame lists in protocol 4 and 5: read; protocol 2 (BINPUT) is left whole
    assert taken == (protocol >= 4 and not list_per_entry)


# ---- handmade pickles: what the reader must leave alone, or read exactly ----------------

class _Asm:
    """A protocol 4 pickle written opcode by opcode (one frame), with its memo counted."""

    def __init__(self) -> None:
        self.out = bytearray()
        self.memo = 0

    def op(self, raw: bytes) -> _Asm:
        self.out += raw
        return self

    def memoize(self) -> int:
        self.out += b"\x94"
        self.memo += 1
        return self.memo - 1

    def text(self, s: str) -> int:
        raw = s.encode()
        self.out += b"\x8c" + bytes([len(raw)]) + raw
        return self.memoize()

    def get(self, i: int) -> _Asm:
        return self.op(b"h" + bytes([i]) if i < 256 else b"j" + i.to_bytes(4, "little"))

    def int(self, v: int) -> _Asm:
        if 0 <= v < 256:
            return self.op(b"K" + bytes([v]))
        raw = v.to_bytes((v.bit_length() + 8) // 8, "little", signed=True)
        return self.op(b"\x8a" + bytes([len(raw)]) + raw)

    def pickle(self) -> bytes:
        body = bytes(self.out) + b"."
        return b"\x80\x04\x95" + len(body).to_bytes(8, "little") + body


KEYS = ("action", "addr", "size", "stream", "time_us", "frames", "device_free")


def _handmade(change: str) -> bytes:
    """A snapshot of one trace of 40 entries, written as PyTorch's pickler writes shared
    frame lists, with `change` made to it."""
    a = _Asm()
    a.op(b"}").memoize()
    a.op(b"(")
    a.text("names")
    a.op(b"]").memoize()
    a.op(b"(")
    k = {name: a.text(name) for name in KEYS}
    acts = {name: a.text(name) for name in ("alloc", "free_completed", "oom")}
    a.op(b"e")
    a.text("frames_table")
    a.op(b"]").memoize()
    a.op(b"(")
    stack = a.op(b"]").memoize()
    a.op(b"(}").memoize()
    a.op(b"(")
    a.text("filename")
    a.text("train.py")
    a.text("line")
    a.int(7)
    a.op(b"ue")
    a.op(b"e")
    seven = None
    if change == "ref_to_int_value":
        a.text("seven")
        a.int(7)
        seven = a.memoize()
    a.text("segments")
    a.op(b"]").memoize()
    if change == "walk_budget":  # opcodes the walk takes one by one, past its budget
        a.op(b"}0" * (1 << 17))
    a.text("device_traces")
    a.op(b"]").memoize()
    a.op(b"(]")
    trace = a.memoize()
    a.op(b"(")
    first = last = None
    for i in range(40):
        a.op(b"}")
        slot = a.memoize()
        first = slot if first is None else first
        a.op(b"(")
        addr = 0x7F0000000000 + 4096 * i
        if change == "payload_lookalike" and i % 3 == 0:
            addr = int.from_bytes(b"\x00}\x94(\x00\x7f", "little")
        pairs: list[tuple[str, object]] = [
            ("action", acts["alloc" if i % 2 == 0 else "free_completed"]), ("addr", addr),
            ("size", 512 * (i + 1)), ("stream", 0), ("time_us", 1000 + i), ("frames", stack)]
        if i == 17:
            if change == "dup_keys":
                pairs.append(("addr", 12345))
            elif change == "odd_setitems":
                pairs = pairs[:-1] + [("frames", None)]
            elif change == "long9":
                pairs[1] = ("addr", 1 << 70)
            elif change == "null_time":
                pairs[4] = ("time_us", NULL)
            elif change == "none_values":
                pairs[3], pairs[4] = ("stream", None), ("time_us", None)
            elif change == "bool_value":
                pairs[3] = ("stream", True)
            elif change == "device_free":
                pairs[0] = ("action", acts["oom"])
                pairs.append(("device_free", 1 << 33))
            elif change == "ref_to_int_value":
                pairs[3] = ("stream", ("ref", seven))
            elif change == "forward_ref":
                pairs[5] = ("frames", ("ref", a.memo + 500))
            elif change == "many_pairs":
                pairs += [("stream", 0)] * 20
            elif change == "fake_entry_at_frame":  # its bytes hold `}` MEMOIZE MARK SETITEMS
                pairs[4] = ("time_us", int.from_bytes(b"\x01\x02\x03}\x94(u", "little"))
            elif change == "negative_size":
                pairs[2] = ("size", -512)
        for name, value in pairs:
            a.get(k[name])
            if name in ("action", "frames") and isinstance(value, int):
                a.get(value)
            elif value is None:
                a.op(b"N")
            elif value is True:
                a.op(b"\x88")
            elif isinstance(value, tuple):
                a.get(value[1])
            else:
                a.int(value)
        if change == "odd_setitems" and i == 17:
            a.get(k["stream"])  # a key with no value
        a.op(b"u")
        if change == "entries_apart":
            a.op(b"N0")  # None pushed and popped: each entry a run of its own
        if change == "memoized_entry" and i == 39:
            last = a.memoize()  # the last entry memoized a second time, referenced below
    if change == "append_after_run":
        a.op(b"a")  # the last entry appended to the one before: a dict, no list
    a.op(b"e")  # the trace's entries
    a.op(b"e")  # the traces
    if change == "ref_into_entry":
        a.text("copied")
        a.get(first)
    if change in ("trace_referenced", "snapshot_referenced", "memoized_entry"):
        a.text("user_metadata")
        a.op(b"}").memoize()
        a.text("what")
        a.get({"trace_referenced": trace, "snapshot_referenced": 0,
               "memoized_entry": last}[change])
        a.op(b"s")
    if change == "entries_elsewhere":
        a.text("other")
        a.op(b"](")
        for i in range(3):
            a.op(b"}").memoize()
            a.op(b"(").get(k["action"]).get(acts["alloc"]).get(k["addr"]).int(i).op(b"u")
        a.op(b"e")
    a.op(b"u")
    raw = a.pickle()
    if change == "truncated":
        raw = raw[:-40]
    if change in ("frame_inside_opcode", "fake_entry_at_frame"):
        # a second frame from the middle of an address, or of a time where its bytes read
        # as an entry of their own
        body = raw[11:]
        cut = (body.index(b"}\x94(u") if change == "fake_entry_at_frame"
               else body.index(b"\x8a\x06") + 3)
        raw = b"".join([b"\x80\x04", b"\x95", cut.to_bytes(8, "little"), body[:cut], b"\x95",
                        (len(body) - cut).to_bytes(8, "little"), body[cut:]])
    return raw


def _load_or_refusal(path: Path, scan: bool, monkeypatch) -> object:
    monkeypatch.setenv("SNAPANA_SCAN_ENTRIES", "0" if scan else str(1 << 62))
    try:
        return load(path)
    except InputError as exc:
        return str(exc)


def _scanned(path: Path, monkeypatch) -> bool:
    """Whether the decode child read the entries from the bytes (its reply says so)."""
    monkeypatch.setenv("SNAPANA_SCAN_ENTRIES", "0")
    child = pickle_child.start(path, path.stat().st_size, False, True)
    _, out = child.wait()
    return bool(json.loads(out.split(b"\n")[0]).get("scanned"))


@pytest.mark.parametrize(("change", "scanned"), [
    ("none", True),
    ("payload_lookalike", True),  # an address holding the bytes an entry starts with
    ("dup_keys", True),  # the last value of a key repeated, as a dict keeps
    ("none_values", True),
    ("device_free", True),
    # not plain (past int64, a bool, int64's minimum as a time, a number by reference): the
    # child decodes the file whole, under its memory limit, and judges it as before
    ("long9", False),
    ("bool_value", False),
    ("null_time", False),
    ("ref_to_int_value", False),
    ("many_pairs", True),
    ("odd_setitems", False),  # a key with no value: the unpickler's error, as before
    ("forward_ref", False),  # a reference to a slot not yet filled
    ("ref_into_entry", False),  # an entry's dict referenced from elsewhere
    ("entries_elsewhere", False),  # entry-like dicts outside a trace: decoded whole
    # found by review: what takes a number of stack items after a run, and anything that
    # references the runs' places from elsewhere, reads as in the file: decoded whole
    ("append_after_run", False),
    ("trace_referenced", False),
    ("snapshot_referenced", False),
    ("memoized_entry", False),
    ("frame_inside_opcode", False),  # the unpickler reads that frame's header as data
    ("walk_budget", False),
    ("fake_entry_at_frame", False),  # a second review's: refused by the unpickler alike
    ("negative_size", True),
    ("truncated", False),
])
def test_handmade_pickles_load_as_without_the_reader(tmp_path, monkeypatch, change,
                                                     scanned):
    path = tmp_path / f"{change}.pickle"
    path.write_bytes(_handmade(change))
    with_scan = _load_or_refusal(path, True, monkeypatch)
    without = _load_or_refusal(path, False, monkeypatch)
    if isinstance(without, str):
        assert with_scan == without
    else:
        _same(with_scan, without)
        _same(with_scan, from_snapshot_dict(raw_load(path), str(path)))
    assert _scanned(path, monkeypatch) == scanned


@pytest.mark.parametrize("path", SAMPLES[:3] + CORPUS[:4], ids=lambda p: p.name)
def test_loading_through_the_reader_equals_the_entry_path(path, monkeypatch):
    monkeypatch.setenv("SNAPANA_SCAN_ENTRIES", "0")
    _same(load(path), from_snapshot_dict(raw_load(path), str(path)))


@pytest.mark.parametrize("raw, expected", [
    ("", None), ("0", 0), ("250000", 250000), ("x", None), ("-1", None), ("9" * 5000, None)])
def test_the_scan_threshold_comes_from_the_environment(monkeypatch, raw, expected):
    monkeypatch.setenv("SNAPANA_SCAN_ENTRIES", raw)
    default = pickle_child.SCAN_ENTRIES
    assert pickle_child.scan_entries() == (default if expected is None else expected)


@pytest.mark.parametrize("list_per_entry", [False, True])
def test_a_file_sampled_without_entries_to_read_is_decoded_whole_at_once(
        tmp_path, monkeypatch, list_per_entry):
    """From SNAPANA_SCAN_ENTRIES entries on, the child first samples the file: PyTorch's own
    layout (a new frame list per entry) holds no entry this reader takes, and is decoded
    whole without reading it twice; shared frame lists are read from the bytes."""
    path = tmp_path / "s.pickle"
    path.write_bytes(pickle.dumps(scale_snapshot(3000, seed=2, list_per_entry=list_per_entry),
                                  protocol=4))
    monkeypatch.setenv("SNAPANA_SCAN_ENTRIES", "1000")
    child = pickle_child.start(path, path.stat().st_size, False, True)
    reply = json.loads(child.wait()[1].split(b"\n")[0])
    assert reply["plain"] and reply["scanned"] == reply["tried"] == (not list_per_entry)


def test_a_frame_starting_inside_an_opcode_reads_as_the_unpickler_reads_it(tmp_path,
                                                                           monkeypatch):
    """The unpickler reads a FRAME only where an opcode starts: one inside a string is part
    of the string's bytes. Here a frame filename's string is cut after 2 of its 11 bytes,
    the next frame's 9 header bytes are the rest of it to the unpickler, and that frame
    starts with 9 bytes of opcodes that leave the stack as it was (what a reader dropping
    every header would read as the string's end)."""
    raw = _handmade("none")
    body = raw[11:]
    cut = body.index(b"\x8c\x08train.py")
    noop = b"\x80\x04K\x000N0N0"  # PROTO 4, push and pop an int, None twice
    first = body[:cut] + b"\x8c\x0b" + b"a\xc2"
    second = noop + body[cut + 10:]
    second += b"\0" * next(p for p in range(256) if max(
        (len(second) + p).to_bytes(8, "little")) < 0x80)  # (after STOP: ignored)
    path = tmp_path / "s.pickle"
    path.write_bytes(b"".join([b"\x80\x04\x95", len(first).to_bytes(8, "little"), first,
                               b"\x95", len(second).to_bytes(8, "little"), second]))
    with_scan = _load_or_refusal(path, True, monkeypatch)
    without = _load_or_refusal(path, False, monkeypatch)
    _same(with_scan, without)
    assert "train.py" not in repr(without.stacks.frames)  # the unpickler's reading
    assert not _scanned(path, monkeypatch)


def test_a_trace_the_parent_finds_not_plain_is_decoded_again_within_the_limits(
        tmp_path, monkeypatch):
    """Entries read from the bytes were never decoded whole: when the parent finds one it
    must judge entry by entry (a negative size), it decodes the file again through the
    bounded child, not as if the child had decoded it within its limits."""
    path = tmp_path / "s.pickle"
    path.write_bytes(_handmade("negative_size"))
    calls: list[bool] = []
    real = torch_snapshot._restricted_load

    def spy(path, progress=None, checked=False):
        calls.append(checked)
        return real(path, progress, checked)

    monkeypatch.setattr(torch_snapshot, "_restricted_load", spy)
    with_scan = _load_or_refusal(path, True, monkeypatch)
    assert calls == [False]
    calls.clear()
    without = _load_or_refusal(path, False, monkeypatch)
    assert calls == [True] and with_scan == without  # (the same refusal)


def test_entries_a_few_at_a_time_are_not_read_from_the_bytes(monkeypatch):
    """Each jump over entries counts as `JUMP_STEPS` opcodes of the walk's budget: entries
    that come one at a time cost the walk more than the unpickler."""
    monkeypatch.setattr(pickle_scan, "WALK_FREE", 256)
    assert _takes(_handmade("none"))
    assert not _takes(_handmade("entries_apart"))


def test_a_scan_given_up_leaves_the_decode_the_room_it_had(tmp_path, monkeypatch):
    """A file the scan gives up on after importing numpy (no entry in it) is decoded whole
    under the same memory limit, numpy's import left out: the same outcome as without the
    scan, at sizes around where the limit falls (here, about 2.5M empty dicts)."""
    monkeypatch.setenv("SNAPANA_DECODE_MEMORY", str(250 << 20))
    for n in (2_200_000, 2_400_000, 2_600_000):
        body = b"]\x94(" + b"}" * n + b"e."
        path = tmp_path / f"{n}.pickle"
        path.write_bytes(b"\x80\x04\x95" + len(body).to_bytes(8, "little") + body)
        outcome = []
        for scan in ("0", str(1 << 62)):
            monkeypatch.setenv("SNAPANA_SCAN_ENTRIES", scan)
            child = pickle_child.start(path, path.stat().st_size, False, True)
            reply = json.loads(child.wait()[1].split(b"\n")[0])
            outcome.append(reply.get("error", "ok"))
        assert outcome[0] == outcome[1], n
