"""The schema of ``inference.toml``: its methods, limits and words, and the signatures the
size and lifetime matchers (`hand_state`, `kv_pairs`, `kept_outputs`,
`weight_copies`) read. One TOML-spec reader for all of them (:func:`inference_file`), so a
key misspelt in any table is refused with its line, not read as a default (issue 68)."""

from __future__ import annotations

from functools import lru_cache

from snapana import data_file

INFERENCE_FILE = "analysis/attribution/inference.toml"


class MethodEntry(data_file.Table, frozen=True, kw_only=True):
    """``[[method]]``: an inference method, the family it gives and its strength."""

    id: str
    family: str
    strength: int
    why: str
    freed_in_phase: str | None = None
    if_function: tuple[str, ...] = ()
    unless_function: tuple[str, ...] = ()
    in_window: bool = False


class Limits(data_file.Table, frozen=True, kw_only=True):
    """``[limits]``: the thresholds of the size and lifetime methods (comments in the
    file)."""

    min_mirror_share: float
    min_distinct_sizes: int
    min_recorded_allocs: int
    min_freed_share: float
    min_layer_repeats: int
    min_layer_sizes: int
    min_layer_share: float
    min_layer_byte_share: float
    max_layer_weight: int
    master_copy_ratio: int
    min_forward_allocs: int


class NoGradMarker(data_file.Table, frozen=True, kw_only=True):
    """``[[no_grad]]``: a frame that shows a stack runs without autograd."""

    file: str
    function: str


class TransientEntry(data_file.Table, frozen=True, kw_only=True):
    """``[[transient]]``: a family freed in the phase that made it becomes that phase's
    working set."""

    family: str
    phase: str
    becomes: str
    label: str
    why: str


class HandStateSpec(data_file.Table, frozen=True, kw_only=True):
    """``[hand_state]``: the signature of a hand-written optimizer's parameters and state."""

    from_families: frozenset[str]
    min_share: float
    min_sizes: int
    param_method: str
    param_why: str
    state_method: str
    state_why: str
    #: tensors per parameter ("1", "2": TOML keys are strings) -> what that state is
    per_parameter: dict[str, str]
    rebound_method: str
    rebound_why: str
    rebound_rules: frozenset[str]
    update_method: str
    update_family: str
    update_phase: str
    update_new_why: str
    update_temp_why: str


class FusedSpec(data_file.Table, frozen=True, kw_only=True):
    """``[kv_pairs.fused]``: the signature of a fused query/key/value projection's output a
    forward returns through its key and value views (one block per layer)."""

    method: str
    label: str
    #: the equal parts of the block (query, key, value), one of them the hidden state's size
    parts: int
    why: str
    fact: str


class PairSpec(data_file.Table, frozen=True, kw_only=True):
    """``[kv_pairs]``: the signature of the key / value pairs a forward returns."""

    family: str
    method: str
    label: str
    from_families: frozenset[str]
    phases: frozenset[str]
    min_layers: int
    max_kept_sites: int
    why: str
    freed_words: str
    decoding_facts: frozenset[str]
    #: where a cache class makes the pairs itself (transformers >= 4.56): the file and
    #: functions of the innermost Python frame of a returned cache's blocks
    update_file: str
    update_functions: frozenset[str]
    #: the `returned_kv_cache` fact's words ({blocks}, {bytes})
    fact: str
    fused: FusedSpec


class KeptSpec(data_file.Table, frozen=True, kw_only=True):
    """``[kept_outputs]``: the signature of a forward's outputs the program keeps with no
    graph."""

    family: str
    method: str
    label: str
    from_families: frozenset[str]
    phases: frozenset[str]
    module_file: str
    module_calls: tuple[str, ...]
    min_blocks: int
    max_kept_sites: int
    min_depth: int
    why: str


class CopySpec(data_file.Table, frozen=True, kw_only=True):
    """``[weight_copies]``: the signature of autocast's cached weight copies."""

    family: str
    method: str
    ratios: tuple[int, ...]
    from_families: frozenset[str]
    phases: frozenset[str]
    cast_symbol: str
    op_follows: bool
    min_param_share: float
    min_copies: int
    why: str
    cast_words: str
    follows_words: str
    weight_families: frozenset[str]
    held_unknown: bool
    #: op -> the argument positions of its weight (a trace's recorded casts, op_casts.toml)
    op_weights: dict[str, tuple[int, ...]]
    op_why: str


class StateCopiesSpec(data_file.Table, frozen=True, kw_only=True):
    """``[state_copies]``: the signature of model state held k times over per weight size."""

    min_bytes: int
    min_sizes: int
    min_share: float
    workspace_sizes: frozenset[int]
    min_workspaces: int
    max_workspaces: int
    why: str
    #: copies per weight ("3", "4": TOML keys are strings) -> what they are
    per_weight: dict[str, str]


@data_file.schema(INFERENCE_FILE)
class InferenceFile(data_file.Table, frozen=True, kw_only=True):
    method: tuple[MethodEntry, ...]
    limits: Limits
    label: dict[str, str]
    engines: dict[str, str] = {}
    no_grad: tuple[NoGradMarker, ...] = ()
    transient: tuple[TransientEntry, ...] = ()
    hand_state: HandStateSpec
    kv_pairs: PairSpec
    kept_outputs: KeptSpec
    weight_copies: CopySpec
    state_copies: StateCopiesSpec


@lru_cache(maxsize=1)
def inference_file() -> InferenceFile:
    """``inference.toml``, read once."""
    return data_file.packaged(INFERENCE_FILE, InferenceFile)
