"""Model state held k times over per weight size, found by counting the sizes held (issue 67).

Why: a snapshot with no frames and no history (``_dump_snapshot`` between steps of a job that
never recorded) names no block, yet its sizes say whether it trains: a training job holds,
per parameter, the parameter, its gradient (AccumulateGrad makes ``.grad`` in the
parameter's shape) and its optimizer's state (torch.optim.Adam's ``_init_group`` makes
``exp_avg`` / ``exp_avg_sq`` with ``torch.zeros_like(p)``), so every weight size is held k
times over. A model's sizes repeat as its layers do, but it holds some weights once (an
embedding, a first layer, a head), so the counts of an untrained model's sizes share no
factor: counts whose greatest common divisor is exactly k are the signature, with a cuBLAS
workspace for each of two threads (the backward runs on the autograd engine's own). A
layered model's buffers can show such counts too, so the evidence is weak: it speaks only
where no frame does (``evidence.toml``). The numbers and the words are data
(``inference.toml`` ``[state_copies]``); this module only counts.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from functools import reduce
from math import gcd

from snapana.analysis.attribution.inference_schema import StateCopiesSpec, inference_file


def spec() -> StateCopiesSpec:
    """The state-copies signature, read once."""
    return inference_file().state_copies


def held_copies(sizes: Iterable[int]) -> str:
    """What the held blocks' sizes (their requested bytes) say about copies of model state:
    the sentence of `spec().why`, or "" when they do not show the signature."""
    s = spec()
    counts = Counter(n for n in sizes if n >= s.min_bytes)
    workspaces = sum(counts.pop(n) for n in s.workspace_sizes
                     if 0 < counts.get(n, 0) <= s.max_workspaces)
    if workspaces < s.min_workspaces:
        return ""
    total = sum(n * c for n, c in counts.items())
    for k in sorted((int(k) for k in s.per_weight), reverse=True):
        held = {n: c for n, c in counts.items() if c % k == 0}
        if len(held) < s.min_sizes or reduce(gcd, held.values()) != k:
            continue
        covered = sum(n * c for n, c in held.items())
        if covered < s.min_share * total:
            continue
        return s.why.format(sizes=len(held), min_bytes=s.min_bytes, k=k,
                            blocks=sum(held.values()), share=covered / total, n=workspaces,
                            what=s.per_weight[str(k)])
    return ""
