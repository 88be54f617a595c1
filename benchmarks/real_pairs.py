"""How big fits on real captures (issue 70): torch.profiler traces (profile_memory,
record_shapes, with_stack) of small Hugging Face models built from random configs (GPT-2 and
Llama, no download), made here on the CPU build of torch at three sizes each (seq 64 / 128 /
256 at batch 2, or batch 2 / 4 / 8 at seq 64): a forward with grad, a training step (forward,
backward, AdamW step, zero_grad; a warm-up step first, outside the profiler, so the optimizer
state exists before recording, as in a real incident capture) and inference under no_grad,
in fp32 and under bf16 autocast (torch.autocast("cpu"), which caches its weight casts as on
CUDA: a weight used three times is cast once, freed at the region's end).

Each larger capture's peak allocated by tests/trace_walk.py (an independent walk of the
trace's `[memory]` events, which never imports snapana) beside `whatif --scale`'s prediction
from the smallest, uncalibrated and calibrated (`--calibrate`) on the third size, neither the
recorded nor the predicted one. Checkpointed jobs (`model.gradient_checkpointing_enable()`,
transformers' default: torch.utils.checkpoint non-reentrant; and with use_reentrant=True):
the plain job's smallest capture replayed by `--fit`'s activation checkpointing next step
(benchmarks/checkpointing.py's `checkpoint_change`) at each size, beside the checkpointed
job's own capture there.

What a CPU trace is not: the CPU allocator caches nothing (reserved is allocated), and its
`Total Allocated` counts from profiling start, so the weights, the optimizer state and
anything else made before the profiler do not count on either side; both sides are the
peak of what the step itself allocates. That is the part that scales: a harder test than a
CUDA capture's, where the model state held fixed dilutes every error.

    python benchmarks/real_pairs.py           # every job (a few minutes on 2 cores)
    python benchmarks/real_pairs.py --quick   # two jobs
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import tempfile
import warnings
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
BAR = 0.10
SEQS, BATCHES = (64, 128, 256), (2, 4, 8)
BASE_BATCH, BASE_SEQ = 2, 64
CKPT = {"": "", "hf": "gradient_checkpointing_enable() (non-reentrant)",
        "reentrant": "gradient_checkpointing_enable(use_reentrant=True)"}


@dataclass(frozen=True)
class Job:
    """One real job, profiled at three sizes of `knob`."""

    model: str  # gpt2 / llama
    mode: str  # forward (with grad) / train (one AdamW step) / inference (no_grad)
    dtype: str  # fp32 / bf16 (autocast)
    knob: str  # seq / batch
    checkpoint: str = ""  # "" / "hf" / "reentrant"

    def label(self) -> str:
        ckpt = f", {CKPT[self.checkpoint]}" if self.checkpoint else ""
        return f"{self.model} {self.mode} {self.dtype}{ckpt}"

    def sizes(self) -> tuple[int, ...]:
        return SEQS if self.knob == "seq" else BATCHES

    def shape(self, size: int) -> tuple[int, int]:
        """(batch, seq) at `size` of the knob."""
        return (BASE_BATCH, size) if self.knob == "seq" else (size, BASE_SEQ)


JOBS = (
    Job("gpt2", "train", "fp32", "seq"),
    Job("gpt2", "train", "fp32", "batch"),
    Job("gpt2", "train", "bf16", "seq"),
    Job("gpt2", "forward", "fp32", "seq"),
    Job("gpt2", "inference", "fp32", "seq"),
    Job("gpt2", "inference", "bf16", "batch"),
    Job("llama", "train", "fp32", "seq"),
    Job("llama", "train", "bf16", "seq"),
    Job("llama", "train", "fp32", "batch"),
    Job("llama", "forward", "bf16", "seq"),
    Job("llama", "inference", "fp32", "seq"),
    Job("gpt2", "train", "fp32", "seq", "hf"),
    Job("gpt2", "train", "fp32", "seq", "reentrant"),
    Job("llama", "train", "fp32", "seq", "hf"),
    Job("llama", "train", "bf16", "seq", "hf"),
)
QUICK = (Job("gpt2", "train", "fp32", "seq"), Job("gpt2", "train", "fp32", "seq", "hf"))


@dataclass(frozen=True)
class Row:
    """One prediction: `whatif --scale` (`kind` "scale") or the checkpointing next step's
    replay of the plain job (`kind` "checkpointing") at `big`, from the capture at `small`."""

    job: Job
    small: int
    big: int
    predicted: int
    captured: int
    calibrated: int | None = None
    calibrated_on: int | None = None
    kind: str = "scale"

    error = property(lambda self: self.predicted / self.captured - 1)

    @property
    def calibrated_error(self) -> float | None:
        return None if self.calibrated is None else self.calibrated / self.captured - 1

    @property
    def ok(self) -> bool:
        return all(e is None or abs(e) <= BAR for e in (self.error, self.calibrated_error))


def _walker() -> Any:
    """tests/trace_walk.py, loaded by path: the independent truth."""
    name = "trace_walk"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / "tests" / f"{name}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def captured_peak(path: Path) -> int:
    """The trace's peak allocated on the CPU, by the independent walker."""
    return int(_walker().peak_allocated(path, 0))


# --- making the captures ----------------------------------------------------------------


def _model(kind: str) -> Any:
    import torch
    import transformers

    torch.manual_seed(0)
    if kind == "gpt2":
        config = transformers.GPT2Config(n_layer=2, n_head=4, n_embd=128, vocab_size=1024,
                                         n_positions=1024, bos_token_id=0, eos_token_id=0)
        return transformers.GPT2LMHeadModel(config)
    config = transformers.LlamaConfig(num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, hidden_size=128,
                                      intermediate_size=256, vocab_size=1024,
                                      max_position_embeddings=1024, bos_token_id=0,
                                      eos_token_id=0, pad_token_id=0)
    return transformers.LlamaForCausalLM(config)


def _work(job: Job, batch: int, seq: int) -> Callable[[], Any]:
    """The model built, warmed up where it trains, and the one call the profiler records."""
    import torch

    model = _model(job.model)
    if job.checkpoint:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # the 5.x alias's deprecation
            model.gradient_checkpointing_enable(
                gradient_checkpointing_kwargs={"use_reentrant": job.checkpoint == "reentrant"})
    torch.manual_seed(1)
    ids = torch.randint(0, 1024, (batch, seq))

    def autocast() -> Any:
        return torch.autocast("cpu", dtype=torch.bfloat16, enabled=job.dtype == "bf16")

    def forward() -> Any:
        with autocast():
            return model(input_ids=ids, labels=ids, use_cache=False).loss

    if job.mode == "inference":
        model.eval()

        def infer() -> Any:
            with torch.no_grad(), autocast():
                return model(input_ids=ids, use_cache=False).logits
        return infer
    model.train()
    if job.mode == "forward":
        return forward
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def step() -> None:
        forward().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    step()  # the optimizer's state exists before the recorded step, as in an incident
    return step


def _path(job: Job, size: int, folder: Path) -> Path:
    batch, seq = job.shape(size)
    name = f"{job.model}-{job.mode}-{job.dtype}-{job.checkpoint or 'plain'}-b{batch}-s{seq}"
    return folder / f"{name}.json"


def _record(job: Job, size: int, path: Path) -> None:
    """Profile the job's one call at `size` and write its chrome trace to `path`."""
    from torch.profiler import ProfilerActivity, profile

    work = _work(job, *job.shape(size))
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True,
                 with_stack=True) as prof:
        kept = work()
    del kept
    prof.export_chrome_trace(str(path))


def capture(job: Job, size: int, folder: Path) -> Path:
    """The job's trace at `size` of its knob, made once per folder, each in a process of its
    own, as a real job is profiled: the CPU reporter's `Total Allocated` is process-wide and
    keeps counting blocks a previous profile made that are still alive (a later capture in
    the same process would start above zero). Every size is recorded by the same code path:
    calibration pairs allocations by their Python call path."""
    path = _path(job, size, folder)
    if not path.exists():
        run = subprocess.run([sys.executable, __file__, "--record", job.model, job.mode,
                              job.dtype, job.knob, job.checkpoint or "-", str(size), str(path)],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if run.returncode:
            raise RuntimeError(f"recording {path.name} failed: {run.stderr[-2000:]}")
    return path


# --- predicting -------------------------------------------------------------------------


def third(sizes: tuple[int, ...], small: int, big: int) -> int | None:
    """The size that calibrates `small` → `big`: the largest strictly between, else the
    smallest above `big` (never the recorded or the predicted one)."""
    between = [s for s in sizes if small < s < big]
    above = [s for s in sizes if s > big]
    others = [s for s in sizes if s not in (small, big)]
    return between[-1] if between else above[0] if above else others[-1] if others else None


def _scale_rows(job: Job, folder: Path, calibrate: bool) -> list[Row]:
    from snapana.analysis.scaling import parse_sizes
    from snapana.session import Session

    sizes = job.sizes()
    small = sizes[0]
    session = Session.open(capture(job, small, folder))
    out = []
    for big in sizes[1:]:
        asked = parse_sizes([f"{job.knob}={small}:{big}"])
        p = session.resize(asked)
        assert p.target is not None
        row = Row(job, small, big, p.target.replay.peak_allocated,
                  captured_peak(capture(job, big, folder)))
        n = third(sizes, small, big)
        if calibrate and n is not None:
            c = session.resize(asked, calibrate=(Session.open(capture(job, n, folder)),
                                                 job.knob, n))
            assert c.target is not None
            row = replace(row, calibrated=c.target.replay.peak_allocated, calibrated_on=n)
        out.append(row)
    return out


def _checkpoint_rows(job: Job, folder: Path, calibrate: bool) -> list[Row]:
    """The plain job's smallest capture, replayed with `--fit`'s checkpointing next step at
    each size, against the checkpointed job's capture there."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from checkpointing import checkpoint_change
    from snapana.analysis.scaling import parse_sizes
    from snapana.session import Session

    plain = replace(job, checkpoint="")
    sizes = job.sizes()
    small = sizes[0]
    session = Session.open(capture(plain, small, folder))
    asked = parse_sizes([f"{job.knob}={small}"])
    window = session.scaling(asked)
    change = checkpoint_change(window)
    out = []
    for size in sizes:
        row = Row(job, small, size, window.run({job.knob: size}, None, change)
                  .replay.peak_allocated, captured_peak(capture(job, size, folder)),
                  kind="checkpointing")
        n = third(sizes, small, size)
        if calibrate and n is not None:
            calibrated = session.scaling(asked, (Session.open(capture(plain, n, folder)),
                                                 job.knob, n))
            row = replace(row, calibrated=calibrated.run(
                {job.knob: size}, None, checkpoint_change(calibrated)).replay.peak_allocated,
                calibrated_on=n)
        out.append(row)
    return out


def rows(jobs: tuple[Job, ...] = JOBS, calibrate: bool = True,
         folder: Path | None = None) -> list[Row]:
    """Every job's rows, its captures made in `folder` (a temporary one by default)."""
    if folder is None:
        with tempfile.TemporaryDirectory() as tmp:
            return rows(jobs, calibrate, Path(tmp))
    out = []
    for job in jobs:
        out += (_checkpoint_rows if job.checkpoint else _scale_rows)(job, folder, calibrate)
    return out


# --- printing ---------------------------------------------------------------------------


def _pct(x: float | None) -> str:
    return "" if x is None else f"{x:+.2%}"


def change(r: Row) -> str:
    what = f"{r.job.knob} {r.small:,} → {r.big:,}"
    return f"{what}, checkpointing replayed" if r.kind == "checkpointing" else what


def table(found: list[Row]) -> str:
    out = ["| job | change | predicted | error | calibrated | on | error | captured "
           "(trace walk) |", "|---|---|---:|---:|---:|---|---:|---:|"]
    out += [f"| {r.job.label()} | {change(r)} | {r.predicted:,} | {_pct(r.error)} | "
            f"{'—' if r.calibrated is None else f'{r.calibrated:,}'} | "
            f"{'' if r.calibrated_on is None else f'{r.job.knob}={r.calibrated_on:,}'} | "
            f"{_pct(r.calibrated_error)} | {r.captured:,} |" for r in found]
    if found:
        unc = [r.error for r in found]
        cal = [e for r in found if (e := r.calibrated_error) is not None]
        bad = [r for r in found if not r.ok]
        out += ["", f"Uncalibrated: {len(unc)} rows, {min(unc):+.2%} … {max(unc):+.2%}."]
        if cal:
            out.append(f"Calibrated: {len(cal)} rows, {min(cal):+.2%} … {max(cal):+.2%}.")
        out.append(f"{len(bad)} row{'' if len(bad) == 1 else 's'} past ±{BAR:.0%}"
                   + (": " + "; ".join(f"{r.job.label()} {change(r)}" for r in bad)
                      if bad else "."))
    return "\n".join(out)


def main(argv: list[str]) -> int:
    if argv[:1] == ["--record"]:  # one capture, in this process of its own (`capture`)
        model, mode, dtype, knob, ckpt, size, path = argv[1:8]
        _record(Job(model, mode, dtype, knob, "" if ckpt == "-" else ckpt), int(size),
                Path(path))
        return 0
    found = rows(QUICK if "--quick" in argv else JOBS)
    print(table(found))
    return 0 if all(r.ok for r in found) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
