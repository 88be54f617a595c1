"""memray captures, first class: every release's files read (or the exact release named),
their stacks attributed by the host pack, and a real PyTorch training job's host families.

Captures of older releases are written at test time by those releases, each installed alone
in a venv of its own (cached under the temp folder): the judge `memray_releases`, built where a
run demands it (a release pip cannot install there fails its cases; elsewhere they skip, naming
it). Expected bytes come from memray's own reader, run in the test.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from snapana.errors import InputError
from snapana.render import views
from snapana.session import analyse
from snapana.sources import memray_capture

from .conftest import corpus_params, invoke, judge_missing, require

#: Releases whose captures the tests write, one per capture format: the oldest the
#: `memray>=1.10` extra allows (format 10), the last of format 11, and the one the corpus's
#: captures (format 12) come from. The installed memray (format 13) is the newest.
RELEASES = {"1.10.0": 10, "1.18.0": 11, "1.19.3": 12}

WRITE = """
import os, sys, memray
def hold(n):
    return [bytearray(1 << 20) for _ in range(n)]
with memray.Tracker(sys.argv[1]):
    kept = hold(3)
    del kept
print(os.getpid())
"""

PEAK = """
import json, sys, memray
r = memray.FileReader(sys.argv[1])
recs = list(r.get_high_watermark_allocation_records(merge_threads=True))
print(json.dumps({"peak": r.metadata.peak_memory, "sum": sum(x.size for x in recs),
                  "torch": any("torch/" in f[1] for x in recs for f in x.stack_trace())}))
"""


def _venv_with(release: str) -> Path | None:
    """The python of a venv holding only memray==release; None when pip cannot install it."""
    tag = f"py{sys.version_info[0]}{sys.version_info[1]}"
    base = Path(tempfile.gettempdir()) / f"snapana-test-memray-{release}-{tag}"
    py = base / "bin" / "python"
    check = f"import memray, sys; sys.exit(memray.__version__ != {release!r})"
    if py.is_file() and subprocess.run([py, "-c", check], capture_output=True).returncode == 0:
        return py
    tmp = Path(tempfile.mkdtemp(prefix=base.name + ".", dir=base.parent))
    made = subprocess.run([sys.executable, "-m", "venv", str(tmp)], capture_output=True)
    if made.returncode == 0:
        made = subprocess.run([tmp / "bin" / "python", "-m", "pip", "install", "-q",
                               "--disable-pip-version-check", f"memray=={release}"],
                              capture_output=True, timeout=900)
    if made.returncode != 0:
        return None
    try:
        tmp.rename(base)
    except OSError:  # another run made it meanwhile
        pass
    return py if py.is_file() else None


@pytest.fixture(scope="module", params=sorted(RELEASES))
def release_venv(request):
    py = _venv_with(request.param)
    if py is None:
        judge_missing("memray_releases", f"memray {request.param} (pip failed)")
    return request.param, py


TOP_HAS_FRAMES = """
import sys
from memray import FileReader
records = FileReader(sys.argv[1]).get_high_watermark_allocation_records(merge_threads=True)
top = max(records, key=lambda a: a.size)
print(bool(top.stack_trace(max_stacks=1)))
"""


def _own_figures(py: Path, capture: Path) -> dict:
    out = subprocess.run([py, "-c", PEAK, str(capture)], capture_output=True, text=True,
                         check=True, timeout=600)
    return json.loads(out.stdout)


def test_release_table_names_each_format():
    assert memray_capture.release_format("1.10.0") == 10
    assert memray_capture.release_format("1.11.0") == 11
    assert memray_capture.release_format("1.18.0") == 11
    assert memray_capture.release_format("1.19.3") == 12
    assert memray_capture.release_format("1.20.0") == 13
    assert memray_capture.release_format("9.0.0") is None  # newer than the table: memray decides


@pytest.mark.memray
@pytest.mark.memray_releases
def test_capture_of_each_release_is_read_or_names_its_release(release_venv, tmp_path):
    release, py = release_venv
    cap = tmp_path / f"written by {release}.bin"
    writer = tmp_path / "writer.py"
    writer.write_text(WRITE)
    pid = int(subprocess.run([py, str(writer), str(cap)], capture_output=True, text=True,
                             check=True, timeout=600).stdout.split()[-1])
    header = memray_capture.read_header(cap)
    assert header.format_version == RELEASES[release]
    assert header.pid == pid and header.n_allocations is not None
    own = _own_figures(py, cap)

    installed = memray_capture._installed_memray()
    if installed is not None and memray_capture.release_format(installed) != RELEASES[release]:
        with pytest.raises(InputError) as info:
            memray_capture.load(cap)
        msg = str(info.value)
        assert "\n" not in msg and f"install 'memray=={release}' in a separate environment" in msg
        assert "--memray-python" in msg  # never a bare pip install that downgrades this one
        first, last = memray_capture.FORMAT_RELEASES[RELEASES[release]]
        assert f"memray {first} to {last}" in msg
        # the user's own -o is the one the advice names
        out = tmp_path / "mine" / "converted here.parquet"
        out.parent.mkdir()
        result = invoke("convert", str(cap), "-o", str(out))
        assert result.returncode == 2
        assert "snapana convert" in result.stderr and "converted here.parquet" in result.stderr
        assert f"'{out}'" in result.stderr, result.stderr

    # the release that wrote it reads it: convert under it, then load anywhere
    from snapana.io.convert import convert_memray

    capture = memray_capture.load(convert_memray(cap, tmp_path / "converted.parquet",
                                                 python=str(py)))
    assert int(capture.blocks["size"].sum()) == own["sum"] == own["peak"]
    (report,) = analyse(capture)
    assert report.allocated_bytes == own["peak"]
    view = views.device_view(report)
    assert "/writer.py:4 " in view.verdict  # the site is named
    assert "no frames" not in view.verdict and "torch" not in view.verdict


def test_reader_failure_says_what_failed_and_debug_shows_the_traceback(tmp_path):
    """A reader that raises (here a memray whose Metadata lacks what the child reads) is named
    in one line; --debug adds the child's own traceback."""
    fake = tmp_path / "fake"
    (fake / "memray").mkdir(parents=True)
    (fake / "memray" / "__init__.py").write_text(
        "__version__ = '1.20.0'\n"
        "class FileReader:\n"
        "    def __init__(self, path):\n"
        "        raise KeyError('no reader in this fake memray')\n")
    wrapper = tmp_path / "python"
    # a fake environment: its memray is on PYTHONPATH, which the isolated child (-I) would
    # ignore, so the wrapper drops -I (a real environment installs memray in site-packages)
    wrapper.write_text(f"#!/bin/sh\n[ \"$1\" = -I ] && shift\n"
                       f"PYTHONPATH={fake} exec {sys.executable} \"$@\"\n")
    wrapper.chmod(0o755)
    cap = tmp_path / "run.bin"
    cap.write_bytes(b"memray\x00" + (13).to_bytes(4, "little") + b"\x00" * 64)
    out = tmp_path / "out.parquet"
    plain = invoke("convert", str(cap), "-o", str(out), "--memray-python", str(wrapper))
    assert plain.returncode == 2
    line = plain.stderr.strip()
    assert "\n" not in line and "KeyError" in line and "no reader in this fake" in line
    assert "Traceback" not in plain.stderr
    debug = invoke("--debug", "convert", str(cap), "-o", str(out), "--memray-python",
                   str(wrapper))
    assert debug.returncode == 2
    assert "Traceback (most recent call last)" in debug.stderr and "KeyError" in debug.stderr
    assert not out.exists()


def test_a_reader_that_stops_reading_is_stopped(tmp_path, monkeypatch):
    """Hang protection is a stall of the reader's position, not a wall-clock limit on work."""
    monkeypatch.setenv("SNAPANA_MEMRAY_STALL_SECONDS", "2")
    cap = tmp_path / "run.bin"
    size = 1 << 20
    cap.write_bytes(b"x" * size)
    stuck = ("import sys, time\nf = open(sys.argv[1], 'rb', buffering=0)\nf.read(10)\n"
             "time.sleep(300)\n")
    seen: list[tuple[int, int]] = []
    with pytest.raises(InputError) as info:
        memray_capture._run_reader([sys.executable, "-c", stuck, str(cap)], cap, size,
                                   lambda done, total: seen.append((done, total)), None)
    assert f"stopped reading at byte 10 of {size}" in str(info.value)
    assert seen and seen[-1] == (10, size)


def test_a_reader_that_spins_is_stopped_by_cpu_time(tmp_path, monkeypatch):
    """Work is bounded in CPU seconds (proportional to the capture), not wall-clock ones."""
    monkeypatch.setattr(memray_capture, "memray_cpu_seconds", lambda size: 1.0)
    cap = tmp_path / "run.bin"
    cap.write_bytes(b"x" * 64)
    spin = "import sys\nopen(sys.argv[1], 'rb').read()\nwhile True:\n    pass\n"
    with pytest.raises(InputError) as info:
        memray_capture._run_reader([sys.executable, "-c", spin, str(cap)], cap, 64, None, None)
    assert "more than 1 s of CPU" in str(info.value)


# ----- the corpus ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def reader_119():
    py = _venv_with("1.19.3")
    if py is None:
        judge_missing("memray_releases", "memray 1.19.3 (pip failed)")
    return py


@pytest.mark.memray
@pytest.mark.memray_releases
@pytest.mark.parametrize("path", corpus_params("memray", "*.bin"))
def test_corpus_capture_is_read_and_its_sites_named(path, reader_119, tmp_path):
    """Each capture read through the release snapana names for its format (1.19.3 for
    format 12; the older formats 10 and 11 by the newest release that reads them)."""
    from snapana import render as renderers
    from snapana.io.convert import convert_memray
    from snapana.sources.memray_capture import read_header

    pin = read_header(path).pin
    reader = reader_119 if pin in (None, "memray==1.19.3") else _venv_with(
        pin.removeprefix("memray=="))
    if reader is None:
        judge_missing("memray_releases", f"{pin} (pip failed)")
    out = convert_memray(path, tmp_path / "c.parquet", python=str(reader))
    capture = memray_capture.load(out)
    own = _own_figures(reader, path)
    assert int(capture.blocks["size"].sum()) == own["sum"]
    (report,) = analyse(capture)
    view = views.device_view(report)
    # the release's own reader says whether the largest allocation at the high-water mark has
    # a Python stack (UMN-CMS's 128 MiB one has none): the verdict says "no frames" then only
    top_has_frames = subprocess.run(
        [reader, "-c", TOP_HAS_FRAMES, str(path)], capture_output=True, text=True, check=True,
        timeout=600).stdout.strip() == "True"
    assert ("no frames" not in view.verdict) == top_has_frames, view.verdict
    # header and verdict speak of the same moment
    assert view.moment == "at the heap's high-water mark" and "high-water mark" in view.verdict
    for contradiction in ("no OOM, peak or timeline", "No allocation history was recorded"):
        assert contradiction not in view.verdict
    # every family is named by its top site
    for g in report.groups:
        assert g.sites and g.sites[0]["site"], g.name
    assert report.groups[0].sites[0]["site"] in view.verdict
    assert not own["torch"]  # none of the corpus's jobs uses torch: no torch advice anywhere
    cv = views.capture_view([report], path.name)
    for fmt in renderers.FORMATS:
        text = renderers.render(cv, fmt)
        assert "torch.cuda.memory" not in text and "_record_memory_history" not in text, fmt
    assert "torch" not in view.history_note
    page = renderers.render(cv, "html")
    assert "snapana — host memory report" in page and "GPU memory report" not in page


# ----- a real training job ---------------------------------------------------------------------

class _Batch:
    """A custom batch: the DataLoader pins it by calling its `pin_memory()` (torch's documented
    hook for custom batch types). A CPU-only torch cannot page-lock memory (`pin_memory()`
    raises "Cannot access accelerator device"), so there the hook returns the host staging
    copy it would have pinned: the same bytes, through torch's own pinning code path."""

    def __init__(self, x):
        self.x = x

    def pin_memory(self):
        try:
            return _Batch(self.x.pin_memory())
        except RuntimeError:
            import torch

            return _Batch(torch.empty_like(self.x).copy_(self.x))


def _train(torch, steps: int = 3):
    """AdamW with its state on the host (the model is on the CPU: what
    `--optimizer-cpu-offload` does to the state), a host copy of the weights
    (copy.deepcopy of the state_dict), and each batch through torch's pin_memory."""
    from torch.utils.data._utils.pin_memory import pin_memory

    torch.manual_seed(0)
    # wide input, narrow hidden layer: weights and batch large enough that each family holds
    # over 10% of the heap beside the interpreter's and torch's own (~30 MB), activations
    # small (a family needs that share for a knob without an OOM)
    model = torch.nn.Sequential(torch.nn.Linear(16384, 256), torch.nn.ReLU(),
                                torch.nn.Linear(256, 16))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)
    backup = copy.deepcopy(model.state_dict())
    batch = None
    for _ in range(steps):
        batch = pin_memory(_Batch(torch.randn(256, 16384)))
        model(batch.x).pow(2).mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return model, opt, backup, batch


@pytest.mark.torch
@pytest.mark.memray
def test_training_capture_names_host_families_with_relax_knobs(tmp_path):
    torch = require("torch")
    memray = require("memray")
    _train(torch, steps=1)  # imports and lazy initialisation happen outside the capture
    cap = tmp_path / "train.bin"
    with memray.Tracker(str(cap)):
        model, opt, backup, batch = _train(torch)
    param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    batch_bytes = batch.x.numel() * batch.x.element_size()

    # memray's own figures, family by family, from its reader's high-water-mark records
    reader = memray.FileReader(str(cap))
    own = {"host_optimizer_state": 0, "host_weight_backup": 0, "pinned_buffer": 0}
    total = 0
    for rec in reader.get_high_watermark_allocation_records(merge_threads=True):
        total += rec.size
        frames = [(f.replace("\\", "/"), fn) for fn, f, _ in rec.stack_trace()]
        if any(f.endswith("torch/optim/adam.py") and fn == "_init_group" for f, fn in frames):
            own["host_optimizer_state"] += rec.size
        elif any(f.endswith("torch/_tensor.py") and fn == "__deepcopy__" for f, fn in frames):
            own["host_weight_backup"] += rec.size
        elif any(f.endswith("torch/utils/data/_utils/pin_memory.py") for f, _ in frames):
            own["pinned_buffer"] += rec.size
    assert total == reader.metadata.peak_memory

    capture = memray_capture.load(cap)
    (report,) = analyse(capture)
    assert report.allocated_bytes == reader.metadata.peak_memory
    got = {g.name: g.bytes for g in report.groups}
    for family, nbytes in own.items():
        assert nbytes > 0, family
        assert abs(got.get(family, 0) - nbytes) <= 0.01 * nbytes, (family, got, own)
    # and what torch says the job holds: 2 moments per parameter, 1 copy, 1 pinned batch
    assert abs(got["host_optimizer_state"] - 2 * param_bytes) <= 0.01 * 2 * param_bytes
    assert abs(got["host_weight_backup"] - param_bytes) <= 0.01 * param_bytes
    assert batch_bytes <= got["pinned_buffer"] <= 2 * batch_bytes * 1.01

    view = views.device_view(report)
    assert view.moment == "at the heap's high-water mark" and "high-water mark" in view.verdict
    assert "host_optimizer_state" in view.verdict
    knobs = {k[0]: k[2] for k in view.knobs}
    by_family = {fam: knob for knob, fams in knobs.items() for fam in fams.split(", ")}
    assert "--optimizer-cpu-offload" in by_family["host_optimizer_state"]
    assert "--disable-weights-backuper" in by_family["host_weight_backup"]
    assert "pin_memory=False" in by_family["pinned_buffer"]
    # torch is in these stacks: the note may say how to record the GPU side too
    assert "_record_memory_history" in view.history_note


def test_a_gpu_capture_never_gets_host_families():
    """The host pack decides heap allocations only: the same AdamW stack on a GPU block is
    still the GPU pack's optimizer state."""
    from snapana.analysis.attribution import load_rules
    from snapana.analysis.attribution.stack import BlockContext

    stack = (("/v/site-packages/torch/optim/adam.py", "_init_group", 178),
             ("/v/site-packages/torch/optim/adam.py", "step", 238),
             ("/v/site-packages/torch/optim/optimizer.py", "wrapper", 526),
             ("/home/u/train.py", "main", 40))
    rules = load_rules()
    assert rules.classify(stack, BlockContext()).family == "optimizer_state"  # device: default
    assert rules.for_memory("device").classify(stack, BlockContext()).family == \
        "optimizer_state"
    assert rules.for_memory("host").classify(stack, BlockContext()).family == \
        "host_optimizer_state"
    other = (("/home/u/physics/histograms.py", "fill", 88),)
    assert rules.for_memory("host").classify(other, BlockContext()).family == "unknown"


def test_read_bound_grows_with_the_capture(monkeypatch):
    """No fixed wall-clock limit: the bound on memray's reader grows with the capture."""
    from snapana.limits import memray_cpu_seconds, memray_read_seconds

    monkeypatch.delenv("SNAPANA_MEMRAY_SECONDS_PER_MIB", raising=False)
    assert memray_cpu_seconds(100 << 20) > 20 * memray_cpu_seconds(1 << 20)
    assert memray_cpu_seconds(1_777_664) > 600  # C-killer's 1.7 MB: ~30 s of real work
    assert memray_read_seconds(1_777_664) > memray_cpu_seconds(1_777_664)


@pytest.mark.memray
def test_the_reader_child_imports_nothing_from_the_working_directory(tmp_path):
    """A capture analysed inside the folder it came with: modules planted there
    (json.py, inspect.py, types.py) never run in the reader's interpreter."""
    require("memray")
    folder = tmp_path / "ticket"
    folder.mkdir()
    ran = tmp_path / "ran"
    for name in ("json", "inspect", "types"):
        (folder / f"{name}.py").write_text(f"open({str(ran)!r}, 'a').write('{name}\\n')\n")
    cap = folder / "run.bin"
    cap.write_bytes(b"memray\x00" + (13).to_bytes(4, "little") + b"\x00" * 64)
    got = invoke("convert", str(cap), "-o", str(tmp_path / "out.parquet"), cwd=folder)
    assert got.returncode == 2  # not a real capture: refused in one line
    assert "\n" not in got.stderr.strip()
    assert not ran.exists(), ran.read_text()
