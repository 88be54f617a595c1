"""A chunk loop grows by more chunks (issue 70): the slime / Megatron step's chunked
log-prob (synth/scenarios/parallel.py `megatron_step_job`, chunks of 1,024 tokens) captured
at 4,100 tokens and replayed at more: each chunk keeps its size, the loop makes
ceil(seq / 1,024) of them, and the peak is the simulator's own at that many tokens."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from snapana.analysis.scaling import CHUNKS, parse_sizes
from snapana.session import Session
from snapana.synth.scenarios import write_snapshot
from snapana.synth.scenarios.parallel import megatron_step_job

from .conftest import ROOT

CHUNK = 1024


def _job(tmp: Path, tokens: int, tag: str) -> tuple[Path, int]:
    path, truth = write_snapshot(*megatron_step_job(2, tokens=tokens, chunk=CHUNK),
                                 tmp / f"{tag}-{tokens}.pickle")
    return path, json.loads(truth.read_text())["peak_allocated_bytes"]


@pytest.mark.parametrize("tokens", [8148, 16384])
def test_more_chunks_at_a_larger_seq(tmp_path, tokens):
    path, _ = _job(tmp_path, 4100, "recorded")
    _, truth = _job(tmp_path, tokens, "larger")
    session = Session.open(path)
    window = session.scaling(parse_sizes(["seq=4100"]))
    assert [(loop.chunk, len(loop.rows)) for loop in window.loops] == [(CHUNK, -(-4100 // CHUNK))]
    p = session.resize(parse_sizes([f"seq=4100:{tokens}"]))
    assert abs(p.target.replay.peak_allocated / truth - 1) <= 0.005
    assert p.growth.blocks.filter(p.growth.blocks["how"] == CHUNKS).height


def test_the_sample_fails_on_a_chunk_of_the_smaller_size():
    """Past the largest seq that fits, the slime sample runs out on its last chunk, of the
    tokens left over: (seq − 7 × 1,024) × the vocabulary per rank × 4 bytes (fp32)."""
    session = Session.open(ROOT / "sample_snapshots" / "slime-tp2-chunked-logprob-oom.pickle")
    p = session.resize(parse_sizes(["seq=8148"]), fit="seq")
    past = p.fit.largest + 1
    vocab_per_rank = 248320 // 2
    _, requested = p.fit.past.replay.simulated_ooms[0]
    assert requested == (past - 7 * CHUNK) * vocab_per_rank * 4


def test_a_layer_loop_is_not_a_chunk_loop():
    """A forward's L layers make L equal blocks at one site ([batch, seq, hidden] each, the
    same module code every layer), and their sum is seq × (L × the bytes per token): that
    fits a chunk loop of seq / L tokens, but it is a layer loop whose blocks grow with seq
    (the corpus's 128 → 256 forwards were over-predicted by 19% to 399% when it was taken
    for one). Only a smaller last block (the rest of the tokens) tells a chunk loop."""
    import polars as pl
    from snapana.analysis.trace_edits import chunk_loops

    seq, layers, per_token = 128, 16, 2 * 768 * 4  # batch 2, hidden 768, fp32
    layer_loop = pl.DataFrame({"site": [7] * layers, "alloc_idx": list(range(layers)),
                               "requested": [seq * per_token] * layers})
    assert chunk_loops(layer_loop, seq) == []
    chunk, k = 48, -(-seq // 48)  # 48 + 48 + 32 tokens
    sizes = [chunk * per_token] * (k - 1) + [(seq - (k - 1) * chunk) * per_token]
    loop = pl.DataFrame({"site": [7] * k, "alloc_idx": list(range(k)), "requested": sizes})
    (found,) = chunk_loops(loop, seq)
    assert (found.chunk, len(found.rows)) == (chunk, k)
