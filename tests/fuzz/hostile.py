"""Hand-made hostile inputs, one or more per class of the issue (#14)."""

from __future__ import annotations

import gzip
import json
import pickle
import struct
import zlib
from functools import cache

from . import seeds
from .cases import INPUT, SUMMARY, Case
from .pickle_codec import Deep, Encoder, Laughs, Raw, encode

_SNAP_SEG = {"device": 0, "address": 1 << 20, "total_size": 2 << 20, "stream": 0,
             "segment_type": "large", "segment_pool_id": (0, 0), "is_expandable": False,
             "blocks": [{"address": 1 << 20, "size": 2 << 20, "requested_size": 2 << 20,
                         "state": "active_allocated", "frames": []}]}


def _snapshot(**over: object) -> dict:
    snap = {"segments": [dict(_SNAP_SEG)],
            "device_traces": [[{"action": "alloc", "addr": 1 << 20, "size": 2 << 20,
                                "stream": 0, "time_us": 5, "frames": []}]],
            "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": ""}}
    snap.update(over)
    return snap


def _pickle_case(name: str, tree: object, protocol: int = 4) -> Case:
    return Case("hostile", name, {INPUT: encode(tree, protocol)}, ext=".pickle")


def _gzip_stream(prefix: bytes, filler: bytes, total: int, suffix: bytes) -> bytes:
    """gzip of prefix + filler * n + suffix without building the plain text."""
    comp = zlib.compressobj(9, zlib.DEFLATED, 31)
    out = [comp.compress(prefix)]
    block = filler * ((1 << 20) // len(filler))
    for _ in range(total // len(block)):
        out.append(comp.compress(block))
    out.append(comp.compress(suffix))
    out.append(comp.flush())
    return b"".join(out)


@cache
def _bombs(size: int) -> dict[str, bytes]:
    return {
        "gzip whitespace bomb (JSON)": _gzip_stream(b'{"traceEvents": [', b" ", size, b"]}"),
        "gzip string bomb (JSON)": _gzip_stream(b'{"traceEvents": [{"name": "', b"z", size,
                                                b'"}]}'),
        "gzip timeline records bomb": _gzip_stream(b"[[0, 2, 1, 1],", b"[1, 2, 8, 3],", size,
                                                   b"[2, 4, -8, 3]]"),
        "gzip pickle bomb": _gzip_stream(b"\x80\x04\x95\x00\x00\x00\x00\x00\x00\x00\x00]",
                                         b"(K\x01e", size, b"."),
    }


@cache
def hostile_cases(bomb_bytes: int = 24 << 20) -> list[Case]:
    cases: list[Case] = []
    add = cases.append
    # --- classes 1 and 2: crashes, hangs and memory blow-ups in snapshot pickles ---------------
    entry = {"action": Deep("list", 100_000, "alloc"), "addr": 1, "size": 512, "frames": []}
    add(_pickle_case("action nested 100k deep", _snapshot(device_traces=[[entry]])))
    for field in ("state", "segment_type"):
        seg = dict(_SNAP_SEG)
        block = dict(seg["blocks"][0])
        if field == "state":
            block["state"] = Laughs("list", 60)
        else:
            seg["segment_type"] = Laughs("list", 60)
        seg["blocks"] = [block]
        add(_pickle_case(f"billion laughs as {field}", _snapshot(segments=[seg])))
    laugh_entry = {"action": Laughs("list", 60), "addr": 1, "size": 512, "frames": []}
    add(_pickle_case("billion laughs as action", _snapshot(device_traces=[[laugh_entry]])))
    frame_entry = {"action": "alloc", "addr": 1, "size": 512,
                   "frames": [{"filename": Laughs("list", 60), "name": "f", "line": 1}]}
    add(_pickle_case("billion laughs as frame name", _snapshot(device_traces=[[frame_entry]])))
    add(_pickle_case("billion laughs tuple as dict key", {Laughs("tuple", 60): 1,
                                                          "segments": []}))
    add(_pickle_case("100k-deep tuple as dict key", {Deep("tuple", 100_000): 1,
                                                     "segments": []}))
    add(_pickle_case("billion laughs in user_metadata",
                     _snapshot(user_metadata={"a": Laughs("list", 60)})))
    add(_pickle_case("deep list in allocator_settings",
                     _snapshot(allocator_settings={"x": Deep("list", 5000)})))
    add(_pickle_case("deep dict in annotations",
                     _snapshot(external_annotations=[Deep("dict", 5000)])))
    add(_pickle_case("huge memo index", _snapshot(user_metadata=Raw(b"Nr\xff\xff\xff\x3f"))))
    add(_pickle_case("huge memo index (proto 2)",
                     _snapshot(user_metadata=Raw(b"Nr\x00\x00\x00\x10")), protocol=2))
    fs = Raw(b"\x8f(" + b"\x8c\x01a\x8c\x01b" + b"\x90")  # EMPTY_SET, MARK, items, ADDITEMS
    add(_pickle_case("set in a snapshot", _snapshot(user_metadata=fs)))
    frozen = Raw(b"(" + b"K\x01" * 3 + b"\x91")
    add(_pickle_case("frozenset as dict key", {frozen: 1, "segments": []}))
    add(_pickle_case("1 MB integer as a size",
                     _snapshot(device_traces=[[{"action": "alloc", "addr": 1,
                                                "size": 1 << (8 << 20), "frames": []}]])))
    # --- class 3: tracebacks ---------------------------------------------------------------------
    add(_pickle_case("infinite block size", _snapshot(segments=[dict(
        _SNAP_SEG, blocks=[{"size": float("inf"), "state": "active_allocated"}])])))
    add(_pickle_case("NaN total_size", _snapshot(segments=[dict(_SNAP_SEG,
                                                               total_size=float("nan"))])))
    add(_pickle_case("size 2**64", _snapshot(device_traces=[[{"action": "alloc", "addr": 1,
                                                               "size": 2**64, "frames": []}]])))
    add(_pickle_case("lists nested 1000 deep as frames",
                     _snapshot(device_traces=[[{"action": "alloc", "addr": 1, "size": 2,
                                                "frames": Deep("list", 1000)}]])))
    add(_pickle_case("second device without time_us", _snapshot(device_traces=[
        [{"action": "alloc", "addr": 1 << 20, "size": 2 << 20, "time_us": 5, "frames": []}],
        [{"action": "alloc", "addr": 1 << 30, "size": 512, "frames": []}]])))
    add(_pickle_case("annotation device is a string", _snapshot(external_annotations=[
        {"device": "0", "stage": "START", "name": "fwd", "time_us": 1},
        {"device": "0", "stage": "END", "name": "fwd", "time_us": 9}])))
    add(_pickle_case("annotation time is NaN", _snapshot(external_annotations=[
        {"device": 0, "stage": "START", "name": "fwd", "time_us": float("nan")},
        {"device": 0, "stage": "END", "name": "fwd", "time_us": 9}])))
    add(_pickle_case("reserved bytes past int64", _snapshot(segments=[
        dict(_SNAP_SEG, address=i << 40, total_size=2**62 - 1, blocks=[]) for i in range(4)])))
    # --- class 5: inconsistent figures ---------------------------------------------------------
    add(_pickle_case("negative block size", _snapshot(segments=[dict(
        _SNAP_SEG, blocks=[{"size": -(2 << 20), "state": "active_allocated"}])])))
    add(_pickle_case("negative device_free and request", _snapshot(device_traces=[[
        {"action": "oom", "addr": 0, "size": -5, "device_free": -7, "frames": []}]])))
    add(_pickle_case("block larger than its segment", _snapshot(segments=[dict(
        _SNAP_SEG, blocks=[{"size": 8 << 20, "state": "active_allocated"}])])))
    add(_pickle_case("device_traces longer than the devices with segments", _snapshot(
        device_traces=[[], [{"action": "alloc", "addr": 5, "size": 4 << 20, "frames": []}]])))
    add(_pickle_case("10,000 devices", _snapshot(device_traces=[
        [{"action": "alloc", "addr": 5, "size": 512, "frames": []}]] * 10_000)))
    seg_only = [{"action": "segment_alloc", "addr": 1 << 20, "size": 4096, "frames": []},
                {"action": "alloc", "addr": 1 << 20, "size": 4096, "frames": []},
                {"action": "alloc", "addr": 2 << 20, "size": 8192, "frames": []}]
    add(_pickle_case("segment events, no final segments: the trace set aside",
                     {"segments": [], "device_traces": [seg_only]}))
    pending = [{"action": "segment_alloc", "addr": 1 << 20, "size": 2 << 20, "frames": []},
               {"action": "alloc", "addr": 1 << 20, "size": 1 << 20, "frames": []},
               {"action": "alloc", "addr": 3 << 19, "size": 1 << 19, "frames": []},
               {"action": "free_requested", "addr": 3 << 19, "size": 1 << 19, "frames": []}]
    add(_pickle_case("a pending free is not cached (at the end)",
                     {"segments": [], "device_traces": [pending]}))
    cases[-1].argv = [*SUMMARY, "--at", "end"]
    add(_pickle_case("unknown actions", _snapshot(device_traces=[[
        {"action": "teleport", "addr": 1, "size": 512, "frames": []}]])))
    # --- pickles the old way (protocol 0/1) and with every protocol ----------------------------
    for proto in (0, 1):
        add(Case("hostile", f"protocol {proto}", {INPUT: pickle.dumps(_plain(), proto)},
                 ext=".pickle"))
    add(Case("hostile", "proto 0 with a global", {INPUT: b"(cos\nsystem\nS'true'\ntR."},
             ext=".pickle"))
    # --- JSON ------------------------------------------------------------------------------------
    trace = seeds.synthetic_kineto()
    text = json.dumps(trace)
    add(Case("hostile", "5,000-digit Bytes", {INPUT: text.replace('"Bytes": 512', '"Bytes": '
                                                                   + "9" * 5000, 1).encode()},
             ext=".json"))
    add(Case("hostile", "NaN ts", {INPUT: text.replace('"ts": 25', '"ts": NaN', 1).encode()},
             ext=".json"))
    add(Case("hostile", "Infinity Bytes", {INPUT: text.replace('"Bytes": 512',
                                                               '"Bytes": Infinity', 1).encode()},
             ext=".json"))
    add(Case("hostile", "Bytes beyond int64", {INPUT: text.replace(
        '"Bytes": 512', '"Bytes": 99999999999999999999999', 1).encode()}, ext=".json"))
    add(Case("hostile", "2,000-deep arrays in an event",
             {INPUT: text.replace('"args": {"Bytes": 512', '"x": ' + "[" * 2000 + "]" * 2000
                                  + ', "args": {"Bytes": 512', 1).encode()}, ext=".json"))
    add(Case("hostile", "2,000-deep array as an event",
             {INPUT: text.replace('"traceEvents": [', '"traceEvents": [' + "[" * 2000
                                  + "]" * 2000 + ",", 1).encode()}, ext=".json"))
    add(Case("hostile", "timeline nested 100k deep",
             {INPUT: ("[" * 100_000 + "]" * 100_000).encode()}, ext=".json"))
    add(Case("hostile", "timeline with NaN time",
             {INPUT: b"[[NaN, 2, 100, 1], [1000, 4, -100, 1]]"}, ext=".json"))
    add(Case("hostile", "timeline bytes beyond int64",
             {INPUT: b"[[0, 2, 99999999999999999999999, 1], [1000, 4, -100, 1]]"}, ext=".json"))
    add(Case("hostile", "plot timeline NaN", {INPUT: b"[[0, NaN], [[0, 1], [0, 2]]]"},
             ext=".json"))
    add(Case("hostile", "plot timeline with huge value",
             {INPUT: b"[[0, 1], [[0, 1], [0, 1e300]]]"}, ext=".json"))
    add(Case("hostile", "not UTF-8 JSON", {INPUT: b'{"traceEvents": ["\xff\xfe"]}'},
             ext=".json"))
    add(Case("hostile", "UTF-16 JSON", {INPUT: text.encode("utf-16")}, ext=".json"))
    for name, data in _bombs(bomb_bytes).items():
        add(Case("hostile", name, {INPUT: data}, ext=".gz"))
    add(Case("hostile", "corrupt gzip body", {INPUT: gzip.compress(
        pickle.dumps(_plain(), 4), mtime=0)[:20] + b"\x00" * 64}, ext=".pickle.gz"))
    add(Case("hostile", "corrupt gzip body (JSON)",
             {INPUT: gzip.compress(text.encode(), mtime=0)[:30] + b"garbage" * 20},
             ext=".json.gz"))
    add(Case("hostile", "gzip with trailing garbage",
             {INPUT: gzip.compress(pickle.dumps(_plain(), 4), mtime=0) + b"trailing"},
             ext=".pickle.gz"))
    add(Case("hostile", "gzip of gzip", {INPUT: gzip.compress(gzip.compress(
        pickle.dumps(_plain(), 4), mtime=0), mtime=0)}, ext=".gz"))
    # --- memray ----------------------------------------------------------------------------------
    add(Case("hostile", "memray magic only", {INPUT: b"memray\x00"}, ext=".bin"))
    add(Case("hostile", "memray header, version 13, garbage",
             {INPUT: b"memray\x00" + struct.pack("<i", 13) + b"\xff" * 300}, ext=".bin"))
    add(Case("hostile", "LZ4 magic only", {INPUT: b"\x04\x22\x4d\x18"}, ext=".bin"))
    add(Case("hostile", "Parquet magic only", {INPUT: b"PAR1" + b"\x00" * 8}, ext=".parquet"))
    # --- paths: not a regular file, output = input ---------------------------------------------
    add(Case("hostile", "FIFO as input", {}, setup=[("fifo", INPUT)]))
    add(Case("hostile", "char device as input", {}, setup=[("symlink", INPUT, "/dev/zero")]))
    add(Case("hostile", "symlink loop as input", {}, setup=[("symlink", INPUT, INPUT)]))
    snap = {INPUT: pickle.dumps(_plain(), 4)}
    add(Case("hostile", "report -o input", dict(snap), argv=["report", "{input}", "-o",
                                                             "{input}"]))
    add(Case("hostile", "report -o symlink to input", dict(snap),
             argv=["report", "{input}", "-o", "out.html"],
             setup=[("symlink", "out.html", INPUT)]))
    add(Case("hostile", "diff A B -o A", {INPUT: snap[INPUT], "b.pickle": snap[INPUT]},
             argv=["diff", "{input}", "b.pickle", "-o", "{input}"]))
    add(Case("hostile", "diff A B -o B", {INPUT: snap[INPUT], "b.pickle": snap[INPUT]},
             argv=["diff", "{input}", "b.pickle", "-o", "b.pickle"]))
    add(Case("hostile", "export -o input", dict(snap), argv=["export", "{input}", "-o",
                                                             "{input}"]))
    export = seeds.export_seed()
    if export is not None:
        files = {f"ex/{k}": v for k, v in export.items()}
        add(Case("hostile", "export DIR -o DIR", dict(files), input="ex",
                 argv=["export", "{input}", "-o", "{input}"]))
        add(Case("hostile", "report DIR -o a table inside DIR", dict(files), input="ex",
                 argv=["report", "{input}", "-o", "ex/blocks.parquet"]))
        add(Case("hostile", "export FILE -o an earlier export folder holding FILE",
                 dict(files, **{"ex/s.pickle": snap[INPUT]}), input="ex/s.pickle",
                 argv=["export", "{input}", "-o", "ex"]))
        add(Case("hostile", "report FILE -o its sidecar",
                 {"run/s.pickle": snap[INPUT], "run/s.meta.json": json.dumps(
                     {"format": "snapana.record.sidecar", "version": 1, "device": 0}).encode()},
                 input="run/s.pickle", argv=["report", "{input}", "-o", "run/s.meta.json"]))
        marker = json.loads(export["snapana-export.json"])
        marker["devices"] = list(range(100_000))
        add(Case("hostile", "export marker with 100,000 devices",
                 dict(files, **{"ex/snapana-export.json": json.dumps(marker).encode()}),
                 input="ex"))
        marker = json.loads(export["snapana-export.json"])
        marker["metadata"] = json.loads("[" * 900 + "]" * 900)
        add(Case("hostile", "export marker metadata 900 deep",
                 dict(files, **{"ex/snapana-export.json": json.dumps(marker).encode()}),
                 input="ex"))
        marker = json.loads(export["snapana-export.json"])
        marker["capacity_bytes"] = {"$ndarray": [1], "dtype": "V100000000000", "shape": [1]}
        add(Case("hostile", "export marker with a 100 GB dtype",
                 dict(files, **{"ex/snapana-export.json": json.dumps(marker).encode()}),
                 input="ex"))
        snapshot = seeds.small_snapshot()
        if snapshot is not None:  # an inventory whose tensor shape is a number, not a list
            marker = json.loads(export["snapana-export.json"])
            tensor = seeds.sidecar_seed(snapshot)["inventory"]["tensors"][0] | {"shape": 5}
            marker["metadata"]["inventory"] = {"$map": [[0, [tensor]]]}
            add(Case("hostile", "export marker inventory with a shape that is a number",
                     dict(files, **{"ex/snapana-export.json": json.dumps(marker).encode()}),
                     input="ex"))
    for case in cases:
        if not case.argv:
            case.argv = list(SUMMARY)
    return cases


def _plain() -> dict:
    return {"segments": [dict(_SNAP_SEG)],
            "device_traces": [[{"action": "alloc", "addr": 1 << 20, "size": 2 << 20,
                                "stream": 0, "time_us": 5, "frames": []}]]}


_ = Encoder  # re-exported for scripts that build their own hostile pickles
