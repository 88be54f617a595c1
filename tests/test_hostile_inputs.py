"""Hostile inputs, one regression test per fix of issue #14: each is refused at the source
boundary with one line naming the file (exit 2) — no traceback, crash, hang or blow-up —
or, when merely odd but real, still analysed."""

from __future__ import annotations

import gzip
import json
import os
import pickle
import zlib

import polars as pl
import pytest
from snapana.errors import InputError
from snapana.sources import kineto_trace, load, memory_timeline, memray_capture
from snapana.sources.torch_snapshot import from_snapshot_dict, restricted_load

from .conftest import run_cli
from .fuzz.pickle_codec import Deep, Laughs, Raw, encode
from .fuzz.seeds import synthetic_kineto

MiB = 1 << 20
FRAMES = [{"filename": "/app/train.py", "line": 10, "name": "step"}]
SEG = {"device": 0, "address": 1 << 20, "total_size": 2 * MiB, "stream": 0,
       "segment_type": "large", "segment_pool_id": (0, 0), "is_expandable": False,
       "blocks": [{"address": 1 << 20, "size": 2 * MiB, "requested_size": 2 * MiB,
                   "state": "active_allocated", "frames": FRAMES}]}


def _snap(**over):
    data = {"segments": [json.loads(json.dumps(SEG)) | {"segment_pool_id": (0, 0)}],
            "device_traces": [[{"action": "alloc", "addr": 1 << 20, "size": 2 * MiB,
                                "stream": 0, "time_us": 5, "frames": FRAMES}]],
            "allocator_settings": {}}
    data.update(over)
    return data


def _refused(tmp_path, data: bytes, words: str, name: str = "input.bin") -> str:
    """The CLI refuses the file: exit 2, exactly one stderr line naming it and `words`."""
    p = tmp_path / name
    p.write_bytes(data)
    result = run_cli("summary", str(p), "-f", "json")  # its subprocess timeout: the hang guard
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, result.stderr[-2000:]
    assert len(lines) == 1 and lines[0].startswith("snapana: error: "), result.stderr[-2000:]
    assert p.name in lines[0] and words in lines[0], lines[0]
    return lines[0]


# ----- not a regular file ----------------------------------------------------------------------

def test_fifo_is_refused_at_once(tmp_path):
    fifo = tmp_path / "snap.pickle"
    os.mkfifo(fifo)
    result = run_cli("summary", str(fifo))  # open() would block: run_cli's timeout guards
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1 and "FIFO" in result.stderr


def test_character_device_is_refused(tmp_path):
    link = tmp_path / "zero.pickle"
    link.symlink_to("/dev/zero")
    with pytest.raises(InputError, match="character device"):
        load(link)


# ----- outputs never touch inputs ------------------------------------------------------------

@pytest.fixture(scope="module")
def export_dir(tmp_path_factory):
    base = tmp_path_factory.mktemp("exp")
    snap = base / "s.pickle"
    snap.write_bytes(pickle.dumps(_snap(), protocol=4))
    out = base / "s-export"
    assert run_cli("export", str(snap), "-o", str(out)).returncode == 0
    return out


def _digest(folder):
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def test_export_over_its_own_input_folder_is_refused(export_dir):
    before = _digest(export_dir)
    result = run_cli("export", str(export_dir), "-o", str(export_dir))
    assert result.returncode == 2 and "is an input" in result.stderr
    assert _digest(export_dir) == before


def test_report_into_an_input_folder_is_refused(export_dir):
    before = _digest(export_dir)
    result = run_cli("report", str(export_dir), "-o", str(export_dir / "blocks.parquet"))
    assert result.returncode == 2 and "is inside the input folder" in result.stderr
    assert _digest(export_dir) == before


def _outputs_case(base, how):
    """(command line, files that must stay as they are) for each way an output can be an
    input: the same file through a link, a sidecar, a folder that is, is inside or holds one."""
    snap = base / "s.pickle"
    snap.write_bytes(pickle.dumps(_snap(), protocol=4))
    other = base / "b.pickle"
    other.write_bytes(snap.read_bytes())
    if how == "report -o a symlink to the input":
        (base / "out.html").symlink_to(snap)
        return ["report", str(snap), "-o", str(base / "out.html")], [snap]
    if how == "report -o a hard link of the input":
        os.link(snap, base / "out.html")
        return ["report", str(snap), "-o", str(base / "out.html")], [snap]
    if how == "report -o the sidecar":
        side = base / "s.meta.json"
        side.write_text(json.dumps({"format": "snapana.record.sidecar", "version": 1,
                                    "device": 0}))
        return ["report", str(snap), "-o", str(side)], [snap, side]
    if how == "report A B -o B":
        return ["report", str(snap), str(other), "-o", str(other)], [snap, other]
    if how == "diff A B -o a link to B":
        (base / "d.html").symlink_to(other)
        return ["diff", str(snap), str(other), "-o", str(base / "d.html")], [snap, other]
    if how == "export FILE -o a folder holding FILE":
        # an earlier export's folder (it has the marker) with the snapshot copied into it
        old = base / "old-export"
        assert run_cli("export", str(snap), "-o", str(old)).returncode == 0
        inside = old / "s.pickle"
        inside.write_bytes(snap.read_bytes())
        return ["export", str(inside), "-o", str(old)], [inside]
    if how == "export FILE -o FILE":
        return ["export", str(snap), "-o", str(snap)], [snap]
    if how == "batch DIR -o DIR":
        ranks = base / "ranks"
        ranks.mkdir()
        (ranks / "rank0.pickle").write_bytes(snap.read_bytes())
        return ["batch", str(ranks), "-o", str(ranks)], [ranks / "rank0.pickle"]
    raise AssertionError(how)


@pytest.mark.parametrize("how", [
    "report -o a symlink to the input", "report -o a hard link of the input",
    "report -o the sidecar", "report A B -o B", "diff A B -o a link to B",
    "export FILE -o a folder holding FILE", "export FILE -o FILE", "batch DIR -o DIR"])
def test_an_output_that_is_or_holds_an_input_is_refused_before_the_work(tmp_path, how):
    argv, keep = _outputs_case(tmp_path, how)
    before = {p: p.read_bytes() for p in keep}
    result = run_cli(*argv)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, result.stderr[-2000:]
    assert len(lines) == 1 and lines[0].startswith("snapana: error: "), lines
    assert ("is an input" in lines[0] or "holds the input" in lines[0]
            or "inside the input folder" in lines[0]), lines[0]
    assert {p: p.read_bytes() for p in keep} == before


def test_an_export_inside_its_input_folder_is_refused(export_dir):
    before = _digest(export_dir)
    result = run_cli("export", str(export_dir), "-o", str(export_dir / "again"))
    assert result.returncode == 2 and "inside the input folder" in result.stderr
    assert _digest(export_dir) == before


# ----- snapshot pickles: decoding bounded --------------------------------------------------------

@pytest.mark.parametrize("key", [Laughs("tuple", 60), Laughs("tuple", 40)])
def test_billion_laughs_dict_key_is_refused_in_bounded_time(tmp_path, monkeypatch, key):
    monkeypatch.setenv("SNAPANA_DECODE_SECONDS", "1")
    p = tmp_path / "laughs.pickle"
    p.write_bytes(encode({key: 1, "segments": []}))
    with pytest.raises(InputError, match="did not finish"):
        restricted_load(p)  # the decode child's own alarm and subprocess timeout bound it


def test_huge_memo_index_is_refused_without_the_memory(tmp_path):
    p = tmp_path / "memo.pickle"
    p.write_bytes(encode(_snap(user_metadata=Raw(b"Nr\xff\xff\xff\x3f"))))
    with pytest.raises(InputError, match="memory"):
        restricted_load(p)


def test_globals_are_still_refused_by_name(tmp_path):
    p = tmp_path / "evil.pickle"
    p.write_bytes(b"\x80\x02cos\nsystem\n(S'true'\ntR.")
    with pytest.raises(InputError, match="os.system"):
        restricted_load(p)


def test_gzip_bomb_names_the_limit(tmp_path):
    comp = zlib.compressobj(9, zlib.DEFLATED, 31)
    body = comp.compress(b"\x80\x04]") + b"".join(
        comp.compress(b"(K\x01e" * (MiB // 4)) for _ in range(24)) + comp.flush()
    _refused(tmp_path, body, "SNAPANA_MAX_RATIO", "bomb.pickle.gz")


def test_corrupt_gzip_body_is_one_line(tmp_path):
    data = gzip.compress(pickle.dumps(_snap(), protocol=4), mtime=0)
    _refused(tmp_path, data[:20] + b"\x00" * 64, "gzip", "bad.pickle.gz")


# ----- snapshot pickles: validated once ------------------------------------------------------

@pytest.mark.parametrize("mutate,words", [
    (lambda d: d["device_traces"][0][0].update(action=Deep("list", 100_000, "alloc")),
     "device_traces[0][0].action"),
    (lambda d: d["device_traces"][0][0].update(action=Laughs("list", 60)),
     "device_traces[0][0].action"),
    (lambda d: d["segments"][0]["blocks"][0].update(state=Laughs("list", 60)),
     "segments[0].blocks[0].state"),
    (lambda d: d["segments"][0].update(segment_type=Laughs("list", 60)),
     "segments[0].segment_type"),
    (lambda d: d["segments"][0]["blocks"][0].update(size=float("inf")),
     "segments[0].blocks[0].size"),
    (lambda d: d["segments"][0].update(total_size=2**64), "segments[0].total_size"),
    (lambda d: d["segments"][0]["blocks"][0].update(size=-512), "segments[0].blocks[0].size"),
    (lambda d: d["segments"][0]["blocks"][0].update(size=8 * MiB), "outside its segment"),
    (lambda d: d["device_traces"][0][0].update(size=2**63), "device_traces[0][0].size"),
    (lambda d: d["device_traces"][0][0].update(time_us=float("nan")),
     "device_traces[0][0].time_us"),
    (lambda d: d["device_traces"][0][0].update(frames=Deep("list", 1000)),
     "device_traces[0][0].frames"),
    (lambda d: d["device_traces"][0][0].update(addr=1 << 40), "outside every segment"),
    (lambda d: d.update(device_traces=[[]] * 5000), "device traces"),
    (lambda d: d.update(external_annotations=[{"device": "0", "time_us": 1}]),
     "external_annotations[0].device"),
    (lambda d: d.update(external_annotations=[{"device": 0, "time_us": float("nan")}]),
     "external_annotations[0].time_us"),
    (lambda d: d.update(user_metadata=Laughs("list", 60)), "user_metadata"),
    (lambda d: d.update(allocator_settings={"x": Deep("list", 5000)}), "allocator_settings"),
    (lambda d: d.update(segments=[dict(SEG, address=i << 40, total_size=2**62 - 1, blocks=[])
                                  for i in range(3)]), "segments"),
])
def test_invalid_snapshot_fields_are_named(tmp_path, mutate, words):
    data = _snap()
    mutate(data)
    p = tmp_path / "s.pickle"
    p.write_bytes(encode(data, 4))
    with pytest.raises(InputError) as info:
        load(p)
    msg = str(info.value)
    assert "\n" not in msg and str(p) in msg and "invalid snapshot" in msg and words in msg, msg


@pytest.mark.parametrize("mutate,warning", [
    # py_symbolize writes a frame's line as uint64: CPython's "no line" (-1) is 2**64 - 1
    (lambda d: d["device_traces"][0][0].update(
        frames=[{"filename": "/app/t.py", "line": 2**64 - 1, "name": "f"}]), "no line number"),
    # the C++ pickler (memory_snapshot.cpp) casts the same line to int64: -1
    (lambda d: d["segments"][0]["blocks"][0].update(
        frames=[{"filename": "??", "line": -1, "name": "at::empty"}]), "no line number"),
    # MempoolId_t is a pair of unsigned long long
    (lambda d: d["segments"][0].update(segment_pool_id=(2**64 - 1, 0)), None),
    # a trace time PyTorch cannot mean (int64 µs since the epoch is ~2**51): dropped, not fatal
    (lambda d: d["device_traces"][0][0].update(time_us=2**63 - 1), "time outside"),
])
def test_values_pytorch_can_write_are_normalised_not_refused(mutate, warning):
    data = _snap()
    mutate(data)
    capture = from_snapshot_dict(data, "x")
    if warning:
        assert sum(warning in w for w in capture.warnings) == 1, capture.warnings
    assert all(0 <= f[2] < 2**31 for f in capture.stacks.frames)


def test_a_device_without_timestamps_still_loads():
    data = _snap()
    data["segments"].append(dict(json.loads(json.dumps(SEG)), device=1))
    data["device_traces"].append([{"action": "alloc", "addr": 1 << 20, "size": 2 * MiB,
                                   "frames": []}])
    capture = from_snapshot_dict(data, "two-devices")
    assert capture.devices == [0, 1] and capture.has_time


def test_unknown_actions_are_kept_and_warned():
    data = _snap()
    data["device_traces"][0].append({"action": "teleport", "addr": 1 << 20, "size": 512})
    capture = from_snapshot_dict(data, "x")
    assert any("teleport" in w for w in capture.warnings)


def test_non_string_dict_keys_are_not_shown_in_errors(tmp_path):
    p = tmp_path / "k.pickle"
    p.write_bytes(encode({Laughs("tuple", 20): 1, "weights": [1]}))
    with pytest.raises(InputError, match=r"not a CUDA memory snapshot .*\['weights'\]"):
        load(p)


# ----- JSON: profiler traces and memory timelines --------------------------------------------

def _trace_text(**replace):
    text = json.dumps(synthetic_kineto())
    for old, new in replace.items():
        text = text.replace(old, new, 1)
    return text.encode()


@pytest.mark.parametrize("old,new,words", [
    ('"Bytes": 512', '"Bytes": ' + "9" * 5000, "number too long"),
    ('"Bytes": 512', '"Bytes": 99999999999999999999999', "Bytes"),
    ('"Bytes": 512', '"Bytes": Infinity', "Bytes"),
    ('"ts": 25', '"ts": NaN', "ts"),
    ('"traceEvents": [', '"traceEvents": [' + "[" * 3000 + "]" * 3000 + ",", "nested too deep"),
    ('"Device Id": 0', '"Device Id": 1e300', "Device Id"),
    ('"pid": 1, "tid": 1, "ts": 25', '"pid": [[1]], "tid": 1, "ts": 25', "pid"),
])
def test_invalid_trace_values_are_refused(tmp_path, old, new, words):
    p = tmp_path / "t.json"
    p.write_bytes(_trace_text(**{old: new}))
    with pytest.raises(InputError) as info:
        load(p)
    msg = str(info.value)
    assert "\n" not in msg and str(p) in msg and words in msg, msg


def test_odd_intervals_are_skipped_not_fatal(tmp_path):
    p = tmp_path / "t.json"
    p.write_bytes(_trace_text(**{'"cat": "cpu_op"': '"cat": ["x"]',
                                 '"dur": 500': '"dur": NaN'}))
    capture = kineto_trace.load(p)
    assert capture.events.height > 0


def test_whitespace_runs_are_skipped_in_bulk(tmp_path, monkeypatch):
    """The work, not the time: 64 MiB of blanks cost the tokenizer its chunk reads and no
    more scanning steps than the same trace without them (a run is skipped in one match)."""
    from snapana.sources import json_stream

    counts = {"peek": 0, "fill": 0}
    peek, fill = json_stream._JsonStream.peek, json_stream._JsonStream._fill

    def counted_peek(self):
        counts["peek"] += 1
        return peek(self)

    def counted_fill(self, want=json_stream._CHUNK):
        counts["fill"] += 1
        return fill(self, want)

    monkeypatch.setattr(json_stream._JsonStream, "peek", counted_peek)
    monkeypatch.setattr(json_stream._JsonStream, "_fill", counted_fill)
    text = _trace_text().decode()
    at = text.index('"traceEvents": [') + len('"traceEvents": [')
    plain, blanks = tmp_path / "plain.json", tmp_path / "t.json"
    plain.write_text(text)
    blanks.write_text(text[:at] + " " * (64 * MiB) + text[at:])
    want = kineto_trace.load(plain).events.height
    base = dict(counts)
    assert kineto_trace.load(blanks).events.height == want
    peeks, fills = counts["peek"] - base["peek"], counts["fill"] - base["fill"]
    assert fills <= 64 * MiB // json_stream._CHUNK + base["fill"] + 2
    assert peeks <= base["peek"] + fills


def test_one_huge_json_value_names_its_limit(tmp_path, monkeypatch):
    monkeypatch.setenv("SNAPANA_MAX_JSON_VALUE", str(4 * MiB))
    text = _trace_text().decode()
    at = text.index('"traceEvents": [') + len('"traceEvents": [')
    p = tmp_path / "t.json"
    p.write_text(text[:at] + '{"name": "' + "z" * (8 * MiB) + '"},' + text[at:])
    with pytest.raises(InputError, match="SNAPANA_MAX_JSON_VALUE"):
        kineto_trace.load(p)


@pytest.mark.parametrize("text,words", [
    (b"[[NaN, 2, 100, 1], [1000, 4, -100, 1]]", "not four integers"),
    (b"[[0, 2, 99999999999999999999999, 1], [1000, 4, -100, 1], [2, 2, 1, 1]]",
     "out of range"),
    (b"[[0, NaN], [[0, 1], [0, 2]]]", "not a usable time"),
    (b"[[0, 1], [[0, -5], [0, 2]]]", "negative"),
    (b"[" * 100_000 + b"]" * 100_000, "nested too deep"),
])
def test_invalid_timelines_are_refused(tmp_path, text, words):
    p = tmp_path / "m.json"
    p.write_bytes(text)
    with pytest.raises(InputError, match=words):
        memory_timeline.load(p)


def test_timeline_record_bomb_is_refused_early(tmp_path, monkeypatch):
    """Refused (one line, exit 2) and, measured as work, not time: in-process the reader
    stops having decompressed at most the ratio's allowance of what it read, not the bomb."""
    from snapana.sources import _io

    comp = zlib.compressobj(9, zlib.DEFLATED, 31)
    body = comp.compress(b"[[0, 2, 1, 1],") + b"".join(
        comp.compress(b"[1, 2, 8, 3]," * (MiB // 13)) for _ in range(64)) + comp.flush()
    _refused(tmp_path, body, "SNAPANA_MAX_RATIO", "m.json.gz")
    seen: list[_io.BoundedGzip] = []
    init = _io.BoundedGzip.__init__

    def kept(self, *args):
        init(self, *args)
        seen.append(self)

    monkeypatch.setattr(_io.BoundedGzip, "__init__", kept)
    with pytest.raises(InputError, match="SNAPANA_MAX_RATIO"):
        memory_timeline.load(tmp_path / "m.json.gz")
    assert seen and all(
        g.done <= max(_io.RATIO_FREE, _io.max_ratio() * len(body)) + 2 * _io.READ_BUFFER
        for g in seen)
    assert max(g.done for g in seen) < 64 * MiB  # the bomb itself expands to 64 MiB and more


# ----- memray: the native reader is isolated ------------------------------------------------

def test_a_crashing_memray_reader_is_a_refusal(tmp_path, monkeypatch):
    header = memray_capture.MemrayHeader(13, False)
    monkeypatch.setattr(memray_capture, "_check_readable", lambda path, *_: header)
    monkeypatch.setattr(memray_capture, "_CHILD",
                        "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)")
    p = tmp_path / "c.bin"
    p.write_bytes(b"memray\x00\x0d\x00\x00\x00" + b"\x00" * 64)
    with pytest.raises(InputError, match="signal 11"):
        memray_capture.read_records(p)


def test_memray_sizes_out_of_range_are_refused(tmp_path):
    records = pl.DataFrame({"size": [2**63 - 1], "n_allocations": [1], "allocator": ["malloc"],
                            "tid": [1], "thread_name": [""], "frames": [[]]},
                           schema=memray_capture.RECORD_SCHEMA)
    with pytest.raises(InputError, match="size"):
        memray_capture.check_records(tmp_path / "x.bin", records)


# ----- export folders ---------------------------------------------------------------------------

def _edited(export_dir, tmp_path, **marker):
    import shutil

    out = tmp_path / "edited"
    shutil.copytree(export_dir, out)
    meta = json.loads((out / "snapana-export.json").read_text())
    meta.update(marker)
    (out / "snapana-export.json").write_text(json.dumps(meta))
    return out


@pytest.mark.parametrize("marker,words", [
    ({"metadata": json.loads("[" * 900 + "]" * 900)}, "metadata"),
    ({"devices": list(range(100_000))}, "devices"),
    ({"devices": []}, "devices"),
    ({"capacity_bytes": {"$ndarray": [1], "dtype": "V100000000000", "shape": [1]}}, "dtype"),
    ({"capacity_bytes": {"$map": [[0, "x"]]}}, "capacity_bytes"),
    ({"capacity_bytes": {"annotations": 2**53 + 1}}, "capacity_bytes"),
    ({"metadata": {"reserved_timeline": "x"}}, "reserved_timeline"),
    ({"warnings": 5}, "warnings"),
    ({"annotations": [{"device": "0"}]}, "annotations"),
])
def test_edited_export_marker_is_refused(export_dir, tmp_path, marker, words):
    out = _edited(export_dir, tmp_path, **marker)
    with pytest.raises(InputError, match=words):
        load(out)


@pytest.mark.parametrize("table,edit,words", [
    ("blocks", lambda df: df.with_columns(pl.lit(10**6).alias("stack_id")), "stack_id"),
    ("blocks", lambda df: df.with_columns(pl.lit(-1).alias("size")), "size"),
    ("segments", lambda df: df.with_columns(pl.col("is_expandable").cast(pl.Utf8)),
     "wrong type"),
    ("events", lambda df: df.drop("action"), "lacks columns"),
    ("stacks", lambda df: df.with_columns(pl.lit([10**6]).alias("frame_ids")), "frame"),
    ("frames", lambda df: df.with_columns(pl.lit(None, pl.Utf8).alias("name")), None),
])
def test_edited_export_tables_are_refused(export_dir, tmp_path, table, edit, words):
    out = _edited(export_dir, tmp_path)
    df = pl.read_parquet(out / f"{table}.parquet")
    edit(df).write_parquet(out / f"{table}.parquet")
    if words is None:  # a null frame name: odd but harmless, read as ""
        load(out)
        return
    with pytest.raises(InputError, match=words):
        load(out)


def test_corrupt_parquet_is_one_line_without_a_panic_backtrace(export_dir, tmp_path):
    out = _edited(export_dir, tmp_path)
    raw = bytearray((out / "segments.parquet").read_bytes())
    for i in range(8, len(raw) - 64, 7):
        raw[i] ^= 0x5A
    (out / "segments.parquet").write_bytes(bytes(raw))
    result = run_cli("summary", str(out))
    assert result.returncode == 2, result.stderr[-2000:]
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr[-2000:]
