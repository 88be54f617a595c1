"""Issue 68: the caching allocator's size rules are written once (`allocator_model.rules`), with
roundup_power2_divisions as PyTorch applies it, and the report's replay and the what-if model
use the same rule: a capture recorded with the setting gets one figure from `report`,
`summary` and `whatif`, the simulator's own."""

from __future__ import annotations

import json
import pickle
import random
from pathlib import Path

import numpy as np
import pytest
from snapana.allocator_model import config
from snapana.allocator_model.rules import round_size, round_sizes
from snapana.allocator_model.simulator import CachingAllocatorSim

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
STACK = (("/w/train.py", 10, "step"), ("/w/train.py", 1, "<module>"))


def torch_round_size(size: int, table: tuple[int, ...]) -> int:
    """PyTorch's round_size, transliterated from c10/cuda/CUDACachingAllocator.cpp and
    AllocatorConfig::roundup_power2_divisions (16 intervals from 1 MiB, index
    log2(size) - 20 clamped to [0, 15]); roundup_power2_next_division: a power of two stays,
    else the step is power2_floor >> log2(divisions), 0 meaning the next power of two."""
    if size < 512:
        return 512
    log_size = size.bit_length() - 1
    divisions = table[min(max(log_size - 20, 0), 15)] if table else 0
    if divisions > 1 and size > 512 * divisions:
        if size & (size - 1) == 0:
            return size
        power2_floor = 1 << log_size
        step = power2_floor >> (divisions.bit_length() - 1)
        if step == 0:
            return power2_floor << 1
        floor = size & ~(step - 1)
        return size if floor == size else floor + step
    return 512 * ((size + 511) // 512)


FOUR = (4,) * 16
#: [256:1,512:2,>:4]: the first entry fills the intervals below it (1 MiB .. 128 MiB: 1),
#: 256 MiB is interval 8, 512 MiB interval 9, '>' fills those after the last (1 GiB on: 4)
LISTED = (1,) * 9 + (2,) + (4,) * 6


@pytest.mark.parametrize(("size", "table", "rounded"), [
    # 1200 KiB lies in [1 MiB, 2 MiB): four 256 KiB steps, 1024, 1280, 1536, 1792 KiB
    (1200 * KiB, FOUR, 1280 * KiB),
    # below 1 MiB the first interval's divisions apply between its own powers of two:
    # [512 KiB, 1 MiB) in 128 KiB steps
    (600 * KiB, FOUR, 640 * KiB),
    (1100 * MiB, FOUR, 1280 * MiB),  # [1 GiB, 2 GiB) in 256 MiB steps
    (2049, FOUR, 2560),  # more than 512 x 4: [2048, 4096) in 512-byte steps
    (2000, FOUR, 2048),  # not more than 512 x 4: kMinBlockSize's rounding
    (5000, (2,) * 16, 6144),  # [4096, 8192) in two 2048-byte steps (512 rounding: 5120)
    (1280 * KiB, FOUR, 1280 * KiB),  # on a step: stays
    (64 * MiB, FOUR, 64 * MiB),  # a power of two stays
    (300 * MiB, LISTED, 300 * MiB),  # interval 8: 1 division, 512-byte rounding
    (600 * MiB, LISTED, 768 * MiB),  # interval 9: [512, 1024) MiB in 256 MiB steps
    (1100 * MiB, LISTED, 1280 * MiB),  # '>': 4
    (3 * MiB + 1, LISTED, 3 * MiB + 512),  # filled below the first entry with its 1
    (100 * GiB + 1, FOUR, 112 * GiB),  # past 64 GiB the last interval's divisions serve
])
def test_round_size_is_pytorchs(size: int, table: tuple[int, ...], rounded: int) -> None:
    assert torch_round_size(size, table) == rounded  # the hand-worked value, by the C++ rule
    assert round_size(size, table) == rounded
    assert int(round_sizes(np.array([size]), table)[0]) == rounded


def test_the_setting_parses_into_the_intervals_pytorch_fills() -> None:
    """Both spellings PYTORCH_CUDA_ALLOC_CONF takes, and the snapshot's record of them (keys
    1 .. 32768: the interval starts in MiB)."""
    four, _ = config.parse(["roundup_power2_divisions:4"])
    listed, _ = config.parse(["roundup_power2_divisions:[256:1,512:2,>:4]"])
    assert four.roundup_divisions == FOUR and listed.roundup_divisions == LISTED
    record = {"roundup_power2_divisions": {str(1 << i): d for i, d in enumerate(LISTED)}}
    assert config.recorded(record).roundup_divisions == LISTED


@pytest.mark.parametrize("table", [(), FOUR, LISTED, (2,) * 16, (16, 1, 8) + (32,) * 13])
def test_the_array_rounding_is_the_rule_row_for_row(table: tuple[int, ...]) -> None:
    """The replay rounds a million requests at once: the same numbers as the rule, on sizes
    across every interval and edge (powers of two, one below, one above)."""
    rng = random.Random(len(table) + sum(table))
    sizes = [rng.randrange(1, 1 << rng.randrange(1, 40)) for _ in range(3000)]
    sizes += [v + d for k in range(0, 40) for v in (1 << k,) for d in (-1, 0, 1) if v + d > 0]
    got = round_sizes(np.array(sizes, dtype=np.int64), table)
    assert got.tolist() == [torch_round_size(s, table) for s in sizes]


def _capture(path: Path, divisions: tuple[int, ...]) -> int:
    """A window recorded with roundup_power2_divisions by the allocator model: a 300 MiB block
    allocated and freed inside the window (its size is the trace's request, rounded by the
    setting: 320 MiB in [256, 512) MiB's 64 MiB steps with 4 divisions), and blocks still
    live at the end (sized by the segments). Returns the model's own peak allocated."""
    sim = CachingAllocatorSim(8 * GiB, roundup_divisions=divisions)
    sim.malloc(1100 * MiB, STACK)
    sim.malloc(3 * MiB + 1, STACK)
    sim.malloc(600 * KiB, STACK)
    sim.free(sim.malloc(300 * MiB, STACK))
    sim.malloc(12 * MiB + 7, STACK)
    with path.open("wb") as fh:
        pickle.dump(sim.snapshot(), fh)
    return sim.peak_allocated


@pytest.mark.parametrize("divisions", [FOUR, (1,) * 8 + (4,) * 8])
def test_report_summary_and_whatif_print_the_models_peak(tmp_path, divisions) -> None:
    """Before issue 68 the report's replay rounded the trace's requests to 512 bytes and gave
    the 300 MiB block 300 MiB, 20 MiB less than the allocator held, while `whatif`'s model
    rounded by the setting: the two commands printed two peaks of one capture."""
    from .conftest import invoke

    capture = tmp_path / "roundup.pickle"
    truth = _capture(capture, divisions)
    plain = truth - (torch_round_size(300 * MiB, divisions) - 300 * MiB)
    assert plain != truth  # the setting changes the peak: the test can tell the rules apart
    summary = json.loads(invoke("summary", str(capture), "-f", "json").stdout)
    (dev,) = summary["devices"]
    assert dev["peak_allocated_bytes"] == truth
    html = tmp_path / "r.html"
    assert invoke("report", str(capture), "-o", str(html)).returncode == 0
    text = html.read_text()
    assert str(truth) in text and str(plain) not in text
    out = json.loads(invoke("whatif", str(capture), "--capacity", "141GiB", "-f",
                            "json").stdout)
    (d,) = out["devices"]
    assert d["reproduced"]
    assert d["as_recorded"]["peak_allocated_bytes"] == truth
    assert d["changed"]["peak_allocated_bytes"] == truth
