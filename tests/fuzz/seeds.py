"""Seed inputs per format: the bundled samples, the shared corpus when present, and small
synthetic files, each reduced so that one case runs in a fraction of a second.

Corpus files are read where they lie (never copied into the repository). Generated seeds (a
memray capture, an export folder) are written once per process under a temporary folder.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
from functools import cache
from pathlib import Path
from typing import Any

from .pickle_codec import safe_loads

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = ROOT / "sample_snapshots"
CORPUS = Path(os.environ.get("SNAPANA_CORPUS") or ROOT.parent / "shared" / "corpus")


def _files(folder: Path, pattern: str) -> list[Path]:
    return sorted(folder.glob(pattern)) if folder.is_dir() else []


@cache
def _workdir() -> Path:
    d = Path(tempfile.mkdtemp(prefix="snapana-fuzz-seeds-"))
    import atexit

    atexit.register(shutil.rmtree, d, True)
    return d


# ----- snapshot pickles ----------------------------------------------------------------------

@cache
def pickle_seed_bytes(use_corpus: bool = True, max_bytes: int = 4 << 20) -> tuple[bytes, ...]:
    """Raw (uncompressed) seed pickles: samples first, then corpus snapshots."""
    paths = _files(SAMPLES, "*.pickle")
    if use_corpus:
        paths += [p for p in _files(CORPUS / "torch_snapshots", "*.pickle")
                  if p.stat().st_size <= max_bytes]
    out = []
    for p in paths:
        data = p.read_bytes()
        if data[:2] == b"\x1f\x8b":
            data = gzip.decompress(data)
        out.append(data)
    return tuple(out)


def reduce_snapshot(tree: Any, keep: int, rng: Any) -> Any:
    """Keep the last `keep` trace entries of each device, as a trace ring buffer that
    overflowed does (so the trace still ends at the snapshot and agrees with the segments),
    and every segment: same shapes, a fraction of the work."""
    if isinstance(tree, list):  # 1.13 layout: a bare list of segments
        return tree
    if not isinstance(tree, dict):
        return tree
    traces = tree.get("device_traces")
    if isinstance(traces, list):
        tree["device_traces"] = [tr[-keep:] if isinstance(tr, list) else tr for tr in traces]
    ann = tree.get("external_annotations")
    if isinstance(ann, list) and len(ann) > keep:
        tree["external_annotations"] = ann[-keep:]
    return tree


# ----- kineto traces -------------------------------------------------------------------------

def synthetic_kineto(layout: str = "modern") -> dict[str, Any]:
    """A small torch.profiler trace with [memory] events inside ops (modern or 2021 layout)."""
    events: list[dict[str, Any]] = [
        {"ph": "X", "cat": "python_function", "name": "train.py(10): step", "pid": 1, "tid": 1,
         "ts": 0, "dur": 1000},
        {"ph": "X", "cat": "user_annotation", "name": "forward", "pid": 1, "tid": 1,
         "ts": 10, "dur": 500},
        {"ph": "X", "cat": "cpu_op", "name": "aten::empty", "pid": 1, "tid": 1, "ts": 20,
         "dur": 30, "args": {"Call stack": "train.py(12): step;model.py(3): forward"}},
    ]
    total = 0
    for i in range(12):
        size = (i + 1) * 512
        sign = 1 if i % 3 != 2 else -1
        total += sign * size
        args: dict[str, Any] = {"Bytes": sign * size, "Device Type": 1, "Device Id": 0}
        if layout == "modern":
            args.update({"Addr": 0x7F00_0000 + (i if sign > 0 else i - 1) * 4096,
                         "Total Allocated": max(total, 0), "Total Reserved": 1 << 22})
        events.append({"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "pid": 1,
                       "tid": 1, "ts": 25 + i, "s": "t", "args": args})
    events.append({"ph": "i", "name": "[OutOfMemory]", "pid": 1, "tid": 1, "ts": 60, "s": "t",
                   "args": {"Bytes": 1 << 30, "Device Type": 1, "Device Id": 0,
                            "Total Allocated": total, "Total Reserved": 1 << 22}})
    return {"schemaVersion": 1, "deviceProperties": [
        {"id": 0, "name": "Fake GPU", "totalGlobalMem": 1 << 34}], "traceEvents": events}


@cache
def kineto_seed_trees() -> tuple[str, ...]:
    """Kineto seeds as JSON text: synthetic ones, then windows of the corpus traces."""
    seeds = [json.dumps(synthetic_kineto("modern")), json.dumps(synthetic_kineto("2021"))]
    for p in _files(CORPUS / "kineto_traces", "*.json*"):
        raw = p.read_bytes()
        if raw[:2] == b"\x1f\x8b":
            raw = gzip.decompress(raw)
        doc = json.loads(raw)
        events = doc.get("traceEvents") or []
        mem = [i for i, e in enumerate(events) if e.get("name") == "[memory]"]
        for k in range(2):  # two windows per trace
            if not mem:
                break
            at = mem[(len(mem) * k) // 2]
            lo = max(0, at - 150)
            window = events[lo:lo + 400]
            small = {k2: v for k2, v in doc.items() if k2 != "traceEvents"}
            small["traceEvents"] = window
            seeds.append(json.dumps(small))
    return tuple(seeds)


# ----- memory timelines ----------------------------------------------------------------------

def synthetic_timeline(layout: str = "raw") -> Any:
    if layout == "plot":
        times = [0, 10, 20, 30, 40]
        sizes = [[0, 100, 0, 0, 0, 0, 0, 0, 0], [0, 100, 50, 0, 0, 0, 0, 0, 0],
                 [0, 100, 50, 0, 0, 300, 0, 0, 0], [0, 100, 50, 0, 0, 100, 40, 0, 0],
                 [0, 100, 50, 0, 0, 0, 40, 0, 0]]
        return [times, sizes]
    recs = [[-1, 1, 4096, 0], [1000, 2, 2048, 4], [2000, 2, 1024, 3], [3000, 4, -1024, 3],
            [4000, 3, -2048, 4], [4000, 3, 2048, 5], [5000, 4, -2048, 5]]
    return recs


@cache
def timeline_seed_texts() -> tuple[str, ...]:
    seeds = [json.dumps(synthetic_timeline("raw")), json.dumps(synthetic_timeline("plot"))]
    for p in _files(CORPUS / "memory_timeline", "*.json*"):
        raw = p.read_bytes()
        if raw[:2] == b"\x1f\x8b":
            raw = gzip.decompress(raw)
        doc = json.loads(raw)
        if isinstance(doc, list) and len(doc) > 2 and isinstance(doc[0], list) \
                and len(doc[0]) == 4:
            for k in range(3):
                lo = (len(doc) * k) // 3
                seeds.append(json.dumps(doc[lo:lo + 200]))
    return tuple(seeds)


# ----- memray --------------------------------------------------------------------------------

def lz4_frame_decompress(data: bytes) -> bytes:
    """A whole LZ4 frame (the format `memray run` compresses with), block by block."""
    if data[:4] != b"\x04\x22\x4d\x18":
        raise ValueError("not an LZ4 frame")
    flg = data[4]
    pos = 6 + (8 if flg & 0x08 else 0) + (4 if flg & 0x01 else 0) + 1
    out = bytearray()
    block_checksum = bool(flg & 0x10)
    while pos + 4 <= len(data):
        (bsize,) = struct.unpack_from("<I", data, pos)
        pos += 4
        if bsize == 0:
            break
        if bsize & 0x80000000:
            n = bsize & 0x7FFFFFFF
            out += data[pos:pos + n]
            pos += n
        else:
            block = data[pos:pos + bsize]
            pos += bsize
            i = 0
            while i < len(block):
                token = block[i]
                i += 1
                lit = token >> 4
                if lit == 15:
                    while True:
                        b = block[i]
                        i += 1
                        lit += b
                        if b != 255:
                            break
                out += block[i:i + lit]
                i += lit
                if i >= len(block):
                    break
                offset = block[i] | (block[i + 1] << 8)
                i += 2
                mlen = token & 15
                if mlen == 15:
                    while True:
                        b = block[i]
                        i += 1
                        mlen += b
                        if b != 255:
                            break
                mlen += 4
                start = len(out) - offset
                if offset == 0 or start < 0:
                    raise ValueError("corrupt LZ4 block")
                if offset >= mlen:
                    out += out[start:start + mlen]
                else:
                    for k in range(mlen):
                        out.append(out[start + k])
        if block_checksum:
            pos += 4
    return bytes(out)


@cache
def memray_seeds() -> tuple[bytes, ...]:
    """memray captures: generated with the installed memray (format it reads, compressed and
    not), then the corpus captures as they are and decompressed with the version field set
    to what the installed memray reads (so its native reader parses them)."""
    seeds: list[bytes] = []
    own = None
    memray_cli = shutil.which("memray") or str(Path(sys.executable).with_name("memray"))
    if Path(memray_cli).exists():
        work = _workdir()
        script = work / "alloc.py"
        script.write_text("import threading\nx = [bytearray(1000) for _ in range(300)]\n"
                          "def f():\n    return [bytes(5000) for _ in range(20)]\n"
                          "t = threading.Thread(target=f)\nt.start()\nt.join()\n")
        for flag, name in (("--no-compress", "raw.bin"), (None, "lz4.bin")):
            out = work / name
            cmd = [memray_cli, "run", "-q", "-o", str(out)] + ([flag] if flag else []) + \
                [str(script)]
            try:
                subprocess.run(cmd, cwd=work, capture_output=True, timeout=60, check=True)
                seeds.append(out.read_bytes())
            except (OSError, subprocess.SubprocessError):
                continue
        if seeds:
            raw = seeds[0]
            if raw.startswith(b"memray\x00"):
                own = struct.unpack_from("<i", raw, 7)[0]
    for p in _files(CORPUS / "memray", "*.bin"):
        data = p.read_bytes()
        seeds.append(data)
        if own is not None:
            try:
                plain = bytearray(lz4_frame_decompress(data))
            except (ValueError, IndexError):
                continue
            if plain.startswith(b"memray\x00"):
                plain[7:11] = struct.pack("<i", own)
                seeds.append(bytes(plain))
    return tuple(seeds)


# ----- a small valid snapshot, its sidecar --------------------------------------------------

@cache
def small_snapshot() -> bytes | None:
    """The smallest sample cut to its trace's last entries: a snapshot of a few KB (saved
    regression cases stay small) that every command analyses (None: no samples)."""
    samples = sorted(_files(SAMPLES, "*.pickle"), key=lambda p: p.stat().st_size)
    if not samples:
        return None
    import pickle
    import random

    tree = reduce_snapshot(safe_loads(samples[0].read_bytes()), 24, random.Random(0))
    return pickle.dumps(tree, protocol=4)


@cache
def rank_snapshot(rank: int, oom: bool) -> bytes:
    """A snapshot of about 2 KB from the allocator simulator, one per rank of a job: a few
    blocks (sizes differ by rank), one freed while another stream uses it (pending free),
    and, with `oom`, a request the 256 MiB device cannot hold."""
    import pickle

    from snapana.allocator_model.simulator import CachingAllocatorSim, SimulatedOOM

    mib = 1 << 20
    stack = (("/app/model.py", 40 + rank, "forward"), ("/app/train.py", 12, "main"))
    sim = CachingAllocatorSim(256 * mib, outside_pytorch=16 * mib)
    keep = [sim.malloc((3 + rank) * mib, stack), sim.malloc(700 * 1024, stack)]
    shared = sim.malloc(5 * mib, stack)
    sim.record_stream(shared, 7)
    sim.free(shared)
    keep.append(sim.malloc((40 + 8 * rank) * mib, stack))
    if oom:
        try:
            sim.malloc(1 << 30, stack)
        except SimulatedOOM:
            pass
    return pickle.dumps(sim.snapshot(), protocol=4)


#: Roles a sidecar's tensor inventory names (snapana.sources.sidecar.ROLES).
ROLES = ("parameter", "buffer", "gradient", "optimizer_state", "tensor")


def sidecar_seed(snapshot: bytes, rank: int = 0) -> dict[str, Any]:
    """The sidecar `snapana record` writes beside `snapshot` (format 1): capacity, run
    facts, and an inventory naming a tensor in each of the first live blocks."""
    tree = safe_loads(snapshot)
    segs = tree.get("segments", []) if isinstance(tree, dict) else tree
    blocks = [b for s in segs for b in s.get("blocks", [])
              if b.get("state") == "active_allocated"][:8]
    tensors = [{"ptr": b["address"], "nbytes": b["requested_size"], "role": ROLES[i % 5],
                "name": f"layers.{i}.weight", "shape": [b["requested_size"] // 4],
                "dtype": "torch.float32"} for i, b in enumerate(blocks)]
    return {"format": "snapana.record.sidecar", "version": 1, "reason": "oom", "device": 0,
            "device_name": "NVIDIA H100 80GB HBM3", "device_total_bytes": 85_045_379_072,
            "device_free_bytes": 1 << 30, "rank": rank, "local_rank": rank,
            "world_size": 2, "hostname": "node-1", "pid": 4242, "step": 3,
            "wall_time": 1.7e9, "pytorch_cuda_alloc_conf": "expandable_segments:False",
            "versions": {"torch": "2.5.1", "cuda": "12.4"}, "argv": ["train.py"],
            "frameworks": {"megatron": "0.9.0"},
            "inventory": {"complete": True, "stopped": None, "seconds": 0.01,
                          "tensors": tensors}}


# ----- snapana export folders ----------------------------------------------------------------

@cache
def export_seed() -> dict[str, bytes] | None:
    """The files of `snapana export` run on the small snapshot (None if it fails)."""
    snapshot = small_snapshot()
    if snapshot is None:
        return None
    work = _workdir()
    small = work / "small.pickle"
    small.write_bytes(snapshot)
    out = work / "export"
    env = dict(os.environ, PYTHONPATH=str(ROOT / "analyzer"))
    try:
        subprocess.run([sys.executable, "-m", "snapana", "export", str(small), "-o",
                        str(out)], capture_output=True, timeout=120, check=True, env=env)
    except (OSError, subprocess.SubprocessError):
        return None
    return {p.name: p.read_bytes() for p in sorted(out.iterdir()) if p.is_file()}


def decode_pickle(data: bytes) -> Any:
    return safe_loads(data)
