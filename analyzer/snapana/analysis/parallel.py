"""The recorded window at another parallel layout (issue 70): tensor (tp), data (dp, with a
ZeRO stage or FSDP sharding), pipeline (pp) and sequence parallelism. Each block's bytes on
one rank are its recorded bytes times the ratio of its divisors under the two layouts, from
`parallel.toml`: model state by ZeRO's rules (Rajbhandari et al. 2020: optimizer state,
gradients, parameters divided by Nd at stages 1 / 2 / 3) and tp / pp, activations by
Megatron's (Korthikanti et al. 2022: the ops inside the tensor-parallel region divided by t,
the rest by t only with sequence parallelism), decided per block from the op that made it.
The resized window is then replayed through the allocator model (`scaled_replay.Window`):
the figure is the replay's, not a formula's.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Literal

import numpy as np
import polars as pl

from snapana import data_file
from snapana.model import is_python_frame
from snapana.units import ascii_int

#: The layout keys `--scale` takes besides batch and seq.
LAYOUT_KEYS = ("tp", "dp", "pp", "sp")
#: The most ranks along one dimension a layout may name.
MOST_RANKS = 1 << 20
#: ZeRO stage of a family never divided over dp.
NEVER = 4


class LayoutError(ValueError):
    """A --scale tp= / dp= / pp= / sp= or --zero text that does not say a layout."""


_Table = data_file.Table


class FamilyRule(_Table, frozen=True, kw_only=True):
    tp: Literal[0, 1] = 0
    ops: bool = False
    zero: Literal[0, 1, 2, 3, 4] = 4  # NEVER
    pp: Literal[0, 1] = 0
    why: str = ""


class OpRule(_Table, frozen=True, kw_only=True):
    id: str
    file_re: str
    function_re: str = ""
    split: Literal["tensor", "sequence", "shape"]


class ZeroFrames(_Table, frozen=True, kw_only=True):
    id: str
    file_re: str
    stage: Literal[0, 1, 2, 3]
    says: str


@data_file.schema("analysis/parallel.toml")
class ParallelRules(_Table, frozen=True, kw_only=True):
    family: dict[str, FamilyRule]
    unmatched: Literal["tensor", "sequence", "shape"] = "shape"
    op: list[OpRule] = []
    zero_frames: list[ZeroFrames] = []
    zero_names: dict[str, Literal[0, 1, 2, 3]] = {}


@lru_cache(maxsize=1)
def load_parallel_rules() -> ParallelRules:
    """The built-in `parallel.toml`, checked against its schema."""
    return data_file.packaged("analysis/parallel.toml", ParallelRules)


@dataclass(frozen=True)
class Layout:
    """One rank's view of a job's layout: tensor, data, pipeline sizes, the ZeRO stage and
    whether sequence parallelism is on."""

    tp: int = 1
    dp: int = 1
    pp: int = 1
    zero: int = 0
    sp: int = 0

    def sizes(self, keys: Sequence[str]) -> dict[str, int]:
        return {k: int(getattr(self, k)) for k in keys}


@dataclass(frozen=True)
class LayoutChange:
    """The recorded layout, the one asked, which keys were given and how the recorded ZeRO
    stage is known (`zero_said`)."""

    recorded: Layout
    target: Layout
    keys: tuple[str, ...]
    zero_said: str = ""

    def said(self) -> list[str]:
        """The change in words: `tp 2 → 4`, `ZeRO stage 0 → 3` (unchanged keys: as kept)."""
        names = {"zero": "ZeRO stage", "sp": "sequence parallel"}
        out = []
        for k in self.keys:
            a, b = getattr(self.recorded, k), getattr(self.target, k)
            out.append(f"{names.get(k, k)} {a:,}" + (f" → {b:,}" if a != b else " (kept)"))
        return out


def check_layout(items: Sequence[str], zero: str | None) -> tuple[list[str], list[str]]:
    """--scale items as (batch / seq ones, layout ones), the layout ones and --zero checked
    (a bad one: InputError, one line) before any capture is read."""
    from snapana.errors import InputError

    layout = [i for i in items if i.partition("=")[0].strip() in LAYOUT_KEYS]
    try:
        parse_layout(layout, zero, (0, ""))
    except LayoutError as exc:
        raise InputError(str(exc)) from None
    return [i for i in items if i not in layout], layout


def _numbers(item: str, rest: str, low: int, high: int) -> tuple[int, int]:
    parts = rest.split(":")
    numbers = [n for n in map(ascii_int, parts) if n is not None and low <= n <= high]
    if len(parts) > 2 or len(numbers) != len(parts):
        raise LayoutError(f"--scale {item[:60]!r}: give RECORDED[:TARGET], whole numbers "
                          f"from {low} to {high:,} (e.g. tp=2:4)")
    return numbers[0], numbers[-1]


def parse_zero(text: str) -> tuple[int | None, int]:
    """`--zero 0:3`, `--zero 3` (the recorded stage read from the capture), or FSDP's names
    (`full_shard`, `no_shard:full_shard`): (recorded or None, target)."""
    names = load_parallel_rules().zero_names
    parts = [p.strip().lower() for p in text.split(":")]
    stages = [names[p] if p in names else ascii_int(p) for p in parts]
    if len(parts) > 2 or any(s is None or not 0 <= s <= 3 for s in stages):
        raise LayoutError(f"--zero {text[:60]!r}: a ZeRO stage is 0, 1, 2 or 3 (or FSDP's "
                          f"{', '.join(names)}), as RECORDED:TARGET or TARGET, e.g. 0:3")
    got = [int(s) for s in stages if s is not None]
    return (got[0] if len(got) == 2 else None), got[-1]


def parse_layout(items: Sequence[str], zero: str | None, zero_read: tuple[int, str]
                 ) -> LayoutChange | None:
    """The layout change --scale tp= / dp= / pp= / sp= and --zero ask for (None: none).
    `KEY=N` alone is the same size recorded and asked (dp=8 with --zero 0:3); `zero_read`:
    the stage the capture's frames say, and the words, for a --zero without a recorded one."""
    if not items and zero is None:
        return None
    rec: dict[str, int] = {}
    new: dict[str, int] = {}
    for item in items:
        key, _, rest = item.partition("=")
        key = key.strip()
        if key in rec:
            raise LayoutError(f"--scale {key} is given twice")
        low, high = (0, 1) if key == "sp" else (1, MOST_RANKS)
        rec[key], new[key] = _numbers(item, rest, low, high)
    said = ""
    if zero is not None:
        first, last = parse_zero(zero)
        if first is None:
            first, said = zero_read
        else:
            said = f"ZeRO stage {first} as stated (--zero {zero.strip()[:20]})"
        rec["zero"], new["zero"] = first, last
    else:
        rec["zero"] = new["zero"] = zero_read[0]
        said = zero_read[1]
    if rec["zero"] != new["zero"] and "dp" not in rec:
        raise LayoutError("--zero divides over the data-parallel ranks: give dp=N (e.g. "
                          "--scale dp=8 --zero 0:3)")
    if (rec.get("sp") or new.get("sp")) and "tp" not in rec:
        raise LayoutError("--scale sp= needs tp= (sequence parallelism splits by the tp size)")
    keys = tuple(k for k in (*LAYOUT_KEYS, "zero") if k in rec)
    return LayoutChange(Layout(**rec), Layout(**new), keys, said)


def zero_from_frames(stacks: Any, stack_ids: Sequence[int]) -> tuple[int, str]:
    """The ZeRO stage the window's frames say (`[[zero_frames]]`), in words too; none:
    stage 0, assumed."""
    rules = load_parallel_rules()
    pats = [(re.compile(z.file_re), z) for z in rules.zero_frames]
    found: dict[str, ZeroFrames] = {}
    for sid in stack_ids:
        for f in stacks.stack(int(sid)):
            if is_python_frame(f):
                for pat, z in pats:
                    if z.id not in found and pat.search(str(f[0])):
                        found[z.id] = z
    for _, z in pats:
        if z.id in found:
            return z.stage, f"ZeRO stage read from frames: {z.says}"
    return 0, "ZeRO stage 0 assumed: no frame of a sharding optimizer (DeepSpeed ZeRO, FSDP, " \
              "Megatron's distributed optimizer) in the window"


@dataclass(frozen=True)
class Sharding:
    """Per growth row: its tp exponent, whether sequence parallelism splits it, the ZeRO
    stage that divides it over dp, its pp exponent, and what decided its tp split."""

    e_tp: np.ndarray
    e_sp: np.ndarray
    zero: np.ndarray
    e_pp: np.ndarray
    how: np.ndarray
    change: LayoutChange

    def factor(self, sizes: Mapping[str, int]) -> np.ndarray:
        """Each row's bytes at `sizes`' layout keys (a key not given: the asked layout's)
        over its recorded bytes."""
        rec, new = self.change.recorded, self.change.target
        at = {k: int(sizes.get(k, getattr(new, k))) for k in (*LAYOUT_KEYS, "zero")}
        f = np.power(rec.tp / at["tp"], self.e_tp) * np.power(rec.pp / at["pp"], self.e_pp)
        sp_rec = np.where(self.e_sp > 0, rec.tp if rec.sp else 1, 1)
        sp_new = np.where(self.e_sp > 0, at["tp"] if at["sp"] else 1, 1)
        dp_rec = np.where(self.zero <= rec.zero, rec.dp, 1)
        dp_new = np.where(self.zero <= at["zero"], at["dp"], 1)
        return f * sp_rec / sp_new * dp_rec / dp_new

    def words(self, requested: np.ndarray) -> tuple[str, ...]:
        """What the split rests on, with the bytes each kind of decision covers."""
        out = [self.change.zero_said + "."] if self.change.zero_said else []
        rec = self.change.recorded
        out.append("Recorded layout as stated: " + ", ".join(
            f"{k}={getattr(rec, k)}" for k in self.change.keys) + "; model state by ZeRO's "
            "rules (optimizer state / gradients / parameters divided by dp at stages 1 / 2 / 3) "
            "and by tp and pp; activations by Megatron's tensor / sequence parallel rules; the "
            "micro-batch per rank as recorded.")
        for how, text in (("op", "split by the op that made them (a Megatron rule)"),
                          ("shape", "split by their shape (a [s, b, h] size a residual-stream "
                                    "op makes is replicated over tp; any other is split): "
                                    "assumed"),
                          ("unmatched", "made by no op a rule names: split as `unmatched` "
                                        "says, assumed")):
            hit = self.how == how
            if hit.any():
                out.append(f"Activations {text}: {int(hit.sum()):,} blocks, "
                           f"{int(requested[hit].sum()):,} bytes.")
        return tuple(out)


def _op_of(stack: Sequence[Any], ops: Sequence[tuple[re.Pattern[str], re.Pattern[str] | None,
                                                       OpRule]]) -> OpRule | None:
    """The rule of the innermost frame any op rule names."""
    for f in stack:
        if not is_python_frame(f):
            continue
        for file_re, fn_re, rule in ops:
            if file_re.search(str(f[0])) and (fn_re is None or fn_re.search(str(f[1]))):
                return rule
    return None


def shard_rows(blocks: pl.DataFrame, stacks: Any, change: LayoutChange) -> Sharding:
    """Each row of `blocks` (requested, stack_id, family: a growth table) decided once: by
    its family, and for activation families by the op that made it (`[[op]]`)."""
    rules = load_parallel_rules()
    n = blocks.height
    family = blocks["family"].fill_null("").to_list()
    req = blocks["requested"].to_numpy()
    sid = blocks["stack_id"].to_numpy()
    e_tp, e_sp = np.zeros(n), np.zeros(n)
    zero, e_pp = np.full(n, NEVER), np.zeros(n)
    how = np.full(n, "family", dtype=object)
    ops = [(re.compile(o.file_re), re.compile(o.function_re) if o.function_re else None, o)
           for o in rules.op]
    split: dict[int, str] = {}
    for s in np.unique(sid).tolist():
        rule = _op_of(stacks.stack(int(s)), ops)
        split[int(s)] = rule.split if rule is not None else ""
    decided = np.array([split[int(s)] for s in sid], dtype=object)
    for i, fam in enumerate(family):
        r = rules.family.get(fam)
        if r is None:
            how[i] = "none"
            continue
        zero[i], e_pp[i] = r.zero, r.pp
        if not r.ops:
            e_tp[i] = r.tp
            continue
        how[i] = "op" if decided[i] else "unmatched"
        decided[i] = decided[i] or rules.unmatched
    acts = np.isin(how, ["op", "unmatched"])
    residual = set(req[acts & (decided == "sequence")].tolist())
    shape = acts & (decided == "shape")
    how[shape & (how == "op")] = "shape"
    decided[shape] = np.where(np.isin(req[shape], list(residual)), "sequence", "tensor")
    e_tp[acts & (decided == "tensor")] = 1
    e_sp[acts & (decided == "sequence")] = 1
    return Sharding(e_tp, e_sp, zero, e_pp, how, change)
