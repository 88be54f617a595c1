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

Rule file schema (TOML)
-----------------------
A file is a *pack*. A framework's pack (``packs/<framework>.toml``) holds everything about
that framework: how to detect it, its rules and phase rules, its knobs and examples. A user
file given with ``--rules`` has the same schema::

    [pack]                       # optional
    name = "slime"               # default: file stem; rule ids are prefixed with it
    description = "..."
    default_priority = 100       # built-in framework packs 100, pytorch 50, user files 150
    markers = ["slime/"]         # detection: a capture uses the framework when a frame's
                                 # path contains one of these; its knobs are then suggested

    [[rule]]                     # a family rule
    id = "slime.logprob_softmax" # "<pack>." is added when missing; unique across packs
    family = "saved_logprob_softmax"   # one of family_ids()
    label = "saved log_prob_softmax (per chunk)"
    priority = 110               # higher wins; equal-priority matches are reported as ties
    description = "..."          # optional, for people
    reason = "..."               # optional; replaces the generated reason text
    # conditions (all optional, all must hold; at least one is required):
    frames = [                   # caller -> callee order (outermost first)
      { file = "slime/utils/ppo_utils.py", function = "calculate_log_probs_and_entropy" },
      { file = "slime/utils/ppo_utils.py", function = "vocab_parallel_softmax" },
    ]
    not_frames = [ {...} ]       # none of these frames may be on the stack
    only_frames = [ {...} ]      # every Python frame matches one of these (file/function
                                 # only), and there is at least one: nothing else ran it
    pool = "default" | "mempool" | "graph" | "private"   # or a list
    stream = "default" | "nondefault"
    state = "active_allocated" | "active_pending_free" | "inactive"   # or a list
    phase = "forward"            # or a list; the inferred phase (family rules only)
    annotation = '^Optimizer\\.step#'   # regex searched in each open annotation name
    min_size = "512MiB"          # bytes or a size string; max_size likewise (inclusive)
    no_python_frames = true      # true: only C++ frames (or none); false: some Python
    no_frames = true             # true: empty stack; false: non-empty
    has_alloc_event = false      # false: predates recording; true: an alloc event exists
    phase_hint = "backward"      # or a list; the phase the *caller* established from the
                                 # timeline (BlockContext.phase_hint), not one inferred from the
                                 # stack; family rules only

    [[phase_rule]]               # same conditions (except `phase`), decides the phase
    id = "phases.optimizer_wrapper"
    phase = "optimizer"
    priority = 90
    frames = [{ file = "torch/optim/optimizer.py", function = "wrapper" }]

    [[knob]]                     # a setting that changes a family or an OOM cause
    id = "slime.recompute_loss_function"   # unique across packs; used as given
    knob = "--recompute-loss-function"     # the flag / setting as written in the framework
    families = ["saved_logprob_softmax"]   # family ids it acts on, and/or
    causes = ["outside_pytorch"]           # cause ids (vocabulary [[cause]]); one is required
    direction = "lowers"         # "lowers" | "raises" | "bounds" | "releases" (offload)
    cost = "compute"             # "free" | "compute" | "communication" | "quality"
                                 # (extra compute, extra communication incl. host transfers,
                                 # may change training quality / results)
    effect = "..."               # one sentence: what it changes
    caveat = "..."               # optional: when it does NOT help, what it costs
    phases = ["logprobs"]        # optional: only suggested for an OOM in one of these
    framework = "any"            # optional, default the pack name; knobs apply when their
                                 # framework is detected; "pytorch" and "any" always apply
    workload = "training"        # optional: only for a capture that trains (a step: a family
                                 # / phase the vocabulary marks "training", a fact that says
                                 # so; a backward alone is autograd's) or, "inference", only
                                 # for one that does not

    [[example]]                  # a stack and the family the rules must give it
    description = "..."          # optional
    family = "saved_logprob_softmax"
    rule = "slime.logprob_softmax"   # optional: the rule that must decide
    phase = "forward"            # optional: the phase that must be inferred
    stack = [                    # innermost first, as a snapshot stores it
      { file = "slime/utils/ppo_utils.py", function = "vocab_parallel_softmax", line = 512 },
      { file = "slime/utils/ppo_utils.py", function = "forward", line = 540 },
      { symbol = "torch::autograd::Engine::thread_main(...)" },   # a C++ frame
    ]
    # optional block context: pool = "default" | "mempool" | "graph", stream = 0,
    # state = "active_allocated", size = "64MiB", has_alloc_event = true,
    # annotations = ["..."], phase_hint = "backward"

Every example of every built-in pack is run through the engine by
``tests/test_pack_examples.py`` (with the sites of its own stack indexed, as the Attributor
indexes a snapshot's); ``RuleSet.check_examples()`` does the same for user packs.

Frame pattern fields:

- ``file``: path suffix on whole components, on a path normalised to ``/`` with ``..``
  resolved (``torch/optim/optimizer.py`` matches ``.../site-packages/torch/optim/optimizer.py``).
- ``file_re``: regex searched in the normalised path (anchor it: ``'(^|/)vllm/v1/worker/'``).
- ``function``: exact function name(s) — a string or a list. Never a substring match, so a
  driver named ``run_forward_backward_step`` is not a ``forward`` frame.
- ``function_re``: regex that must match the *whole* function name.
- ``symbol_re``: regex searched in a C++ frame's symbol (``torch::autograd::Engine::thread_main``);
  C++-only, cannot be combined with the four fields above.
- ``where = "innermost"`` / ``within = N``: the frame must be among the first N Python
  frames (N=1 for ``innermost``); C++ frames are not counted, so interleaved C++ frames do
  not break innermost matching.
- ``max_gap = N``: at most N Python frames between this frame and the previous (caller)
  pattern's frame (``forward`` directly under ``_call_impl``, allowing hook wrappers).
- ``line_lt`` / ``line_ge``: line bounds, for one known version.
- ``line_rank = k`` (``min_sites = m``): the frame's line is the k-th (0-based; negative
  counts from the end) of the distinct lines seen for that (file, function) across the
  snapshot (needs :meth:`RuleSet.with_sites`), with at least m such lines; requires
  ``where = "innermost"`` (only allocating lines are ranked). This survives
  version changes that move line numbers but keep the order of allocations.
  ``line_rank = [i, j]`` is an inclusive range of ranks: ``[0, -2]`` is every allocating
  line of the function but its last (the intermediates of a helper that returns its last
  allocation). The Attributor ranks the lines of every alloc and of the failing (OOM)
  request.
- ``outermost = true``: only the outermost frame of the stack that matches the pattern's
  file/function (or symbol) fields is a candidate — the ``forward`` of the top-level model,
  not of a layer nested inside it. ``within`` / line bounds then test that frame, so
  ``outermost = true, where = "innermost"`` means "allocated by the top-level forward itself".

Precedence is by ``priority`` only (then load order: built-in packs sorted by file name,
then user files in the order given), never by which file a rule is in. A block that no rule
matches is ``unknown`` with the reason in its label ("no rule matched (innermost user frame:
file:line name)"); the built-in pytorch pack explains empty stacks ("no frames: allocated
before recording began", "... by a thread without a Python stack"). An empty stack with an
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
