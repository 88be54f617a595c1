"""OOM messages read from text (issue 44). The corpus is written here: each wording put
together from the pieces PyTorch's allocator joins (the release that prints it cited), filled
with figures the test chooses; the expected figures and causes are computed from those
chosen numbers with the test's own arithmetic, never read back by the parser under test.
Then the messages are dressed as real logs dress them: log prefixes on every wrapped line,
HTML escapes, a JSON string, a pytest failure line, several ranks in one file."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from snapana.analysis.text_diagnosis import diagnose
from snapana.sources.oom_text import read_messages

from .conftest import invoke

GIB, MIB = 1 << 30, 1 << 20


def shown(n: int) -> str:
    """Bytes as c10's format_size prints them: bytes up to 1 KiB, else two decimals."""
    if n <= 1024:
        return f"{n} bytes"
    for unit, scale in (("KiB", 1 << 10), ("MiB", 1 << 20)):
        if n <= scale << 10:
            return f"{n / scale:.2f} {unit}"
    return f"{n / GIB:.2f} GiB"


def printed(n: int) -> int:
    """The bytes a printed figure stands for (what a reader of the text can know)."""
    text = shown(n)
    number, unit = text.split()
    scale = {"bytes": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": GIB}[unit]
    return round(float(number) * scale)


@dataclass
class Oom:
    """The figures of one OOM, chosen by the test."""

    request: int
    device: int
    capacity: int
    free: int
    allocated: int
    unallocated: int  # reserved - allocated
    this_process: int | None = None
    processes: tuple[tuple[int, int], ...] = ()
    private: int | None = None

    @property
    def reserved(self) -> int:
        return self.allocated + self.unallocated

    def v2(self, capacity_word: str = "capacity", hip: bool = False) -> str:
        """PyTorch 2.1+ (c10/cuda/CUDACachingAllocator.cpp, `malloc`'s OOM branch; 2.1.0
        spells 'capacty', fixed in 2.2.0; the private-pool clause from 2.4)."""
        procs = "".join(f"Process {pid} has {shown(b)} memory in use. "
                        for pid, b in self.processes)
        own = ("" if self.this_process is None else
               f"Including non-PyTorch memory, this process has {shown(self.this_process)} "
               "memory in use. ")
        private = ("" if self.private is None else
                   f"with {shown(self.private)} allocated in private pools (e.g., CUDA "
                   "Graphs), ")
        env = "PYTORCH_HIP_ALLOC_CONF" if hip else "PYTORCH_CUDA_ALLOC_CONF"
        return (f"{'HIP' if hip else 'CUDA'} out of memory. Tried to allocate "
                f"{shown(self.request)}. GPU {self.device} has a total {capacity_word} of "
                f"{shown(self.capacity)} of which {shown(self.free)} is free. {procs}{own}"
                f"Of the allocated memory {shown(self.allocated)} is allocated by PyTorch, "
                f"{private}and {shown(self.unallocated)} is reserved by PyTorch but "
                "unallocated. If reserved but unallocated memory is large try setting "
                f"{env}=expandable_segments:True to avoid fragmentation.  See documentation "
                "for Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html"
                "#environment-variables)")

    def v14(self) -> str:
        """PyTorch 1.4 - 2.0 (c10/cuda/CUDACachingAllocator.cpp: '(GPU n; total capacity;
        already allocated; free; reserved in total by PyTorch)')."""
        return (f"CUDA out of memory. Tried to allocate {shown(self.request)} (GPU "
                f"{self.device}; {shown(self.capacity)} total capacity; "
                f"{shown(self.allocated)} already allocated; {shown(self.free)} free; "
                f"{shown(self.reserved)} reserved in total by PyTorch) If reserved memory is "
                ">> allocated memory try setting max_split_size_mb to avoid fragmentation.  "
                "See documentation for Memory Management and PYTORCH_CUDA_ALLOC_CONF")

    def v10(self) -> str:
        """PyTorch 1.0 - 1.3 (aten/src/THC/THCCachingAllocator.cpp: '... free; cached)',
        where cached is the allocator's cache: reserved and not allocated)."""
        return (f"CUDA out of memory. Tried to allocate {shown(self.request)} (GPU "
                f"{self.device}; {shown(self.capacity)} total capacity; "
                f"{shown(self.allocated)} already allocated; {shown(self.free)} free; "
                f"{shown(self.unallocated)} cached)")


def npu(oom: Oom, active: int | None = None, cached_word: bool = False) -> str:
    """torch_npu (Ascend): torch_npu/csrc/core/npu/NPUCachingAllocator.cpp, `malloc`'s OOM
    branch: 'NPU out of memory. Tried to allocate <a> (NPU <d>; <t> total capacity; <a>
    already allocated; <c> current active; <f> free; <r> reserved in total by PyTorch).If
    reserved memory is >> allocated memory try setting max_split_size_mb to avoid
    fragmentation.' (the old 1.x copy: '... <f> free; <c> cached)', no 'current active')."""
    head = (f"NPU out of memory. Tried to allocate {shown(oom.request)} (NPU {oom.device}; "
            f"{shown(oom.capacity)} total capacity; {shown(oom.allocated)} already allocated; ")
    if cached_word:
        return head + f"{shown(oom.free)} free; {shown(oom.unallocated)} cached)"
    return (head + f"{shown(oom.allocated if active is None else active)} current active; "
            f"{shown(oom.free)} free; {shown(oom.reserved)} reserved in total by PyTorch)."
            "If reserved memory is >> allocated memory try setting max_split_size_mb to "
            "avoid fragmentation.")


def test_torch_npu_wordings_read_their_figures() -> None:
    """An Ascend job's OOM (torch_npu's own allocator, same clauses as PyTorch 1.4 - 2.0 but
    'NPU' and a 'current active' figure) is read, not refused; its knob names torch_npu's
    own variable, which has expandable segments."""
    r = random.Random("npu")
    for _ in range(30):
        oom = _random_oom(r)
        (m,) = read_messages(f"RuntimeError: {npu(oom)}\n")
        assert m.backend == "NPU" and m.device == oom.device and m.wording == "torch_npu"
        for name in ("request", "capacity", "free", "allocated", "reserved"):
            assert _close(getattr(m, name), getattr(oom, name)), (name, npu(oom))
        (old,) = read_messages(npu(oom, cached_word=True))
        assert old.wording == "torch_npu 1.x" and _close(old.unallocated, oom.unallocated)
    # the idle cache (reserved - allocated) is at least the request: fragmentation leads
    oom = Oom(request=72 * MIB, device=3, capacity=61 * GIB, free=5 * MIB,
              allocated=56 * GIB, unallocated=2 * GIB)
    d = diagnose(read_messages(npu(oom))[0])
    assert d.causes[0].id == "fragmentation"
    assert [k for k, _ in d.knobs] == ["PYTORCH_NPU_ALLOC_CONF=expandable_segments:True"]


def test_an_npu_paste_behind_ray_prefixes_is_summarised(tmp_path: Path) -> None:
    """A Ray worker's NPU OOM ('[repeated Nx across cluster]' after it, the next line an
    HCCL warning): read with exit 0, the device called an NPU."""
    oom = Oom(request=30 * MIB, device=3, capacity=61 * GIB, free=14 * MIB,
              allocated=60 * GIB, unallocated=300 * MIB)
    tag = "(NPURayWorkerWrapper pid=4242) ERROR 06-09 06:57:48 worker_base.py:581] "
    log = tmp_path / "npu.log"
    log.write_text(f"{tag}RuntimeError: {npu(oom)} [repeated 6x across cluster]\n"
                   "(NPURayWorkerWrapper pid=4243) [rank7]:[W609 06:57:47.8 x.ts:877] "
                   "Warning: HCCL timeout (function ProcessGroupHCCL)\n")
    r = invoke("summary", str(log))
    assert r.returncode == 0, r.stderr
    assert f"NPU out of memory on NPU 3 for a request of {shown(oom.request)}" in \
        " ".join(r.stdout.split())


def _random_oom(r: random.Random) -> Oom:
    capacity = r.choice((16, 24, 40, 80, 141)) * GIB - r.randrange(0, 900) * MIB
    reserved = r.randrange(capacity // 2, capacity - 64 * MIB)
    unallocated = r.randrange(0, reserved // 4)
    own = reserved + r.randrange(300, 1500) * MIB
    free = max(0, capacity - own - r.randrange(0, 200) * MIB)
    return Oom(request=r.randrange(1, 8 * 1024) * MIB, device=r.randrange(8),
               capacity=capacity, free=free, allocated=reserved - unallocated,
               unallocated=unallocated, this_process=own)


def _close(read, expected: int) -> bool:
    """A read figure equals the printed one; its slack covers the rounding."""
    return read is not None and read.bytes == printed(expected) and \
        abs(read.bytes - expected) <= read.slack + 1


@pytest.mark.parametrize("wording", ["v2", "v2-capacty", "v14", "v10", "hip"])
def test_every_wording_reads_its_figures(wording: str) -> None:
    r = random.Random(wording)
    for _ in range(40):
        oom = _random_oom(r)
        text = (oom.v14() if wording == "v14" else oom.v10() if wording == "v10" else
                oom.v2("capacty" if wording == "v2-capacty" else "capacity",
                       hip=wording == "hip"))
        (m,) = read_messages(f"torch.OutOfMemoryError: {text}\n")
        assert m.device == oom.device and m.backend == ("HIP" if wording == "hip" else "CUDA")
        for name in ("request", "capacity", "free", "allocated"):
            assert _close(getattr(m, name), getattr(oom, name)), (name, text)
        if wording.startswith(("v2", "hip")):
            assert m.wording == "2.1+"
            assert _close(m.unallocated, oom.unallocated) and _close(m.this_process,
                                                                      oom.this_process)
            assert m.reserved.bytes == printed(oom.allocated) + printed(oom.unallocated)
        elif wording == "v14":
            assert m.wording == "1.4-2.0"
            assert _close(m.reserved, oom.reserved) and m.unallocated is None
        else:
            assert m.wording == "1.0-1.3" and _close(m.unallocated, oom.unallocated)
            assert m.reserved.bytes == printed(oom.allocated) + printed(oom.unallocated)
    if wording == "v2-capacty":
        assert any("capacty" in o for o in m.oddities)
    if wording == "v10":
        assert any("'cached' is the 1.0 - 1.3 word" in o for o in m.oddities)


def _expected_lead(oom: Oom) -> str:
    """The lead cause, by the test's own counterfactual arithmetic on the printed figures:
    the first holder (in the order causes are weighed) whose bytes alone cover the
    shortfall, the idle cache only when it is at least the request; else the live
    tensors. Other processes holding half the card or more are weighed first."""
    req, cap, free = printed(oom.request), printed(oom.capacity), printed(oom.free)
    cached, own = printed(oom.unallocated), printed(oom.this_process)
    reserved = printed(oom.allocated) + cached
    if req > cap:
        return "size_bug"
    gap = req - free
    others = sum(printed(b) for _, b in oom.processes) if oom.processes else cap - free - own
    if others >= cap / 2 and others >= gap:  # most of the card held by others: said first
        return "other_processes"  # (issue 69)
    weighed = [("fragmentation", cached >= req),
               ("other_processes", others > 3 * (GIB // 200) and others >= gap),
               ("demand", printed(oom.allocated) >= gap),
               ("own_outside", own - reserved >= gap)]
    return next((cause for cause, covers in weighed if covers), "demand")


def test_causes_agree_with_independent_arithmetic() -> None:
    r = random.Random(44)
    seen = set()
    for _ in range(300):
        oom = _random_oom(r)
        oom.free = min(oom.free, max(0, oom.request - r.randrange(65, 4096) * MIB))  # failed
        if oom.request <= oom.free:
            continue
        if r.random() < 0.2:  # another process on the card
            oom.processes = ((r.randrange(100, 99999), r.randrange(1, 20) * GIB),)
            oom.free = max(0, oom.free - oom.processes[0][1])
        (m,) = read_messages(oom.v2())
        d = diagnose(m)
        assert d.lead.id == _expected_lead(oom), oom
        assert d.shortfall == printed(oom.request) - printed(oom.free)
        seen.add(d.lead.id)
        # no cause but the live tensors leads without covering the shortfall alone
        if d.lead.id not in ("fragmentation", "demand"):
            assert d.lead.terms[0][1] >= d.shortfall
        # the split adds up to the printed capacity
        assert sum(n for _, n in d.split) == printed(oom.capacity)
        if printed(oom.unallocated) >= printed(oom.request):  # the idle cache covers, led
            assert any("expandable_segments:True" in k for k, _ in d.knobs)  # or not
        else:
            assert not d.knobs
    assert {"fragmentation", "demand"} <= seen


def _dress(text: str, how: str, rank: int) -> str:
    """A message as a log carries it."""
    if how == "prefixed":  # wrapped at 80 columns, a timestamp and a rank tag on each line
        import textwrap

        return "\n".join(f"2026-12-01 03:12:{rank:02d} [rank{rank}]: {ln}"
                         for ln in textwrap.wrap(f"torch.OutOfMemoryError: {text}", 80))
    if how == "html":
        import html

        return f"<pre>{html.escape(text)}</pre>"
    if how == "json":
        return json.dumps({"level": "error", "rank": rank,
                           "msg": f"Traceback ...\ntorch.OutOfMemoryError: {text}\n"})
    if how == "pytest":
        return f"FAILED tests/test_big.py::test_step - torch.OutOfMemoryError: {text}"
    if how == "compose":
        return f"sglang-1  | torch.OutOfMemoryError: {text}"
    return text


@pytest.mark.parametrize("how", ["prefixed", "html", "json", "pytest", "compose"])
def test_messages_as_logs_carry_them(how: str) -> None:
    r = random.Random(how)
    ooms = [_random_oom(r) for _ in range(4)]
    log = "\n".join(["starting", *(_dress(o.v2(), how, rank) for rank, o in enumerate(ooms)),
                     "done"])
    got = read_messages(log)
    assert len(got) == len(ooms)
    for rank, (m, oom) in enumerate(zip(got, ooms, strict=True)):
        assert _close(m.request, oom.request) and _close(m.free, oom.free)
        assert _close(m.unallocated, oom.unallocated) and m.device == oom.device
        if how == "prefixed":
            assert m.rank == rank


def test_oddities_are_said_not_read_as_figures() -> None:
    base = Oom(request=2 * GIB, device=0, capacity=80 * GIB, free=100 * MIB,
               allocated=70 * GIB, unallocated=GIB, this_process=0)
    (m,) = read_messages(base.v2())
    assert any("0 bytes memory in use" in o for o in m.oddities)
    big = Oom(request=300 * GIB, device=0, capacity=80 * GIB, free=60 * GIB,
              allocated=10 * GIB, unallocated=0, this_process=11 * GIB)
    (m,) = read_messages(big.v2())
    assert [c.id for c in diagnose(m).causes][0] == "size_bug"
    spill = Oom(request=GIB, device=0, capacity=8 * GIB, free=0, allocated=12 * GIB,
                unallocated=0, this_process=13 * GIB)
    (m,) = read_messages(spill.v2())
    assert "spill" in {c.id for c in diagnose(m).causes}
    cut = base.v2()[:60]  # a paste cut short
    (m,) = read_messages(cut)
    assert m.capacity is None and any("capacity is not in the text" in o for o in m.oddities)


def _cli(*args: str, stdin: str | None = None, cwd: Path | None = None
         ) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "snapana", *args], input=stdin, cwd=cwd,
                          capture_output=True, text=True, timeout=120)


def test_a_paste_on_standard_input(tmp_path: Path) -> None:
    oom = Oom(request=2 * GIB, device=3, capacity=79 * GIB, free=GIB, allocated=70 * GIB,
              unallocated=6 * GIB, this_process=77 * GIB + 512 * MIB)
    paste = "Traceback (most recent call last):\n  File \"train.py\", line 3\n" + \
        f"torch.OutOfMemoryError: {oom.v2()}\n"
    result = _cli("summary", "-f", "json", "-", stdin=paste, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    (msg,) = doc["messages"]
    assert msg["request"]["bytes"] == printed(oom.request)
    assert msg["unallocated"]["bytes"] == printed(oom.unallocated)
    assert msg["causes"][0]["id"] == "fragmentation" and msg["causes"][0]["role"] == "lead"
    assert sum(t["bytes"] for t in msg["split"]) == printed(oom.capacity)
    text = _cli("summary", "-", stdin=paste, cwd=tmp_path)
    assert text.returncode == 0 and "Verdict." in text.stdout and "fragmentation" in text.stdout
    assert "_record_memory_history(max_entries=100000)" in text.stdout


def test_a_multi_rank_log_gets_a_rank_table_and_a_report(tmp_path: Path) -> None:
    r = random.Random(7)
    ooms = [_random_oom(r) for _ in range(4)]
    log = tmp_path / "job.log"
    log.write_text("\n".join(_dress(o.v2(), "prefixed", k) for k, o in enumerate(ooms)))
    result = invoke("summary", "--format", "json", str(log))
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert [row[0] for row in doc["ranks"]["rows"]] == ["0", "1", "2", "3"]
    out = tmp_path / "job.html"
    result = invoke("report", str(log), "-o", str(out))
    assert result.returncode == 0 and out.is_file(), result.stderr
    page = out.read_text()
    assert page.count('<h2 id="message-') == 4 and "https://" not in page.split("<body", 1)[1] \
        .replace("https://pytorch.org", "")


def test_text_that_is_not_a_log_is_refused_in_one_line(tmp_path: Path) -> None:
    note = tmp_path / "notes.txt"
    note.write_text("nothing about memory here\n")
    result = invoke("summary", str(note))
    assert result.returncode == 2 and "unrecognised format" in result.stderr
    log = tmp_path / "job.log"
    log.write_text(Oom(GIB, 0, 8 * GIB, 0, 7 * GIB, 0, 8 * GIB).v2())
    result = invoke("export", str(log), "-o", str(tmp_path / "x"))
    assert result.returncode == 2 and "a text log with 1 out-of-memory" in result.stderr


def test_wordings_of_particular_releases() -> None:
    """2.3.0 printed the device as a raw byte; 2.12 refuses a request that would pass the
    memory fraction before trying it; 1.9+ refuses one of more than an exabyte; 2.14 leaves
    the expandable_segments hint out when they are already on (no knob offered then)."""
    oom = Oom(request=512 * MIB, device=0, capacity=80 * GIB, free=100 * MIB,
              allocated=60 * GIB, unallocated=10 * GIB, this_process=71 * GIB)
    (m,) = read_messages(oom.v2().replace("GPU 0 has", "GPU \x00 has"))
    assert m.device == 0 and _close(m.capacity, oom.capacity)
    assert any("raw byte" in o for o in m.oddities)
    assert diagnose(m).knobs  # fragmentation, hint present: the knob, with its caveat
    es_on = oom.v2().split(" If reserved but unallocated")[0]  # 2.14+, expandable on
    (m,) = read_messages(es_on)
    assert "fragmentation" in {c.id for c in diagnose(m).causes} and not diagnose(m).knobs
    text = ("CUDA out of memory. Allocation was preemptively rejected because it would exceed "
            "per_process_memory_fraction limit. Requested size: 3.00 GiB")
    (m,) = read_messages(text)
    assert m.request.bytes == 3 * GIB and diagnose(m).causes[0].id == "other_limit"
    (m,) = read_messages("RuntimeError: CUDA out of memory. Tried to allocate more than 1EB "
                         "memory.")
    assert diagnose(m).causes[0].id == "size_bug"
