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


def _parts(r: random.Random) -> list[str]:
    """The texts a log holds, written with random figures by the same writers the readers'
    own tests use (PyTorch's wordings of each era, memory_summary() before 2.0, nvidia-smi
    with and without MIG columns, vLLM's budget and refusals)."""
    from ..test_log_texts import NO_BLOCKS, OLD_SUMMARY, _budget, _smi, _v1_too_long
    from ..test_oom_text import _random_oom

    oom = _random_oom(r)
    gpus = [(i, "NVIDIA H100 80GB HBM3", r.randrange(81559), 81559) for i in range(2)]
    procs = [(0, r.randrange(1, 1 << 22), "python3", r.randrange(81559))]
    return [f"torch.OutOfMemoryError: {oom.v2()}\n", f"RuntimeError: {oom.v14()}\n",
            f"RuntimeError: {oom.v10()}\n", f"{oom.v2(hip=True)}\n", OLD_SUMMARY,
            _smi(gpus, procs, r.random() < 0.5),
            _budget(79.19, 0.9, 14.99, 0.25, r.uniform(1, 80))[0] + NO_BLOCKS + "\n",
            _v1_too_long(32768, 4.0, 2.1, 16384, r.random() < 0.5) + "\n"]

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
    text = "".join(r.sample(_parts(r), r.randint(1, 3)))
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
