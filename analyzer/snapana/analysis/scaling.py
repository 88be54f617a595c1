"""How each block of a capture grows with the batch and the sequence length (issue 61): the
decision behind `snapana whatif --scale`, made once per block from what attribution found.

A block's growth is a pair of exponents (batch, seq): its bytes at another size are its
recorded bytes times (batch'/batch)^e_b × (seq'/seq)^e_s. They come, strongest first, from

- a second capture of the same job at another size (`calibrate`): each allocation is paired
  with the same-numbered allocation of the same call path in the other capture, and the ratio
  of their sizes gives the exponent;
- a score-matrix site (`scaling.toml` `[[scores]]`): the largest blocks made under an
  attention function of an unfused attention grow with seq²;
- the block's family (`scaling.toml` `[family.*]`): model state not at all, activations,
  logits and KV cache linearly in both.

A block whose family has no rule, or whose size is not a multiple of the stated batch / seq
as its exponents say it must be, is held at its recorded size and listed: the prediction says
how much it did not scale.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from typing import TYPE_CHECKING, Any

import numpy as np
import polars as pl

from snapana import data_file
from snapana.analysis.attribution.lifetimes import attribute_lifetimes, carry_families
from snapana.analysis.replay import NEVER
from snapana.analysis.scaling_file import ScalingFile, same_step
from snapana.analysis.sites import code_site_of
from snapana.analysis.trace_edits import hidden_size
from snapana.caching_allocator import ACTIVE_ALLOCATED
from snapana.model import is_kernel_frame, is_python_frame
from snapana.units import ascii_int, fmt_bytes

if TYPE_CHECKING:
    from snapana.analysis.attribution.assign import Attributor
    from snapana.analysis.replay import DeviceReplay, Moment

KNOBS = ("batch", "seq")
#: An exponent measured between two captures within this of a whole number is that number.
SNAP = 0.05

#: A resized block is never taken larger than this (1 PiB: more than any card; it keeps the
#: bytes in int64 at any size a bisection tries).
LARGEST = 1 << 50
#: How a block's growth was decided (the `how` column).
FAMILY, SCORES, CALIBRATED, UNCLASSIFIED, INDIVISIBLE, FACTORED, CHUNKS, AMBIGUOUS = (
    "family", "scores", "calibrated", "unclassified", "indivisible", "factored", "chunks",
    "ambiguous")
#: How-value of a loss's vocabulary-sized blocks freed before the backward (`loss_chunks`):
#: a chunk or the whole loss, not known; held at their recorded size.
LOSS_CHUNK = "loss chunk"
#: How-value of blocks sized for the padded token count (`[seq_evidence]` padding): kept at
#: a smaller seq, grown from the padded count at a larger one.
PADDED = "padded"
#: How-values of blocks held at their recorded size although their family might grow.
HELD_HOWS = (UNCLASSIFIED, INDIVISIBLE, LOSS_CHUNK)
#: How-values whose growth was read off the block's own size (or a second capture), not
#: assumed from its family: the "derived" share of a prediction.
DERIVED = (CALIBRATED, FACTORED)


class ScaleError(ValueError):
    """A --scale or --calibrate-size text that does not say a size."""


@dataclass(frozen=True)
class Size:
    """One knob's sizes: as recorded, and as asked (None: only the recorded one, for --fit)."""

    knob: str
    recorded: int
    target: int | None = None


def parse_sizes(items: Sequence[str]) -> dict[str, Size]:
    """`batch=4:16`, `seq=128:2048`, `seq=128` (recorded only) as Sizes by knob."""
    out: dict[str, Size] = {}
    for item in items:
        knob, eq, rest = item.partition("=")
        knob = knob.strip()
        if not eq or knob not in KNOBS:
            raise ScaleError(f"{item[:60]!r}: give batch=RECORDED[:TARGET] or "
                             "seq=RECORDED[:TARGET], e.g. seq=128:2048")
        # ASCII digits only: '²' passes str.isdigit and fails int()
        parts = rest.split(":")
        numbers = [n for n in map(ascii_int, parts) if n is not None and 0 < n <= 1 << 32]
        if len(parts) > 2 or len(numbers) != len(parts):
            raise ScaleError(f"{item[:60]!r}: sizes are whole numbers from 1 to 2^32 (ASCII "
                             "digits), e.g. seq=128:2048")
        if knob in out:
            raise ScaleError(f"{knob} is given twice")
        out[knob] = Size(knob, numbers[0], numbers[1] if len(numbers) == 2 else None)
    return out


@dataclass(frozen=True)
class ScoreRule:
    id: str
    function: re.Pattern[str]
    batch: int
    seq: int
    assumption: str
    #: a block of the scores' size over seq² times one of these (the scores' bytes per
    #: element over another dtype's) is one more [batch, heads, seq, seq] matrix
    dtype_ratios: tuple[float, ...] = ()
    shaped: str = ""
    #: the byte sizes a fused attention's output [batch, seq, hidden] may have per element
    output_bytes: tuple[int, ...] = ()
    #: `function` names a C++ frame (a torch kernel), not a Python function
    native: bool = False
    #: what made the scores, in the knob list's words (the `score_matrices` fact)
    maker: str = "an unfused attention"
    #: where the scores have the output's bytes (seq = head dim), the output is told apart
    #: by the order and lifetimes within one call (`_outputs_after_softmax`)
    output_after_softmax: bool = False
    #: the softmax's bytes over the scores' it is made from (`_scores_before_softmax`: where
    #: seq is below the head dim, the scores are smaller than the output)
    softmax_repeats: tuple[float, ...] = ()


@dataclass(frozen=True)
class NextStep:
    """A knob replayed at one size past the largest that fits (`[[next_step]]`)."""

    id: str
    text: str
    drop_scores: bool = False
    drop_families: tuple[str, ...] = ()
    hold_families: tuple[str, ...] = ()
    setting: str = ""
    caveat: str = ""
    #: replayed as activation checkpointing (`[checkpointing]`, analysis/trace_edits.py)
    checkpoint: bool = False


@dataclass(frozen=True)
class Padding:
    """`[seq_evidence]` padding: the multiple a padded count is of, the share of the
    indivisible blocks' bytes one padded count must divide, and the texts that say it."""

    multiple: int = 64
    most: float = 0.5
    text: str = ""
    block: str = ""
    share: str = ""


@dataclass(frozen=True)
class ScalingRules:
    families: Mapping[str, tuple[int, int, str]]  # family -> (batch, seq, why)
    scores: tuple[ScoreRule, ...]
    next_steps: tuple[NextStep, ...]
    #: family -> (families whose sizes it mirrors, the family a block of no such size is,
    #: the families whose first block a block of it alive there is read by: a mirrored one)
    mirrors: Mapping[str, tuple[tuple[str, ...], str, tuple[str, ...]]] = field(
        default_factory=dict)
    #: `[seq_evidence]`: how far from the stated seq to look, and the share of the model
    #: state's bytes past which dividing by a number is chance
    seq_window: float = 0.05
    seq_chance: float = 0.25
    seq_least: float = 0.10
    #: `[confidence]`: the most a --fit figure may be off from what is held fixed, and the
    #: uncalibrated error band measured on the size pairs (percent, low / high) with its source
    max_held_error: float = 0.10
    band: tuple[float, float] = (0.0, 0.0)
    band_source: str = ""
    #: a framework's knob id -> the next step's id that replays its mechanism
    same_step: Mapping[str, str] = field(default_factory=dict)
    #: --scale key -> the knob ids whose setting is the largest size --fit finds
    fit_size: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    #: knob id -> the whatif flag that replays it (not --fit)
    whatif_flags: Mapping[str, str] = field(default_factory=dict)
    #: `[checkpointing]`: the families a forward saves for the backward, and those whose
    #: first allocation starts the backward
    checkpoint_saved: tuple[str, ...] = ()
    checkpoint_backward: tuple[str, ...] = ()
    checkpoint_without_layers: tuple[str, ...] = ()
    checkpoint_cached: tuple[str, ...] = ()
    padding: Padding = Padding()
    #: `[loss_chunks]`: the families of a loss's vocabulary-sized blocks, and why they are held
    loss_families: tuple[str, ...] = ()
    loss_why: str = ""


@lru_cache(maxsize=1)
def load_rules() -> ScalingRules:
    """The built-in `scaling.toml`."""
    text = resources.files("snapana.analysis").joinpath("scaling.toml").read_text("utf-8")
    data = data_file.checked(text, "analysis/scaling.toml", ScalingFile)
    families = {name: (int(f["batch"]), int(f["seq"]), str(f.get("why", "")))
                for name, f in data.get("family", {}).items()}
    mirrors = {name: (tuple(f["mirror"]), str(f["unmatched"]), tuple(f.get("read_by") or ()))
               for name, f in data.get("family", {}).items() if "mirror" in f}
    scores = tuple(ScoreRule(s["id"], re.compile(s["function"]), int(s["batch"]),
                             int(s["seq"]), s["assumption"],
                             tuple(float(r) for r in s.get("dtype_ratios", ())),
                             s.get("shaped", ""), tuple(int(b) for b in s.get("output_bytes", ())),
                             bool(s.get("native", False)),
                             s.get("maker", "an unfused attention"),
                             bool(s.get("output_after_softmax", False)),
                             tuple(float(r) for r in s.get("softmax_repeats", ())))
                   for s in data.get("scores", []))
    steps = tuple(NextStep(n["id"], n.get("text", ""), bool(n.get("drop_scores", False)),
                           tuple(n.get("drop_families", ())), tuple(n.get("hold_families", ())),
                           n.get("setting", ""), n.get("caveat", ""),
                           bool(n.get("checkpoint", False)))
                  for n in data.get("next_step", []))
    evidence, sure = data.get("seq_evidence", {}), data.get("confidence", {})
    low, high = (float(x) for x in sure.get("band", (0.0, 0.0)))
    return ScalingRules(families, scores, steps, mirrors,
                        float(evidence.get("window", 0.05)), float(evidence.get("chance", 0.25)),
                        float(evidence.get("least", 0.10)),
                        float(sure.get("max_held_error", 0.10)), (low, high),
                        str(sure.get("band_source", "")),
                        same_step=same_step(),
                        fit_size={key: tuple(ids)
                                  for key, ids in data.get("fit_size", {}).items()},
                        whatif_flags={str(f["id"]): str(f["flag"])
                                      for f in data.get("whatif_flag", [])},
                        checkpoint_saved=tuple(data.get("checkpointing", {}).get("saved", ())),
                        checkpoint_backward=tuple(data.get("checkpointing", {})
                                                  .get("backward", ())),
                        checkpoint_without_layers=tuple(data.get("checkpointing", {})
                                                        .get("without_layers", ())),
                        checkpoint_cached=tuple(data.get("checkpointing", {})
                                                .get("cached", ())),
                        padding=Padding(int(evidence.get("pad_multiple", 64)),
                                        float(evidence.get("pad_most", 0.5)),
                                        str(evidence.get("padded", "")),
                                        str(evidence.get("padded_block", "")),
                                        str(evidence.get("padded_share", ""))),
                        loss_families=tuple(data.get("loss_chunks", {}).get("families", ())),
                        loss_why=str(data.get("loss_chunks", {}).get("why", "")))


@dataclass(frozen=True)
class ReplayRoute:
    """How `snapana whatif` replays a knob: `how` is "fit" (a next step of --fit, as `step`),
    "fit_size" (the size --fit finds, with --scale `key`), "set" (an allocator setting,
    --set), "flag" (a flag of its own), or "none" (no mechanical model of it); `command`
    says it."""

    how: str
    command: str = ""
    step: str = ""
    key: str = ""


def replay_route(knob_id: str, simulate: Sequence[str] = ()) -> ReplayRoute:
    """Which whatif replays `knob_id` (a pack knob; `simulate`: its allocator settings)."""
    rules = load_rules()
    steps = {s.id for s in rules.next_steps}
    step = knob_id if knob_id in steps else rules.same_step.get(knob_id, "")
    if step:
        return ReplayRoute("fit", "snapana whatif --scale seq=N --fit (or batch=N)", step)
    key = next((k for k, ids in rules.fit_size.items() if knob_id in ids), "")
    if key:
        return ReplayRoute("fit_size", f"snapana whatif --scale {key}=N --fit", key=key)
    if simulate:
        return ReplayRoute("set", "snapana whatif " + " ".join(f"--set {s}" for s in simulate))
    if knob_id in rules.whatif_flags:
        return ReplayRoute("flag", f"snapana whatif {rules.whatif_flags[knob_id]}")
    return ReplayRoute("none")


def step_knob(step_id: str, offered: Sequence[str]) -> str:
    """The knob a next step is named by, so whatif --fit and the summary say one name: the
    first of the summary's knobs (`offered`, pack ids in its order) that `[[same_step]]`
    links to the step (a framework's own flag for its mechanism), else the step's own."""
    same = load_rules().same_step
    return next((k for k in offered if same.get(k) == step_id), step_id)


def size_knobs(key: str, offered: Sequence[str]) -> tuple[str, ...]:
    """The knobs whose setting is the largest `key` --fit finds (`[fit_size]`): those the
    summary offers where it offers any (it names one of them for the job's workload),
    else all."""
    ids = load_rules().fit_size.get(key, ())
    return tuple(k for k in ids if k in offered) or ids


@dataclass(frozen=True)
class Growth:
    """Each block's growth. `blocks`: one row per allocation of the window (`alloc_idx` ≥ 0,
    the failed requests included) and per block held before it (`alloc_idx` −1, by
    `address`), with `requested` bytes, `family`, `site`, exponents `e_batch` / `e_seq`,
    `how` (one of FAMILY, SCORES, CALIBRATED, UNCLASSIFIED, INDIVISIBLE, PADDED, ...), `why`
    and, where present, `pad` (the padded token count a PADDED block is sized for, else 0).
    `assumptions`: the sentences the prediction rests on."""

    blocks: pl.DataFrame
    sizes: Mapping[str, Size]
    assumptions: tuple[str, ...]
    calibration: str = ""  # what the second capture decided, in words ("" : none given)
    #: the seq the sizes were made at, in words, where it is not the one stated ("": it is)
    sized_for: str = ""
    #: the padded token count blocks that do not divide by the seq are sized for (0: none;
    #: `[seq_evidence]` padding)
    padded: int = 0

    def padded_seq(self) -> int:
        """The padded count where blocks are still sized for it (0: none; a chunk loop
        marked or a second capture measured after the decision takes its own)."""
        return self.padded if self.padded and (self.blocks["how"] == PADDED).any() else 0

    def padded_for(self) -> str:
        """The blocks sized for the padded count, in words ("" when none)."""
        if not self.padded_seq():
            return ""
        rows = self.blocks.filter(pl.col("how") == PADDED)
        return load_rules().padding.text.format(
            blocks=f"{rows.height:,}", bytes=fmt_bytes(int(rows["requested"].sum())),
            padded=self.padded, seq=self.sizes["seq"].recorded)

    def factor(self, sizes: Mapping[str, int]) -> np.ndarray:
        """Each block's bytes at `sizes` (knob -> size; a knob not given keeps its
        recorded size): exact integers where the block divides by its recorded sizes. A
        block sized for a padded count P (`pad`) is sized for P at any seq up to the
        recorded one (padding only rounds up) and for P × seq / recorded above it."""
        req = self.blocks["requested"].to_numpy().astype(np.float64)
        scale = np.ones(len(req))
        exact = np.ones(len(req), dtype=bool)
        denom = np.ones(len(req))
        numer = np.ones(len(req))
        for knob in KNOBS:
            size = self.sizes.get(knob)
            if size is None or knob not in sizes:
                continue
            e = self.blocks[f"e_{knob}"].to_numpy()
            whole = np.equal(np.round(e), e)
            exact &= whole
            was = np.full(len(req), float(size.recorded))
            now = np.full(len(req), float(sizes[knob]))
            if knob == "seq" and "pad" in self.blocks.columns:
                pad = self.blocks["pad"].fill_null(0).to_numpy().astype(np.float64)
                at = pad > 0
                was[at] = pad[at]
                now[at] = np.maximum(pad[at], np.ceil(pad[at] * sizes[knob] / size.recorded))
            denom *= np.power(was, e)
            numer *= np.power(now, e)
            scale *= np.power(now / was, e)
        out = np.where(exact, np.round(req / denom) * numer, np.round(req * scale))
        return np.clip(out, 0, LARGEST).astype(np.int64)

    def held_fixed(self) -> pl.DataFrame:
        """Blocks held at their recorded size although their family might grow: per site,
        how many, their bytes, and why."""
        fixed = self.blocks.filter(pl.col("how").is_in(list(HELD_HOWS)))
        return (fixed.group_by("site", "family", "why")
                .agg(pl.len().alias("blocks"), pl.col("requested").sum().alias("bytes"))
                .sort(["bytes", "site", "family", "why"],  # ties in a stable order
                      descending=[True, False, False, False]))


def window_blocks(attributor: Attributor, dr: DeviceReplay, moment: Moment) -> pl.DataFrame:
    """The blocks a resized replay resizes, with their family and site: every allocation of
    the window and every block held before it (`attribute_lifetimes`; a block held from
    before the window to `moment` takes the family the report gives it there), and each
    failed request (`alloc_idx` its OOM event, `address` −1), classified as the diagnosis
    does."""
    at_moment = attributor.attribute(
        dr.blocks_at(moment).filter(pl.col("state") == ACTIVE_ALLOCATED))
    lt = attribute_lifetimes(attributor, dr, at_moment.filter(pl.col("alloc_idx") < 0))
    lt = carry_families(lt, [at_moment])
    blocks = lt.select("alloc_idx", "address",
                       pl.coalesce("requested_size", "size").alias("requested"),
                       "stack_id", "stream", "family",
                       pl.col("free_done_idx").fill_null(NEVER).alias("free_idx"))
    failed = pl.DataFrame(
        [(o.idx, -1, o.requested_bytes, o.stack_id, o.stream, attributor.decide(
            o.stack_id, attributor.context(o.stack_id, "0,0", o.stream, ACTIVE_ALLOCATED,
                                           o.requested_bytes, o.idx)).family, NEVER)
         for o in dr.ooms], schema=blocks.schema, orient="row")
    blocks = pl.concat([blocks, failed])
    ids = blocks["stack_id"].unique().to_list()
    sites = {sid: attributor.site(sid) for sid in ids}
    # the line of code that made each block (a trace's op frames left out): the checkpointing
    # replay's layers are the lines that saved one tensor per layer (`checkpoint_edit`)
    code = {sid: code_site_of(attributor.stacks.stack(sid)) for sid in ids}
    return blocks.with_columns(
        pl.col("stack_id").replace_strict(sites, return_dtype=pl.Utf8).alias("site"),
        pl.col("stack_id").replace_strict(code, return_dtype=pl.Utf8).alias("code_site"))


def _unmirrored(blocks: pl.DataFrame, family: str, mirrored: Sequence[str],
                read_by: Sequence[str] = ()) -> list[int]:
    """Rows of `family` that no block of the `mirrored` families accounts for: per size, the
    blocks beyond the count of mirrored blocks of that size, the shortest-lived first (a
    weight's .grad lives to the next zero_grad; an activation's gradient only through the
    backward). A block alive where the first block of `read_by` is made (the optimizer
    step reads it) is a mirrored one whatever the count: a trace's window may hold no
    weights."""
    mirrors = (blocks.filter(pl.col("family").is_in(list(mirrored)))
               .group_by("requested").agg(pl.len().alias("_mirrors")))
    rows = (blocks.with_row_index("_row").filter(pl.col("family") == family)
            .join(mirrors, on="requested", how="left")
            .with_columns(pl.col("_mirrors").fill_null(0),
                          (pl.col("free_idx") - pl.col("alloc_idx")).alias("_life"))
            .with_columns(pl.col("_life").rank("ordinal", descending=True)
                          .over("requested").alias("_rank"))
            .filter(pl.col("_rank") > pl.col("_mirrors")))
    step = blocks.filter(pl.col("family").is_in(list(read_by)) & (pl.col("alloc_idx") >= 0))
    if step.height:
        at = int(step["alloc_idx"].cast(pl.Int64).min() or 0)
        rows = rows.filter((pl.col("alloc_idx") >= at) | (pl.col("free_idx") <= at))
    return rows["_row"].to_list()


def _frames(stack: Sequence[Any]) -> tuple[tuple[str, str, int], ...]:
    return tuple((str(f[0]), str(f[1]), int(f[2])) for f in stack if is_python_frame(f))


def _rule_function(rule: ScoreRule, stack: Sequence[Any]) -> str | None:
    """The function of `stack` the score rule names: a Python frame's function, or for a
    `native` rule the kernel a C++ frame or a profiler trace's op frame names (the rule's
    first group: its name without the namespace and arguments)."""
    if not rule.native:
        return next((f for _, f, _ in _frames(stack) if rule.function.search(f)), None)
    for f in stack:
        m = rule.function.search(str(f[1])) if is_kernel_frame(f) else None
        if m:
            return m.group(1) if m.groups() else m.group(0)
    return None


#: What `score_blocks` says of the scores' bytes: nothing ("": they are not the output's), the
#: output's bytes at two or more lines (seq = head dim in one dtype), or a softmax wider than
#: both (one line makes the largest; blocks of its bytes × a dtype ratio below one, the scores
#: and the output in half precision, are made under the function too: autocast's fp32 softmax
#: at seq = head dim)
COINCIDE_BYTES, COINCIDE_SOFTMAX = "bytes", "softmax"


def score_blocks(rule: ScoreRule, stack_ids: np.ndarray, requested: np.ndarray,
                 grows: np.ndarray, stacks: Any, distinct: np.ndarray | None = None,
                 hidden: int | None = None) -> tuple[np.ndarray, dict[int, str], str]:
    """The score matrices of an unfused attention (`[[scores]]`): of the blocks that grow
    (`grows`) made under a frame whose function the rule names, those of the largest size
    ([batch, heads, seq, seq]; the row max, the output are smaller). The one detection for
    the resized replay (`decide`) and the knob list (`held_scores`): it needs no seq, which
    the knob list does not know. Returns the mask, the matching function of each stack that
    has one, and whether the scores' bytes are the attention output's too.

    `hidden`: the hidden size read off the weights (None where no weights are named: a
    forward whose weights' sizes its activations share). A fused attention (SDPA, flash)
    makes no scores: its largest block is its output [batch, seq, hidden], made at one line
    (the innermost frame; each layer reaches it through its own stack), whose bytes are
    those of a [batch, seq, hidden] activation made elsewhere (`_is_output_size`). Where the
    largest size is such and one line makes it, it is taken for the output, not for scores,
    unless blocks of its bytes times a dtype ratio below one are made under the function
    too: then it may be a softmax wider than the scores and the output (torch's autocast
    runs softmax in fp32, the matmuls in bf16: aten/src/ATen/autocast_mode.cpp), and those
    blocks are returned with it (COINCIDE_SOFTMAX). Made at two or more lines (scores,
    softmax), they are scores whose bytes coincide with the output's (seq = head dim:
    COINCIDE_BYTES). Either way `decide` tells the output apart by its place in each call
    where it can (`_outputs_after_softmax`); the third value is "" otherwise."""
    distinct = np.unique(stack_ids) if distinct is None else distinct
    hits = {int(sid): fn for sid in distinct
            for fn in [_rule_function(rule, stacks.stack(int(sid)))] if fn is not None}
    under = np.isin(stack_ids, list(hits)) & grows
    if not under.any():
        return under, hits, ""
    largest = under & (requested == int(requested[under].max()))
    size = int(requested[largest][0])
    if not _is_output_size(rule, size, stack_ids, requested, grows, stacks, distinct, hits,
                           hidden):
        return largest, hits, ""
    lines = {_frames(stacks.stack(int(sid)))[:1] for sid in np.unique(stack_ids[largest])}
    if len(lines) > 1:
        return largest, hits, COINCIDE_BYTES
    if _narrower(rule, requested, under, size).any() and rule.output_after_softmax:
        return largest, hits, COINCIDE_SOFTMAX
    return np.zeros(len(requested), dtype=bool), hits, ""  # one line of code: the output


def _narrower(rule: ScoreRule, requested: np.ndarray, under: np.ndarray, size: int
              ) -> np.ndarray:
    """The blocks under the attention function (`under`) whose bytes are `size` times a
    dtype ratio below one: scores and output in half precision beside an fp32 softmax."""
    return under & np.isin(requested, [size * r for r in rule.dtype_ratios if r < 1])


def _is_output_size(rule: ScoreRule, size: int, stack_ids: np.ndarray, requested: np.ndarray,
                    grows: np.ndarray, stacks: Any, distinct: np.ndarray,
                    hits: Mapping[int, str], hidden: int | None) -> bool:
    """Whether `size` bytes may be an attention's output [batch, seq, hidden] (`score_blocks`):
    it is tokens × hidden elements of one of `rule.output_bytes`, and the smallest
    [.., hidden]-sized activation (`grows`: not a weight-sized optimizer temporary) with
    frames made outside the attention function whose bytes
    divide twice `size` (a layer norm's, the embedding's [batch, seq, hidden]: fewer tokens
    than the output's would make it smaller) is `size` or twice it (an output in bf16
    beside a layer norm's fp32 under autocast). No seq is needed: the knob list knows
    none. Without `hidden` (no weights named) every such activation counts: a smaller one
    ([batch, seq] positions, a norm's statistics) then says no, as an unknown size should."""
    framed = _framed(stack_ids, distinct, stacks) & ~np.isin(stack_ids, list(hits)) & grows
    return _output_sized(rule, size, requested[framed], hidden)


def _output_sized(rule: ScoreRule, size: int, outside: np.ndarray, hidden: int | None) -> bool:
    """`_is_output_size` on the bytes of the activations with frames made outside the
    attention function (`outside`)."""
    if not rule.output_bytes or (hidden and not any(size % (hidden * e) == 0
                                                    for e in rule.output_bytes)):
        return False
    outside = outside[outside > 0]
    unit = (hidden or 1) * min(rule.output_bytes)
    found = outside[(outside % unit == 0) & ((2 * size) % outside == 0)]
    return bool(len(found)) and int(found.min()) in (size, 2 * size)


def held_scores(blocks: pl.DataFrame, stacks: Any) -> tuple[int, int, int, str, str]:
    """The score matrices among `blocks` (stack_id, size, family, alloc_idx: held at a
    moment), found as the resized replay finds them (`decide`, through `score_blocks`):
    under an attention function, of a growing family or of one with no rule made in the
    window (the program's own attention: `user_tensors`), and the blocks of their shape made
    elsewhere (their gradients in backward: `_score_shaped`, the sequence length unknown, so
    their bytes are the scores' times a dtype ratio). Their bytes, their count, how many of
    them were made elsewhere, the attention function and what made them (the first rule's
    `maker`) (0, 0, 0, "", "" when none). A block the first rule takes is not counted again."""
    if blocks.is_empty():
        return 0, 0, 0, "", ""
    rules = load_rules()
    grow = {f for f, (b, q, _) in rules.families.items() if b > 0 or q > 0}
    family = blocks["family"].fill_null("")
    grows = family.is_in(list(grow)).to_numpy()
    made = blocks["alloc_idx"].to_numpy() >= 0 if "alloc_idx" in blocks.columns else \
        np.zeros(blocks.height, dtype=bool)
    candidates = grows | (~family.is_in(list(rules.families)).to_numpy() & made)
    stack_ids = blocks["stack_id"].to_numpy()
    size = blocks["size"].to_numpy()
    # decided on the bytes asked for, as the resized replay decides (a block may hold a
    # segment's unsplit remainder beyond them); counted at the bytes held
    asked = blocks.select(pl.when(pl.col("requested_size") > 0).then(pl.col("requested_size"))
                          .otherwise(pl.col("size")).alias("requested")) \
        if "requested_size" in blocks.columns else blocks.select(pl.col("size").alias("requested"))
    req = asked["requested"].to_numpy()
    distinct = np.unique(stack_ids)
    framed = _framed(stack_ids, distinct, stacks)
    hidden = hidden_size(asked.with_columns(family))
    taken = np.zeros(blocks.height, dtype=bool)
    shaped_count, name, maker = 0, "", ""
    for rule in rules.scores:
        mask, hits, coincide = score_blocks(rule, stack_ids, req, candidates, stacks,
                                            distinct, hidden)
        if coincide == COINCIDE_SOFTMAX:
            # a softmax or a fused attention's output: only the call's order tells (the
            # scores consumed before it, freed by the moment held here), so none is counted
            continue
        mask &= ~taken
        if not mask.any():
            continue
        shaped = _score_shaped(rule, req, mask, candidates & ~mask & ~taken,
                               np.isin(stack_ids, list(hits)), framed, {"seq": Size("seq", 1)},
                               hidden)
        taken |= mask | shaped
        shaped_count += int(shaped.sum())
        name, maker = (name, maker) if name else (hits[int(stack_ids[mask][0])], rule.maker)
    return int(size[taken].sum()), int(taken.sum()), shaped_count, name, maker


def _outputs_after_softmax(blocks: pl.DataFrame, scores: np.ndarray, under: np.ndarray
                           ) -> tuple[np.ndarray, np.ndarray]:
    """Where the scores have the bytes of the attention's output (seq = head dim), which of
    the blocks of that size (`scores`) the output is, from one call's order and lifetimes
    (a call: a run of consecutive allocations under the attention function, `under`). An
    unfused attention (torch's `_scaled_dot_product_attention_math`, transformers'
    `eager_attention_forward`) makes q·kᵀ (scaled, masked), its softmax (dropout), then
    attn @ v, and returns it (transformers: its transposed copy). The scores and what is made
    from them before the softmax are consumed inside the call (no backward saves them);
    the softmax lives past it (saved for the backward, or returned as the weights). So:
    the first block freed inside the call is the scores; the first after it still held
    when the call ends, the softmax; the last block, held past the call and made after the
    softmax, the output, and a block between them freed inside the call its copy (attn @ v
    before `.transpose(1, 2).contiguous()`). Blocks kept past the call between the softmax
    and the output (dropout's) stay scores. Returns the outputs and the score blocks so
    decided; a call that shows no such order (nothing freed inside it, no softmax kept
    past it, or no block after the softmax: a function that makes the scores only, or one
    whose locals all die at its return) decides none, and the blocks made before its scores
    (q and k scaled: the math path) are not decided either."""
    n = blocks.height
    output = np.zeros(n, dtype=bool)
    sure = np.zeros(n, dtype=bool)
    free = blocks["free_idx"].to_numpy()
    for call, end in _calls(blocks, under):
        rows = call[scores[call]]
        kept = free[rows] >= end
        if kept.all():
            continue
        first = int(np.argmax(~kept))  # the scores
        later = np.flatnonzero(kept[first + 1:])
        last = len(rows) - 1
        if not len(later) or first + 1 + int(later[0]) >= last or not kept[last]:
            continue
        softmax = first + 1 + int(later[0])
        out = [last, *(i for i in range(softmax + 1, last) if not kept[i])]
        sure[rows[first:]] = True
        sure[rows[out]] = False
        output[rows[out]] = True
    return output, sure


def _calls(blocks: pl.DataFrame, under: np.ndarray) -> list[tuple[np.ndarray, int]]:
    """The attention calls: each run of consecutive allocations (trace order, failed
    requests left out) under the attention function (`under`), as its rows in order and
    the trace index where it ends (the next allocation's; NEVER for the last)."""
    alloc = blocks["alloc_idx"].to_numpy()
    made = np.flatnonzero((alloc >= 0) & (blocks["address"].to_numpy() >= 0))
    order = made[np.argsort(alloc[made], kind="stable")]
    inside = under[order].astype(np.int8)
    edges = np.flatnonzero(np.diff(np.concatenate([[0], inside, [0]])))
    return [(order[start:stop], int(alloc[order[stop]]) if stop < len(order) else NEVER)
            for start, stop in zip(edges[::2], edges[1::2], strict=True)]


def _scores_before_softmax(rule: ScoreRule, blocks: pl.DataFrame, under: np.ndarray,
                           candidates: np.ndarray, outside: np.ndarray,
                           sizes: Mapping[str, Size], hidden: int | None) -> np.ndarray:
    """The score matrices where they are not the largest blocks under the attention function
    (seq below the head dim: [b, heads, s, s] is smaller than the output [b, s, hidden]),
    from one call's order, as torch's `_scaled_dot_product_attention_math` and transformers'
    `eager_attention_forward` write it: q·kᵀ (the scores), its softmax (the same elements:
    its bytes the scores' times one of `rule.softmax_repeats`, fp32 from half under
    autocast), then attn @ v, the output. In each call (`_calls`) of the `candidates`, the
    scores are the first block that is shaped [batch, heads, seq, seq] (its bytes / seq² are
    the batch × heads × a dtype's bytes of `rule.output_bytes`, the heads dividing the
    hidden size read off the weights), is not output-sized (`_output_sized`; tokens × hidden
    × a dtype's bytes), is freed inside the call (consumed: no backward saves them), and
    whose size a later block of the call repeats (the softmax); the blocks of the call
    from the scores on of their bytes times a dtype ratio, the output's size excepted, are
    [batch, heads, seq, seq] too (a mask added, the softmax's half-precision copy, dropout).
    Wherever a call shows no such order, none are taken (today's rule stands)."""
    out = np.zeros(blocks.height, dtype=bool)
    if "seq" not in sizes or not rule.softmax_repeats or not rule.output_bytes:
        return out
    seq = sizes["seq"].recorded
    batch = sizes["batch"].recorded if "batch" in sizes else None
    requested = blocks["requested"].to_numpy().astype(np.int64)
    free = blocks["free_idx"].to_numpy()

    def output_like(size: int) -> bool:
        if hidden and batch:
            return any(size == batch * seq * hidden * e for e in rule.output_bytes)
        return _output_sized(rule, size, outside, hidden)

    def shaped(size: int) -> bool:
        per, rest = divmod(size, (batch or 1) * seq * seq)  # batch × heads × dtype bytes
        if size <= 0 or rest or output_like(size):
            return False
        return any(per % e == 0 and (not hidden or not batch or hidden % (per // e) == 0)
                   for e in rule.output_bytes)

    for call, end in _calls(blocks, under):
        rows = call[candidates[call]]
        sizes_ = requested[rows]
        for i, size in enumerate(sizes_.tolist()):
            if free[rows[i]] >= end or not shaped(size):
                continue
            later = np.flatnonzero(np.isin(sizes_[i + 1:],
                                           [size * r for r in rule.softmax_repeats]))
            if not len(later):
                continue
            ratio = np.isin(sizes_[i:], [size * r for r in rule.dtype_ratios])
            keep = np.array([bool(r) and not output_like(int(b))
                             for r, b in zip(ratio, sizes_[i:].tolist(), strict=True)])
            out[rows[i:][keep]] = True
            break
    return out


def _framed(stack_ids: np.ndarray, distinct: np.ndarray, stacks: Any) -> np.ndarray:
    """Which blocks have a Python frame (a size such a block makes outside the attention
    function is an activation's too)."""
    return np.isin(stack_ids, [int(i) for i in distinct if _frames(stacks.stack(int(i)))])


def decide(blocks: pl.DataFrame, stacks: Any, sizes: Mapping[str, Size],
           rules: ScalingRules | None = None) -> Growth:
    """The growth of each row of `blocks` (alloc_idx, address, requested, stack_id, stream,
    family, free_idx, site: `window_blocks`) from the rules and the sizes themselves.
    `stacks`: a stack table with `.stack(stack_id)` (frames innermost first). Columns
    throughout: per-row Python only over distinct stacks."""
    rules = rules or load_rules()
    sizes, sized_for = identify_seq(blocks, sizes, rules)
    n = blocks.height
    effective = blocks["family"].fill_null("")
    prefix = pl.Series([""] * n, dtype=pl.Utf8)
    for family, (mirrored, unmatched, read_by) in rules.mirrors.items():
        rows = _unmirrored(blocks, family, mirrored, read_by)
        effective = effective.scatter(rows, unmatched)
        prefix = prefix.scatter(rows, f"more {family} blocks of its size than "
                                      f"{' or '.join(mirrored)} blocks, and among the "
                                      "shortest-lived: ")
    table = pl.DataFrame({"_family": list(rules.families),
                          "e_batch": [float(r[0]) for r in rules.families.values()],
                          "e_seq": [float(r[1]) for r in rules.families.values()],
                          "_why": [r[2] for r in rules.families.values()]},
                         schema={"_family": pl.Utf8, "e_batch": pl.Float64,
                                 "e_seq": pl.Float64, "_why": pl.Utf8})
    ruled = (pl.DataFrame({"_family": effective, "_prefix": prefix})
             .join(table, on="_family", how="left", maintain_order="left"))
    known = ruled["e_batch"].is_not_null().to_numpy()
    e_b = ruled["e_batch"].fill_null(0.0).to_numpy().copy()
    e_s = ruled["e_seq"].fill_null(0.0).to_numpy().copy()
    unruled = pl.when(pl.col("_family") == "").then(pl.lit("unknown")).otherwise(
        pl.col("_family"))
    said = ruled.select(
        pl.when(pl.col("_why").is_not_null()).then(pl.col("_prefix") + pl.col("_why"))
        .otherwise(pl.format("family {} has no scaling rule: held at its recorded size",
                             unruled)))
    why = said.to_series().to_numpy().astype(object)
    how = np.where(known, FAMILY, UNCLASSIFIED).astype(object)
    grows = known & ((e_b > 0) | (e_s > 0))
    stack_ids = blocks["stack_id"].to_numpy()
    requested = blocks["requested"].to_numpy()
    # a family with no rule, made in the window: its blocks may be scores or activations,
    # which only their sizes can say (model state is held before the window or ruled)
    open_ = ~known & (blocks["alloc_idx"].to_numpy() >= 0)
    assumptions: list[str] = []
    distinct = np.unique(stack_ids)
    hidden = hidden_size(blocks)
    taken = np.zeros(n, dtype=bool)  # a block an earlier rule took is not taken again
    for rule in rules.scores:
        scores, hits, coincide = score_blocks(rule, stack_ids, requested, grows | open_,
                                              stacks, distinct, hidden)
        scores &= ~taken
        under = np.isin(stack_ids, list(hits))
        small = False
        if not scores.any() and hits:  # the largest block is no score matrix: seq < head dim?
            framed = _framed(stack_ids, distinct, stacks)
            scores = _scores_before_softmax(rule, blocks, under, (grows | open_) & ~taken,
                                            requested[framed & ~under & (grows | open_)],
                                            sizes, hidden)
            small = bool(scores.any())
        if not scores.any():
            continue
        output = unsure = np.zeros(n, dtype=bool)
        if coincide:  # the output is told apart by its place in the call, or not at all
            # with the narrower blocks of the call (half-precision scores and output beside
            # an fp32 softmax): those a call decides are scores or the output, the others
            # are left to the shapes (`_score_shaped`)
            narrower = _narrower(rule, requested, under & (grows | open_) & ~taken,
                                 int(requested[scores].max()))
            output, sure = (_outputs_after_softmax(blocks, scores | narrower, under)
                            if rule.output_after_softmax else (output, output))
            if coincide == COINCIDE_SOFTMAX and not output.any():
                continue  # no call shows an unfused attention's order: a fused one's output
            scores = (scores & ~output) | (narrower & sure)
            unsure = scores & ~sure
            taken |= output
        e_b[scores], e_s[scores] = rule.batch, rule.seq
        how[scores] = SCORES
        sites = blocks["site"].filter(pl.Series(scores)).unique(maintain_order=True).to_list()
        fn = hits[int(stack_ids[scores][0])]
        why[scores] = rule.assumption.format(site=", ".join(sites[:3]), function=fn)
        more = f" (+{len(sites) - 3} more)" if len(sites) > 3 else ""
        assumptions.append(rule.assumption.format(site=", ".join(sites[:3]) + more,
                                                  function=fn)
                           + f"; the smaller blocks under {fn} follow their family")
        if small:
            assumptions.append(
                f"the largest blocks under {fn} are no score matrices (seq is below the head "
                "dimension: [batch, heads, seq, seq] is smaller than the output [batch, seq, "
                "hidden]); in each call the scores are the first block shaped batch × heads "
                "× seq² that is consumed inside it and whose size a later block repeats (the "
                f"softmax): {int(scores.sum()):,} blocks grow with seq², the output and q, k, "
                "v as their family")
        if output.any() and coincide == COINCIDE_SOFTMAX:
            wide = int(requested[scores].max())
            assumptions.append(
                f"the largest block under {fn}, made at one line, has the bytes of an output "
                "[batch, seq, hidden], but blocks of its bytes times a dtype ratio below one "
                "are made around it (a softmax in fp32 beside half-precision scores and "
                "output, as autocast runs them; seq is the head dimension): in each call the "
                "first is consumed inside it (the scores), the wide one is kept past it (the "
                "softmax), so the block made last, after it, is the output: "
                f"{int(output.sum()):,} blocks grow as their family, not with seq², and "
                f"{int((scores & (requested == wide)).sum()):,} softmax blocks of {wide:,} "
                "bytes with seq²")
        elif output.any():
            assumptions.append(
                f"the scores under {fn} have the bytes of its output [batch, seq, hidden] "
                "(seq is the head dimension); in each call the scores are consumed inside it "
                "and a later block of their size is kept past it (the softmax: saved for the "
                "backward, or returned), so the block made last, after it, is the output "
                "(attn @ v, or its transposed copy with the attn @ v it was copied from, "
                "freed inside the call): "
                f"{int(output.sum()):,} blocks grow as their family, not with seq²")
        if unsure.any():
            how[unsure] = AMBIGUOUS
            assumptions.append(
                f"the scores under {fn} have the bytes of its output [batch, seq, hidden] "
                "(the hidden size read off the weights, or off the activations where no "
                "weights are named: seq is the head dimension, or a multiple of it by the "
                "dtypes' ratio); neither the sizes nor the order and "
                f"lifetimes within a call tell which of {int(unsure.sum()):,} blocks are "
                "which, so they are grown with seq² (an upper bound)")
        framed = _framed(stack_ids, distinct, stacks)
        shaped = _score_shaped(rule, requested, scores,
                               (grows | open_) & ~scores & ~taken, under, framed, sizes, hidden)
        taken |= scores | shaped
        if shaped.any():
            e_b[shaped], e_s[shaped] = rule.batch, rule.seq
            how[shaped] = SCORES
            why[shaped] = rule.shaped.format(function=fn)
            assumptions.append(rule.shaped.format(function=fn) + f": {int(shaped.sum()):,} "
                               "blocks made elsewhere (their gradients, a mask, a copy in "
                               "another dtype)")
    derived = open_ & (how == UNCLASSIFIED)
    if derived.any():
        e_b[derived], e_s[derived], how[derived], why[derived] = _by_factors(
            blocks.filter(pl.Series(derived)), sizes)
    grows = grows | (open_ & ((e_b > 0) | (e_s > 0)))
    # the size itself: a [batch, seq, ...] block divides by batch × seq
    need = np.ones(n, dtype=np.float64)
    for knob, e in (("batch", e_b), ("seq", e_s)):
        if knob in sizes:
            need *= np.power(float(sizes[knob].recorded), e)
    bad = grows & (np.mod(requested, need) != 0)
    if bad.any():
        why[bad] = _indivisible(blocks.filter(pl.Series(bad)), e_b[bad], e_s[bad], sizes)
    padded, pad_rows = _padded(requested, bad & (e_s == 1), e_b, sizes,
                                          rules.padding, rules.seq_window)
    bad &= ~pad_rows
    e_b[bad] = 0
    e_s[bad] = 0
    how[bad] = INDIVISIBLE
    how[pad_rows] = PADDED
    if pad_rows.any():
        why[pad_rows] = rules.padding.block.format(padded=padded,
                                                   seq=sizes["seq"].recorded)
    chunk = loss_chunks(blocks, rules.loss_families, rules.checkpoint_backward)
    if chunk.any():
        e_b[chunk], e_s[chunk], how[chunk], why[chunk] = 0, 0, LOSS_CHUNK, rules.loss_why
    table = blocks.select("alloc_idx", "address", "requested", "stack_id", "stream",
                          "family", "site", "code_site", "free_idx").with_columns(
        pl.Series("e_batch", e_b), pl.Series("e_seq", e_s),
        pl.Series("how", how.tolist(), dtype=pl.Utf8),
        pl.Series("why", why.tolist(), dtype=pl.Utf8),
        pl.Series("pad", np.where(pad_rows, padded, 0).astype(np.int64)))
    return Growth(table, dict(sizes), tuple(assumptions), sized_for=sized_for,
                  padded=padded)


def loss_chunks(blocks: pl.DataFrame, families: Sequence[str], backward: Sequence[str]
                ) -> np.ndarray:
    """The rows of a loss's vocabulary-sized blocks (`families`, and blocks of their bytes)
    made in the window when every one is freed before the backward starts (the first block
    of a `backward` family made after the last of them), the loss's own value aside: a
    whole loss keeps its log-softmax for the backward (or, written by hand, what it saved),
    a chunked or fused one (Liger's fused linear cross-entropy) frees each chunk in the
    forward, so its blocks may be one chunk of a fixed size or the whole."""
    n = blocks.height
    alloc = blocks["alloc_idx"].to_numpy()
    fam = blocks["family"].fill_null("").to_numpy()
    vocab = (alloc >= 0) & np.isin(fam, list(families))
    if not vocab.any() or "free_idx" not in blocks.columns:
        return np.zeros(n, dtype=bool)
    req = blocks["requested"].to_numpy()
    # the largest of them (within a dtype ratio of four) are the vocabulary's: a
    # [tokens, hidden] block the attribution named logits is not
    big = vocab & (req * 4 >= req[vocab].max())
    free = blocks["free_idx"].fill_null(NEVER).to_numpy()
    # a block of their bytes alive when the first is made is one too (the lm_head's output,
    # named for its op, before the log-softmax named logits)
    first = int(alloc[big].min())
    same = (alloc >= 0) & np.isin(req, req[big])
    first = int(alloc[same & (free >= first)].min())
    vocab = (alloc >= first) & (vocab | same)
    after = (alloc > int(alloc[big].max())) & np.isin(fam, list(backward))
    if not after.any():
        return np.zeros(n, dtype=bool)
    start = int(alloc[after].min())
    # none of them, but the loss's own value (a scalar, or one per token), kept for the
    # backward: a hand-written whole loss frees its temporaries and keeps what it saved
    kept = vocab & (alloc < start) & (free >= start) & (req * 64 >= req[big].max())
    if kept.any() or not bool((free[big] < start).all()):
        return np.zeros(n, dtype=bool)
    return vocab & (alloc < start) & (free < start)


def _padded(requested: np.ndarray, open_: np.ndarray, e_b: np.ndarray,
            sizes: Mapping[str, Size], padding: Padding, window: float
            ) -> tuple[int, np.ndarray]:
    """The padded token count P the blocks `open_` (linear in seq, not dividing by it) are
    sized for and the blocks sized for it ((0, none) when none): a
    count above the seq, within `window` of it and a multiple of `padding.multiple`, that
    divides (times the batch where it grows with it) the most of their bytes, at least
    `padding.most` of them (the nearest on a tie). A job that pads its packed tokens to a
    multiple (slime's get_batch: tp × 128) sizes its activations for the padded count."""
    none = np.zeros(len(requested), dtype=bool)
    size = sizes.get("seq")
    if size is None or not open_.any() or not padding.text:
        return 0, none
    seq = size.recorded
    step = padding.multiple
    cand = np.arange((seq // step + 1) * step, seq + seq * window + 1, step, dtype=np.int64)
    if not len(cand):
        return 0, none
    per = np.ones(len(requested), dtype=np.int64)
    if "batch" in sizes:
        per = np.power(sizes["batch"].recorded, e_b.astype(np.int64))
    req = requested.astype(np.int64)
    hit = open_[None, :] & (req[None, :] % (per[None, :] * cand[:, None]) == 0)
    covered = (hit * req[None, :]).sum(1)
    best = int(np.argmax(covered))  # the first, the nearest, on a tie
    total = int(req[open_].sum())
    if not covered[best] or covered[best] < padding.most * total:
        return 0, none
    return int(cand[best]), hit[best]


def identify_seq(blocks: pl.DataFrame, sizes: Mapping[str, Size], rules: ScalingRules
                 ) -> tuple[dict[str, Size], str]:
    """`sizes` with the recorded seq the blocks' sizes were made at, and why in words ("" when
    it is the stated one). A number that divides at least `rules.seq_chance` of the model
    state's bytes divides sizes by chance (8,192 = 2^13 divides most weights' bytes) and is
    no evidence; where it leaves `rules.seq_least` of the bytes of blocks whose family grows
    with seq undivided, the number within `rules.seq_window` of it that divides the most of
    them (at least `rules.seq_least` of them among those the stated one does not divide),
    and is itself evidence, is taken, and said."""
    out = dict(sizes)
    size = sizes.get("seq")
    if size is None or blocks.is_empty():
        return out, ""
    rule = {f: (b, q) for f, (b, q, _) in rules.families.items()}
    family = blocks["family"].fill_null("").to_list()
    req = blocks["requested"].to_numpy().astype(np.int64)
    state = np.array([rule.get(f) == (0, 0) for f in family])
    grows = np.array([rule.get(f, (0, 0))[1] > 0 for f in family])
    state_bytes = int(req[state].sum())

    def chance(d: np.ndarray) -> np.ndarray:
        """Per candidate, the share of the model state's bytes it divides."""
        if not state_bytes:
            return np.zeros(len(d))
        return ((req[state][None, :] % d[:, None] == 0) * req[state][None, :]).sum(1) \
            / state_bytes

    stated = size.recorded
    said = float(chance(np.array([stated]))[0])
    if said < rules.seq_chance or not grows.any():
        return out, ""
    span = max(1, int(stated * rules.seq_window))
    cand = np.arange(max(1, stated - span), stated + span + 1, dtype=np.int64)
    cand = cand[cand != stated]
    sizes_g, counts = np.unique(req[grows], return_counts=True)
    weight = (sizes_g * counts)[None, :]
    total = int(req[grows].sum())
    # the stated seq's own sizes are the evidence against it: bytes it does not divide
    # (a number near it, a product of the hidden size's and the batch's factors, divides
    # sizes made at the stated seq too: 255 = 3 × 5 × 17 divides [6, 256, 1360])
    undivided = sizes_g % stated != 0
    if int((undivided * weight).sum()) < rules.seq_least * total:
        return out, ""
    divides = (sizes_g[None, :] % cand[:, None] == 0) * weight
    covered = divides.sum(1)
    beyond = (divides * undivided[None, :]).sum(1)
    ok = (beyond >= rules.seq_least * total) & (chance(cand) < rules.seq_chance)
    note = (f"{stated:,} also divides {said:.0%} of the model state's bytes (weights, "
            "optimizer state), so a size dividing by it says nothing about seq")
    if not ok.any():
        return out, (f"The sizes do not say which seq they were made at: {note}, and no "
                     f"number within {rules.seq_window:.0%} of it divides "
                     f"{rules.seq_least:.0%} of the activations' bytes and less than "
                     f"{rules.seq_chance:.0%} of the model state's: give the seq the job ran "
                     "at, or --calibrate with a capture at another seq.")
    best = np.flatnonzero(ok)[np.lexsort((np.abs(cand[ok] - stated), -covered[ok]))[0]]
    found, grown = int(cand[best]), int(covered[best])
    out["seq"] = Size("seq", found, size.target)
    return out, (f"The activations are sized for seq={found:,}, not {stated:,}: "
                 f"{grown / total:.0%} of the bytes of blocks whose family grows with seq "
                 f"divide by {found:,}; {note}. Scaled from {found:,}.")


def _score_shaped(rule: ScoreRule, requested: np.ndarray, scores: np.ndarray,
                  candidates: np.ndarray, under: np.ndarray, framed: np.ndarray,
                  sizes: Mapping[str, Size], hidden: int | None = None) -> np.ndarray:
    """Among `candidates`, the blocks shaped like the score matrices found under an attention
    function (`scores`; `under`: made under that function): bytes / seq^e the scores' own
    batch × heads × dtype bytes times one of the rule's dtype ratios (the same dtype: their
    gradients in backward; another: a bool mask, a bf16 copy), wherever made, for a size
    that no block with Python frames (`framed`) makes outside the attention function: one
    that does says the size is an activation's too (at seq = ffn / heads an fp32
    [batch, seq, ffn] has the bytes of [batch, heads, seq, seq]), and then none of that size
    is taken for scores. Nor is a block under the function that has the bytes of its output
    [batch, seq, hidden] (`_output_sized`): at seq = 2 × head dim under autocast the fp32
    softmax is four times the bf16 output, the ratio of fp32 scores to a bool mask, and no
    other block of the output's bytes need be made (hidden: as for `score_blocks`)."""
    out = np.zeros(len(requested), dtype=bool)
    if "seq" not in sizes:
        return out
    square = sizes["seq"].recorded ** rule.seq
    found = requested[scores]
    quotients = {int(q) for q in found[found % square == 0] // square}
    whole = candidates & (requested % square == 0)
    per = requested.astype(np.float64) / square
    outside = requested[candidates & framed & ~under]
    elsewhere = set(outside.tolist())
    for q in quotients:
        for r in rule.dtype_ratios:
            hit = whole & (per == q * r)
            if not hit.any() or int(requested[hit][0]) in elsewhere:
                continue
            if _output_sized(rule, int(requested[hit][0]), outside, hidden):
                hit &= ~under  # the attention's output, not a copy of its scores
            out |= hit
    return out


def _by_factors(rows: pl.DataFrame, sizes: Mapping[str, Size]
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Exponents, how and why for blocks of no rule made in the window, from their sizes: a
    multiple of the stated seq (batch) is [.., seq, ..] and grows linearly in it; a size
    that is not is held fixed. Only the stated sizes are known, so a block whose size is a
    multiple by coincidence (a weight-shaped temporary) would grow too: the share so derived
    is printed."""
    req = rows["requested"].to_numpy()
    e = {}
    for knob in KNOBS:
        e[knob] = (np.mod(req, sizes[knob].recorded) == 0).astype(np.float64) \
            if knob in sizes else np.zeros(len(req))
    grows = (e["batch"] > 0) | (e["seq"] > 0)
    family = rows["family"].fill_null("unknown").to_numpy().astype(object)
    said = [k for k in KNOBS if k in sizes]
    how = np.where(grows, FACTORED, UNCLASSIFIED).astype(object)
    why = np.array([
        (f"family {f or 'unknown'} has no scaling rule; its size is a multiple of "
         + " × ".join(f"{k} {sizes[k].recorded:,}" for k in said if e[k][i] > 0)
         + ": grown linearly in it, as an activation [.., " + ", ".join(
             k for k in said if e[k][i] > 0) + ", ..]")
        if grows[i] else
        f"family {f or 'unknown'} has no scaling rule and its size is a multiple of no "
        "stated size: held at its recorded size"
        for i, f in enumerate(family)], dtype=object)
    return e["batch"], e["seq"], how, why


def _indivisible(rows: pl.DataFrame, e_b: np.ndarray, e_s: np.ndarray,
                 sizes: Mapping[str, Size]) -> np.ndarray:
    """Why each of `rows` is held fixed: its bytes are not a multiple of the stated sizes
    its exponents say it must divide by."""
    parts = []
    for knob, e in (("batch", e_b), ("seq", e_s)):
        if knob in sizes:
            name = pl.Series(np.where(e == 2, f"{knob}² {sizes[knob].recorded}",
                                      np.where(e > 0, f"{knob} {sizes[knob].recorded}", "")))
            parts.append(name)
    said = pl.DataFrame({f"_{i}": p for i, p in enumerate(parts)}).select(
        pl.concat_str([pl.col(f"_{i}") for i in range(len(parts))], separator=" × ")
        .str.strip_chars(" ×").str.replace(" ×  × ", " × ", literal=True)).to_series()
    return (rows.select(pl.format("{} bytes is not a multiple of {} as a block of {} must be: "
                                  "held at its recorded size", pl.col("requested"),
                                  pl.lit(said), pl.col("family")))
            .to_series().to_numpy().astype(object))


def call_paths(blocks: pl.DataFrame, stacks: Any) -> pl.DataFrame:
    """`blocks` (alloc_idx ≥ 0, in trace order) with `path` (the stack's Python frames as one
    text) and `nth` (the how-manyth allocation of that path): the key that pairs an
    allocation with its counterpart in a capture of the same job at another size."""
    ids = blocks["stack_id"].unique().to_list()
    text = {sid: "\n".join(f"{f}:{n}:{line}" for f, n, line in _frames(stacks.stack(sid)))
            for sid in ids}
    framed = blocks.filter(pl.col("alloc_idx") >= 0).sort("alloc_idx")
    return framed.with_columns(
        pl.col("stack_id").replace_strict(text, return_dtype=pl.Utf8).alias("path"),
    ).filter(pl.col("path") != "").with_columns(
        pl.int_range(pl.len()).over("path").alias("nth"))


def calibrate(growth: Growth, mine: pl.DataFrame, other: pl.DataFrame, knob: str,
              other_size: int) -> Growth:
    """`growth` with the exponent of `knob` measured against a capture of the same job at
    `other_size` (`mine` / `other`: `call_paths` of each): each allocation paired with the
    same path's same-numbered allocation there; the exponent log(ratio) / log(size ratio),
    a whole number when within SNAP of one. A path whose count of allocations differs
    between the two keeps its rule (the two runs did not make the same calls there)."""
    size = growth.sizes[knob]
    if other_size == size.recorded:
        raise ScaleError(f"the other capture's {knob} is the recorded one ({other_size}): "
                         "nothing to measure")
    counts = (mine.group_by("path").len().join(other.group_by("path").len(), on="path",
                                               suffix="_other"))
    same = counts.filter(pl.col("len") == pl.col("len_other"))["path"]
    pairs = (mine.filter(pl.col("path").is_in(same.implode()))
             .join(other.select("path", "nth", pl.col("requested").alias("requested_other")),
                   on=["path", "nth"]).filter((pl.col("requested") > 0)
                                              & (pl.col("requested_other") > 0)))
    log_step = math.log(other_size / size.recorded)
    e = np.log(pairs["requested_other"].to_numpy() / pairs["requested"].to_numpy()) / log_step
    e = np.where(np.abs(e - np.round(e)) < SNAP, np.round(e), e)
    measured = pairs.select("alloc_idx").with_columns(pl.Series("_e", e))
    table = growth.blocks.join(measured, on="alloc_idx", how="left")
    hit = table["_e"].is_not_null()
    table = table.with_columns(
        pl.when(hit).then(pl.col("_e")).otherwise(pl.col(f"e_{knob}")).alias(f"e_{knob}"),
        pl.when(hit).then(pl.lit(CALIBRATED)).otherwise(pl.col("how")).alias("how"),
        *([pl.when(hit).then(0).otherwise(pl.col("pad")).alias("pad")]
          if "pad" in growth.blocks.columns else []),
        pl.when(hit).then(pl.format("measured against the capture at {}={}: bytes × ({}'/{})^"
                                    "{}", pl.lit(knob), pl.lit(other_size), pl.lit(knob),
                                    pl.lit(knob), pl.col("_e").round(2)))
        .otherwise(pl.col("why")).alias("why")).drop("_e")
    paths = mine["path"].n_unique()
    words = (f"{int(hit.sum()):,} allocations on {pairs['path'].n_unique():,} of {paths:,} "
             f"call paths measured against the capture at {knob}={other_size}"
             + (f"; {paths - same.len():,} paths allocate a different number of times there "
                "and keep their rule" if paths > same.len() else ""))
    return Growth(table, growth.sizes, growth.assumptions, words, growth.sized_for,
                  growth.padded)


#: How-values by how sure their growth is: given by a rule, a shape or a second capture;
#: assumed from the size alone (no rule); not known, held at the recorded size. `shares`
#: adds "ambiguous": blocks of a shape two rules give (scores or the attention's output).
SURE = {"derived": (FAMILY, SCORES, CALIBRATED, CHUNKS), "assumed": (FACTORED, PADDED),
        "held fixed": HELD_HOWS}


@dataclass(frozen=True)
class Shares:
    """The bytes live at the recorded peak (`peak`: the blocks' requested bytes, summed at
    the trace index where their total is largest), by how sure their growth is (`SURE`)."""

    peak: int
    by: Mapping[str, int]

    def share(self, kind: str) -> float:
        return self.by.get(kind, 0) / self.peak if self.peak else 0.0


def shares(growth: Growth) -> Shares:
    """The recorded peak's bytes by how sure their growth is: the blocks (held before the
    window from its start; the failed requests left out) swept in trace order, and those
    live where the sum is largest counted by `SURE`."""
    b = growth.blocks.filter((pl.col("alloc_idx") < 0) | (pl.col("address") >= 0))
    if b.is_empty():
        return Shares(0, {})
    start = b["alloc_idx"].to_numpy().clip(-1, None)
    end = b["free_idx"].to_numpy()
    req = b["requested"].to_numpy().astype(np.int64)
    t = np.concatenate([start, end])
    d = np.concatenate([req, -req])
    order = np.lexsort((d, t))  # at one index, a free before an allocation
    live = np.cumsum(d[order])
    top = int(np.argmax(live))
    at = int(t[order][top])
    alive = (start <= at) & (end > at)
    how = b["how"].to_numpy()
    by = {kind: int(req[alive & np.isin(how, list(hows))].sum()) for kind, hows in SURE.items()}
    # blocks of a shape two rules give (`AMBIGUOUS`): the most of them live at once, wherever
    # that is (a forward's scores are freed before a training step's recorded peak, and
    # grown with seq² they may make the peak at the size asked)
    amb = np.concatenate([how, how]) == AMBIGUOUS
    if amb.any():
        o = np.lexsort((d[amb], t[amb]))
        by["ambiguous"] = int(np.cumsum(d[amb][o]).max())
    # a loss's blocks held (`loss_chunks`) are freed before a training step's recorded peak:
    # the most of them live at once count as held, wherever that is
    lc = np.concatenate([how, how]) == LOSS_CHUNK
    if lc.any():
        o = np.lexsort((d[lc], t[lc]))
        most = int(np.cumsum(d[lc][o]).max())
        at_peak = int(req[alive & (how == LOSS_CHUNK)].sum())
        by["held fixed"] = by.get("held fixed", 0) + max(0, most - at_peak)
    return Shares(int(req[alive].sum()), by)
