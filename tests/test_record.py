"""The capture side on a CPU machine: PyTorch's CUDA entry points are replaced by a fake that
records the calls and returns simulator snapshots; the tensor inventory walks real (CPU)
tensors, modules and an AdamW optimizer; the injection runs real child processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from snapana.record import recorder as recorder_module
from snapana.record.cuda import CudaBackend
from snapana.record.launch import job_environment
from snapana.record.recorder import Options, Recorder
from snapana.synth.scenarios import run_scenario

from .conftest import require

GiB = 1 << 30


class FakeCuda(CudaBackend):
    """Records what the recorder asks of PyTorch; answers with a simulated snapshot."""

    def __init__(self, available: bool = True, fail_snapshot: bool = False) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.observer: Any = None
        self._available = available
        self._fail = fail_snapshot

    def available(self) -> bool:
        return self._available

    def start_history(self, max_entries: int, stacks: str) -> None:
        self.calls.append(("start_history", (max_entries, stacks)))

    def snapshot(self) -> dict[str, Any]:
        self.calls.append(("snapshot", None))
        if self._fail:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        snap, _ = run_scenario("fsdp-train-step")
        return dict(snap)

    def attach_oom_observer(self, observer: Any) -> None:
        self.observer = observer

    def mem_get_info(self, device: int) -> tuple[int, int]:
        return 3 * GiB, 80 * GiB

    def current_device(self) -> int:
        return 0

    def device_name(self, device: int) -> str:
        return "Fake H100"

    def versions(self) -> dict[str, str | None]:
        return {"torch": "2.13.0", "cuda": "12.8"}


@pytest.fixture()
def quiet_exit(monkeypatch: pytest.MonkeyPatch) -> None:
    """In-process recorders must not dump when pytest itself exits."""
    monkeypatch.setattr(recorder_module.atexit, "register", lambda fn: None)


def _recorder(tmp_path: Path, cuda: FakeCuda, **kw: Any) -> Recorder:
    rec = Recorder(Options(tmp_path / "out", inventory_device="cpu", job="train", **kw), cuda)
    return rec


def _train(steps: int) -> tuple[Any, Any]:
    torch = require("torch")
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    model.register_buffer("scale", torch.ones(4))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for _ in range(steps):
        model(torch.randn(2, 8)).sum().backward()
        opt.step()
    return model, opt


@pytest.mark.torch
def test_dump_at_step_writes_snapshot_sidecar_and_inventory(tmp_path: Path, quiet_exit,
                                                            monkeypatch) -> None:
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "8")
    cuda = FakeCuda()
    # the walk's deadline is not what this tests: a full suite in one loaded process holds
    # millions of objects, which the default 3 s may not cover
    rec = _recorder(tmp_path, cuda, dump_at_step=2, inventory_deadline_s=120.0)
    try:
        assert rec.start()
        assert cuda.calls[0] == ("start_history", (100_000, "python"))
        model, opt = _train(3)
    finally:
        rec.close()
    out = tmp_path / "out"
    assert sorted(p.name for p in out.iterdir()) == ["train-rank3-step2.meta.json",
                                                     "train-rank3-step2.pickle"]
    from snapana.sources import load

    assert load(out / "train-rank3-step2.pickle").devices  # a snapshot snapana reads
    meta = json.loads((out / "train-rank3-step2.meta.json").read_text())
    assert meta["format"] == "snapana.record.sidecar" and meta["version"] == 1
    assert (meta["reason"], meta["step"], meta["rank"], meta["world_size"]) == ("step", 2, 3, 8)
    assert meta["device_total_bytes"] == 80 * GiB and meta["device_free_bytes"] == 3 * GiB
    assert meta["device_name"] == "Fake H100" and meta["snapshot"] == "train-rank3-step2.pickle"
    inv = {e["ptr"]: e for e in meta["inventory"]["tensors"]}
    assert meta["inventory"]["complete"] is True
    w = model[0].weight
    entry = inv[w.untyped_storage().data_ptr()]
    assert (entry["name"], entry["role"], entry["shape"], entry["dtype"]) == \
        ("0.weight", "parameter", [16, 8], "float32")
    assert inv[w.grad.untyped_storage().data_ptr()]["name"] == "0.weight.grad"
    state = opt.state[w]
    assert inv[state["exp_avg"].untyped_storage().data_ptr()]["name"] == "0.weight:exp_avg"
    assert inv[state["exp_avg_sq"].untyped_storage().data_ptr()]["role"] == "optimizer_state"
    assert inv[model.scale.untyped_storage().data_ptr()]["role"] == "buffer"


def test_oom_dumps_once_and_never_overwrites(tmp_path: Path, quiet_exit) -> None:
    cuda = FakeCuda()
    # no tensor inventory: what is tested is the dump-once rule, and the inventory needs torch
    first = _recorder(tmp_path, cuda, inventory=False)
    # a second recorder: e.g. a restarted rank writing to the same folder
    second = _recorder(tmp_path, cuda, inventory=False)
    assert first.start() and second.start()
    first.on_oom(0, 2 * GiB, 70 * GiB, GiB)
    first.on_oom(0, 2 * GiB, 70 * GiB, GiB)  # the allocator's retry: no second dump
    second.on_oom(0, 2 * GiB, 70 * GiB, GiB)
    first.on_exit()  # after an OOM, the OOM dump is the story
    first.close()
    second.close()
    names = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert names == ["train-rank0-oom-2.meta.json", "train-rank0-oom-2.pickle",
                     "train-rank0-oom.meta.json", "train-rank0-oom.pickle"]
    meta = json.loads((tmp_path / "out" / "train-rank0-oom-2.meta.json").read_text())
    assert meta["snapshot"] == "train-rank0-oom-2.pickle" and meta["reason"] == "oom"


def test_exit_dump_and_a_failing_dump_is_one_notice(tmp_path: Path, quiet_exit, capsys) -> None:
    rec = _recorder(tmp_path, FakeCuda(), inventory=False)
    assert rec.start()
    rec.on_exit()
    rec.close()
    assert (tmp_path / "out" / "train-rank0-exit.pickle").is_file()
    broken = _recorder(tmp_path, FakeCuda(fail_snapshot=True))
    assert broken.start()
    assert broken.dump("oom") is None  # never raises into the job
    broken.close()
    err = capsys.readouterr().err
    assert "could not write the oom snapshot: RuntimeError" in err


def test_without_cuda_one_notice_and_nothing_armed(tmp_path: Path, capsys) -> None:
    cuda = FakeCuda(available=False)
    assert not _recorder(tmp_path, cuda).start()
    assert cuda.calls == [] and cuda.observer is None
    assert capsys.readouterr().err.count("snapana record:") == 1


def _child(code: str, tmp_path: Path, extra_env: dict[str, str] | None = None
           ) -> subprocess.CompletedProcess:
    env = job_environment(tmp_path / "out", 1000, "python", None, None)
    env.update(extra_env or {})
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=300, cwd=tmp_path)


def test_injection_leaves_a_job_without_torch_untouched(tmp_path: Path) -> None:
    run = _child("import sys; print('hello'); sys.stderr.write('own\\n'); sys.exit(7)", tmp_path)
    assert (run.returncode, run.stdout, run.stderr) == (7, "hello\n", "own\n")
    assert not (tmp_path / "out").exists()


@pytest.mark.torch
def test_injection_arms_when_torch_is_imported(tmp_path: Path) -> None:
    require("torch")
    run = _child("import torch, sys; import snapana.record as r; "
                 "print('armed' if 'snapana.record' in sys.modules else 'no')", tmp_path)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "armed"
    # this machine has no GPU: one notice, and the job ran normally
    assert run.stderr.count("snapana record: CUDA is not available") == 1


def test_injection_keeps_the_sitecustomize_it_shadows(tmp_path: Path) -> None:
    own = tmp_path / "own_site"
    own.mkdir()
    (own / "sitecustomize.py").write_text("import os\nos.environ['OWN_SITE'] = 'ran'\n")
    env = job_environment(tmp_path / "out", 1000, "python", None, None)
    env["PYTHONPATH"] += os.pathsep + str(own)
    run = subprocess.run([sys.executable, "-c", "import os; print(os.environ.get('OWN_SITE'))"],
                         env=env, capture_output=True, text=True, timeout=120)
    assert run.stdout.strip() == "ran", run.stderr


def test_snapana_record_runs_the_job_and_passes_its_exit_code(tmp_path: Path) -> None:
    run = subprocess.run([sys.executable, "-m", "snapana", "record", "-o", str(tmp_path / "o"),
                          "--", sys.executable, "-c",
                          "import sys; print('job out'); sys.exit(4)"],
                         capture_output=True, text=True, timeout=300)
    assert (run.returncode, run.stdout, run.stderr) == (4, "job out\n", "")
    bad = subprocess.run([sys.executable, "-m", "snapana", "record", "--", "no-such-cmd-x"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1


def test_the_job_runs_in_the_users_environment_not_with_snapanas_settings(tmp_path: Path
                                                                          ) -> None:
    """snapana asks OpenBLAS for one thread and arrow for the system pool for its own process
    (`__main__`); the job it records gets the environment the user gave (a training job's
    BLAS threads are its own), a user's own value kept."""
    own = ("OPENBLAS_NUM_THREADS", "ARROW_DEFAULT_MEMORY_POOL")
    show = f"import os; print(*(os.environ.get(k) for k in {own!r}))"
    env = {k: v for k, v in os.environ.items() if k not in own}
    for given, seen in (({}, "None None"), ({"OPENBLAS_NUM_THREADS": "8"}, "8 None")):
        run = subprocess.run([sys.executable, "-m", "snapana", "record", "-o",
                              str(tmp_path / "o"), "--", sys.executable, "-c", show],
                             env={**env, **given}, capture_output=True, text=True,
                             timeout=300)
        assert (run.returncode, run.stdout.strip()) == (0, seen), run.stderr


def _oom_dump(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A recorder on the fake GPU dumps the chunked log-prob OOM sample with its sidecar."""
    monkeypatch.setattr(recorder_module.atexit, "register", lambda fn: None)

    class OomCuda(FakeCuda):
        def snapshot(self) -> dict[str, Any]:
            snap, _ = run_scenario("slime-tp2-chunked-logprob-oom")
            return dict(snap)

    rec = _recorder(tmp_path, OomCuda(), inventory=False)
    assert rec.start()
    rec.on_oom(0, 1, 1, 1)
    rec.close()
    return tmp_path / "out" / "train-rank0-oom.pickle"


def test_report_reads_capacity_and_rank_from_the_sidecar(tmp_path: Path, monkeypatch) -> None:
    from .conftest import invoke

    dump = _oom_dump(tmp_path, monkeypatch)
    run = invoke("summary", str(dump), "-f", "json")
    assert run.returncode == 0, run.stderr
    dev = json.loads(run.stdout)["devices"][0]
    d = dev["diagnosis"]
    assert d["capacity_bytes"] == 80 * GiB  # measured by the recording, no --capacity
    assert d["outside_pytorch_bytes"] == (80 * GiB - dev["reserved_bytes"]
                                          - dev["oom"]["device_free_bytes"])
    run = invoke("summary", str(dump), "-f", "json", "--capacity", "79GiB")
    assert json.loads(run.stdout)["devices"][0]["diagnosis"]["capacity_bytes"] == 79 * GiB
    import snapana

    assert snapana.load(dump).capture.metadata["sidecar"]["reason"] == "oom"


def test_inventory_names_blocks_above_frame_rules(tmp_path: Path, monkeypatch) -> None:
    from .conftest import invoke

    dump = _oom_dump(tmp_path, monkeypatch)
    import snapana

    blocks = snapana.load(dump).blocks.sort("size", descending=True)
    picks = blocks.filter(blocks["family"].is_in(["saved_activations", "logits"])).head(2)
    meta_path = dump.with_name("train-rank0-oom.meta.json")
    meta = json.loads(meta_path.read_text())
    meta["inventory"] = {"complete": True, "stopped": None, "seconds": 0.1, "tensors": [
        {"ptr": int(a), "nbytes": int(n), "shape": [4, 1024], "dtype": "bfloat16",
         "requires_grad": True, "device": 0, "name": f"model.layers.{i}.mlp.weight",
         "role": "parameter"} for i, (a, n) in enumerate(picks.select("address", "size")
                                                        .iter_rows())]}
    meta_path.write_text(json.dumps(meta))
    again = snapana.load(dump).blocks
    named = again.filter(again["address"].is_in(picks["address"].implode()))
    assert set(named["family"].to_list()) == {"parameters"}
    assert set(named["evidence"].to_list()) == {"inventory"}
    assert "model.layers.0.mlp.weight" in " ".join(named["label"].to_list())
    run = invoke("explain", str(dump), "--block", hex(int(picks["address"][0])))
    assert run.returncode == 0, run.stderr
    assert "model.layers.0.mlp.weight" in run.stdout


def test_a_broken_sidecar_is_one_line(tmp_path: Path, monkeypatch) -> None:
    from .conftest import invoke

    dump = _oom_dump(tmp_path, monkeypatch)
    dump.with_name("train-rank0-oom.meta.json").write_text('{"format": "snapana.record.sidecar"'
                                                           ', "version": 99}')
    run = invoke("summary", str(dump))
    assert run.returncode == 2 and "newer than this snapana reads" in run.stderr


def test_report_of_a_recording_folder_uses_every_sidecar(tmp_path: Path, monkeypatch) -> None:
    """Two ranks dumped into one folder: the folder report measures memory outside PyTorch
    without --capacity, for the failing rank shown in full."""
    from .conftest import invoke

    monkeypatch.setattr(recorder_module.atexit, "register", lambda fn: None)

    class OomCuda(FakeCuda):
        def snapshot(self) -> dict[str, Any]:
            return dict(run_scenario("slime-tp2-chunked-logprob-oom")[0])

    for rank in ("0", "1"):
        monkeypatch.setenv("RANK", rank)
        rec = _recorder(tmp_path, OomCuda(), inventory=False)
        assert rec.start()
        rec.on_oom(0, 1, 1, 1)
        rec.close()
    out = tmp_path / "out"
    assert sorted(p.name for p in out.glob("*.pickle")) == ["train-rank0-oom.pickle",
                                                             "train-rank1-oom.pickle"]
    run = invoke("report", str(out), "-o", str(tmp_path / "r.html"))
    assert run.returncode == 0, run.stderr
    html = (tmp_path / "r.html").read_text()
    assert "outside PyTorch" in html and "pass --capacity" not in html
