"""torch.profiler chrome traces: streamed, exact totals, stacks from the enclosing ops."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import snapana
from snapana.analysis.replay import replay
from snapana.errors import InputError
from snapana.session import analyse
from snapana.sources import json_stream, kineto_trace

from .conftest import CORPUS, corpus_params, invoke, require

TRACES = CORPUS / "kineto_traces"


def _raw_trace(path: Path) -> dict:
    """Decode a trace independently of snapana (whole-file json; test data is small)."""
    with path.open("rb") as fh:
        data = fh.read()
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    return json.loads(data)


def _memory_by_device(trace: dict) -> dict[tuple[int, int], list[dict]]:
    out: dict[tuple[int, int], list[dict]] = {}
    for ev in trace["traceEvents"]:
        if ev.get("name") == "[memory]":
            a = ev["args"]
            out.setdefault((a["Device Type"], a["Device Id"]), []).append(ev)
    for evs in out.values():
        evs.sort(key=lambda e: e["ts"])
    return out


@pytest.mark.parametrize("path", corpus_params("kineto_traces"))
def test_corpus_trace_loads_replays_and_analyses(path):
    capture = kineto_trace.load(path)
    assert capture.source == "kineto_trace"
    assert capture.events.height > 0 and capture.segments.is_empty()
    names = capture.metadata["device_names"]
    assert set(names) == set(capture.devices)
    for dev in capture.devices:
        dr = replay(capture, dev)
        assert dr.mismatches == []
        assert dr.allocated.min() >= 0
    reports = analyse(capture)
    assert [r.device for r in reports] == capture.devices


def test_a100_peak_is_max_total_allocated():
    path = TRACES / "switch-transformer-a100.json"
    if not path.exists():
        pytest.skip("../shared/corpus absent")
    raw = _memory_by_device(_raw_trace(path))
    capture = kineto_trace.load(path)
    for (dtype, did), evs in sorted(raw.items(), reverse=True):  # GPU first
        dev = -1 if dtype == 0 else did
        expected = max(e["args"]["Total Allocated"] for e in evs)
        totals = capture.metadata["kineto_totals"][dev]["allocated"]
        assert int(totals.max()) == expected
        dr = replay(capture, dev)
        assert dr.peak_allocated_bytes == expected  # exact bytes: replay honours size_rounding
        if dev == 0:  # every event: replay's running total is the profiler's own
            allocs = dr.allocated[capture.device_events(dev)["action"].to_numpy() != "oom"]
            ta = np.repeat([e["args"]["Total Allocated"] for e in evs],
                           [2 if e["args"]["Bytes"] < 0 else 1 for e in evs])
            assert np.array_equal(allocs, ta)
    assert "NVIDIA A100" in capture.metadata["device_names"][0]
    assert capture.capacity_bytes[0] == 84987740160
    assert not capture.warnings


def test_a100_large_allocations_have_op_and_python_frames():
    path = TRACES / "switch-transformer-a100.json"
    if not path.exists():
        pytest.skip("../shared/corpus absent")
    capture = kineto_trace.load(path)
    allocs = capture.device_events(0).filter(pl.col("action") == "alloc")
    for sid in allocs.sort("size", descending=True).head(10)["stack_id"]:
        stack = capture.stacks.stack(sid)
        assert stack and stack[0][0] == "<op>"  # innermost first: the op that allocated
        assert any(f[0].endswith(".py") for f in stack)


def test_2021_trace_peak_is_max_running_sum_of_bytes():
    path = TRACES / "resnet50-v100-2021.pt.trace.json.gz"
    if not path.exists():
        pytest.skip("../shared/corpus absent")
    raw = _memory_by_device(_raw_trace(path))
    capture = kineto_trace.load(path)
    assert any("relative to the start of profiling" in w for w in capture.warnings)
    for (dtype, did), evs in sorted(raw.items(), reverse=True):  # GPU first
        dev = -1 if dtype == 0 else did
        running = np.cumsum([e["args"]["Bytes"] for e in evs])
        dr = replay(capture, dev)
        assert dr.mismatches == []
        assert dr.peak_allocated_bytes == int(running.max())


@pytest.mark.torch
def test_profiled_cpu_model_attributes_allocations_to_ops(tmp_path):
    torch = require("torch")
    from torch.profiler import ProfilerActivity, profile

    lin = torch.nn.Linear(1024, 2048, bias=False)
    x = torch.randn(512, 1024)
    out_bytes, mm_bytes = 512 * 2048 * 4, 512 * 512 * 4  # 4 MiB, 1 MiB
    keep = []
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True,
                 with_stack=True) as prof:
        for _ in range(3):
            keep.append(lin(x))
        keep.append(torch.mm(x, x.t()))
        del keep[0]
    trace = tmp_path / "trace.json"
    prof.export_chrome_trace(str(trace))

    capture = kineto_trace.load(trace)
    dr = replay(capture, -1)
    assert dr.mismatches == []
    assert dr.peak_allocated_bytes >= 3 * out_bytes + mm_bytes
    raw = _memory_by_device(_raw_trace(trace))[(0, -1)]
    assert dr.peak_allocated_bytes == max(e["args"]["Total Allocated"] for e in raw)

    allocs = capture.device_events(-1).filter(pl.col("action") == "alloc")
    big = allocs.filter(pl.col("size") == out_bytes)
    assert big.height == 3
    for sid in big["stack_id"]:
        names = [f[1] for f in capture.stacks.stack(sid)]
        assert "aten::linear" in names and "aten::mm" in names
        assert names.index("aten::mm") < names.index("aten::linear")  # innermost first
        assert any(f[0].endswith("torch/nn/modules/linear.py") for f in
                   capture.stacks.stack(sid))
    (mm_sid,) = allocs.filter(pl.col("size") == mm_bytes)["stack_id"]
    assert capture.stacks.stack(mm_sid)[0] == ("<op>", "aten::mm", 0)
    assert any(f[0].endswith("test_source_kineto.py") for f in capture.stacks.stack(mm_sid))
    analyse(capture)


def _trace_with(events: list[dict], **top) -> dict:
    return {"schemaVersion": 1, **top, "traceEvents": events}


def _mem(ts, nbytes, addr=None, total=None, name="[memory]", dev=(1, 0), tid=1):
    args = {"Device Type": dev[0], "Device Id": dev[1], "Bytes": nbytes}
    if addr is not None:
        args["Addr"] = addr
    if total is not None:
        args["Total Allocated"] = total
        args["Total Reserved"] = total + 1024
    return {"ph": "i", "s": "t", "cat": "cpu_instant_event", "name": name, "pid": 1,
            "tid": tid, "ts": ts, "args": args}


def _op(ts, dur, name, cat="cpu_op", tid=1):
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur,
            "args": {}}


def test_oom_event_and_preexisting_memory(tmp_path):
    events = [
        _op(0, 100, "train.py(10): step", "python_function"),
        _op(5, 50, "## forward ##", "user_annotation"),
        _op(10, 5, "aten::empty"),
        _mem(12, 4096, addr=0x1000, total=1 << 20 | 4096),  # 1 MiB was live before profiling
        _mem(20, 8192, addr=0x2000, total=(1 << 20) + 12288),
        _mem(60, -4096, addr=0x1000, total=(1 << 20) + 8192),
        _mem(70, 1 << 30, name="[OutOfMemory]", total=(1 << 20) + 8192),
        _op(200, 10, "aten::zeros", tid=2),
    ]
    path = tmp_path / "oom.json"
    path.write_text(json.dumps(_trace_with(events)))
    capture = kineto_trace.load(path)
    ev = capture.device_events(0)
    assert ev["action"].to_list() == ["alloc", "alloc", "free_requested", "free_completed",
                                      "oom"]
    dr = replay(capture, 0)
    assert dr.mismatches == []
    assert dr.oom is not None and dr.oom.requested_bytes == 1 << 30
    assert dr.peak_allocated_bytes == (1 << 20) + 12288
    assert dr.baseline_allocated == 1 << 20
    stack = capture.stacks.stack(int(ev["stack_id"][0]))
    assert stack == (("<op>", "aten::empty", 0), ("<annotation>", "## forward ##", 0),
                     ("train.py", "step", 10))
    assert capture.stacks.stack(int(ev["stack_id"][1])) == stack[1:]
    assert capture.stacks.stack(int(ev["stack_id"][4])) == stack[2:]  # annotation ended
    res = capture.metadata["reserved_timeline"][0]
    assert res.tolist() == [(1 << 20) + 5120, (1 << 20) + 13312, (1 << 20) + 9216,
                            (1 << 20) + 9216, (1 << 20) + 9216]
    (report,) = analyse(capture)
    assert report.oom is not None and report.oom.requested_bytes == 1 << 30


def test_stack_sweep_handles_ties_overlaps_and_threads(tmp_path):
    events = [
        _op(0, 10, "a.py(1): outer", "python_function"),
        _op(0, 10, "aten::outer_op"),  # same interval: the op is inside the function
        _op(3, 10, "aten::overlaps"),  # starts inside, ends after the function
        _mem(4, 512, addr=1),
        _mem(11, 512, addr=2),  # the function ended at 10, the overlapping op has not
        _mem(4, 512, addr=3, tid=9),  # another thread: no enclosing events
    ]
    path = tmp_path / "sweep.json"
    path.write_text(json.dumps(_trace_with(events)))
    capture = kineto_trace.load(path)
    ev = capture.device_events(0).sort("addr")
    stacks = [capture.stacks.stack(int(s)) for s in ev["stack_id"]]
    assert stacks[0] == (("<op>", "aten::overlaps", 0), ("<op>", "aten::outer_op", 0),
                         ("a.py", "outer", 1))
    assert stacks[1] == (("<op>", "aten::overlaps", 0),)
    assert stacks[2] == ()


def test_2021_style_events_pair_frees_by_size(tmp_path):
    events = [_mem(1, 1024), _mem(2, 2048), _mem(3, -1024), _mem(4, 1024), _mem(5, -2048),
              _mem(6, -1024), _mem(7, -512)]  # the last one predates profiling
    path = tmp_path / "old.json.gz"
    path.write_bytes(gzip.compress(json.dumps(_trace_with(events)).encode()))
    capture = kineto_trace.load(path)
    dr = replay(capture, 0)
    assert dr.mismatches == []
    assert capture.blocks.is_empty()
    assert dr.peak_allocated_bytes == 3072 + 512
    assert any("match no earlier allocation" in w for w in capture.warnings)


def test_streaming_across_tiny_chunks(monkeypatch):
    path = TRACES / "switch-transformer-cpu.json"
    if not path.exists():
        pytest.skip("../shared/corpus absent")
    whole = kineto_trace.load(path)
    monkeypatch.setattr(json_stream, "_CHUNK", 7)  # the streaming tokenizer kineto reads with
    chunked = kineto_trace.load(path)
    assert chunked.events.equals(whole.events)
    assert chunked.blocks.equals(whole.blocks)
    assert chunked.stacks.frames == whole.stacks.frames


def test_array_form_trace(tmp_path):
    path = tmp_path / "array.json"
    path.write_text(json.dumps([_op(0, 10, "aten::empty"), _mem(1, 512, addr=8)]))
    capture = kineto_trace.load(path)
    assert capture.blocks["size"].to_list() == [512]


@pytest.mark.parametrize("case", ["truncated", "truncated_gz", "not_a_trace", "no_memory",
                                  "garbage", "empty", "bad_utf8"])
def test_bad_traces_raise_one_line_input_error(tmp_path, case):
    full = json.dumps(_trace_with([_op(0, 10, "aten::empty"), _mem(1, 512, addr=8)] * 50))
    path = tmp_path / f"{case}.json"
    words = {
        "truncated": "truncated", "truncated_gz": "gzip", "not_a_trace": "not a torch.profiler",
        "no_memory": "profile_memory=True", "garbage": "not JSON", "empty": "empty",
        "bad_utf8": "UTF-8",
    }[case]
    if case == "truncated":
        path.write_text(full[: len(full) // 2])
    elif case == "truncated_gz":
        path.write_bytes(gzip.compress(full.encode())[:200])
    elif case == "not_a_trace":
        path.write_text(json.dumps({"weights": [1, 2, 3]}))
    elif case == "no_memory":
        path.write_text(json.dumps({"traceEvents": [_op(0, 1, "aten::add")]}))
    elif case == "garbage":
        path.write_text("hello")
    elif case == "empty":
        path.write_text("   ")
    else:
        path.write_bytes(b'{"traceEvents": [{"name": "\xff\xfe"}]}')
    with pytest.raises(InputError) as info:
        kineto_trace.load(path)
    msg = str(info.value)
    assert "\n" not in msg and str(path) in msg and words in msg, msg


def test_cli_summary_reads_a_trace():
    from snapana import sources

    path = TRACES / "switch-transformer-cpu.json"
    if not path.exists():
        pytest.skip("../shared/corpus absent")
    assert sources.sniff(path) == "kineto_trace"
    result = invoke("summary", str(path), "--format", "json")
    assert result.returncode == 0, result.stderr
    json.loads(result.stdout)


def _serving_trace(frame: str) -> dict:
    """A profiler trace of a steady serving loop: 60 GiB live before profiling (Total
    Allocated says so) and 150 allocations that are all freed again, under `frame`."""
    base = 60 << 30
    events, total = [_op(0, 10_000, frame, "python_function")], base
    for i in range(150):
        total += 1 << 20
        events.append(_mem(10 + 2 * i, 1 << 20, addr=0x1000 + i, total=total))
        total -= 1 << 20
        events.append(_mem(11 + 2 * i, -(1 << 20), addr=0x1000 + i, total=total))
    return _trace_with(events)


@pytest.mark.parametrize(("frame", "engine"), [
    ("vllm/worker/model_runner.py(1200): execute_model", "vLLM"),
    ("sglang/srt/model_executor/model_runner.py(900): forward", "SGLang"),
    ("serve.py(10): run", ""),
])
def test_a_serving_engines_baseline_is_not_called_weights(tmp_path, frame, engine):
    """What a vLLM / SGLang process held before profiling is its weights and its KV-cache
    pool, which nothing in the trace tells apart: unknown, said so; the same loop in a
    process that is no serving engine keeps the steady-loop inference (weights)."""
    path = tmp_path / "serve.json"
    path.write_text(json.dumps(_serving_trace(frame)))
    blocks = snapana.load(path).blocks
    (base,) = blocks.filter(pl.col("size") == 60 << 30).iter_rows(named=True)
    if engine:
        assert base["family"] == "unknown"
        assert f"in a {engine} process" in base["reason"] and "KV-cache" in base["reason"]
    else:
        assert base["family"] == "parameters" and base["method"] == "lifetime:persistent"


@pytest.mark.parametrize("path", corpus_params("kineto_traces", "*resnet50*"))
def test_made_up_addresses_are_never_shown(path, tmp_path):
    """A 2021 trace gives memory that predates profiling no address; the blocks get keys
    from a made-up range, which no report, hover or explanation shows as an address."""
    from snapana.units import SYNTHETIC_ADDRESSES

    a = snapana.load(path)
    made_up = a.blocks.filter(pl.col("address") >= SYNTHETIC_ADDRESSES)
    assert made_up.height, "this trace has memory from before profiling"
    out = a.report(tmp_path / "r.html")
    page = out.read_text()
    assert "0x7e00000000" not in page.lower()
    assert "no address recorded" in page  # the allocations view's hover says so
    said = a.explain_text(family=str(made_up["family"][0]))
    assert "0x7e00000000" not in said.lower()


#: kineto's roctracer build writes each device's `hipDeviceProp_t` under the same keys as the
#: CUPTI build writes `cudaDeviceProp` (libkineto/src/DeviceProperties.cpp,
#: createDevicePropertiesJson): id, name, totalGlobalMem, computeMajor/Minor, ...; only the
#: last key differs (maxSharedMemoryPerMultiProcessor instead of the three CUDA ones).
MI300X = {"id": 0, "name": "AMD Instinct MI300X", "totalGlobalMem": 205822885888,
          "computeMajor": 9, "computeMinor": 4, "maxThreadsPerBlock": 1024,
          "maxThreadsPerMultiprocessor": 2048, "regsPerBlock": 65536, "warpSize": 64,
          "sharedMemPerBlock": 65536, "numSms": 304, "maxSharedMemoryPerMultiProcessor": 65536}
_OWLV2 = "google_owlv2-large-patch14-ensemble__1016001.json.gz"
H100_TWIN = TRACES / f"AMD-AGI+TraceLens__tests_traces_h100_{_OWLV2}"
MI300_TWIN = TRACES / f"AMD-AGI+TraceLens__tests_traces_mi300_{_OWLV2}"


def _judgement(path: Path) -> tuple[bool, list, str]:
    """Whether the summary prescribes, the knobs it offers, and its verdict, for the GPU."""
    result = invoke("summary", str(path), "--format", "json")
    assert result.returncode == 0, result.stderr
    (gpu,) = [r for r in json.loads(result.stdout)["devices"] if r["device"] >= 0]
    d = gpu["diagnosis"]
    return d["prescribe"], d["knobs"], d["verdict"]


def test_a_rocm_trace_reads_its_device_properties(tmp_path):
    """A ROCm build's torch.profiler writes `Device Type` 6 (c10::DeviceType::HIP: hipify v1
    renamed the allocator's DeviceType::CUDA) and kineto's roctracer path writes
    deviceProperties as the CUDA path does: the card's name and capacity come from it, and
    the device is called cuda:N, as torch on ROCm calls it. The real H100 trace rewritten so
    is judged as the H100 is: far below capacity, nothing to shrink, no knob."""
    if not H100_TWIN.exists():
        pytest.skip("../shared/corpus absent")
    trace = _raw_trace(H100_TWIN)
    for ev in trace["traceEvents"]:
        args = ev.get("args") or {}
        if ev.get("name") in ("[memory]", "[OutOfMemory]") and args.get("Device Type") == 1:
            args["Device Type"] = 6
    assert len(trace["deviceProperties"]) == 1 and trace["deviceProperties"][0]["id"] == 0
    trace["deviceProperties"] = [MI300X]
    for key in ("cuda_runtime_version", "cupti_version", "cuda_driver_version"):
        trace.pop(key, None)
    trace["roctracer_version"] = 4.1
    path = tmp_path / "mi300x.json"
    path.write_text(json.dumps(trace))

    capture = kineto_trace.load(path)
    gpus = [d for d in capture.devices if d >= 0]
    assert gpus == [0]
    assert capture.capacity_bytes == {0: MI300X["totalGlobalMem"]}
    assert capture.metadata["device_names"][0] == "cuda:0 (AMD Instinct MI300X)"
    prescribe, knobs, verdict = _judgement(path)
    twin = _judgement(H100_TWIN)
    assert (prescribe, knobs) == (twin[0], twin[1]) == (False, [])
    assert "nothing needs to shrink" in verdict and "nothing needs to shrink" in twin[2]


def test_the_real_mi300_trace_is_judged_against_its_card():
    """The MI300X capture of the same model: capacity is its own deviceProperties'
    totalGlobalMem (read here from the raw file), and a 2.6 GiB peak needs nothing to shrink."""
    if not MI300_TWIN.exists():
        pytest.skip("../shared/corpus absent")
    raw = _raw_trace(MI300_TWIN)
    types = {k[0] for k in _memory_by_device(raw)}
    assert 6 in types  # recorded by torch 2.7 on ROCm: HIP's own device type
    (prop,) = raw["deviceProperties"]
    capture = kineto_trace.load(MI300_TWIN)
    assert capture.capacity_bytes[prop["id"]] == prop["totalGlobalMem"]
    assert capture.metadata["device_names"][prop["id"]] == f"cuda:{prop['id']} ({prop['name']})"
    prescribe, knobs, verdict = _judgement(MI300_TWIN)
    assert not prescribe and knobs == [] and "nothing needs to shrink" in verdict
