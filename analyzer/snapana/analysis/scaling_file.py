"""The schema of `scaling.toml` (issue 68), apart from the scaling itself (issue 70): the knob
list reads its `[[same_step]]` links (a framework's own knob for a mechanism a generic knob
names) without importing the replay that grows blocks."""

from __future__ import annotations

from functools import lru_cache
from typing import Annotated

import msgspec

from snapana import data_file


class _FamilyScale(data_file.Table, frozen=True, kw_only=True):
    batch: int
    seq: int
    why: str = ""
    mirror: list[str] | None = None
    unmatched: str | None = None
    read_by: list[str] | None = None


class _Score(data_file.Table, frozen=True, kw_only=True):
    id: str
    function: str
    batch: int
    seq: int
    assumption: str
    dtype_ratios: list[float] = []
    output_bytes: list[int] = []
    native: bool = False
    maker: str = "an unfused attention"
    shaped: str = ""
    output_after_softmax: bool = False
    softmax_repeats: list[float] = []


class _NextStep(data_file.Table, frozen=True, kw_only=True):
    id: str
    text: str = ""
    drop_scores: bool = False
    drop_families: list[str] = []
    hold_families: list[str] = []
    setting: str = ""
    caveat: str = ""
    checkpoint: bool = False


class _Checkpointing(data_file.Table, frozen=True, kw_only=True):
    saved: list[str] = []
    backward: list[str] = []
    without_layers: list[str] = []
    cached: list[str] = []


class _LossChunks(data_file.Table, frozen=True, kw_only=True):
    families: list[str] = []
    why: str = ""


class _SeqEvidence(data_file.Table, frozen=True, kw_only=True):
    window: float = 0.05
    chance: float = 0.25
    least: float = 0.10
    pad_multiple: int = 64
    pad_most: float = 0.5
    padded: str = ""
    padded_block: str = ""
    padded_share: str = ""


class _Confidence(data_file.Table, frozen=True, kw_only=True):
    max_held_error: float = 0.10
    band: Annotated[tuple[float, ...], msgspec.Meta(min_length=2, max_length=2)] = (0.0, 0.0)
    band_source: str = ""


class _SameStep(data_file.Table, frozen=True, kw_only=True):
    id: str
    knobs: list[str]


class _WhatifFlag(data_file.Table, frozen=True, kw_only=True):
    id: str
    flag: str


@data_file.schema("analysis/scaling.toml")
class ScalingFile(data_file.Table, frozen=True, kw_only=True):
    """The schema `scaling.toml` is checked against (`load_rules` reads what it checked)."""

    family: dict[str, _FamilyScale] = {}
    scores: list[_Score] = []
    next_step: list[_NextStep] = []
    seq_evidence: _SeqEvidence = _SeqEvidence()
    confidence: _Confidence = _Confidence()
    same_step: list[_SameStep] = []
    same_setting: list[_SameStep] = []
    fit_size: dict[str, list[str]] = {}
    whatif_flag: list[_WhatifFlag] = []
    checkpointing: _Checkpointing = _Checkpointing()
    loss_chunks: _LossChunks = _LossChunks()


@lru_cache(maxsize=1)
def same_step() -> dict[str, str]:
    """`[[same_step]]`: a framework's knob id -> the generic knob id (a next step's) whose
    mechanism it switches on (Megatron's --recompute-granularity -> activation
    checkpointing)."""
    data = data_file.packaged("analysis/scaling.toml", ScalingFile)
    return {k: t.id for t in data.same_step for k in t.knobs}


@lru_cache(maxsize=1)
def same_setting() -> dict[str, str]:
    """`[[same_setting]]`: a wrapper's knob id -> the knob id of the engine setting it passes
    on unchanged (ms-swift's --vllm_gpu_memory_utilization is vLLM's
    gpu_memory_utilization): one setting, listed once, by the wrapper's name. Unlike
    `[[same_step]]`, no whatif step replays it."""
    data = data_file.packaged("analysis/scaling.toml", ScalingFile)
    return {k: t.id for t in data.same_setting for k in t.knobs}
