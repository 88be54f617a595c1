"""Issue 58, the fourth hostile round: text is read in linear time, every figure and budget
is bounded, outputs that are not files are refused, and an amplified frame name is stored
once in the report.

Linearity is shown by counting work, never by a clock: each pattern of the text readers runs
in a step-counting copy of `re`'s backtracking engine (`regex_steps`) over pathological
inputs of two lengths, and the readers themselves run over 100 KB and 1 MB texts with every
pattern call recorded (the span each call is given, and their sum).
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
from snapana.limits import MAX_LOG_LINE, MAX_LOG_MESSAGES
from snapana.sources import (
    log_tables,
    log_text,
    memory_lines,
    oom_text,
    settings_text,
    traceback_text,
    vllm_text,
)

from .conftest import ROOT, invoke
from .regex_steps import Budget, search_steps

SAMPLE = ROOT / "sample_snapshots" / "fsdp-train-step.pickle"

READERS = (oom_text, log_tables, vllm_text, traceback_text, memory_lines, settings_text)


def _patterns() -> dict[str, re.Pattern[str]]:
    """Every compiled pattern the text readers hold, by module and name."""
    out = {}
    for module in READERS:
        for name, value in vars(module).items():
            if isinstance(value, re.Pattern):
                out[f"{module.__name__.rsplit('.', 1)[1]}.{name}"] = value
            elif isinstance(value, dict) and value and all(
                    isinstance(v, re.Pattern) for v in value.values()):
                for key, pattern in value.items():
                    out[f"{module.__name__.rsplit('.', 1)[1]}.{name}[{key}]"] = pattern
    return out


PATTERNS = _patterns()


def _prefix(pattern: re.Pattern[str]) -> str:
    """The literal text a pattern starts with (its anchor): repeated, it makes a search try
    the rest of the pattern at every copy."""
    out = []
    for ch in pattern.pattern:
        if ch.isalnum() or ch in " -:;,'":
            out.append(ch)
        elif ch == "\\" or not out:
            continue
        else:
            break
    return "".join(out)


def _hostile(pattern: re.Pattern[str], n: int) -> dict[str, str]:
    """Pathological texts of `n` characters for `pattern`: runs of digits, spaces, dots,
    figures glued together, pipes, and the pattern's own anchor repeated, alone or before a
    run."""
    def fill(unit: str, head: str = "") -> str:
        body = head + unit * (n // max(1, len(unit)) + 1)
        return body[:n]

    anchor = _prefix(pattern) or "GPU "
    return {"digits": fill("9"), "spaces": fill(" "), "dots": fill("."),
            "figures": fill("9."), "digit-space": fill("9 "), "pipes": fill("| "),
            "pipe-spaces": fill(" ", "| 0 "), "signed": fill("-9"), "tabs": fill("\t9"),
            "anchors": fill(anchor + " "), "anchor-digits": fill("9", anchor + " "),
            "anchor-spaces": fill(" ", anchor), "anchor-dots": fill(".", anchor + " 9"),
            "refs": fill("9", "&#")}


SMALL, LARGE = 1024, MAX_LOG_LINE  # the largest span a reader gives one call is a few lines
#: Steps per character a linear pattern may take on these inputs (a search tries each start
#: once and each start a bounded number of steps): measured at most 19, bounded at 64.
STEPS_PER_CHAR = 64


@pytest.mark.parametrize("name", sorted(PATTERNS))
def test_every_pattern_of_the_text_readers_is_linear(name: str) -> None:
    """Steps on 8,192 characters are at most ~8x those on 1,024 (a quadratic pattern takes
    64x, the catastrophic ones of issue 58 more): counted, not timed."""
    pattern = PATTERNS[name]
    slow = []
    for kind, small in _hostile(pattern, SMALL).items():
        large = _hostile(pattern, LARGE)[kind]
        a, _ = search_steps(pattern, small)
        try:
            b, _ = search_steps(pattern, large, limit=STEPS_PER_CHAR * LARGE)
        except Budget as exc:
            slow.append(f"{kind}: over {exc.args[0]:,} steps on {LARGE:,} characters")
            continue
        if b > 10 * a:
            slow.append(f"{kind}: {a:,} steps on {SMALL:,} characters, {b:,} on {LARGE:,}")
    assert not slow, f"{name} ({pattern.pattern[:60]}...) is not linear: " + "; ".join(slow)


#: Lines that each pattern must still read (the step counter is checked against `re` on
#: them, and on the hostile texts): what the readers' own tests feed them, in short.
REAL = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a "
        "total capacity of 79.15 GiB of which 14.81 MiB is free. Process 1234 has 79.13 GiB "
        "memory in use. Of the allocated memory 77.71 GiB is allocated by PyTorch, and 900.52 "
        "MiB is reserved by PyTorch but unallocated.",
        "CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 15.78 GiB total capacity; 14.56 "
        "GiB already allocated; 3.44 MiB free; 14.75 GiB reserved in total by PyTorch)",
        "|   0  NVIDIA H100 80GB HBM3          On  | 00000000:18:00.0 Off |     0 |",
        "|    0   N/A  N/A   1234      C   python                          79000MiB |",
        "| Allocated memory      |  14909 MiB |  15200 MiB |  99 GiB |  84 GiB |",
        "the current vLLM instance can use total_gpu_memory (79.19GiB) x "
        "gpu_memory_utilization (0.90) = 71.27GiB; model weights take -1.5GiB",
        "[rank3]: max seq len (32768), (4.00 GiB KV cache is needed, which is larger than the "
        "available KV cache memory (2.10 GiB). Based on the available memory, the estimated "
        "maximum model length is 16384.")


@pytest.mark.parametrize("name", sorted(PATTERNS))
def test_the_step_counter_matches_as_re_does(name: str) -> None:
    """The counter is `re`'s semantics: the same first match on real lines and hostile
    texts (else its counts would prove nothing)."""
    pattern = PATTERNS[name]
    for text in (*REAL, *_hostile(pattern, 200).values()):
        m = pattern.search(text)
        _, start = search_steps(pattern, text)
        assert start == (m.start() if m else None), (name, text[:80])


# ----- the readers over 100 KB and 1 MB ------------------------------------------------------

class _Recorder:
    """A pattern that records the span each call is given."""

    def __init__(self, pattern: re.Pattern[str], spans: list[tuple[str, int]], name: str
                 ) -> None:
        self.pattern, self.spans, self.name = pattern, spans, name

    def __getattr__(self, attr: str) -> Any:
        method = getattr(self.pattern, attr)
        if attr not in ("search", "match", "fullmatch", "finditer", "sub", "findall"):
            return method

        def call(*args: Any, **kw: Any) -> Any:
            text = args[1] if attr == "sub" else args[0]
            self.spans.append((self.name, len(text)))
            return method(*args, **kw)
        return call


def _record(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int]]:
    spans: list[tuple[str, int]] = []
    for module in READERS:
        for name, value in list(vars(module).items()):
            if isinstance(value, re.Pattern):
                monkeypatch.setattr(module, name, _Recorder(value, spans, name))
            elif isinstance(value, dict) and value and all(
                    isinstance(v, re.Pattern) for v in value.values()):
                monkeypatch.setattr(module, name,
                                    {k: _Recorder(v, spans, k) for k, v in value.items()})
    return spans


#: The one pattern run over the whole text, once: the character references undone before the
#: text is cut into lines (it starts only at "&#" and its runs are possessive: linear above).
WHOLE_TEXT = {"_OVERLONG_REF"}


def _texts(n: int) -> dict[str, str]:
    """The reproducers of issue 58 grown to `n` characters."""
    def grow(head: str, unit: str, sep: str = "") -> str:
        """`head` and a run of `unit` to n characters or, with `sep`, both repeated."""
        one = head + unit + sep
        return one * (n // len(one)) if sep else (head + unit * n)[:n]

    smi = "NVIDIA-SMI 535.104   Driver Version: 535.104   CUDA Version: 12.2\n"
    summary = "|       PyTorch CUDA memory summary, device ID 0        |\n"
    return {
        "oom-digits": grow("CUDA out of memory. ", "9"),
        "oom-digit-lines": grow("CUDA out of memory. ", "9" * 2000, "\n"),
        "smi-spaces": smi + grow("|", " "),
        "smi-space-rows": grow(smi + "|", " " * 2000, "\n"),
        "anchors-one-line": grow("", "CUDA out of memory. "),
        "anchors-lines": grow("xCUDA out of memory.", "\n" * 4, "\n"),
        "summary-spaces": grow(summary + "| Allocated memory |", " 9 " * 500, "\n"),
        "vllm-spaces": grow("max seq len (1),", " " * 1000 + "(", "\n"),
        "dots": grow("Tried to allocate ", "."),
        "refs": grow("CUDA out of memory. &#", "9"),
    }


def test_the_readers_give_each_pattern_a_bounded_span(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every pattern call of the readers gets at most a few bounded lines, and the
    characters all calls are given grow with the text, not faster: 1 MB costs at most
    ~10x what 100 KB does."""
    spans = _record(monkeypatch)
    totals = {}
    for size in (100_000, 1_000_000):
        for kind, text in _texts(size).items():
            spans.clear()
            log = log_text.read_text(text, kind)
            assert len(log.messages) <= MAX_LOG_MESSAGES
            whole = [n for name, n in spans if name in WHOLE_TEXT]
            assert whole == [len(text)] or not whole, (kind, whole)
            lines = [n for name, n in spans if name not in WHOLE_TEXT]
            assert max(lines) <= 4 * MAX_LOG_LINE + 8, (kind, max(lines))
            totals[kind, size] = sum(lines)
            assert sum(lines) <= 64 * size, (kind, size, sum(lines))
    for kind in _texts(10):
        assert totals[kind, 1_000_000] <= 12 * totals[kind, 100_000] + 10_000, (
            kind, totals[kind, 100_000], totals[kind, 1_000_000])


def test_a_cut_line_is_said() -> None:
    log = log_text.read_text("CUDA out of memory. Tried to allocate " + "9" * 20_000, "paste")
    assert any(f"longer than {MAX_LOG_LINE:,} characters" in n for n in log.notes)
    assert len(log.messages) == 1 and log.messages[0].request is None


def test_anchors_past_the_cap_are_counted_not_read() -> None:
    text = "CUDA out of memory. Tried to allocate 2.00 MiB.\n" * (MAX_LOG_MESSAGES + 7)
    log = log_text.read_text(text, "paste")
    assert len(log.messages) == MAX_LOG_MESSAGES
    assert f"{MAX_LOG_MESSAGES + 7:,} messages: the first {MAX_LOG_MESSAGES:,}" in \
        " ".join(log.notes)


# ----- every figure and budget bounded -------------------------------------------------------

def _one_error_line(result: subprocess.CompletedProcess) -> str:
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert result.returncode == 2, (result.returncode, result.stderr[-400:])
    assert len(lines) == 1 and lines[0].startswith("snapana: error: "), result.stderr
    return lines[0]


DIGITS = "9" * 400
#: A figure of 400 digits where each reader takes one, in its writer's wording.
ABSURD_FIGURES = {
    "oom request": f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {DIGITS} GiB. "
                   "GPU 0 has a total capacity of 79.15 GiB of which 14.81 MiB is free.\n",
    "oom process": "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. "
                   f"GPU 0 has a total capacity of 79.15 GiB of which 14.81 MiB is free. "
                   f"Process {DIGITS} has 79.13 GiB memory in use.\n",
    "summary cell": "|       PyTorch CUDA memory summary, device ID 0        |\n"
                    f"| Allocated memory      | {DIGITS} MiB | 1 MiB | 1 MiB | 1 MiB |\n",
    "summary device": f"|       PyTorch CUDA memory summary, device ID {DIGITS} |\n"
                      "| Allocated memory      | 1 MiB | 1 MiB | 1 MiB | 1 MiB |\n",
    "smi memory": "NVIDIA-SMI 535.104   Driver Version: 535.104   CUDA Version: 12.2\n"
                  "|   0  NVIDIA H100 80GB HBM3          On  | 00000000:18:00.0 Off |\n"
                  f"| N/A   30C  P0   70W / 700W |  {DIGITS}MiB / 81559MiB |\n",
    "vllm budget": f"the current vLLM instance can use total_gpu_memory ({DIGITS}GiB) x "
                   "gpu_memory_utilization (0.90) = 71.27GiB\n",
    "vllm length": f"ValueError: The model's max seq len ({DIGITS}) is larger than the maximum "
                   "number of tokens that can be stored in KV cache (1000).\n",
}


@pytest.mark.parametrize("where", sorted(ABSURD_FIGURES))
def test_a_figure_past_its_bound_is_one_line_and_exit_2(where: str, tmp_path: Path) -> None:
    log = tmp_path / "job.log"
    log.write_text(ABSURD_FIGURES[where])
    line = _one_error_line(invoke("summary", str(log)))
    assert "job.log" in line and ("past 2^64 bytes" in line or "past 2^63" in line), line


def test_the_largest_figures_a_job_prints_are_read(tmp_path: Path) -> None:
    """The bound refuses no real figure: 16 EiB - 1 MiB and a 19-digit count are read."""
    text = (f"CUDA out of memory. Tried to allocate {(1 << 44) - 1} MiB. GPU 0 has a total "
            f"capacity of 79.15 GiB of which 14.81 MiB is free. Process {(1 << 63) - 1} has "
            "1.00 GiB memory in use.\n")
    (m,) = log_text.read_text(text, "paste").messages
    assert m.request is not None and m.request.bytes == ((1 << 44) - 1) << 20
    assert m.processes[0][0] == (1 << 63) - 1


@pytest.mark.parametrize("budget, said", [
    ("x = " + "[" * 5000 + "]" * 5000, "nested 5,000 deep"),
    ('x = """ " """\ny = ' + "[" * 5000 + "]" * 5000, "nested 5,000 deep"),
    ("[chunks]\nsaved_logprob_softmax = " + DIGITS, "a count past 2^63"),
    ("[chunks]\nsaved_logprob_softmax = " + "9" * 5000, "a number of thousands of digits"),
    ('peak_reserved = "' + DIGITS + ' GiB"', "larger than any memory"),
    ('peak_reserved = "1' + "\t" * 200_000 + 'x"', "unknown unit"),
])
def test_a_budget_past_its_bounds_is_one_line_and_exit_2(budget: str, said: str,
                                                          tmp_path: Path) -> None:
    path = tmp_path / "budget.toml"
    path.write_text(budget)
    line = _one_error_line(invoke("check", str(SAMPLE), "--budget", str(path)))
    assert said in line and "budget.toml" in line, line


def test_a_rule_pack_nested_too_deep_is_one_line_and_exit_2(tmp_path: Path) -> None:
    path = tmp_path / "rules.toml"
    path.write_text("x = " + "[" * 5000 + "]" * 5000)
    line = _one_error_line(invoke("summary", str(SAMPLE), "--rules", str(path)))
    assert "nested 5,000 deep" in line, line


def test_a_rule_pack_that_is_a_fifo_is_refused_not_waited_on(tmp_path: Path) -> None:
    """`--rules` names a FIFO (or a device): nothing writes to it, so reading it would block
    forever; it is refused like every other input that is not a regular file."""
    import os

    fifo = tmp_path / "rules.toml"
    os.mkfifo(fifo)
    line = _one_error_line(invoke("summary", str(SAMPLE), "--rules", str(fifo)))
    assert "FIFO" in line and str(fifo) in line, line


def test_the_depth_check_skips_strings_and_comments() -> None:
    from snapana.limits import MAX_TOML_DEPTH, toml_too_deep

    deep = "[" * (MAX_TOML_DEPTH + 1)
    for text in (f'x = "{deep}"', f"x = '{deep}'", f"# {deep}\nx = 1", f'x = """\n{deep}\n"""',
                 f'x = "\\"{deep}"'):
        assert toml_too_deep(text) is None, text
    assert toml_too_deep(f"x = {deep}{']' * (MAX_TOML_DEPTH + 1)}") is not None


def _nesting_one_char_at_a_time(text: str) -> int:
    """The depth check's reference: the TOML text read one character at a time."""
    depth = deepest = i = 0
    while i < len(text):
        ch = text[i]
        if ch == "#":
            i = _string_end(text, "\n", i + 1, escapes=False, line=True)
        elif ch in "\"'":
            close = ch * 3 if text.startswith(ch * 3, i) else ch
            i = _string_end(text, close, i + len(close), escapes=ch == '"', line=len(close) == 1)
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth = max(0, depth - 1)
        i += 1
    return deepest


def _string_end(text: str, close: str, i: int, escapes: bool, line: bool) -> int:
    while i < len(text):
        if escapes and text[i] == "\\":
            i += 2
        elif text.startswith(close, i):
            return i + len(close) - 1
        elif line and text[i] == "\n":
            return i
        else:
            i += 1
    return i


def test_the_depth_check_reads_as_one_character_at_a_time_would() -> None:
    """The check reads a text by one pattern (linear); it must count as a reader walking the
    text character by character: on every built-in pack and on random texts made of the
    tokens that open and close strings, comments and brackets."""
    import random

    import snapana
    from snapana.limits import _toml_nesting

    packs = sorted(Path(snapana.__file__).parent.rglob("*.toml"))
    assert packs
    for pack in packs:
        text = pack.read_text(encoding="utf-8")
        assert _toml_nesting(text) == _nesting_one_char_at_a_time(text), pack
    rng = random.Random(5)
    tokens = ['"', "'", '"""', "'''", "[", "]", "{", "}", "#", "\n", "\\", "a", " "]
    for _ in range(20_000):
        text = "".join(rng.choice(tokens) for _ in range(rng.randint(0, 30)))
        assert _toml_nesting(text) == _nesting_one_char_at_a_time(text), repr(text)


# ----- outputs opened by name; every exit code documented --------------------------------------

def _readme_codes() -> set[int]:
    """The exit codes the README's table lists."""
    text = (ROOT / "README.md").read_text()
    table = text.split("### Exit codes", 1)[1].split("\n\n", 2)[2]
    return {int(m.group(1)) for m in re.finditer(r"^\| (\d+) \|", table, re.MULTILINE)}


#: Where the source sets an exit code: an error's class attribute, a named constant, an exit
#: with a literal (a variable, `record`'s job code, is the job's own).
_SETS_CODE = re.compile(r"exit_code = (\d+)|^[A-Z_]+(?:ERROR|BUDGET|FAILED) = (\d+)|"
                        r"(?:Exit|SystemExit|_end)\((\d+)\)", re.MULTILINE)


def test_every_exit_code_the_source_sets_is_in_the_readme() -> None:
    documented = _readme_codes()
    assert documented == {0, 1, 2, 3, 4, 5, 130}, documented
    found = {}
    for path in (ROOT / "analyzer" / "snapana").rglob("*.py"):
        if "synth" in path.parts:
            continue  # the simulator's own script, not the CLI
        for m in _SETS_CODE.finditer(path.read_text()):
            found.setdefault(int(next(g for g in m.groups() if g)), path.name)
    assert {1, 2, 3, 4, 5, 130} <= set(found), found  # the scan sees them all
    assert set(found) <= documented, {c: p for c, p in found.items() if c not in documented}


def _cli(*args: str, cwd: Path, env: dict[str, str] | None = None,
         stdout: Any = subprocess.DEVNULL) -> subprocess.CompletedProcess:
    import os
    import sys

    return subprocess.run([sys.executable, "-m", "snapana", *args], cwd=cwd,
                          env={**os.environ, **(env or {})}, stdout=stdout,
                          stderr=subprocess.PIPE, text=True, timeout=120)


def test_the_cli_exits_with_documented_codes_only(tmp_path: Path) -> None:
    """Each outcome as a user meets it, in a process of its own: within and over budget, bad
    input, stdout on a full disk, an output that is a device, a CI summary that is a FIFO
    (refused at once: the timeout would stop a wait)."""
    import os

    documented = _readme_codes()
    within, over = tmp_path / "within.toml", tmp_path / "over.toml"
    within.write_text('peak_allocated = "1000 GiB"\n')
    over.write_text('peak_allocated = "1 MiB"\n')
    fifo = tmp_path / "summary.fifo"
    os.mkfifo(fifo)
    (tmp_path / "bad.pickle").write_bytes(b"not a snapshot")
    runs = {
        "within": (_cli("check", str(SAMPLE), "--budget", str(within), cwd=tmp_path), 0),
        "over": (_cli("check", str(SAMPLE), "--budget", str(over), cwd=tmp_path), 1),
        "bad input": (_cli("summary", "bad.pickle", cwd=tmp_path), 2),
        "usage": (_cli("summary", "--no-such-option", cwd=tmp_path), 2),
        "-o a device": (_cli("report", str(SAMPLE), "-o", "/dev/full", cwd=tmp_path), 2),
        "--junit a FIFO": (_cli("check", str(SAMPLE), "--budget", str(within), "--junit",
                                str(fifo), cwd=tmp_path), 2),
        "summary a FIFO": (_cli("check", str(SAMPLE), "--budget", str(within), cwd=tmp_path,
                                env={"GITHUB_STEP_SUMMARY": str(fifo)}), 2),
        "summary a device": (_cli("check", str(SAMPLE), "--budget", str(within), cwd=tmp_path,
                                  env={"GITHUB_STEP_SUMMARY": "/dev/full"}), 2),
    }
    with open("/dev/full", "w") as full:
        runs["stdout full"] = (_cli("summary", str(SAMPLE), cwd=tmp_path, stdout=full), 4)
    for what, (result, code) in runs.items():
        assert result.returncode == code, (what, result.returncode, result.stderr[-300:])
        assert result.returncode in documented
        if code >= 2 and what != "usage":  # (a usage error is the CLI framework's usage text)
            lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
            assert len(lines) == 1, (what, result.stderr)
    assert "FIFO" in runs["summary a FIFO"][0].stderr
    assert fifo.exists() and not fifo.is_file()  # left as it was


def test_a_step_summary_that_is_a_regular_file_is_appended_to(tmp_path: Path) -> None:
    from snapana.io.output import append_text

    path = tmp_path / "summary.md"
    path.write_text("earlier step\n")
    append_text(path, "this step\n")
    append_text(tmp_path / "new.md", "first\n")
    assert path.read_text() == "earlier step\nthis step\n"
    assert (tmp_path / "new.md").read_text() == "first\n"


# ----- one long name shared by many stacks: stored once in the page ----------------------------

def _amplified(path: Path, name_chars: int, stacks: int) -> str:
    """A snapshot whose one long function name is shared by `stacks` distinct stacks through
    the pickle's memo (written once, referenced by each frame): the name."""
    import pickle

    long = "f" * name_chars
    blocks = [{"address": (1 << 40) + 512 * i, "size": 512, "requested_size": 500,
               "state": "active_allocated",
               "frames": [{"filename": "/app/a.py", "name": long, "line": i},
                          {"filename": "/app/m.py", "name": "main", "line": 1}]}
              for i in range(stacks)]
    trace = [{"action": "alloc", "addr": b["address"], "size": 500, "stream": 0,
              "frames": b["frames"]} for b in blocks]
    snap = {"segments": [{"device": 0, "address": 1 << 40, "total_size": 512 * stacks,
                          "stream": 0, "segment_type": "large", "blocks": blocks}],
            "device_traces": [trace]}
    path.write_bytes(pickle.dumps(snap, protocol=4))
    return long


def _measured(*args: str, cwd: Path) -> tuple[int, float]:
    """(peak RSS in KiB, CPU seconds) of `snapana ARGS` as a process of its own (and its
    children: the reader's)."""
    import sys

    measure = ("import resource, subprocess, sys; r = subprocess.run(sys.argv[1:], "
               "stdout=subprocess.DEVNULL); u = resource.getrusage(resource.RUSAGE_CHILDREN); "
               "print(u.ru_maxrss, u.ru_utime + u.ru_stime, file=sys.stderr); "
               "sys.exit(r.returncode)")
    result = subprocess.run([sys.executable, "-c", measure, sys.executable, "-m", "snapana",
                             *args], cwd=cwd, stderr=subprocess.PIPE, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-500:]
    rss, cpu = result.stderr.strip().splitlines()[-1].split()
    return int(rss), float(cpu)


def test_a_memo_amplified_name_is_stored_once_and_the_report_costs_what_summary_does(
        tmp_path: Path) -> None:
    """A 100,000-character name in 4,000 distinct stacks (a 500 KB pickle; before, its
    report took 2.5 GB and 46 s against summary's 0.2 GB): the page holds each distinct name
    once, shortened as every report shows names, and each stack's frames read back from its
    indices are the pickle's own; the report takes at most 2x summary's memory and CPU."""
    import base64
    import gzip
    import json

    from snapana.limits import MAX_FRAME_TEXT
    from snapana.units import shown_name

    path = tmp_path / "amp.pickle"
    long = _amplified(path, 100_000, 4000)
    assert path.stat().st_size < 600 << 10
    summary = _measured("summary", str(path), cwd=tmp_path)
    report = _measured("report", str(path), "-o", str(tmp_path / "amp.html"), cwd=tmp_path)
    assert report[0] <= 2 * summary[0], (report, summary)
    assert report[1] <= 2 * summary[1] + 2, (report, summary)
    page = (tmp_path / "amp.html").read_text()
    assert len(page) < 4 << 20
    assert "f" * (MAX_FRAME_TEXT + 1) not in page  # never the whole name, anywhere
    data = json.loads(re.search(r'<script type="application/json" id="explore-data-0">(.*?)'
                                r"</script>", page, re.S).group(1).replace("<\\/", "</"))
    names = json.loads(gzip.decompress(base64.b64decode(data["texts"])))["names"]
    assert sorted(names) == sorted({"/app/a.py", "/app/m.py", "main",
                                    shown_name(long, MAX_FRAME_TEXT)})
    from .conftest import regenerate_module

    C = regenerate_module().unpack_columns(data["columns"], data["packed"])  # as the page does
    lines = [f"{names[f]}:{n} {names[k]}" for f, n, k in
             zip(C["frame_file"], C["frame_line"], C["frame_name"], strict=True)]
    starts = [0, *map(int, C["stack_len"].cumsum())]
    stacks = [[lines[i] for i in C["stack_lines"][a:b]]
              for a, b in zip(starts, starts[1:], strict=False)]
    assert len(stacks) == 4000
    for address, entry in zip(C["address"], C["stack"], strict=True):
        i = (int(address) - (1 << 40)) // 512
        assert stacks[entry - 1] == [f"/app/a.py:{i} {shown_name(long, MAX_FRAME_TEXT)}",
                                     "/app/m.py:1 main"]


@pytest.mark.parametrize("fmt", ["text", "markdown"])
def test_a_rank_files_name_with_a_newline_stays_on_its_line(fmt, tmp_path):
    """A rank file whose name holds a newline: its rank-table row, the headline naming the
    first OOM and the heading of its full report each keep it on one line, the newline shown
    escaped (it split the table's row, the markdown headline and heading before)."""
    sample = min((ROOT / "sample_snapshots").glob("*oom*.pickle"), key=lambda p: p.stat().st_size)
    folder = tmp_path / "job"
    folder.mkdir()
    (folder / "rank0\nEVIL.pickle").write_bytes(sample.read_bytes())
    (folder / "rank1.pickle").write_bytes(sample.read_bytes())
    run = invoke("summary", str(folder), "-f", fmt)
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert not [line for line in lines if line.lstrip("| ").startswith("EVIL")], run.stdout
    assert sum("rank0\\x0aEVIL" in line or "rank0\\\\x0aEVIL" in line for line in lines) >= 3
