"""Issue 44, the texts beside an OOM message: `torch.cuda.memory_summary()` (printed by the
real torch function from statistics the test chooses), `nvidia-smi` tables, vLLM's KV-cache
refusals and budget, a folder of per-rank logs, and a log checked against the snapshot of
the same failure. Expected figures come from the numbers the test put in the text, or from
the raw snapshot pickle decoded by the test's own loader."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest
from snapana.log_session import weigh
from snapana.sources.log_text import read_text

from .conftest import ROOT, invoke, raw_load, require
from .test_oom_text import GIB, MIB, Oom, shown

SIZE_STATS = {"allocated_bytes": "allocated", "active_bytes": "active",
              "requested_bytes": "requested", "reserved_bytes": "reserved",
              "inactive_split_bytes": "non_releasable"}
COUNT_STATS = {"allocation": "allocations", "active": "active_allocs", "segment": "segments",
               "inactive_split": "non_releasable_allocs"}
POOLS = {"all": "", "large_pool": ".large", "small_pool": ".small"}
COLUMNS = ("current", "peak", "allocated", "freed")


def _random_stats(r: random.Random) -> dict[str, int]:
    """memory_stats() as the allocator keeps them, at scales from bytes to TiB (each row's
    "all" value picks the unit its pools are printed in)."""
    stats: dict[str, int] = {"num_ooms": r.randrange(0, 5),
                             "num_alloc_retries": r.randrange(0, 50)}
    for key in (*SIZE_STATS, *COUNT_STATS):
        count = key in COUNT_STATS
        for column in COLUMNS:
            scale = r.choice((1, 1000, 10**6, 10**9)) if count else \
                r.choice((1, 1 << 10, 1 << 20, 1 << 30, 1 << 40))
            total = r.randrange(0, 1000 * scale)
            small = r.randrange(0, total + 1)
            stats[f"{key}.all.{column}"] = total
            stats[f"{key}.small_pool.{column}"] = small
            stats[f"{key}.large_pool.{column}"] = total - small
    for key in ("oversize_allocations", "oversize_segments"):
        for column in COLUMNS:
            stats[f"{key}.{column}"] = r.randrange(0, 10)
    return stats


@pytest.mark.torch
@pytest.mark.parametrize("seed", range(6))
def test_memory_summary_printed_by_torch_is_read(seed: int, monkeypatch) -> None:
    """Every figure of a table torch's own memory_summary() prints, read within the unit it
    was rounded down to; a log prefix before each line allowed."""
    torch = require("torch")
    r = random.Random(seed)
    stats = _random_stats(r)
    monkeypatch.setattr(torch.cuda.memory, "memory_stats", lambda device=None: stats)
    table = torch.cuda.memory.memory_summary(device=3)
    prefix = r.choice(("", "[rank3]: ", "2025-03-01 10:00:00,123 INFO "))
    text = "\n".join(prefix + line for line in table.splitlines())
    (summary,) = read_text(text, "log").summaries
    assert summary.device == 3
    assert (summary.ooms, summary.retries) == (stats["num_ooms"], stats["num_alloc_retries"])
    for key, name in SIZE_STATS.items():
        for pool, suffix in POOLS.items():
            read = summary.sizes[name + suffix]
            for column, figure in zip(COLUMNS, read, strict=True):
                true = stats[f"{key}.{pool}.{column}"]
                assert abs(figure.bytes - true) <= figure.slack, (name + suffix, column, figure)
    for key, name in COUNT_STATS.items():
        for pool, suffix in POOLS.items():
            for column, (n, slack) in zip(COLUMNS, summary.counts[name + suffix], strict=True):
                assert abs(n - stats[f"{key}.{pool}.{column}"]) <= slack
    for key in ("oversize_allocations", "oversize_segments"):
        assert [n for n, _ in summary.counts[key]] == [stats[f"{key}.{c}"] for c in COLUMNS]


#: memory_summary() before PyTorch 2.0 (pytorch#91854 changed KB/MB/GB to KiB/MiB/GiB; no
#: "Requested memory" row before the requested_bytes statistic), abbreviated=True.
OLD_SUMMARY = """\
|===========================================================================|
|                  PyTorch CUDA memory summary, device ID 0                 |
|---------------------------------------------------------------------------|
|            CUDA OOMs: 2            |        cudaMalloc retries: 7         |
|===========================================================================|
|        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  |
|---------------------------------------------------------------------------|
| Allocated memory      |   14210 MB |   15020 MB |    3120 GB |    3106 GB |
|---------------------------------------------------------------------------|
| Active memory         |   14210 MB |   15020 MB |    3120 GB |    3106 GB |
|---------------------------------------------------------------------------|
| GPU reserved memory   |   15102 MB |   15102 MB |   15200 MB |      98 MB |
|---------------------------------------------------------------------------|
| Non-releasable memory |     891 MB |    1303 MB |    2410 GB |    2409 GB |
|---------------------------------------------------------------------------|
| Allocations           |    1517    |    1630    |    4130 K  |    4128 K  |
|===========================================================================|
"""


def test_memory_summary_of_the_1x_releases_and_what_it_adds() -> None:
    """The KB/MB spelling is the same powers of 1024; reserved − allocated and the
    non-releasable share are said with their figures; the expandable_segments knob comes
    with the non-releasable figure that supports it; counts in thousands keep their slack."""
    (s,) = read_text(OLD_SUMMARY, "log").summaries
    assert (s.ooms, s.retries) == (2, 7)
    allocated = s.sizes["allocated"][0]
    assert allocated.bytes - allocated.slack == 14210 * MIB
    assert allocated.bytes + allocated.slack == 14211 * MIB
    assert s.sizes["allocated"][2].bytes - s.sizes["allocated"][2].slack == 3120 * GIB
    assert "requested" not in s.sizes
    assert s.counts["allocations"][2] == (4130 * 1000 + 500, 500)
    view = _view(OLD_SUMMARY)
    (sec,) = view.sections
    text = " ".join(sec.sentences)
    assert "cached but unallocated" in text and "7 cudaMalloc retries" in text
    share = (891 * MIB) / (15102 * MIB)
    assert f"= {share:.0%} of reserved" in text
    assert [k for k, _ in sec.knobs] == ["PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"]
    assert "non-releasable" in sec.knobs[0][1]


def test_memory_summary_is_checked_against_the_message_before_it() -> None:
    """The table printed after an OOM is checked against that message's allocated and
    reserved: agreeing within both roundings, or the difference said; no expandable_segments
    knob where the message says they were on."""
    oom = Oom(request=2 * GIB, device=0, capacity=80 * GIB, free=GIB // 4,
              allocated=14210 * MIB + 300 * 1024, unallocated=892 * MIB)
    text = f"torch.OutOfMemoryError: {oom.v2()}\n{OLD_SUMMARY}"
    (sec,) = _view(text).sections
    sentences = " ".join(sec.sentences)
    assert "allocated by PyTorch: the OOM message at line 1" in sentences
    assert sentences.count("they agree within their rounding") == 2
    far = Oom(request=2 * GIB, device=0, capacity=80 * GIB, free=GIB // 4,
              allocated=12 * GIB, unallocated=892 * MIB)
    (sec,) = _view(f"torch.OutOfMemoryError: {far.v2()}\n{OLD_SUMMARY}").sections
    assert "they differ by" in " ".join(sec.sentences)
    on = oom.v2().replace("If reserved but unallocated memory is large try setting "
                          "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid "
                          "fragmentation.  See documentation for Memory Management  "
                          "(https://pytorch.org/docs/stable/notes/cuda.html"
                          "#environment-variables)", "")
    (sec,) = _view(f"torch.OutOfMemoryError: {on}\n{OLD_SUMMARY}").sections
    assert not sec.knobs  # 2.14+ leaves the hint out when expandable segments are on


def _view(text: str, name: str = "log"):
    from snapana.render.text_log import text_log_view

    return text_log_view(name, weigh([read_text(text, name)]))


def _smi(gpus: list[tuple[int, str, int, int]], procs: list[tuple[int, int, str, int]],
         mig: bool = True) -> str:
    """An nvidia-smi table as drivers 450+ print it (`mig`: the GI / CI columns), else as
    older ones did, from the figures given (MiB)."""
    lines = ["+-----------------------------------------------------------------------------+",
             "| NVIDIA-SMI 535.104.05   Driver Version: 535.104.05   CUDA Version: 12.2     |",
             "|-------------------------------+----------------------+----------------------+",
             "| GPU  Name        Persistence-M| Bus-Id        Disp.A | Volatile Uncorr. ECC |",
             "|===============================+======================+======================|"]
    for index, name, used, total in gpus:
        lines += [f"|   {index}  {name:<20}  On   | 00000000:{index:02d}:00.0 Off |       0 |",
                  f"| N/A   34C    P0    61W / 400W |  {used:>6}MiB / {total}MiB |  0%  Default |",
                  "+-------------------------------+----------------------+----------------------+"]
    lines += ["", "+-----------------------------------------------------------------------------+",
              "| Processes:                                                                  |",
              "|  GPU   GI   CI        PID   Type   Process name                  GPU Memory |",
              "|=============================================================================|"]
    for gpu, pid, name, used in procs:
        mid = "  N/A  N/A" if mig else ""
        lines.append(f"|    {gpu}{mid}  {pid:>8}      C   {name:<28} {used:>6}MiB |")
    lines.append("+-----------------------------------------------------------------------------+")
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("mig", [True, False])
def test_nvidia_smi_tables_name_the_processes_sharing_a_card(mig: bool) -> None:
    r = random.Random(int(mig))
    gpus = [(i, "NVIDIA A100-SXM4-80GB", r.randrange(0, 81920), 81920) for i in range(4)]
    procs = [(0, 4242, "python3", 60000), (0, 5151, "/usr/bin/python", 18000),
             (1, 6161, "python3", 70000)]
    (table,) = read_text(_smi(gpus, procs, mig), "log").smi
    assert [(g.index, g.name, g.used.bytes, g.total.bytes) for g in table.gpus] == \
        [(i, n, u * MIB, t * MIB) for i, n, u, t in gpus]
    assert [(p.gpu, p.pid, p.name, p.used.bytes) for p in table.processes] == \
        [(g, pid, n, u * MIB) for g, pid, n, u in procs]
    oom = Oom(request=2 * GIB, device=0, capacity=80 * GIB, free=GIB // 4, allocated=50 * GIB,
              unallocated=GIB, this_process=58 * GIB, processes=((5151, 18000 * MIB),))
    (sec,) = _view(f"torch.OutOfMemoryError: {oom.v2()}\n" + _smi(gpus, procs, mig)).sections
    text = " ".join(sec.sentences)
    assert "GPU 0 is shared by 2 processes" in text and "pid 5151" in text
    assert f"{(60000 + 18000) / 1024:.2f} GiB in all" in text
    assert "the OOM message at line 1 names processes nvidia-smi lists on its GPU 0" in text
    assert "GPU 1 is shared" not in text


# ----- vLLM -------------------------------------------------------------------------------------

def _budget(total: float, util: float, weights: float, non_torch: float, activation: float,
            prefix: str = "INFO 03-01 10:00:00 [worker.py:267] ") -> tuple[str, float, float]:
    """vLLM 0.7's budget message (three lines of one record) from the figures given (GiB):
    the text, the budget and what is left for the KV cache, as vLLM computes them."""
    budget = round(total * util, 2)
    kv = round(budget - weights - non_torch - activation, 2)
    text = (f"{prefix}Memory profiling takes 5.20 seconds\n"
            f"{prefix}the current vLLM instance can use total_gpu_memory ({total:.2f}GiB) x "
            f"gpu_memory_utilization ({util:.2f}) = {budget:.2f}GiB\n"
            f"{prefix}model weights take {weights:.2f}GiB; non_torch_memory takes "
            f"{non_torch:.2f}GiB; PyTorch activation peak memory takes {activation:.2f}GiB; "
            f"the rest of the memory reserved for KV Cache is {kv:.2f}GiB.\n")
    return text, budget, kv


NO_BLOCKS = ("ValueError: No available memory for the cache blocks. Try increasing "
             "`gpu_memory_utilization` when initializing the engine.")


def _v1_too_long(n: int, needed: float, available: float, estimate: int,
                 newer: bool = False) -> str:
    if newer:  # later V1 releases: no parenthesis, "Estimated maximum model length"
        return (f"ValueError: To serve at least one request with the model's max seq len ({n}),"
                f" {needed:.2f} GiB KV cache is needed, which is larger than the available KV "
                f"cache memory ({available:.2f} GiB). Estimated maximum model length is "
                f"{estimate}.")
    return (f"ValueError: To serve at least one request with the models's max seq len ({n}), "
            f"({needed:.2f} GiB KV cache is needed, which is larger than the available KV "
            f"cache memory ({available:.2f} GiB). Based on the available memory, the "
            f"estimated maximum model length is {estimate}. Try increasing "
            "`gpu_memory_utilization` or decreasing `max_model_len` when initializing the "
            "engine.")


def test_vllm_no_room_for_the_cache_with_its_budget() -> None:
    """The budget adds up; the least utilisation that leaves the cache anything is computed
    from the printed figures; the weights knob comes when the weights take most of it; the
    refusal printed twice (log line and traceback) is one."""
    text, budget, kv = _budget(79.15, 0.90, 65.50, 0.30, 6.00)
    view = _view(text + f"ERROR [core.py:1] {NO_BLOCKS}\nTraceback ...\n{NO_BLOCKS}\n")
    (sec,) = view.sections
    assert sec.id == "vllm" and view.verdict and "no memory was left" in view.verdict
    assert f"{kv:.2f} GiB" in " ".join(c for row in sec.rows for c in row)
    knobs = dict(sec.knobs)
    used = 65.50 + 0.30 + 6.00
    least = math.ceil((used + 0.01 * 79.15) / 79.15 * 100) / 100
    assert f"--gpu-memory-utilization {least:.2f}" in knobs
    assert "if no other process shares the card" in knobs[f"--gpu-memory-utilization {least:.2f}"]
    assert any(k.startswith("--tensor-parallel-size") for k in knobs)
    assert f"{65.50 / budget:.0%} of the budget" in " ".join(knobs.values())


@pytest.mark.parametrize("newer", [False, True])
def test_vllm_cache_too_short_for_max_model_len(newer: bool) -> None:
    text, budget, kv = _budget(79.11, 0.90, 14.99, 0.35, 1.24)
    needed, estimate = 64.0, 447088
    view = _view(text + "ERROR 03-01 [core.py:390] "
                 + _v1_too_long(131072 * 8, needed, kv, estimate, newer))
    (sec,) = view.sections
    assert f"needs {needed:.2f} GiB" in sec.verdict and f"{kv:.2f} GiB was available" in \
        sec.verdict
    knobs = dict(sec.knobs)
    assert f"--max-model-len {estimate}" in knobs
    least = math.ceil((budget + needed - kv) / 79.11 * 100) / 100
    if least <= 0.95:
        assert f"--gpu-memory-utilization {least:.2f}" in knobs
    else:
        assert not any(k.startswith("--gpu-memory-utilization") for k in knobs)


def test_vllm_utilisation_is_not_offered_when_another_process_shares_the_card() -> None:
    text, budget, kv = _budget(79.11, 0.80, 14.99, 0.35, 1.24)
    smi = _smi([(0, "NVIDIA H100 80GB HBM3", 80000, 81559)],
               [(0, 100, "vllm-engine", 64000), (0, 200, "python3", 15000)])
    refusal = _v1_too_long(131072, kv + 2, kv, 100000)
    bare = dict(_view(text + refusal).sections[0].knobs)
    shared = dict(next(s for s in _view(text + refusal + "\n" + smi).sections
                       if s.id == "vllm").knobs)
    assert any(k.startswith("--gpu-memory-utilization") for k in bare)
    assert not any(k.startswith("--gpu-memory-utilization") for k in shared)
    assert "--max-model-len 100000" in shared


def test_vllm_v0_max_seq_len_refusal() -> None:
    text = ("ValueError: The model's max seq len (131072) is larger than the maximum number of "
            "tokens that can be stored in KV cache (24480). Try increasing "
            "`gpu_memory_utilization` or decreasing `max_model_len` when initializing the "
            "engine.")
    (sec,) = _view(text).sections
    assert "131,072" in sec.verdict and "24,480 tokens" in sec.verdict
    assert [k for k, _ in sec.knobs] == ["--max-model-len 24480"]


# ----- per-rank logs and the CLI -------------------------------------------------------------

def _rank_log(rank: int, request: int) -> str:
    oom = Oom(request=request, device=rank % 8, capacity=80 * GIB, free=GIB // 8,
              allocated=70 * GIB, unallocated=2 * GIB, this_process=75 * GIB)
    return f"step 10 loss 1.2\ntorch.OutOfMemoryError: {oom.v2()}\n"


def test_a_folder_of_per_rank_logs(tmp_path: Path) -> None:
    """Ranks from the file names, the rank table, and a log with nothing about memory (a
    rank killed by the watchdog) or an empty one said, not failed on."""
    logs = tmp_path / "logs"
    logs.mkdir()
    requests = {r: (r + 1) * GIB for r in range(4)}
    for r, req in requests.items():
        (logs / f"worker_rank{r}.log").write_text(_rank_log(r, req))
    (logs / "rank4.log").write_text("NCCL watchdog timeout\n")
    (logs / "rank5.log").write_text("")
    result = invoke("summary", str(logs), "--format", "json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    rows = data["ranks"]["rows"]
    assert [int(row[0]) for row in rows] == list(requests)
    assert [row[3] for row in rows] == [shown(req) for req in requests.values()]
    assert all(row[1].startswith(f"worker_rank{row[0]}.log:") for row in rows)
    notes = " ".join(data["not_read"])
    assert "rank4.log: nothing about GPU memory" in notes and "rank5.log: not read" in notes
    report = invoke("report", str(logs), "-o", str(tmp_path / "r.html"))
    assert report.returncode == 0, report.stderr
    assert (tmp_path / "r.html").read_text().count("worker_rank") >= 4


def test_a_folder_of_logs_none_of_which_says_anything(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    for r in range(3):
        (logs / f"rank{r}.log").write_text("training step ok\n")
    result = invoke("summary", str(logs))
    assert result.returncode == 2
    assert "none of the 3 text inputs" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize("first", ["[rank0]: ", "[2025-03-14 09:20:11] "])
def test_a_log_whose_first_line_opens_with_a_bracket_is_a_log(tmp_path: Path,
                                                               first: str) -> None:
    """Not a JSON array (a profiler trace): a rank tag or a timestamp."""
    path = tmp_path / "job.log"
    path.write_text(first + _rank_log(0, 3 * GIB))
    result = invoke("summary", str(path))
    assert result.returncode == 0, result.stderr
    assert "CUDA out of memory on GPU 0 for a request of 3.00 GiB" in result.stdout


# ----- a log beside its snapshot -------------------------------------------------------------

SAMPLE = ROOT / "sample_snapshots" / "slime-tp1-logits-fp32-oom.pickle"


def _segment(request: int) -> int:
    """What the allocator asks the device for (c10's get_allocation_size), recomputed: the
    request rounded to 512 bytes; 2 MiB for up to 1 MiB, 20 MiB below 10 MiB, else rounded
    up to 2 MiB."""
    size = max(512, -(-request // 512) * 512)
    if size <= MIB:
        return 2 * MIB
    if size < 10 * MIB:
        return 20 * MIB
    return -(-size // (2 * MIB)) * (2 * MIB)


def _sample_oom() -> Oom:
    """The OOM of the sample's raw pickle, its figures as a 2.1+ message would print them:
    the failed request's segment and device_free from its last trace entry, reserved and
    allocated from its segments (dumped at the OOM)."""
    snap = raw_load(SAMPLE)
    (oom,) = [e for e in snap["device_traces"][0] if e["action"] == "oom"][-1:]
    segments = [s for s in snap["segments"] if s["device"] == 0]
    reserved = sum(s["total_size"] for s in segments)
    allocated = sum(b["size"] for s in segments for b in s["blocks"]
                    if b["state"] == "active_allocated")
    return Oom(request=_segment(oom["size"]), device=0, capacity=80 * GIB,
               free=oom["device_free"], allocated=allocated,
               unallocated=reserved - allocated)


@pytest.mark.parametrize("how", ["--log", "among the inputs"])
def test_a_log_beside_its_snapshot_is_checked_against_it(tmp_path: Path, how: str) -> None:
    oom = _sample_oom()
    good = tmp_path / "good.log"
    good.write_text(f"[rank0]: torch.OutOfMemoryError: {oom.v2()}\n")
    oom.free += GIB
    bad = tmp_path / "bad.log"
    bad.write_text(f"[rank0]: torch.OutOfMemoryError: {oom.v2()}\n")
    for log, agrees in ((good, True), (bad, False)):
        args = [str(SAMPLE), "--log", str(log)] if how == "--log" else [str(SAMPLE), str(log)]
        result = invoke("summary", *args, "--format", "json")
        assert result.returncode == 0, result.stderr
        (check,) = json.loads(result.stdout)["log_checks"]
        verdicts = {row[0]: row[3] for row in check["rows"]}
        assert set(verdicts) == {"asked of the device", "device free", "reserved by PyTorch",
                                 "allocated by PyTorch"}
        if agrees:
            assert set(verdicts.values()) == {"agrees"}, check
            assert "agree with the snapshot's" in check["verdict"]
        else:
            assert verdicts["device free"] == "differs by 1.00 GiB"
            assert "1 of 4 figures disagree (device free)" in check["verdict"]
    out = tmp_path / "r.html"
    result = invoke("report", str(SAMPLE), "--log", str(bad), "-o", str(out))
    assert result.returncode == 0, result.stderr
    assert "1 of 4 figures disagree" in out.read_text()
    assert invoke("report", str(SAMPLE), "--log", str(bad), "-o", str(bad)).returncode == 2


def test_a_log_beside_its_snapshot_is_judged_on_the_first_screen(tmp_path: Path) -> None:
    """`summary SNAP --log LOG` without --full says whether the log agrees, and on which
    figure it does not (it said only "1 log(s) ... checked (--full)" before)."""
    oom = _sample_oom()
    good = tmp_path / "good.log"
    good.write_text(f"[rank0]: torch.OutOfMemoryError: {oom.v2()}\n")
    oom.free += GIB  # the message's free memory off by a GiB: another moment
    bad = tmp_path / "bad.log"
    bad.write_text(f"[rank0]: torch.OutOfMemoryError: {oom.v2()}\n")
    for log, said in ((good, "good.log line 1 (rank 0) agrees with the snapshot"),
                      (bad, "bad.log line 1 (rank 0) disagrees with the snapshot on device "
                            "free (by 1.00 GiB)")):
        result = invoke("summary", str(SAMPLE), "--log", str(log))
        assert result.returncode == 0, result.stderr
        lines = result.stdout.splitlines()
        assert len(lines) <= 21  # the first screen
        assert said in " ".join(line.strip() for line in lines), result.stdout
        assert ("disagrees" in result.stdout) is (log == bad)


def test_every_format_says_what_the_view_says() -> None:
    """The verdict, each section's sentences, rows and knobs, in the terminal text, the
    markdown, the HTML page and the JSON alike."""
    import html
    import re

    from snapana.render import Options, render

    oom = Oom(request=2 * GIB, device=0, capacity=80 * GIB, free=GIB // 4,
              allocated=14210 * MIB, unallocated=892 * MIB, this_process=77 * GIB,
              processes=((200, 15000 * MIB),))
    budget, _, kv = _budget(79.11, 0.80, 14.99, 0.35, 1.24)
    text = "\n".join((f"torch.OutOfMemoryError: {oom.v2()}", OLD_SUMMARY, _smi(
        [(0, "NVIDIA H100 80GB HBM3", 80000, 81559)],
        [(0, 100, "python3", 64000), (0, 200, "python3", 15000)]),
        budget, _v1_too_long(131072, kv + 2, kv, 100000)))
    view = _view(text)
    assert {s.id for s in view.sections} == {"memory_summary", "nvidia_smi", "vllm"}

    def flat(s: str) -> str:
        s = html.unescape(re.sub(r"<[^>]+>", " ", s)).replace("\\", "")
        return re.sub(r"\s+", " ", s)

    said = [view.verdict or ""] + [x for sec in view.sections for x in (
        sec.title, *sec.sentences, *(c for row in sec.rows for c in row if c),
        *(k for pair in sec.knobs for k in pair))]
    for fmt in ("text", "markdown", "html"):
        out = flat(render(view, fmt, Options(width=100)))
        missing = [s for s in said if flat(s) not in out]
        assert not missing, (fmt, missing[:3])
    data = json.loads(render(view, "json", Options(width=100)))
    assert data["verdict"] == view.verdict
    assert [(s["id"], s["sentences"], s["knobs"]) for s in data["sections"]] == [
        (s.id, list(s.sentences), [{"knob": k, "why": w} for k, w in s.knobs])
        for s in view.sections]


def test_vllm_texts_as_real_logs_mangle_them() -> None:
    """A budget message whose first line was not pasted (no total: its parts and their sum
    still read, no utilisation offered); a refusal wrapped across lines by a terminal,
    inside a word; the 'No available memory' sentence broken over two lines; a budget with
    no refusal (an engine that started) is a section of its own."""
    partial = ("22:12:16  INFO [worker.py:295] model weights take 6.59GiB; non_torch_memory "
               "takes 8.29GiB;\n                    PyTorch activation peak memory takes "
               "4.93GiB;\n                    the rest of the memory reserved for KV Cache "
               "is -7.83GiB.\n")
    broken = ("[error] model failed: No available memory\n           for the cache blocks. "
              "Try increasing `gpu_memory_utilization`\n")
    (sec,) = _view(partial + broken).sections
    assert "no memory was left" in sec.verdict
    assert dict(sec.rows)["left for the KV cache"] == "-7.83 GiB"
    assert f"= {(6.59 + 8.29 + 4.93 - 7.83):.2f} GiB" in " ".join(sec.sentences)
    # no total printed: no utilisation computed, only the direction vLLM's message gives
    assert [k for k, _ in sec.knobs if k.startswith("--gpu-memory-utilization")] == [
        "--gpu-memory-utilization <higher than the one set>"]
    message = _v1_too_long(100000, 4.26, 4.25, 99000)
    width = 120
    prefix = "(EngineCore pid=316) "
    first = prefix + message
    wrapped = "\n".join(first[i:i + width] for i in range(0, len(first), width))
    (sec,) = _view(wrapped).sections
    assert "needs 4.26 GiB of KV cache and 4.25 GiB was available" in sec.verdict
    assert [k for k, _ in sec.knobs] == ["--max-model-len 99000"]
    started, _, kv = _budget(47.50, 0.78, 0.52, 0.08, 1.78)
    (sec,) = [s for s in _view(started + "INFO Maximum concurrency for 32768 tokens per "
                                         "request: 92x\n").sections if s.id == "vllm"]
    assert sec.verdict.endswith(f"vLLM's memory budget: {kv:.2f} GiB left for the KV cache.")
    assert not sec.knobs


def test_nvidia_smi_rows_with_hidden_values_are_said_not_read() -> None:
    table = _smi([(0, "NVIDIA A100-SXM4-80GB", 70000, 81920)],
                 [(0, 1, "x", 1), (0, 2, "y", 2)])
    table = table.replace("       1      C   x", "  ******      C   ******").replace(
        "     1MiB", "*****MiB")
    (t,) = read_text(table, "log").smi
    assert [(p.pid, p.used) for p in t.processes][0] == (None, None)
    assert t.processes[1].pid == 2
    (sec,) = _view(table).sections
    assert "1 process row(s) show no pid or no usage" in " ".join(sec.sentences)
