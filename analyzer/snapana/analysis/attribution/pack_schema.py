"""The rule pack schema: what a pack file may say, as typed structs a schema library checks.

These structs are the one statement of the schema: :mod:`.pack_parser` decodes a pack's TOML
into them (types, required fields, fixed choices, unknown fields refused, every error naming
its path in the file) and then checks what needs the vocabulary (families, phases, causes,
facts) and compiles; ``packs/README.md`` is generated from them (:mod:`.pack_doc`). A new key
is one field here, with its description.
"""

from typing import Annotated, Any, Literal, get_args

import msgspec
from msgspec import Meta

from snapana import data_file
from snapana.caching_allocator import BLOCK_STATES

PoolKind = Literal["default", "mempool", "graph", "private"]
StreamKind = Literal["default", "nondefault"]
MemoryKind = Literal["device", "host", "any"]
KnobDirection = Literal["lowers", "raises", "bounds", "releases"]
KnobCost = Literal["free", "compute", "communication", "quality"]
ExamplePool = Literal["default", "mempool", "graph"]

POOL_KINDS: tuple[str, ...] = get_args(PoolKind)
"""``private`` means any non-default pool (``mempool`` or ``graph``)."""
STREAM_KINDS: tuple[str, ...] = get_args(StreamKind)
MEMORY_KINDS: tuple[str, ...] = get_args(MemoryKind)
"""What memory a pack's family rules describe: a GPU caching allocator's blocks ("device",
the default), a process's heap as memray records it ("host"), or both ("any")."""
KNOB_DIRECTIONS: tuple[str, ...] = get_args(KnobDirection)
"""What a knob does to the families / causes it names: ``releases`` moves model state off
the GPU (offload), ``bounds`` caps a size without lowering the typical case."""
KNOB_COSTS: tuple[str, ...] = get_args(KnobCost)
"""What turning a knob costs: nothing that matters, extra compute (recompute, more or smaller
micro-batches, slower kernels or engines), extra communication (collectives, host <-> device
transfers), or it may change training quality / results (truncation, lower precision)."""

ID_PATTERN = r"^[A-Za-z0-9_][A-Za-z0-9_.\-]*\Z"
NAME_PATTERN = r"^[A-Za-z0-9_\-]+\Z"
#: The patterns in words, for the documentation and the errors.
PATTERN_WORDS = {
    ID_PATTERN: 'dotted name (letters, digits, `_`, `.`, `-`: "pack.my_rule")',
    NAME_PATTERN: "simple name (letters, digits, `_`, `-`)",
}

Id = Annotated[str, Meta(pattern=ID_PATTERN)]
Name = Annotated[str, Meta(pattern=NAME_PATTERN)]
Size = int | str
"""A byte count or a size string with a unit (``"512MiB"``, ``"1.5 GiB"``, ``"80GB"``)."""
Names = str | Annotated[list[str], Meta(min_length=1)]
"""One name or a non-empty list of them."""


def _doc(text: str) -> Meta:
    return Meta(description=" ".join(text.split()))


_Table = data_file.Table


class PackHeader(_Table, frozen=True, kw_only=True):
    """``[pack]``: the pack's name, how to detect its framework, its defaults (optional)."""

    name: Annotated[Name | None, _doc(
        "default: the file's stem; rule ids are prefixed with it")] = None
    description: Annotated[str, _doc("for people")] = ""
    default_priority: Annotated[int | None, _doc(
        "priority of the pack's rules that set none: built-in framework packs 100, the generic "
        "pytorch pack 50, user files 150 (a user rule wins over a built-in one)")] = None
    markers: Annotated[Names | None, _doc(
        "detection: a capture uses the framework when a frame's path contains one of these "
        "fragments (`\"slime/\"`); its knobs are then suggested")] = None
    memory: Annotated[MemoryKind, _doc(
        "the memory the pack's family rules describe: a GPU caching allocator's blocks, a "
        "process's heap as memray records it, or both; a host pack's rules never decide a GPU "
        "block, nor a GPU pack's a heap allocation")] = "device"
    versions: Annotated[Any, _doc("free-form, for people (not read)")] = None
    notes: Annotated[Any, _doc("free-form, for people (not read)")] = None


class FrameEntry(_Table, frozen=True, kw_only=True):
    """One frame a rule looks for (an entry of ``frames``, ``not_frames``, ``only_frames``)."""

    file: Annotated[Annotated[str, Meta(min_length=1)] | None, _doc(
        "path suffix on whole components, on a path normalised to `/` with `..` resolved "
        "(`torch/optim/optimizer.py` matches `.../site-packages/torch/optim/optimizer.py`)")
    ] = None
    file_re: Annotated[str | None, _doc(
        "regex searched in the normalised path (anchor it: `'(^|/)vllm/v1/worker/'`)")] = None
    function: Annotated[Names | None, _doc(
        "exact function name(s); never a substring match, so a driver named "
        "`run_forward_backward_step` is not a `forward` frame (a glob is refused: use "
        "`function_re`)")] = None
    function_re: Annotated[str | None, _doc(
        "regex that must match the *whole* function name")] = None
    symbol_re: Annotated[str | None, _doc(
        "regex searched in a C++ frame's symbol (`torch::autograd::Engine::thread_main`); "
        "C++ only, cannot be combined with file / file_re / function / function_re")] = None
    where: Annotated[Literal["anywhere", "innermost"], _doc(
        "`innermost`: the frame must be the first Python frame (`within = 1`); C++ frames "
        "are not counted, so interleaved C++ frames do not break innermost matching")
    ] = "anywhere"
    within: Annotated[Annotated[int, Meta(ge=1)] | None, _doc(
        "the frame must be among the first N Python frames")] = None
    max_gap: Annotated[Annotated[int, Meta(ge=0)] | None, _doc(
        "at most N Python frames between this frame and the previous (caller) pattern's frame "
        "(`forward` directly under `_call_impl`, allowing hook wrappers)")] = None
    line_lt: Annotated[int | None, _doc("line bound (line < N), for one known version")] = None
    line_ge: Annotated[int | None, _doc("line bound (line >= N), for one known version")] = None
    line_rank: Annotated[int | Annotated[list[int], Meta(min_length=2, max_length=2)] | None,
                         _doc(
        "the frame's line is the k-th (0-based; negative counts from the end) of the distinct "
        "lines seen for that (file, function) across the snapshot, or within the inclusive "
        "range `[i, j]` of ranks (`[0, -2]`: every allocating line but the last); needs "
        "`where = \"innermost\"` (only allocating lines are ranked). Survives version changes "
        "that move lines but keep the order of allocations")] = None
    min_sites: Annotated[Annotated[int, Meta(ge=1)] | None, _doc(
        "with `line_rank`: at least this many distinct lines seen (default 1)")] = None
    outermost: Annotated[bool, _doc(
        "only the outermost frame of the stack that matches the file / function (or symbol) "
        "fields is a candidate: the `forward` of the top-level model, not of a layer inside "
        "it; `within` and the line bounds then test that frame")] = False


class _Conditions(_Table, frozen=True, kw_only=True):
    """What a rule tests (all optional, all must hold)."""

    frames: Annotated[list[FrameEntry], _doc(
        "frames that must all be on the stack, caller -> callee order (outermost first)")] = []
    not_frames: Annotated[list[FrameEntry], _doc(
        "none of these frames may be on the stack")] = []
    only_frames: Annotated[list[FrameEntry], _doc(
        "every Python frame matches one of these (file / function fields only), and there is "
        "at least one: nothing else ran it")] = []
    pool: Annotated[PoolKind | Annotated[list[PoolKind], Meta(min_length=1)] | None, _doc(
        "the block's pool kind(s); `private` is any non-default pool")] = None
    stream: Annotated[StreamKind | None, _doc("the block's stream")] = None
    state: Annotated[Names | None, _doc(
        "block state(s): `active_allocated`, `active_pending_free` (or "
        "`active_awaiting_free`), `inactive`")] = None
    annotation: Annotated[str | None, _doc(
        "regex searched in each open annotation name (`'^Optimizer\\\\.step#'`)")] = None
    min_size: Annotated[Size | None, _doc(
        "bytes or a size string (`\"512MiB\"`); inclusive")] = None
    max_size: Annotated[Size | None, _doc("bytes or a size string; inclusive")] = None
    no_python_frames: Annotated[bool | None, _doc(
        "true: only C++ frames (or none); false: some Python")] = None
    no_frames: Annotated[bool | None, _doc("true: empty stack; false: non-empty")] = None
    has_alloc_event: Annotated[bool | None, _doc(
        "false: the block predates recording; true: an alloc event exists")] = None


class RuleEntry(_Conditions, frozen=True, kw_only=True):
    """``[[rule]]``: a family rule; at least one condition is required."""

    id: Annotated[Id, _doc(
        "`\"<pack>.\"` is added when missing; unique across packs")]
    family: Annotated[str, _doc("the family it gives: one of the vocabulary's [[family]] ids")]
    label: Annotated[str, _doc("what the block is, in a report")]
    priority: Annotated[int | None, _doc(
        "higher wins; equal-priority matches are reported as ties (default: the pack's "
        "`default_priority`)")] = None
    description: Annotated[str, _doc("for people")] = ""
    reason: Annotated[str | None, _doc("replaces the generated reason text")] = None
    phase: Annotated[Names | None, _doc(
        "condition: the phase(s) inferred from the stack (vocabulary [[phase]] ids)")] = None
    phase_hint: Annotated[Names | None, _doc(
        "condition: the phase(s) the *caller* established from the timeline, not one inferred "
        "from the stack")] = None


class PhaseRuleEntry(_Conditions, frozen=True, kw_only=True):
    """``[[phase_rule]]``: decides the phase; the same conditions as a rule but ``phase`` and
    ``phase_hint`` (a phase rule cannot test what it decides)."""

    id: Annotated[Id, _doc("as a rule's")]
    phase: Annotated[str, _doc("the phase it decides: one of the vocabulary's [[phase]] ids")]
    label: Annotated[str | None, _doc("default: the phase")] = None
    priority: Annotated[int | None, _doc("as a rule's")] = None
    description: Annotated[str, _doc("for people")] = ""
    reason: Annotated[str | None, _doc("replaces the generated reason text")] = None


class KnobEntry(_Table, frozen=True, kw_only=True):
    """``[[knob]]``: a setting that changes a family or an OOM cause."""

    id: Annotated[Id, _doc("unique across packs; used as given")]
    knob: Annotated[str, _doc("the flag / setting as written in the framework")]
    direction: Annotated[KnobDirection, _doc(
        "what it does to the families / causes: `releases` moves model state off the GPU "
        "(offload), `bounds` caps a size without lowering the typical case")]
    cost: Annotated[KnobCost, _doc(
        "nothing that matters, extra compute, extra communication (host transfers included), "
        "or it may change training quality / results")]
    effect: Annotated[str, _doc("one sentence: what it changes")]
    families: Annotated[Names | None, _doc(
        "family ids it acts on (this and / or `causes` is required)")] = None
    causes: Annotated[Names | None, _doc("cause ids (vocabulary [[cause]]) it acts on")] = None
    caveat: Annotated[str, _doc("when it does NOT help, what it costs")] = ""
    phases: Annotated[Names | None, _doc(
        "only suggested for an OOM in one of these phases")] = None
    framework: Annotated[Name | None, _doc(
        "default: the pack's name; the knob applies when its framework is detected; "
        "`pytorch` and `any` always apply")] = None
    workload: Annotated[str, _doc(
        "`training`: only for a capture that trains (a step: a family / phase the vocabulary "
        "marks `training`, or a fact that says so; a backward alone is autograd's); "
        "`inference`: only for one that does not; empty: either")] = ""
    requires: Annotated[Names | None, _doc(
        "facts (listed below) that must all hold in the capture for the knob to be offered")
    ] = None
    unless: Annotated[Names | None, _doc(
        "facts any of which means the knob would not act or would break the job")] = None
    unless_set: Annotated[Names | None, _doc(
        "allocator settings (`PYTORCH_CUDA_ALLOC_CONF` keys) the knob turns on: not offered "
        "where the capture records them already on")] = None
    simulate: Annotated[Names | None, _doc(
        "`PYTORCH_CUDA_ALLOC_CONF` items (`\"expandable_segments:True\"`) that are this knob, "
        "for the allocator model to replay the recorded window under: a knob with them is "
        "predicted, not only argued")] = None
    replay_decides: Annotated[Names | None, _doc(
        "facts of `requires` that only argue what replaying `simulate` shows: where the "
        "recorded window is replayed to an OOM, the replay decides in their place (offered "
        "where the OOM goes away, never where it stays)")] = None


class ExampleFrame(_Table, frozen=True, kw_only=True):
    """One frame of an example's ``stack``: a Python ``file`` + ``function``, or a C++
    ``symbol``."""

    file: Annotated[str | None, _doc("a Python file (`*.py` or `<...>`)")] = None
    function: Annotated[str | None, _doc("the Python function")] = None
    symbol: Annotated[str | None, _doc("a C++ frame's symbol, instead of file + function")
                      ] = None
    line: Annotated[Annotated[int, Meta(ge=0)], _doc("line number")] = 0


class ExampleEntry(_Table, frozen=True, kw_only=True):
    """``[[example]]``: a stack and the family the rules must give it (the test suite runs
    every built-in one; ``RuleSet.check_examples()`` a user pack's)."""

    family: Annotated[str, _doc("the family the rules must give it")]
    description: Annotated[str, _doc("for people")] = ""
    rule: Annotated[Id | None, _doc(
        "the rule that must decide (`\"<pack>.\"` added when there is no dot)")] = None
    phase: Annotated[str | None, _doc("the phase that must be inferred")] = None
    stack: Annotated[list[ExampleFrame], _doc(
        "innermost first, as a snapshot stores it")] = []
    pool: Annotated[ExamplePool, _doc("the block's pool")] = "default"
    stream: Annotated[Annotated[int, Meta(ge=0)], _doc("the block's stream")] = 0
    state: Annotated[str, _doc("the block's state")] = BLOCK_STATES[0]
    size: Annotated[Size, _doc("the block's size")] = "64MiB"
    has_alloc_event: Annotated[bool, _doc("whether an alloc event exists")] = True
    annotations: Annotated[Names | None, _doc("the annotations open at the allocation")] = None
    phase_hint: Annotated[str | None, _doc("the phase the caller established")] = None


@data_file.schema("analysis/attribution/packs/*.toml")
class PackFile(_Table, frozen=True, kw_only=True):
    """A pack file. A framework's pack (``packs/<framework>.toml``) holds everything about
    that framework: how to detect it, its rules and phase rules, its knobs and examples. A
    user file given with ``--rules`` has the same schema."""

    pack: Annotated[PackHeader, _doc("optional")] = PackHeader()
    rule: Annotated[list[RuleEntry], _doc("family rules")] = []
    phase_rule: Annotated[list[PhaseRuleEntry], _doc("phase rules")] = []
    knob: Annotated[list[KnobEntry], _doc("knobs")] = []
    example: Annotated[list[ExampleEntry], _doc("examples")] = []


# --------------------------------------------------------------------------------------
# a validation error in the schema's words


def explain(exc: msgspec.ValidationError) -> tuple[str, str]:
    """(path in the file, problem) of msgspec's message (``Expected `str`, got `int` - at
    `$.rule[3].label```), in the file's terms: tables, lists, the allowed fields or values."""
    return data_file.explain(exc, PackFile, PATTERN_WORDS)
