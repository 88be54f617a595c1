"""vLLM's refusals to start for want of KV-cache memory, and the memory budget it logs before
them (issue 44). vLLM does not raise a CUDA OOM when the cache does not fit: it measures
what the weights and a profiling run took and raises a ValueError; its figures say why.

The wordings, from vLLM's sources:

- "No available memory for the cache blocks." — `vllm/worker/worker.py`
  (`raise_if_cache_size_invalid`, V0) and `vllm/v1/core/kv_cache_utils.py`
  (`check_enough_kv_cache_memory`, V1): nothing was left for the cache.
- "The model's max seq len (N) is larger than the maximum number of tokens that can be
  stored in KV cache (M)." — V0, the same function.
- "To serve at least one request with the model's max seq len (N), (X GiB KV cache is
  needed, which is larger than the available KV cache memory (Y GiB). Based on the available
  memory, the estimated maximum model length is M." — V1 (`models's` in its first releases;
  later "X GiB KV cache is needed" without the parenthesis and "Estimated maximum model
  length is M").
- The budget message of 0.7-0.8 (`vllm/worker/worker.py` `determine_num_available_blocks`,
  `vllm/v1/worker/gpu_worker.py`), one log record of three lines:
  "the current vLLM instance can use total_gpu_memory (T) x gpu_memory_utilization (U) = B;
  model weights take W; non_torch_memory takes N; PyTorch activation peak memory takes A;
  the rest of the memory reserved for KV Cache is K."
- "Available KV cache memory: K GiB" — V1's log line (`vllm/v1/worker/gpu_worker.py`);
  negative when the budget was already spent.
"""

from __future__ import annotations

import re

from snapana.errors import InputError
from snapana.log_model import KvBudget, KvRefusal
from snapana.printed import SIZE, Size, whole

#: vLLM writes sizes as "14.99GiB" or "5.0 GiB": SIZE takes both; a negative one is read.
#: (Linear as SIZE: a figure starts where its run starts, its runs possessive.)
_SIGNED = r"(?<![\d.-])(-?+\d++(?:\.\d++)?+)\s?+(GiB|MiB|KiB|GB|MB|B)\b"

PATTERNS: dict[str, str] = {
    "no_blocks": r"No\s+available\s+memory\s+for\s+the\s+cache\s+blocks",
    "too_long_v0": (r"model's max seq len \((\d++)\) is larger than the maximum number of "
                    r"tokens that can be stored in KV cache \((\d++)\)"),
    "too_long_v1": (r"max seq len \((\d++)\),?+\s*+\(?+" + SIZE + r" KV cache is needed, which is "
                    r"larger than the available KV cache memory \(" + SIZE + r"\)\.?"
                    r"(?:\s*(?:Based on the available memory, the estimated|Estimated) "
                    r"maximum model length is (\d++))?"),
    "budget": (r"total_gpu_memory \(" + SIZE + r"\) x gpu_memory_utilization "
               r"\((\d++(?:\.\d++)?+)\) = "
               + SIZE),
    "weights": r"model weights take " + _SIGNED,
    "non_torch": r"non_torch_memory takes " + _SIGNED,
    "activation": r"PyTorch activation peak memory takes " + _SIGNED,
    "kv_rest": r"the rest of the memory reserved for KV Cache is " + _SIGNED,
    "kv_available": r"Available KV cache memory: " + _SIGNED,
}
_COMPILED = {k: re.compile(v) for k, v in PATTERNS.items()}
#: Lines the budget message spans (vLLM 0.7+ writes it as three lines, one log record).
BUDGET_SPAN = 3




def _signed(number: str, unit: str) -> Size | None:
    """A signed figure; None where it is past any device (a mangled line: a figure no vLLM
    prints is not read, and never refuses the log around it)."""
    try:
        size = Size.parse(number.lstrip("-"), unit)
    except InputError:
        return None
    return Size(-size.bytes, size.slack, number + " " + unit) if number.startswith("-") \
        else size


def _fraction(number: str) -> float | None:
    """gpu_memory_utilization as printed (0 to 1); None where it is no such fraction."""
    value = float(number) if len(number) <= 32 else None
    return value if value is not None and 0 <= value <= 1 else None


def _part(name: str, line: str) -> Size | None:
    m = _COMPILED[name].search(line)
    return None if m is None else _signed(m.group(1), m.group(2))


def read_budgets(lines: list[str]) -> list[KvBudget]:
    """Each budget message: from its first line (the total) or, where a paste starts later,
    from its 'model weights take' part; its parts on the lines that follow."""
    out = []
    last_total = -BUDGET_SPAN
    for i, line in enumerate(lines):
        b = _COMPILED["budget"].search(line)
        if b is None and (i - last_total < BUDGET_SPAN
                          or _COMPILED["weights"].search(line) is None):
            continue
        if b is not None:
            last_total = i
        text = " ".join(lines[i:i + BUDGET_SPAN])  # its parts follow on the next lines
        out.append(KvBudget(
            i + 1, Size.parse(b.group(1), b.group(2)) if b else None,
            _fraction(b.group(3)) if b else None, Size.parse(b.group(4), b.group(5)) if b else None,
            _part("weights", text), _part("non_torch", text), _part("activation", text),
            _part("kv_rest", text)))
    return out


def read_refusals(lines: list[str]) -> list[KvRefusal]:
    """Every refusal in `lines` (joined where a log wrapped a message), with the
    'Available KV cache memory' lines logged before each."""
    out: list[KvRefusal] = []
    seen: list[Size] = []
    for i, line in enumerate(lines):
        if (a := _COMPILED["kv_available"].search(line)) is not None:
            if (kv := _signed(a.group(1), a.group(2))) is not None:
                seen.append(kv)
        if not _STARTS.search(line):
            continue
        joined = _joined(lines[i:i + 4])
        if (m := _COMPILED["too_long_v1"].search(joined)) is not None and \
                m.start() < len(line.strip()) + 1:
            out.append(KvRefusal(i + 1, "too_long", whole(m.group(1)),
                                 Size.parse(m.group(2), m.group(3)),
                                 Size.parse(m.group(4), m.group(5)),
                                 whole(m.group(6)) if m.group(6) else None, None,
                                 tuple(seen)))
        elif (m := _COMPILED["too_long_v0"].search(joined)) is not None and \
                m.start() < len(line.strip()) + 1:
            out.append(KvRefusal(i + 1, "too_long", whole(m.group(1)), None, None, None,
                                 whole(m.group(2)), tuple(seen)))
        elif (m := _COMPILED["no_blocks"].search(joined)) is not None and \
                m.start() < len(line.strip()) + 1:
            out.append(KvRefusal(i + 1, "no_blocks", None, None, None, None, None,
                                 tuple(seen)))
        else:
            continue
        if len(out) > 1 and _same(out[-1], out[-2]):
            out.pop()  # the log line and the traceback's last line: one refusal
        seen = []
    return out


#: Where a refusal may start on a line (its first words), so that a message is read once.
_STARTS = re.compile(r"max seq len|No\s++available(?:\s++memory)?+\s*+$|No available memory")


def _joined(lines: list[str]) -> str:
    """A message's lines joined. A terminal wraps at its width, inside a word ('KV cach' /
    'e is needed'): a line of 100+ columns whose next line does not start with a space is
    joined to it without one."""
    out = lines[0].strip()
    for prev, line in zip(lines, lines[1:], strict=False):
        glue = "" if len(prev.rstrip("\n")) >= WRAP_WIDTH and line[:1] not in (" ", "\t") \
            else " "
        out += glue + line.strip()
    return out


#: A terminal's width from which a line that ends mid-word was wrapped there.
WRAP_WIDTH = 100


def _same(a: KvRefusal, b: KvRefusal) -> bool:
    return (a.kind, a.max_model_len, a.needed, a.available, a.estimated_len, a.tokens) == \
        (b.kind, b.max_model_len, b.needed, b.available, b.estimated_len, b.tokens)
