"""Registry of synthetic incidents and the writer of ``sample_snapshots/NAME.pickle`` +
``NAME.truth.json``.

Each scenario replays an incident from SCENARIOS.md on the allocator simulator and returns
the snapshot PyTorch would have dumped plus the ground truth the analyzer is checked against.
"""

from __future__ import annotations

import json
import os
import pickle
from collections.abc import Callable
from pathlib import Path

from snapana.io.output import write_atomic

from .common import Outcome, truth
from .dataparallel import dataparallel_3gpu_oom
from .expandable import expandable_segments_oom
from .fsdp import fsdp_train_step
from .sized import sized_job
from .slime import (
    tp1_logits_fp32_oom,
    tp1_long_episode_softmax_oom,
    tp2_chunked_logprob_oom,
    tp2_recompute_loss_ok,
)
from .swift import vllm_colocate_oom

SCENARIOS: dict[str, Callable[[], Outcome]] = {
    "slime-tp1-logits-fp32-oom": tp1_logits_fp32_oom,
    "slime-tp1-long-episode-softmax-oom": tp1_long_episode_softmax_oom,
    "slime-tp2-chunked-logprob-oom": tp2_chunked_logprob_oom,
    "slime-tp2-recompute-loss-ok": tp2_recompute_loss_ok,
    "swift-vllm-colocate-oom": vllm_colocate_oom,
    "fsdp-train-step": fsdp_train_step,
    "expandable-segments-oom": expandable_segments_oom,
}

#: Multi-device captures, combined from one simulator run per device: (snapshot, truth).
#: Not bundled as samples; tests and `python -m snapana.synth.scenarios NAME -o FILE` build
#: them. Their truth lists the devices (`devices`, `failed_devices`).
MULTI_DEVICE: dict[str, Callable[[], tuple[dict[str, object], dict[str, object]]]] = {
    "dataparallel-3gpu-expandable-oom": dataparallel_3gpu_oom,
}


#: Jobs written at any batch and sequence length (`snapana synth NAME --batch B --seq S`),
#: each size with its own ground truth: (batch, seq) -> (snapshot, truth).
SIZED: dict[str, Callable[[int, int], tuple[dict[str, object], dict[str, object]]]] = {
    "gpt-train-sized": sized_job,
}


def run_scenario(name: str) -> tuple[dict[str, object], dict[str, object]]:
    """(snapshot dict in PyTorch's layout, ground-truth dict) for one scenario."""
    if name in MULTI_DEVICE:
        return MULTI_DEVICE[name]()
    try:
        build = SCENARIOS[name]
    except KeyError:
        known = ", ".join([*SCENARIOS, *MULTI_DEVICE])
        raise KeyError(f"unknown scenario {name!r}; known: {known}") from None
    out = build()
    return out.sim.snapshot(), truth(name, out)


def truth_path(pickle_path: str | os.PathLike[str]) -> Path:
    """``x/NAME.pickle`` -> ``x/NAME.truth.json``."""
    p = Path(pickle_path)
    stem = p.name[: -len(".pickle")] if p.name.endswith(".pickle") else p.stem
    return p.with_name(f"{stem}.truth.json")


def write_sample(name: str, out_pickle_path: str | os.PathLike[str]) -> tuple[Path, Path]:
    """Write the scenario's snapshot (pickle protocol 4, builtins only) and its truth JSON
    beside it, each atomically. Deterministic: the same bytes on every run."""
    return write_snapshot(*run_scenario(name), out_pickle_path)


def write_snapshot(snapshot: dict[str, object], gt: dict[str, object],
                   out_pickle_path: str | os.PathLike[str]) -> tuple[Path, Path]:
    """Write a snapshot and its truth JSON beside it, each atomically."""
    path = Path(out_pickle_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, pickle.dumps(snapshot, protocol=4))
    tpath = truth_path(path)
    write_atomic(tpath, (json.dumps(gt, indent=1, sort_keys=True) + "\n").encode())
    return path, tpath


def write_all(out_dir: str | os.PathLike[str]) -> list[Path]:
    """(Re)write every sample into ``out_dir``."""
    return [write_sample(n, Path(out_dir) / f"{n}.pickle")[0] for n in SCENARIOS]


__all__ = ["MULTI_DEVICE", "SCENARIOS", "SIZED", "run_scenario", "truth_path", "write_all",
           "write_sample", "write_snapshot"]
