"""`snapana batch --engine ray` on a real local Ray instance: the same dataset as --engine local.

Ray is in the dev extra; the module is marked with the `ray` judge (skipped, naming it, where
absent; a failure where .ci/run demands it).
"""

from __future__ import annotations

import json
import logging
import shutil
import sys

import polars as pl
import pytest
from polars.testing import assert_frame_equal
from snapana.session import summarize_many

from .conftest import SAMPLES, invoke, require

pytestmark = pytest.mark.ray

#: Bundled samples as the ranks of one incident: two OOMs and a clean step, plus a broken file,
#: so that the error path also crosses the Ray boundary.
RANK_FILES = {
    0: "expandable-segments-oom.pickle",
    1: "fsdp-train-step.pickle",
    2: "swift-vllm-colocate-oom.pickle",
}
BROKEN_RANK = 3


def _ray():
    return require("ray")


@pytest.fixture(scope="module")
def incident(tmp_path_factory):
    folder = tmp_path_factory.mktemp("ray_incident")
    for rank, name in RANK_FILES.items():
        shutil.copyfile(SAMPLES / name, folder / f"snapshot_oom_rank-{rank}.pickle")
    (folder / f"snapshot_oom_rank-{BROKEN_RANK}.pickle").write_bytes(b"\x80\x04not a pickle")
    return folder


@pytest.fixture(scope="module")
def ray_local():
    """One small local Ray instance for the module: 2 CPUs, no dashboard, localhost only
    (address="local" ignores any RAY_ADDRESS), worker output not echoed."""
    ray = _ray()
    assert not ray.is_initialized(), "a Ray instance is already running in this process"
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
             logging_level=logging.WARNING)
    yield ray
    ray.shutdown()


def _dataset(folder) -> dict[str, pl.DataFrame]:
    return {table: pl.read_parquet(folder / table, hive_partitioning=True)
            .sort("rank", "file", *(["family"] if table == "families" else []))
            for table in ("ranks", "families")}


# First in the module, before ray_local starts an instance that _map_ray would then reuse.
def test_a_ray_instance_snapana_starts_is_stopped(incident, monkeypatch):
    ray = _ray()
    monkeypatch.delenv("RAY_ADDRESS", raising=False)  # start locally, join nothing
    assert not ray.is_initialized(), "run before the ray_local fixture"
    (summary,) = summarize_many([incident / "snapshot_oom_rank-0.pickle"], engine="ray")
    assert summary.error is None and summary.oom is not None
    assert not ray.is_initialized()


def test_ray_engine_writes_the_same_dataset_as_local(ray_local, incident, tmp_path):
    out = {}
    for engine in ("ray", "local"):
        out[engine] = tmp_path / engine
        result = invoke("batch", str(incident), "-o", str(out[engine]), "--engine", engine,
                        "--job", "incident7")
        assert result.returncode == 0, result.stderr
    assert ray_local.is_initialized()  # the caller's instance is left running

    ray_ds, local_ds = _dataset(out["ray"]), _dataset(out["local"])
    ranks = local_ds["ranks"]
    assert ranks["rank"].to_list() == [*RANK_FILES, BROKEN_RANK]
    assert ranks.filter(pl.col("error").is_not_null())["rank"].to_list() == [BROKEN_RANK]
    assert ranks["oom"].to_list() == [True, False, True, False]
    assert ranks["first_oom"].sum() == 1
    assert set(local_ds["families"]["rank"].to_list()) == set(RANK_FILES)
    # Every column compared, none left out: `file` is the same path in both runs (the same
    # input folder), and nothing in a summary depends on the engine, the worker or timing.
    for table in ("ranks", "families"):
        assert ray_ds[table].columns == local_ds[table].columns
        assert_frame_equal(ray_ds[table], local_ds[table])
    marker = "snapana-dataset.json"
    assert (json.loads((out["ray"] / marker).read_text())
            == json.loads((out["local"] / marker).read_text()))


def test_without_ray_the_engine_is_a_one_line_error(incident, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` now raises ImportError
    result = invoke("batch", str(incident), "-o", str(tmp_path / "ds"), "--engine", "ray")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "snapana: error: --engine ray needs ray: pip install 'snapana[ray]'"]
    assert not (tmp_path / "ds").exists()
