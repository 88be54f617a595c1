"""Attribution: give every memory block exactly one tensor family, and say why.

The engine is pure Python over plain data. It is meant to run once per distinct
(stack, context) — decisions are memoised — not once per block; the caller (the model
wiring) maps the result back onto its block table.

Public API
----------
``Frame = tuple[str, str, int]``
    ``(filename, function name, line)``. A ``Stack`` is ``tuple[Frame, ...]``, innermost
    first, as the snapshot stores it. C++ frames (``??``, ``''``, ``RegisterCUDA_0.cpp``;
    names like ``at::native::...``) may be interleaved with Python frames (``*.py``).
``BlockContext`` (frozen dataclass)
    ``pool_id, stream, state, size, has_alloc_event, annotations, phase_hint``; see
    :class:`~snapana.analysis.attribution.stack.BlockContext`.
``load_rules(extra_files=()) -> RuleSet``
    All built-in packs (``packs/*.toml`` but ``packs/vocabulary.toml``) plus user rule files.
    Bad files raise :class:`RuleError` (a ``ValueError``) with one line:
    ``<file>: rule `<id>`: <problem>`` (``knob `<id>```, ``example `<pack>[<n>]``` for
    those entries).
``RuleSet.knobs / RuleSet.markers / RuleSet.examples``
    The loaded packs' ``[[knob]]`` entries (:class:`Knob`), detection markers
    (framework -> path fragments) and ``[[example]]`` entries (:class:`Example`), user packs
    included. ``RuleSet.run_example(example) -> Decision``; ``RuleSet.check_examples()``
    lists (one line each) the examples that do not get the family they declare.
``builtin_packs() -> tuple[Pack, ...]``
    The built-in packs, parsed once (``snapana.analysis.knobs`` reads knobs and markers from them).
``RuleSet.classify(stack, ctx) -> Decision``
    ``Decision(family, label, rule_id, matched_frames, reason, phase, ties, near_misses)``.
    Memoised by (stack, context key).
``RuleSet.explain(stack, ctx) -> Explanation``
    The decision plus every nearly-matching rule (some conditions held, some failed, and
    which), for family and phase rules.
``RuleSet.with_sites(stacks) -> RuleSet``
    A copy that knows which lines each function allocates from across the snapshot;
    needed by ``line_rank`` rules (Megatron param vs grad buffer).
``infer_phase(stack, ctx, rules=None) -> str``
    One of ``init, forward, backward, optimizer, rollout, logprobs, weight_update, unknown``.
``chunk_groups(blocks) -> list[ChunkGroup]``
    Groups ``(site_key, family, size, alloc_order)`` blocks of one site repeated in a loop:
    count, chunk size, total (the implied full tensor). Numbers only.
``families() / family_ids() / family_label(id) / families_with_lifetime(lifetime)``
    The stable family table; ``phases() / phase_ids() / phase_label(id)`` (:data:`PHASES`
    is ``phase_ids()``) and ``cause_ids()`` likewise. All three tables are the vocabulary
    file, ``packs/vocabulary.toml`` (``[[family]]`` id, label, description, optional
    ``lifetime = "transient" | "working_set"``; ``[[phase]]`` id, label, description;
    ``[[cause]]`` id, description): the only file in ``packs/`` that is not a pack.

Rule file schema
----------------
A file is a *pack*: ``[pack]``, ``[[rule]]``, ``[[phase_rule]]``, ``[[knob]]`` and
``[[example]]`` tables. The schema is the structs of :mod:`.pack_schema` (msgspec; unknown
fields refused, errors naming the path in the file); ``packs/README.md`` documents it, generated
from them and from the facts a knob may name (:mod:`.pack_doc`; a test keeps it up to date).

Precedence is by ``priority`` only (then load order: built-in packs sorted by file name,
then user files in the order given), never by which file a rule is in. A block that no rule
matches is ``unknown`` with the reason in its label ("no rule matched (innermost user frame:
file:line name)"); the built-in pytorch pack explains empty stacks ("no frames: allocated
before recording began", "... on the autograd thread during backward"). An empty stack with an
alloc event is placed in time by the Attributor (``assign.TracePhases``): when the
allocations around it show backward running it gets ``phase_hint = "backward"`` and the
pytorch pack calls it ``gradients``; otherwise it stays ``unknown``.
"""

from __future__ import annotations

from .chunks import AttributedBlock, ChunkGroup, chunk_groups
from .engine import (
    Decision,
    Explanation,
    NearMiss,
    RuleSet,
    SiteIndex,
    builtin_pack_names,
    builtin_packs,
    infer_phase,
    load_rules,
)
from .families import (
    Family,
    Phase,
    cause_ids,
    families,
    families_with_lifetime,
    family_ids,
    family_label,
    get_family,
    phase_ids,
    phase_label,
    phases,
)
from .pack_parser import KNOB_COSTS, PHASES, Example, Knob, Pack, RuleError, parse_size
from .stack import BlockContext, Frame, Stack

__all__ = [
    "KNOB_COSTS",
    "PHASES",
    "AttributedBlock",
    "BlockContext",
    "ChunkGroup",
    "Decision",
    "Example",
    "Explanation",
    "Family",
    "Frame",
    "Knob",
    "NearMiss",
    "Pack",
    "Phase",
    "RuleError",
    "RuleSet",
    "SiteIndex",
    "Stack",
    "builtin_pack_names",
    "builtin_packs",
    "cause_ids",
    "chunk_groups",
    "families",
    "families_with_lifetime",
    "family_ids",
    "family_label",
    "get_family",
    "infer_phase",
    "load_rules",
    "parse_size",
    "phase_ids",
    "phase_label",
    "phases",
]
