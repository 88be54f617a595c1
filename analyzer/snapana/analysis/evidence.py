"""What a capture shows about the job as a whole, decided once: its workload with the evidence
that decided it, the frameworks that own each family's blocks (their own frames), the facts a
knob's preconditions name (an optimizer, a process group, an engine ...), the allocator
settings the capture records and the bytes `empty_cache()` could give back.

Every section of a report reads these from one `JobEvidence`, so no two can disagree. The
facts and the workload each speaks for are data (``attribution/evidence.toml``); this module
only matches them.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import polars as pl

from snapana.analysis.attribution import kept_outputs, kv_pairs, state_copies
from snapana.analysis.attribution.engine import RuleSet, builtin_packs, markers_of
from snapana.analysis.attribution.facts import (
    AUTOGRAD_RAN,
    FREE_SEGMENTS,
    HALF_PRECISION_WEIGHTS,
    LAYERED_ACTIVATIONS,
    OPTIMIZER_STATE,
    OWN_OPTIMIZER_STEP,
    RETURNED_KV_CACHE,
    SCOPED_ELSEWHERE,
    SCORE_MATRICES,
    SEVERAL_DEVICES,
    STRANDED_CACHE,
    FactPattern,
    fact_limits,
    fact_specs,
    frame_place,
    half_weights,
    is_library,
    seen_facts,
    shown_at,
    workload_words,
)
from snapana.analysis.attribution.families import forward_only_phases, workload_marks
from snapana.analysis.attribution.stack import import_path
from snapana.analysis.scaling import held_scores
from snapana.caching_allocator import ACTIVE_ALLOCATED, ALLOCATOR_DEFAULTS
from snapana.model import Capture, Frame, is_python_file
from snapana.units import fmt_bytes

Answer = Literal["training", "inference", "undetermined"]


@dataclass(frozen=True)
class Workload:
    """What the job was doing in the recorded window: `answer` None when nothing in the
    capture speaks for either (no frames, no family only a backward makes)."""

    answer: Answer | None
    evidence: tuple[str, ...]

    @property
    def sentence(self) -> str:
        """The one statement every format makes about the workload."""
        why = "; ".join(self.evidence)
        if self.answer is None:
            return ("Workload not determined: the capture holds no frames or blocks that say "
                    "whether it trains.")
        if self.answer == "undetermined":
            return f"Whether this job trains is not recorded ({why})."
        return f"Workload: {self.answer} ({why})."


@dataclass(frozen=True)
class JobEvidence:
    workload: Workload
    #: fact id -> where it was seen ("torch/optim/adamw.py:_multi_tensor_adamw")
    facts: Mapping[str, str]
    #: family -> framework -> a frame of one of that family's blocks that shows it
    owners: Mapping[str, Mapping[str, str]]
    #: the allocator settings the capture records (None: the layout does not record them)
    settings: Mapping[str, Any] | None
    #: expandable segments in use: the settings say so, or a segment is expandable
    expandable: bool
    #: bytes in segments that hold no live block at the moment, per pool ("0,0": default)
    free_segment_bytes: Mapping[str, int] = field(default_factory=dict)
    #: frameworks whose packs name markers: only they can own a block by its frames (a pack
    #: without markers, such as the host pack, applies to its kind of capture as a whole)
    marked: frozenset[str] = frozenset()
    #: fact id -> the bytes held at the moment that the fact is about (score_matrices: the
    #: score matrices' bytes): what a knob requiring it removes, by which knobs are ranked
    fact_bytes: Mapping[str, int] = field(default_factory=dict)

    def is_set(self, key: str) -> bool:
        """An allocator setting is on (not its default: False, 0, -1, empty, all zeros)."""
        if key == "expandable_segments" and self.expandable:
            return True
        return self.settings is not None and _is_on(self.settings.get(key), key)

    @property
    def releasable_bytes(self) -> int:
        return sum(self.free_segment_bytes.values())

    def settings_line(self) -> str:
        """The recorded allocator settings that differ from PyTorch's defaults, one line."""
        if self.settings is None:
            return ("allocator settings: not recorded (older snapshot layout)" +
                    ("; segments are expandable" if self.expandable else ""))
        on = [f"{k}={_show(v)}" for k, v in self.settings.items()
              if k != "PYTORCH_CUDA_ALLOC_CONF" and _is_on(v, k)]
        conf = self.settings.get("PYTORCH_CUDA_ALLOC_CONF")
        text = (f"allocator settings: PYTORCH_CUDA_ALLOC_CONF={conf!r}" if conf
                else "allocator settings: PYTORCH_CUDA_ALLOC_CONF not set")
        return text + ("; " + ", ".join(on) if on else "; all at PyTorch's defaults")


def _is_on(value: Any, key: str = "") -> bool:
    """A setting differs from PyTorch's default (off, 0, -1 / SIZE_MAX, or
    `ALLOCATOR_DEFAULTS`)."""
    if key in ALLOCATOR_DEFAULTS and value == ALLOCATOR_DEFAULTS[key]:
        return False
    if isinstance(value, Mapping):
        return any(_is_on(v) for v in value.values())
    if isinstance(value, bool):
        return value
    if isinstance(value, int | float):
        return value not in (0, -1) and value < 2**63
    return bool(value)


def _show(value: Any) -> str:
    if isinstance(value, Mapping):
        return ",".join(f"{k}:{v}" for k, v in value.items() if _is_on(v))
    return str(value)


# ----- the workload ---------------------------------------------------------------------

def decide_workload(facts: Mapping[str, str], marks: Mapping[str, tuple[str, str]],
                    framed: bool) -> Workload:
    """Training when anything only a training step makes shows (an optimizer, a parameter's
    gradients, a training driver); else inference when an inference driver or engine shows;
    else undetermined: where autograd ran (a backward with no parameter gradient or optimizer
    is guidance, an attack or a benchmark as often as training), or where the capture holds
    frames (a forward, trained or not); else no answer. `marks`: families / phases held ->
    (the workload they speak for, a description)."""
    specs = {f.id: f for f in fact_specs()}
    said: dict[str, list[str]] = {"training": [], "inference": [], "autograd": []}
    weak: dict[str, list[str]] = {"training": [], "inference": [], "autograd": []}
    for fact, where in facts.items():
        spec = specs.get(fact)
        if spec is None or spec.only_with and not facts.keys() & set(spec.only_with) \
                or facts.keys() & set(spec.unless_with):
            continue
        to = weak if spec.weak else said
        # one place is said once, by the first fact that names it (two facts can share an
        # annotation: a torch.optim step is also an optimizer step)
        if spec.says in to and not any(s.endswith(f": {where}") for s in to[spec.says]):
            to[spec.says].append(f"{spec.words}: {where}")
    for says, what in marks.values():
        said[says].append(what)
    backed = bool(said["autograd"])  # a backward ran (not only a forward kept its graph)
    if not any(said.values()):  # only the lifetimes speak
        said = weak
    if said["training"]:
        return Workload("training", tuple(said["training"][:4] + said["autograd"][:1]))
    if said["inference"]:
        return Workload("inference", tuple(said["inference"][:3] + said["autograd"][:1]))
    if said["autograd"]:
        return Workload("undetermined", (said["autograd"][0],
                                         *([workload_words()["autograd_only"]] if backed
                                           else [])))
    if framed:
        return Workload("undetermined", (
            "no backward, optimizer, gradient or training / inference driver in the frames",
            *([facts[SCOPED_ELSEWHERE.id]] if SCOPED_ELSEWHERE.id in facts else [])))
    return Workload(None, ())


#: The phases of the stacks that freed blocks at the given event indices (None where the
#: stack has no frames): `Attributor.free_phases`.
FreePhases = Callable[[np.ndarray], np.ndarray]


def forward_retention(lifetimes: pl.DataFrame | None, n_events: int,
                      free_phases: FreePhases | None = None) -> dict[str, str]:
    """The weak facts of a recorded forward: did it keep what it allocated (autograd saving
    outputs for a backward) or free each layer's tensors within the layer (no graph)? By the
    share of its bytes that live long (`fact_limits`: how long, how many, how much). A graph
    it kept and the window then dropped with no backward (`_graph_dropped`) was never used."""
    if lifetimes is None or lifetimes.is_empty():
        return {}
    lim = fact_limits()
    fwd = lifetimes.filter((pl.col("phase") == "forward") & (pl.col("alloc_idx") >= 0))
    total = int(fwd["size"].sum())
    if fwd.height < lim["forward_allocations"] or not total:
        return {}
    freed = pl.col("free_req_idx")
    end = pl.when(freed.is_null() | (freed < 0)).then(n_events).otherwise(freed)
    long = fwd.filter(end - pl.col("alloc_idx") >= lim["long_life_events"])
    share = int(long["size"].sum()) / total
    said = (f"{share:.0%} of the bytes of {fwd.height} forward allocations lived longer than "
            f"{int(lim['long_life_events'])} events")
    if share >= lim["kept_share"]:
        return {"forward_outputs_kept": said,
                **_graph_dropped(lifetimes, long, n_events, free_phases)}
    if fwd.height >= lim["freed_allocations"] and share <= lim["freed_share_max"]:
        return {"forward_outputs_freed": said}
    return {}


def _graph_dropped(lifetimes: pl.DataFrame, kept: pl.DataFrame, n_events: int,
                   free_phases: FreePhases | None) -> dict[str, str]:
    """`forward_graph_dropped` where the window runs no backward and no optimizer step, and
    stacks with frames (not the autograd thread's, no backward's) freed most of the bytes the
    forward `kept` within the window: autograd saved them for a backward that never came."""
    if free_phases is None or kept.is_empty() or lifetimes["phase"].is_in(
            ["backward", "optimizer"]).any():
        return {}
    at = kept["free_req_idx"].fill_null(-1).to_numpy().astype(np.int64)
    inside = (at >= 0) & (at < n_events)
    by_frames = np.zeros(at.size, dtype=bool)  # freed by a stack with frames
    if inside.any():
        by_frames[inside] = np.not_equal(free_phases(at[inside]),
                                         np.array(None, dtype=object))
    size = kept["size"].to_numpy()
    share = int(size[by_frames].sum()) / int(size.sum())
    if share < fact_limits()["dropped_share"]:
        return {}
    return {"forward_graph_dropped": (
        f"{share:.0%} of the bytes the forward kept ({fmt_bytes(int(size.sum()))}) were freed "
        "in the window by stacks with frames (none a backward's), and no backward or optimizer "
        "step ran")}


def _workload_marks(held: pl.DataFrame | None, lifetimes: pl.DataFrame | None,
                    n_events: int) -> dict[str, tuple[str, str]]:
    """The families and phases that speak for a workload: id -> (what they say, a
    description). A family held at the moment is described by what is held; one seen only
    over the window by how many blocks it made and the most of them live at once (their
    sum over the window can exceed the device: a gradient freed and made again each step)."""
    families, phases = workload_marks()
    forward_only = forward_only_phases()
    out: dict[str, tuple[str, str]] = {}
    for table, over_window in ((held, False), (lifetimes, True)):
        if table is None or table.is_empty():
            continue
        if "phase" in table.columns and forward_only:  # made with no backward to follow
            table = table.filter(~pl.col("phase").is_in(list(forward_only))
                                 | pl.col("phase").is_null())
        for fam, says in sorted(families.items()):
            got = table.filter(pl.col("family") == fam)
            if got.height and fam not in out:
                blocks = f"{got.height} {fam} block{'s' if got.height != 1 else ''}"
                out[fam] = (says, f"{blocks} made over the window, at most "
                                  f"{fmt_bytes(_most_live_at_once(got, n_events))} live at once"
                            if over_window else f"{blocks} ({fmt_bytes(int(got['size'].sum()))})")
        if "phase" in table.columns:
            for ph, says in sorted(phases.items()):
                if ph not in out and (table["phase"] == ph).any():
                    out[ph] = (says, f"blocks made in the {ph} phase")
    return out


def _most_live_at_once(lifetimes: pl.DataFrame, n_events: int) -> int:
    """The most bytes of `lifetimes` live at one event: a block counts from its allocation
    (the window's start when it predates it) to the request that freed it (the end when
    none did); a free at an event is counted before an allocation at the same one."""
    freed = pl.col("free_req_idx")
    steps = pl.concat([
        lifetimes.select(pl.col("alloc_idx").clip(lower_bound=0).cast(pl.Int64).alias("at"),
                         pl.col("size").cast(pl.Int64).alias("delta")),
        lifetimes.select(pl.when(freed.is_null() | (freed < 0)).then(n_events).otherwise(freed)
                         .cast(pl.Int64).alias("at"),
                         (-pl.col("size")).cast(pl.Int64).alias("delta")),
    ]).sort(["at", "delta"])
    return int(np.cumsum(steps["delta"].to_numpy()).max(initial=0))


def scoped_facts(facts: Mapping[str, str], capture: Capture,
                 held: pl.DataFrame) -> dict[str, str]:
    """`facts` less those scoped to blocks (`of_blocks`) that most bytes of the blocks they
    speak for do not show in their own frames; a dropped one is said in `scoped_elsewhere`.
    The blocks: those `held` at the moment, else those every device holds at the end."""
    out = dict(facts)
    share = fact_limits()["of_blocks_share"]
    for spec in fact_specs():
        if not spec.of_blocks or spec.id not in out:
            continue
        mine = (_sizes_by_stack(capture, held, spec.of_blocks)
                or _sizes_by_stack(capture, _allocated_at_end(capture), spec.of_blocks))
        if not mine:
            continue
        inside = [(place, size) for sid, size in mine
                  if (place := shown_at(spec.frames, capture.stacks.stack(sid)))]
        made, total = sum(size for _, size in inside), sum(size for _, size in mine)
        if made < share * total:
            out.pop(spec.id)
            where = f" ({inside[0][0]})" if inside else ""
            out[SCOPED_ELSEWHERE.id] = (
                f"{spec.seen_as}{where} made {fmt_bytes(made)} of the {fmt_bytes(total)} "
                "that a module's forward made; the rest carry no such frame")
    return out


def _allocated_at_end(capture: Capture) -> pl.DataFrame:
    """Every device's allocated blocks as the capture ends."""
    blocks = capture.blocks
    return blocks.filter(pl.col("state") == ACTIVE_ALLOCATED) if blocks.height else blocks


def _sizes_by_stack(capture: Capture, blocks: pl.DataFrame,
                    patterns: tuple[FactPattern, ...]) -> list[tuple[int, int]]:
    """(stack id, bytes) of `blocks` whose stacks show one of `patterns`, largest first."""
    if blocks.is_empty():
        return []
    by_stack = blocks.group_by("stack_id").agg(pl.col("size").sum()).sort(
        ["size", "stack_id"], descending=[True, False])  # ties by stack id, not group order
    return [(int(sid), int(size)) for sid, size in by_stack.iter_rows()
            if sid is not None and shown_at(patterns, capture.stacks.stack(int(sid)))]


#: the weak fact of model state held k times over per weight size (evidence.toml, computed
#: by `state_copies`)
STATE_COPIES = "state_copies"


def _state_copies(held: pl.DataFrame) -> str:
    """What the sizes held say about copies of model state (`state_copies.held_copies`): the
    requested bytes, else the block's, of every block held at the moment."""
    if held.is_empty():
        return ""
    size = (pl.when(pl.col("requested_size") > 0).then(pl.col("requested_size"))
            .otherwise(pl.col("size")) if "requested_size" in held.columns
            else pl.col("size"))
    return state_copies.held_copies(held.select(size.alias("n"))["n"].to_list())


def autograd_ran(facts: Mapping[str, str], marks: Mapping[str, tuple[str, str]]) -> str:
    """Where a backward ran (or torch.autograd.grad was called): the first fact, family or
    phase that speaks for autograd by itself, not a weak one ("" when none does)."""
    for spec in fact_specs():
        if spec.says == "autograd" and not spec.weak and spec.id in facts:
            return f"{spec.words}: {facts[spec.id]}"
    return next((what for says, what in marks.values() if says == "autograd"), "")


def kept_without_graph(capture: Capture, held: pl.DataFrame) -> dict[str, str]:
    """The weak facts of a forward's outputs kept with no graph (inference.toml
    [kept_outputs]): `outputs_kept_without_graph`, and `graph_beside_no_graph` where the same
    model (its outermost module's forward) keeps saved activations from more sites than kept
    outputs have when called from another place."""
    if held.is_empty() or "method" not in held.columns:
        return {}
    spec = kept_outputs.spec()
    kept = held.filter(pl.col("method") == spec.method)
    if kept.is_empty():
        return {}
    sites = kept["site"].unique().sort().to_list()
    out = {"outputs_kept_without_graph": (
        f"{kept.height} blocks ({fmt_bytes(int(kept['size'].sum()))}) made at "
        f"{', '.join(sites[:2])}")}
    tops = {c.top for sid in kept["stack_id"].unique().to_list()
            if (c := kept_outputs.module_call(capture.stacks.stack(int(sid)))) is not None}
    saved = held.filter(pl.col("family") == "saved_activations")
    graph_sites: dict[tuple[str, str], set[str]] = {}
    for sid, site in saved.select("stack_id", "site").unique().iter_rows():
        call = kept_outputs.module_call(capture.stacks.stack(int(sid)))
        if call is not None and call.top in tops:
            graph_sites.setdefault(call.top, set()).add(site)
    graph = {top: s for top, s in graph_sites.items() if len(s) > spec.max_kept_sites}
    if graph:
        # the most sites; between equal counts the first module by place (dict order here
        # is `unique`'s, which is any)
        top, s = min(graph.items(), key=lambda kv: (-len(kv[1]), kv[0]))
        out["graph_beside_no_graph"] = (
            f"{frame_place((top[0], top[1], 0))} keeps saved activations from {len(s)} sites")
    return out


def own_optimizer_step(capture: Capture, held: pl.DataFrame) -> str:
    """Where the program's own code (not an installed library's) made the step temporaries
    held at the moment: its optimizer's update is written out of place ("" when none)."""
    if held.is_empty():
        return ""
    temps = held.filter(pl.col("family") == "optimizer_temporaries")
    # the largest first; a tie by stack id, so that the place named never depends on the
    # order group_by happens to give
    by_stack = temps.group_by("stack_id").agg(pl.col("size").sum()).sort(
        ["size", "stack_id"], descending=[True, False])
    for sid in by_stack["stack_id"].to_list():
        inner = next((f for f in capture.stacks.stack(int(sid)) if is_python_file(f[0])), None)
        if inner is not None and not is_library(inner[0].replace("\\", "/")):
            return (f"the program's own optimizer step made {fmt_bytes(int(temps['size'].sum()))}"
                    f" of update temporaries: {frame_place(inner)}")
    return ""


def half_precision_weights(capture: Capture) -> str:
    """Where the recorded window shows its weights are 16-bit already ("" when it does not):
    at least `min_allocations` of its allocations made under 16-bit cuBLAS matmuls (their
    C++ frames name the dtype), none under a 32- or 64-bit one, and no autocast frame in the
    capture, which would have cast fp32 weights to 16 bits first (evidence.toml
    [half_weights])."""
    spec = half_weights()
    frames = capture.stacks.frames
    autocast = re.compile(spec.autocast)
    if any(autocast.search(f[1]) or spec.autocast_file in f[0].replace("\\", "/")
           for f in frames):
        return ""
    half, other = re.compile(spec.half_gemm), re.compile(spec.other_gemm)
    if not any(half.search(f[1]) for f in frames) or capture.events.is_empty():
        return ""
    # stacks in id order: the symbol named is the first stack's, not group_by's pick
    made = capture.events.filter(pl.col("action") == "alloc").group_by("stack_id").len() \
        .sort("stack_id")
    count, shown = 0, ""
    for sid, n in made.iter_rows():
        stack = capture.stacks.stack(int(sid)) if sid is not None else ()
        if any(other.search(f[1]) for f in stack):
            return ""
        symbol = next((m.group(0) for f in stack if (m := half.search(f[1]))), "")
        if symbol:
            count, shown = count + int(n), shown or symbol
    if count < spec.min_allocations:
        return ""
    return (f"{count} allocations of the recorded window were made under 16-bit cuBLAS "
            f"matmuls ({shown}), none under a 32-bit one, and no autocast frame shows: "
            "without autocast a matmul runs in its weight's dtype")


# ----- owners and the allocator state ---------------------------------------------------

def family_owners(capture: Capture, held: pl.DataFrame,
                  markers: Mapping[str, tuple[str, ...]],
                  extra: Mapping[str, Iterable[int]] | None = None
                  ) -> dict[str, dict[str, str]]:
    """Family -> framework -> a frame showing it, from the frames of the family's own blocks
    (`extra`: more stacks per family, e.g. the failed request's). Each framework is shown by
    the first stack that shows it: `extra`'s in their order (the request that failed is
    what the advice is for), then the held stacks, the most bytes first (a tie: the lower
    stack id), so the frame named is the same on every run."""
    per_family: dict[str, dict[int, None]] = {}  # stacks in that order
    for fam, sids in (extra or {}).items():
        per_family.setdefault(fam, {}).update(dict.fromkeys(sids))
    if not held.is_empty():
        by_stack = held.group_by("family", "stack_id").agg(pl.col("size").sum()).sort(
            ["family", "size", "stack_id"], descending=[False, True, False])
        for fam, sid in by_stack.select("family", "stack_id").iter_rows():
            per_family.setdefault(fam, {})[sid] = None
    cache: dict[int, dict[str, str]] = {}
    out: dict[str, dict[str, str]] = {}
    for fam, ordered in per_family.items():
        owned: dict[str, str] = {}
        for sid in ordered:
            if sid not in cache:
                cache[sid] = _stack_owners(capture.stacks.stack(sid), markers)
            for fw, where in cache[sid].items():
                owned.setdefault(fw, where)
        out[fam] = owned
    return out


def _stack_owners(stack: tuple[Frame, ...], markers: Mapping[str, tuple[str, ...]]
                  ) -> dict[str, str]:
    """The frameworks that own a block: walking out from the innermost frame past PyTorch's
    own, the standard library and libraries no pack knows, the first frame that is a
    framework's (it and the frameworks calling it own the block) or the program's own (the
    program made it: no framework's knob acts on it, whatever library calls the program)."""
    out: dict[str, str] = {}
    for frame in stack:
        path = frame[0].replace("\\", "/")
        if not is_python_file(path):
            continue
        package = import_path(path)
        found = [fw for fw, parts in markers.items() if any(p in package for p in parts)]
        if not out and not found:
            if not is_library(path):
                return {}  # the program's own code made it
            continue  # PyTorch, the standard library, a helper library: look further out
        for fw in found:
            out.setdefault(fw, frame_place(frame))
    return out


def free_segments(segments: pl.DataFrame, live: pl.DataFrame) -> dict[str, int]:
    """Pool -> bytes of the segments that hold no live block: what empty_cache() returns."""
    if segments.is_empty():
        return {}
    seg = segments.sort("address")
    starts = seg["address"].to_numpy()
    ends = starts + seg["total_size"].to_numpy()
    used = np.zeros(seg.height, dtype=bool)
    if not live.is_empty():
        addr = live["address"].to_numpy()
        pos = np.searchsorted(starts, addr, side="right") - 1
        ok = (pos >= 0) & (addr < ends[np.clip(pos, 0, None)])
        used[pos[ok]] = True
    out: dict[str, int] = {}
    for pool, size, u in zip(seg["pool"].to_list(), seg["total_size"].to_list(), used,
                             strict=True):
        if not u:
            out[pool] = out.get(pool, 0) + int(size)
    return out


def _returned_by_update(capture: Capture, held: pl.DataFrame,
                        lifetimes: pl.DataFrame | None) -> pl.DataFrame:
    """The held kv_cache blocks a cache layer's own update made that a forward returns
    (`kv_pairs.returned_by_update`); none without the window's lifetimes."""
    family = kv_pairs.spec().family
    if lifetimes is None or not held.height or "stack_id" not in held.columns:
        return held.clear()
    kv = held.filter(pl.col("family") == family)
    if not kv.height:
        return kv
    rows = []
    for size, req, alloc, sid in kv.select("size", "requested_size", "alloc_idx",
                                           "stack_id").iter_rows():
        # the innermost frame of a source file (not a profiler's `<op>` / `<python>` entry)
        frame = next(((f[0], f[1]) for f in capture.stacks.stack(int(sid))
                      if f[0].endswith(".py")), None) if sid is not None else None
        rows.append(kv_pairs.Held(int(req or size), -1 if alloc is None else int(alloc), frame))
    freed = lifetimes.filter((pl.col("family") == family) & (pl.col("alloc_idx") >= 0)
                             & (pl.col("free_req_idx") >= 0))["free_req_idx"]
    first = int(freed.min()) if freed.len() else -1  # type: ignore[arg-type]
    return kv[kv_pairs.returned_by_update(rows, first)]


def job_evidence(capture: Capture, held: pl.DataFrame, lifetimes: pl.DataFrame | None,
                 segments: pl.DataFrame, live: pl.DataFrame, rules: RuleSet | None = None,
                 extra_stacks: Mapping[str, Iterable[int]] | None = None,
                 devices_holding: int = 1, n_events: int = 0,
                 free_phases: FreePhases | None = None) -> JobEvidence:
    """The evidence at one moment of one device (the facts are the capture's)."""
    markers = rules.markers if rules is not None else markers_of(builtin_packs())
    names = (a.get("name") for a in capture.annotations if isinstance(a, Mapping))
    facts = scoped_facts(seen_facts(capture.stacks.frames,
                                    (n for n in names if isinstance(n, str))), capture, held)
    free = free_segments(segments, live)
    if sum(free.values()):
        facts[FREE_SEGMENTS.id] = f"{fmt_bytes(sum(free.values()))} in segments holding no " \
                                  "live block"
    cached = int(segments["total_size"].sum()) - int(live["size"].sum()) \
        if segments.height else 0
    stranded = cached - sum(free.values())
    if stranded > 0 and stranded >= cached / 2:
        facts[STRANDED_CACHE.id] = f"{fmt_bytes(stranded)} of the {fmt_bytes(cached)} cached " \
                                   "free lies inside segments that hold live blocks"
    saved = held.filter(pl.col("family") == "saved_activations") if held.height else held
    if saved.height and saved["site"].n_unique() >= 2:
        facts[LAYERED_ACTIVATIONS.id] = f"saved activations from {saved['site'].n_unique()} " \
                                        "sites"
    pairs = kv_pairs.spec()
    words = pairs.fact
    returned = held.filter(pl.col("method") == pairs.method) \
        if held.height and "method" in held.columns else held
    if not returned.height and held.height and "method" in held.columns:
        returned = held.filter(pl.col("method") == pairs.fused.method)
        words = pairs.fused.fact
    if not returned.height:
        returned = _returned_by_update(capture, held, lifetimes)
        words = pairs.fact
    if returned.height and not facts.keys() & pairs.decoding_facts:
        facts[RETURNED_KV_CACHE.id] = words.format(
            blocks=returned.height, bytes=fmt_bytes(int(returned["size"].sum())))
    if devices_holding > 1:
        facts[SEVERAL_DEVICES.id] = f"{devices_holding} devices hold memory"
    half = half_precision_weights(capture)
    if half:
        facts[HALF_PRECISION_WEIGHTS.id] = half
    own = own_optimizer_step(capture, held)
    if own:
        facts[OWN_OPTIMIZER_STEP.id] = own
    scores, count, elsewhere, fn, maker = held_scores(held, capture.stacks) \
        if held.height and "stack_id" in held.columns else (0, 0, 0, "", "")
    if scores:
        made = (f"made under {fn}" if not elsewhere else
                f"{count - elsewhere} made under {fn}, {elsewhere} of their shape made "
                "elsewhere (their gradients, a copy)")
        facts[SCORE_MATRICES.id] = (f"{count} score matri{'ces' if count != 1 else 'x'} of "
                                    f"{maker} ({fmt_bytes(scores)}), {made}")
    facts.update(forward_retention(lifetimes, n_events, free_phases))
    facts.update(kept_without_graph(capture, held))
    framed = any(is_python_file(f[0]) for f in capture.stacks.frames)
    copies = _state_copies(held)
    if copies:
        facts[STATE_COPIES] = copies
    marks = _workload_marks(held, lifetimes, n_events)
    ran = autograd_ran(facts, marks)
    if ran:
        facts[AUTOGRAD_RAN.id] = ran
    if "optimizer_state" in marks:  # blocks of the family of that name are held
        facts[OPTIMIZER_STATE.id] = f"an optimizer keeps state: {marks['optimizer_state'][1]}"
    workload = decide_workload(facts, marks, framed)
    settings = capture.allocator_settings
    expandable = bool(capture.segments["is_expandable"].any()) \
        if "is_expandable" in capture.segments.columns and capture.segments.height else False
    return JobEvidence(workload, facts, family_owners(capture, held, markers, extra_stacks),
                       settings, expandable or bool(settings and _is_on(
                           settings.get("expandable_segments"), "expandable_segments")), free,
                       frozenset(fw for fw, parts in markers.items() if parts),
                       {SCORE_MATRICES.id: scores} if scores else {})


def stack_evidence(stack: tuple[Frame, ...], family: str,
                   markers: Mapping[str, tuple[str, ...]],
                   expandable: bool | None = None) -> JobEvidence:
    """The evidence one stack gives (a traceback's failing request, issue 57): the facts its
    frames show, the workload they speak for, the frameworks that own the request's family
    by its own frames. A log records no allocator settings (`expandable`: the OOM message
    says expandable segments were on) and no segments."""
    facts = seen_facts(stack)
    workload = decide_workload(facts, {}, any(is_python_file(f[0]) for f in stack))
    return JobEvidence(workload, facts, {family: _stack_owners(stack, markers)}, None,
                       bool(expandable), {}, frozenset(fw for fw, parts in markers.items()
                                                       if parts))
