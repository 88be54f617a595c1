"""Text logs, budgets and CI outputs as inputs (issue 58).

- `log_case`: a job's log as PyTorch, nvidia-smi and vLLM print it (OOM messages of each
  era, a `memory_summary()` table, an nvidia-smi table, vLLM's budget and refusals), then
  mutated where the readers' patterns look: runs of digits, spaces, dots or anchors of up
  to a megabyte, figures of hundreds of digits, one line of thousands of anchors, overlong
  character references, JSON escapes, a line prefix on every line, gzip.
- `budget_case`: `check` with a budget file that is hostile (nested thousands deep, counts
  and sizes of hundreds of digits, a value of tabs, not UTF-8, too large, a FIFO).
- `ci_output_case`: `check` whose `--junit` file or `$GITHUB_STEP_SUMMARY` is a FIFO, a
  device, a socket, a folder, a link to one, or a regular file (appended to).
The runner's classes apply as to every input: a refusal is one line and exit 2, `check`
may exit 1 (over budget), a hang is a finding.
"""

from __future__ import annotations

import gzip
import random

from . import seeds
from .cases import INPUT, Case

#: Real wordings (PyTorch 2.1+, 1.4-2.0, HIP), a memory_summary() table, an nvidia-smi
#: table and vLLM's lines, in the formats their writers print.
OOM_V2 = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a "
          "total capacity of 79.15 GiB of which 14.81 MiB is free. Process 1234 has 79.13 GiB "
          "memory in use. Of the allocated memory 77.71 GiB is allocated by PyTorch, and 900.52 "
          "MiB is reserved by PyTorch but unallocated. If reserved but unallocated memory is "
          "large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid "
          "fragmentation.  See documentation for Memory Management  "
          "(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)\n")
OOM_V14 = ("RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 15.78 GiB total "
           "capacity; 14.56 GiB already allocated; 3.44 MiB free; 14.75 GiB reserved in total "
           "by PyTorch)\n")
OOM_HIP = OOM_V2.replace("CUDA", "HIP")
SUMMARY = """|===========================================================================|
|                  PyTorch CUDA memory summary, device ID 0                 |
|---------------------------------------------------------------------------|
|            CUDA OOMs: 1            |        cudaMalloc retries: 3         |
|===========================================================================|
|        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  |
|---------------------------------------------------------------------------|
| Allocated memory      |  14909 MiB |  15200 MiB |  99000 GiB |  98985 GiB |
|       from large pool |  14800 MiB |  15100 MiB |  98000 GiB |  97985 GiB |
|       from small pool |    109 MiB |    100 MiB |   1000 GiB |   1000 GiB |
| GPU reserved memory   |  15600 MiB |  15600 MiB |  16000 MiB |    400 MiB |
| Allocations           |     1234   |     1300   |    9999 K  |    9998 K  |
|===========================================================================|
"""
SMI = """+---------------------------------------------------------------------------------------+
| NVIDIA-SMI 535.104.05             Driver Version: 535.104.05   CUDA Version: 12.2     |
|-----------------------------------------+----------------------+----------------------+
| GPU  Name                 Persistence-M | Bus-Id        Disp.A | Volatile Uncorr. ECC |
|=========================================+======================+======================|
|   0  NVIDIA H100 80GB HBM3          On  | 00000000:18:00.0 Off |                    0 |
| N/A   30C    P0              70W / 700W |  81000MiB / 81559MiB |      0%      Default |
+-----------------------------------------+----------------------+----------------------+
| Processes:                                                                            |
|  GPU   GI   CI        PID   Type   Process name                            GPU Memory |
|=======================================================================================|
|    0   N/A  N/A      1234      C   python                                    79000MiB |
+---------------------------------------------------------------------------------------+
"""
VLLM = ("INFO worker.py:241] Memory profiling takes 5.1 seconds\n"
        "the current vLLM instance can use total_gpu_memory (79.19GiB) x "
        "gpu_memory_utilization (0.90) = 71.27GiB\n"
        "model weights take 14.99GiB; non_torch_memory takes 0.25GiB; PyTorch activation peak "
        "memory takes 4.35GiB; the rest of the memory reserved for KV Cache is -1.5GiB.\n"
        "Available KV cache memory: -1.5 GiB\n"
        "ValueError: No available memory for the cache blocks. Try increasing "
        "`gpu_memory_utilization` when initializing the engine.\n"
        "ValueError: To serve at least one request with the models's max seq len (32768), "
        "(4.00 GiB KV cache is needed, which is larger than the available KV cache memory "
        "(2.10 GiB). Based on the available memory, the estimated maximum model length is "
        "16384. Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when "
        "initializing the engine.\n")
PARTS = (OOM_V2, OOM_V14, OOM_HIP, SUMMARY, SMI, VLLM)
#: What the readers' patterns run over, repeated into a run (issue 58's reproducers).
RUNS = ("9", " ", ".", "9.", "9 ", "\t", "| ", "-", "CUDA out of memory. ", "&#", "\\n",
        "NVIDIA-SMI 1 Driver Version: 1\n", "Process 1 has ", "max seq len (1), ", "(",
        "PyTorch CUDA memory summary, device ID 0\n", "\n")
LENGTHS = (1000, 10_000, 100_000, 1_000_000)
PREFIXES = ("", "[rank3]: ", "2025-03-14 09:20:11,123 - ERROR - ", "&lt;", '{"log": "')


def _figure_site(r: random.Random, text: str) -> int:
    """A position where a figure starts (or anywhere, when the text holds none)."""
    sites = [i for i in range(1, len(text)) if text[i].isdigit() and not text[i - 1].isdigit()]
    return r.choice(sites) if sites else r.randrange(len(text) + 1)


def mutate_text(r: random.Random, text: str) -> tuple[str, str]:
    """One mutation aimed at the text readers; its name."""
    op = r.random()
    if op < 0.30:  # a run where a figure or anywhere
        run, n = r.choice(RUNS), r.choice(LENGTHS)
        at = _figure_site(r, text) if r.random() < 0.6 else r.randrange(len(text) + 1)
        body = run * (n // len(run) + 1)
        return text[:at] + body[:n] + text[at:], f"run {run[:12]!r} x{n} at {at}"
    if op < 0.45:  # a figure of hundreds or thousands of digits
        at = _figure_site(r, text)
        digits = "9" * r.choice((20, 21, 400, 5000))
        return text[:at] + digits + text[at:], f"{len(digits)} digits at {at}"
    if op < 0.55:  # one line of anchors
        n = r.choice((5000, 50_000))
        return text + "CUDA out of memory. " * n + "\n", f"{n} anchors on one line"
    if op < 0.62:  # an anchor on each of many lines, blank lines between
        n, gap = r.choice((2000, 20_000)), r.choice((0, 5, 60))
        return text + ("xCUDA out of memory." + "\n" * (gap + 1)) * n, f"{n} anchors, gap {gap}"
    if op < 0.70:  # character references past the last code point, escapes
        ref = r.choice(("&#" + "9" * 5000 + ";", "&#x" + "f" * 5000, "&#00000000065;",
                        "&amp;" * 1000, "\\u0000", '\\"' * 1000))
        at = r.randrange(len(text) + 1)
        return text[:at] + ref + text[at:], f"reference {ref[:12]!r}"
    if op < 0.80:  # a prefix before every line, the lines as JSON strings
        prefix = r.choice(PREFIXES)
        lines = text.splitlines()
        if prefix.startswith('{"'):
            return "".join(prefix + ln.replace('"', '\\"') + '"}\n' for ln in lines), "json lines"
        return "".join(prefix + ln + "\n" for ln in lines), f"prefix {prefix!r}"
    if op < 0.90:  # cut anywhere, or a line's end removed
        at = r.randrange(len(text) + 1)
        return text[:at], f"cut at {at}"
    return text.replace("\n", r.choice(("\r\n", "\r", " ", "\u2028"))), "line ends"


def log_case(r: random.Random) -> Case:
    text = "".join(r.sample(PARTS, r.randint(1, 3)))
    names = []
    for _ in range(r.randint(1, 3)):
        text, name = mutate_text(r, text)
        names.append(name)
    data = text.encode("utf-8", "surrogatepass")
    if r.random() < 0.15:
        data = gzip.compress(data, mtime=0)
        names.append("gzip")
    argv = r.choice((["summary", "{input}", "-f", "json"], ["summary", "{input}"],
                     ["report", "{input}", "-o", "out.html"],
                     ["summary", "{input}", "-f", "markdown"]))
    return Case("textlog", "; ".join(names), {INPUT: data}, argv=argv, ext=".log")


# ----- budgets and CI outputs --------------------------------------------------------------

BUDGETS = (
    "x = " + "[" * 5000 + "]" * 5000,
    "x = " + "{a = " * 3000 + "1" + "}" * 3000,
    'x = """ " """\ny = ' + "[" * 5000 + "]" * 5000,
    "[chunks]\nsaved_logprob_softmax = " + "9" * 400,
    "[chunks]\nsaved_logprob_softmax = " + "9" * 5000,
    "[chunks]\nsaved_logprob_softmax = -" + "9" * 30,
    'peak_reserved = "' + "9" * 400 + ' GiB"',
    'peak_reserved = "1' + "\t" * 300_000 + 'x"',
    'peak_reserved = "1' + " " * 300_000 + 'GiB"',
    "cached_share = 1e999",
    "cached_share = nan",
    "no_oom = " + "t" * 100_000,
    "[families]\n" + "".join(f'f{i} = "1 GiB"\n' for i in range(50_000)),
    '[families]\nkv_cache = "20 GiB"\n' * 2,
    "# " + "[" * 100_000 + "\nno_oom = true",
    'peak_allocated = "' + "." * 100_000 + '"',
)


def budget_case(r: random.Random) -> Case:
    snapshot = seeds.small_snapshot() or seeds.rank_snapshot(0, True)
    files = {INPUT: snapshot}
    setup: list[tuple[str, ...]] = []
    kind = r.random()
    if kind < 0.1:
        setup.append(("fifo", "budget.toml"))
        name = "budget a FIFO"
    elif kind < 0.2:
        files["budget.toml"] = b"no_oom = true\n\xff\xfe" + b"\x00" * r.choice((10, 2 << 20))
        name = "budget not UTF-8"
    else:
        text = r.choice(BUDGETS)
        files["budget.toml"] = text.encode()
        name = f"budget {text[:40]!r} ({len(text):,} chars)"
    return Case("budget", name, files, argv=["check", "{input}", "--budget", "budget.toml"],
                setup=setup, ext=".pickle")


#: What a CI output may find at its path: (setup kind, name), or a link to a device.
NODES = (("fifo",), ("chardev",), ("socket",), ("dir",), ("symlink", "/dev/full"),
         ("symlink", "/dev/null"), ("regular",), ("missing",))


def ci_output_case(r: random.Random) -> Case:
    snapshot = seeds.small_snapshot() or seeds.rank_snapshot(0, True)
    budget = r.choice((b"no_oom = true\n", b'peak_allocated = "1 MiB"\n'))
    files = {INPUT: snapshot, "budget.toml": budget}
    node, where = r.choice(NODES), r.choice(("junit", "summary", "both"))
    setup: list[tuple[str, ...]] = []
    target = "ci.out"
    if node[0] == "regular":
        setup.append(("file", target, "an earlier step's summary\n"))
    elif node[0] == "symlink":
        setup.append(("symlink", target, node[1]))
    elif node[0] != "missing":
        setup.append((node[0], target))
    argv = ["check", "{input}", "--budget", "budget.toml"]
    env = {}
    if where in ("junit", "both"):
        argv += ["--junit", target]
    if where in ("summary", "both"):
        env["GITHUB_STEP_SUMMARY"] = target
    return Case("ci", f"{where} onto {' '.join(node)}", files, argv=argv, setup=setup,
                process={"env": env} if env else None, ext=".pickle")


def text_case(r: random.Random) -> Case:
    """One of the three strategies."""
    pick = r.random()
    if pick < 0.6:
        return log_case(r)
    return budget_case(r) if pick < 0.8 else ci_output_case(r)
