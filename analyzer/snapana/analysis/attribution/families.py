"""The vocabulary every pack speaks: tensor families, phases and OOM causes.

It is data (``packs/vocabulary.toml``) so that documentation, renderers, diagnosis and rule
validation read one source. Ids are stable API (reports, JSON output and user rule files
refer to them); labels may be reworded. The vocabulary file is the only file in ``packs/``
that is not a rule pack.
"""

from __future__ import annotations

from functools import lru_cache
from importlib import resources
from typing import Annotated, Literal, get_args

import msgspec

from snapana import data_file

VOCABULARY_FILE = "vocabulary.toml"

UNKNOWN = "unknown"
#: the phase of an allocation no rule or annotation placed (the vocabulary's phase id)
UNKNOWN_PHASE = "unknown"

WORKLOADS = ("training", "inference")
"""What a capture does: a ``training`` one updates weights (a family or phase marked
``workload = "training"`` in the vocabulary shows it); any other is ``inference``. Knobs that
only make sense for one (activation checkpointing, ``inference_mode``) say which."""

Mark = Literal["training", "autograd"]
Lifetime = Literal["transient", "working_set", "undetermined"]

MARKS: tuple[str, ...] = get_args(Mark)
"""What holding a family or reaching a phase says of the workload (its ``workload`` in the
vocabulary): ``training``, only a training step makes it (an optimizer's state, a parameter's
gradient); ``autograd``, a backward ran, which guidance, a gradient-based attack or a
benchmark does as well as training (the workload stays undetermined on it alone)."""

LIFETIMES: tuple[str, ...] = get_args(Lifetime)
"""Values of a family's optional ``lifetime``: ``transient`` families are built and dropped
within one step (a knob can make them go), ``working_set`` families belong to the operation
in flight (they can only shrink), ``undetermined`` ones are known by where they were made,
not by what they are for (whether they can go is not known). Without one a family is model
state."""


Colour = Annotated[str, msgspec.Meta(pattern=r"^#[0-9a-fA-F]{6}$")]


class Family(data_file.Table, frozen=True, kw_only=True):
    """One tensor family: ``id`` is stable, ``label`` is for display."""

    id: str
    label: str
    description: str
    colour: Colour
    """``#rrggbb``: the family's one colour in every report, figure and diff. Given in the
    vocabulary, not derived from the family's place in it, so a new family recolours no
    other; the colours of families that meet in one report must be told apart (a test)."""
    lifetime: Lifetime | None = None
    """One of :data:`LIFETIMES`, or None (model state, or not known)."""
    workload: Mark | None = None
    """One of :data:`MARKS`: what a capture holding it does; None: either."""
    inventory_roles: tuple[str, ...] = ()
    """The roles of a recording's tensor inventory (`snapana record`'s sidecar) that are
    this family: a named parameter or buffer is ``parameters``."""
    loop: bool = False
    """Repeated live blocks of it from one stack are copies a loop keeps (per chunk, per
    micro-batch, per layer saved for backward): the only ones reports call repeats."""
    mirrors_parameters: bool = False
    """Its blocks may be sized like the parameters, so size mirroring may give a block of it
    to one of its peers (a gradient, an optimizer's state)."""
    shows_parameters: bool = False
    """The recorded window's blocks of it show the parameters' sizes, one per parameter."""
    refines: str | None = None
    """A family a rule giving this one says more than (an inventory role of it)."""


class Phase(data_file.Table, frozen=True, kw_only=True):
    """One phase of a training / RL step: ``id`` is stable, ``label`` is for display."""

    id: str
    label: str
    description: str
    workload: Mark | None = None
    """One of :data:`MARKS`: what a capture reaching this phase does (an optimizer step
    trains; a backward needs autograd); None: either."""
    forward_only: bool = False
    """A forward with no backward (an RL framework's log-prob pass): what it makes speaks for
    no workload, whatever its family."""


class Cause(data_file.Table, frozen=True, kw_only=True):
    """One reason an allocation can fail (diagnosis); knobs name the causes they act on."""

    id: str
    description: str


@data_file.schema(f"analysis/attribution/packs/{VOCABULARY_FILE}")
class Vocabulary(data_file.Table, frozen=True, kw_only=True):
    """The vocabulary file: each table needs one entry at least."""

    family: Annotated[tuple[Family, ...], msgspec.Meta(min_length=1)]
    phase: Annotated[tuple[Phase, ...], msgspec.Meta(min_length=1)]
    cause: Annotated[tuple[Cause, ...], msgspec.Meta(min_length=1)]

    @property
    def families(self) -> tuple[Family, ...]:
        return self.family

    @property
    def phases(self) -> tuple[Phase, ...]:
        return self.phase

    @property
    def causes(self) -> tuple[Cause, ...]:
        return self.cause


def parse_vocabulary(text: str, source: str = VOCABULARY_FILE) -> Vocabulary:
    """Read a vocabulary file; a malformed one is a ``ValueError`` with one line (the file,
    the line, the path in it)."""
    vocab = data_file.read(text, source, Vocabulary)
    fams = vocab.family
    for table in ("family", "phase", "cause"):
        ids = [e.id for e in getattr(vocab, table)]
        if twice := next((n for n, i in enumerate(ids) if i in ids[:n]), None):
            where = f"{table}[{twice}].id"
            raise ValueError(f"{data_file.at(source, text, where)}: {where}: duplicate id "
                             f"{ids[twice]!r}")
    unknown_refined = sorted({f.refines for f in fams if f.refines} - {f.id for f in fams})
    if unknown_refined:
        raise ValueError(f"{source}: `refines` names no family: {unknown_refined[0]!r}")
    roles = [r for f in fams for r in f.inventory_roles]
    twice_roles = sorted({r for r in roles if roles.count(r) > 1})
    if twice_roles:
        raise ValueError(f"{source}: inventory role {twice_roles[0]!r} is given to two families")
    if UNKNOWN not in {f.id for f in fams}:
        raise ValueError(f"{source}: the family table needs the {UNKNOWN!r} family")
    if UNKNOWN not in {p.id for p in vocab.phase}:
        raise ValueError(f"{source}: the phase table needs the {UNKNOWN!r} phase")
    return msgspec.structs.replace(vocab, family=tuple(
        msgspec.structs.replace(f, colour=f.colour.lower()) for f in fams))


@lru_cache(maxsize=1)
def vocabulary() -> Vocabulary:
    """The built-in vocabulary (``packs/vocabulary.toml``)."""
    text = (resources.files(__package__) / "packs" / VOCABULARY_FILE).read_text(encoding="utf-8")
    return parse_vocabulary(text, f"packs/{VOCABULARY_FILE}")


# -- families ---------------------------------------------------------------------------


def families() -> tuple[Family, ...]:
    """All families in display order."""
    return vocabulary().families


def family_ids() -> tuple[str, ...]:
    """The stable family ids in display order."""
    return tuple(f.id for f in vocabulary().families)


def get_family(family_id: str) -> Family:
    """The :class:`Family` for ``family_id``; ``KeyError`` if it is not a known id."""
    for f in vocabulary().families:
        if f.id == family_id:
            return f
    raise KeyError(family_id)


def family_label(family_id: str) -> str:
    """The display label of ``family_id`` (the id itself if unknown)."""
    try:
        return get_family(family_id).label
    except KeyError:
        return family_id


def role_families() -> dict[str, str]:
    """What each role of a recording's tensor inventory means as a family (a role no
    family names, `tensor`, decides nothing)."""
    return {r: f.id for f in vocabulary().families for r in f.inventory_roles}


@lru_cache(maxsize=1)
def loop_families() -> frozenset[str]:
    """Families whose repeated live blocks from one stack are a loop's copies (`loop`)."""
    return frozenset(f.id for f in vocabulary().families if f.loop)


@lru_cache(maxsize=1)
def parameter_mirrors() -> frozenset[str]:
    """Families whose blocks size mirroring may move among themselves (`mirrors_parameters`)."""
    return frozenset(f.id for f in vocabulary().families if f.mirrors_parameters)


@lru_cache(maxsize=1)
def parameter_witnesses() -> frozenset[str]:
    """Families whose window blocks show the parameters' sizes (`shows_parameters`)."""
    return frozenset(f.id for f in vocabulary().families if f.shows_parameters)


@lru_cache(maxsize=1)
def refinements() -> dict[str, tuple[str, ...]]:
    """Family -> the rule families that say more than an inventory role of it (`refines`)."""
    out: dict[str, tuple[str, ...]] = {}
    for f in vocabulary().families:
        if f.refines:
            out[f.refines] = (*out.get(f.refines, ()), f.id)
    return out


def families_with_lifetime(lifetime: str) -> frozenset[str]:
    """Ids of the families whose ``lifetime`` is ``lifetime`` (one of :data:`LIFETIMES`)."""
    return frozenset(f.id for f in vocabulary().families if f.lifetime == lifetime)


def workload_marks() -> tuple[dict[str, str], dict[str, str]]:
    """The families and the phases whose presence speaks for a workload, each with the one
    it speaks for (:data:`MARKS`): those the vocabulary gives a ``workload``."""
    v = vocabulary()
    return ({f.id: f.workload for f in v.families if f.workload},
            {p.id: p.workload for p in v.phases if p.workload})


def forward_only_phases() -> frozenset[str]:
    """Phases that run a forward and no backward (``forward_only`` in the vocabulary): a
    family made there (a log-prob softmax) is no evidence of training."""
    return frozenset(p.id for p in vocabulary().phases if p.forward_only)


# -- phases and causes ------------------------------------------------------------------


def phases() -> tuple[Phase, ...]:
    """All phases in display order."""
    return vocabulary().phases


def phase_ids() -> tuple[str, ...]:
    """The stable phase ids (what :func:`~snapana.analysis.attribution.infer_phase` can return)."""
    return tuple(p.id for p in vocabulary().phases)


def phase_label(phase_id: str) -> str:
    """The display label of ``phase_id`` (the id itself if unknown)."""
    return next((p.label for p in vocabulary().phases if p.id == phase_id), phase_id)


def cause_ids() -> tuple[str, ...]:
    """The OOM cause ids diagnosis reports and knobs may name."""
    return tuple(c.id for c in vocabulary().causes)
