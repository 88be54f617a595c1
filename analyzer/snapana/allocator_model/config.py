"""PYTORCH_CUDA_ALLOC_CONF as CUDAAllocatorConfig reads it (c10/cuda/CUDAAllocatorConfig.cpp):
the settings the allocator model has rules for, from what a user writes on `--set` and from
the `allocator_settings` a snapshot records."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from .rules import LARGE_BUFFER, ROUNDUP_INTERVALS, MiB

#: Settings with no rule in the model, and why nothing is predicted for them.
NOT_SIMULATED = {
    "garbage_collection_threshold": "it acts only under a memory fraction set with "
    "torch.cuda.set_per_process_memory_fraction, which a capture does not record",
    "release_lock_on_cudamalloc": "it changes locking around cudaMalloc, not where blocks go",
    "pinned_use_cuda_host_register": "it concerns pinned host memory, not the device",
    "pinned_num_register_threads": "it concerns pinned host memory, not the device",
    "backend": "the model is of the native caching allocator only",
}
SIMULATED = ("expandable_segments", "max_split_size_mb", "roundup_power2_divisions")


class ConfError(ValueError):
    """A setting PyTorch itself would refuse, in its words where it has them."""


@dataclass(frozen=True)
class AllocConf:
    """The settings the model honours; None/() where unset (PyTorch's defaults)."""

    expandable_segments: bool | None = None
    max_split_size: int | None = None  # bytes
    roundup_divisions: tuple[int, ...] | None = None  # per power-of-two interval from 1 MiB


def split_pairs(text: str) -> list[str]:
    """`key:value` items separated by commas outside brackets (roundup_power2_divisions
    takes a bracketed list)."""
    return [p.strip() for p in re.split(r",(?![^\[]*\])", text) if p.strip()]


def parse(pairs: Iterable[str]) -> tuple[AllocConf, list[str]]:
    """The asked settings, and a line for each known setting the model has no rule for."""
    expandable: bool | None = None
    max_split: int | None = None
    roundup: tuple[int, ...] | None = None
    not_simulated: list[str] = []
    for pair in (p for item in pairs for p in split_pairs(item)):
        key, sep, value = pair.replace("=", ":", 1).partition(":")
        key, value = key.strip(), value.strip()
        if not sep or not value:
            raise ConfError(f"{pair[:60]!r}: expected KEY:VALUE (e.g. expandable_segments:True)")
        if key == "expandable_segments":
            if value.lower() not in ("true", "false", "1", "0"):
                raise ConfError(f"{pair[:60]!r}: expandable_segments is True or False")
            expandable = value.lower() in ("true", "1")
        elif key == "max_split_size_mb":
            max_split = _max_split(pair, value)
        elif key == "roundup_power2_divisions":
            roundup = _roundup(pair, value)
        elif key in NOT_SIMULATED:
            not_simulated.append(f"{key}:{value[:40]} ({NOT_SIMULATED[key]}: nothing is predicted "
                                 "for it)")
        else:
            known = ", ".join((*SIMULATED, *NOT_SIMULATED))
            raise ConfError(f"{pair[:60]!r}: not a PYTORCH_CUDA_ALLOC_CONF setting "
                            f"(known: {known})")
    return AllocConf(expandable, max_split, roundup), not_simulated


def _whole(text: str) -> int | None:
    """A whole number as stoul reads one: ASCII digits only, at most 18 of them."""
    return int(text) if text.isascii() and text.isdigit() and len(text) <= 18 else None


def _max_split(pair: str, value: str) -> int:
    """max_split_size_mb: MiB, more than kLargeBuffer's 20 (CUDAAllocatorConfig refuses
    less)."""
    mb = _whole(value)
    if mb is None:
        raise ConfError(f"{pair[:60]!r}: max_split_size_mb is a whole number of MiB")
    if mb <= LARGE_BUFFER // MiB:
        raise ConfError(f"{pair[:60]!r}: max_split_size_mb too small, must be > "
                        f"{LARGE_BUFFER // MiB} (PyTorch refuses it)")
    return mb * MiB


def _power_of_two(pair: str, text: str, zero: bool) -> int:
    n = _whole(text)
    if n is None or n & (n - 1) or (n == 0 and not zero):
        raise ConfError(f"{pair[:60]!r}: {text[:20]!r} is not a power of 2")
    return n


def _roundup(pair: str, value: str) -> tuple[int, ...]:
    """roundup_power2_divisions: one power of two for every size, or [MiB:divisions, ...,
    >:divisions] per interval (an entry fills the intervals before the first, '>' those
    after the last)."""
    if not value.startswith("["):
        return (_power_of_two(pair, value, True),) * ROUNDUP_INTERVALS
    if not value.endswith("]"):
        raise ConfError(f"{pair[:60]!r}: a bracketed list ends with ']'")
    out = [0] * ROUNDUP_INTERVALS
    last, first = 0, True
    for entry in (e.strip() for e in value[1:-1].split(",") if e.strip()):
        size, sep, n = entry.partition(":")
        if not sep:
            raise ConfError(f"{pair[:60]!r}: {entry[:20]!r} is not SIZE_MB:DIVISIONS")
        divisions = _power_of_two(pair, n.strip(), True)
        if size.strip() == ">":
            out[last + 1:] = [divisions] * (ROUNDUP_INTERVALS - last - 1)
            continue
        index = min(_power_of_two(pair, size.strip(), False).bit_length() - 1,
                    ROUNDUP_INTERVALS - 1)
        if first:
            out[:index] = [divisions] * index
            first = False
        out[index], last = divisions, index
    return tuple(out)


def recorded(settings: Mapping[str, object] | None) -> AllocConf:
    """The settings a snapshot's `allocator_settings` records (max_split_size in bytes, -1
    or SIZE_MAX when unset; roundup_power2_divisions keyed by interval start in MiB)."""
    settings = settings or {}
    split = settings.get("max_split_size")
    max_split = split if isinstance(split, int) and 0 < split < (1 << 63) else None
    table = settings.get("roundup_power2_divisions")
    roundup: tuple[int, ...] | None = None
    if isinstance(table, Mapping):
        try:
            ordered = sorted((int(k), int(v)) for k, v in table.items())
        except (TypeError, ValueError):
            ordered = []
        if any(v > 1 for _, v in ordered):
            roundup = tuple(v for _, v in ordered)
    return AllocConf(bool(settings.get("expandable_segments")), max_split, roundup)


def in_force(asked: AllocConf, settings: Mapping[str, object] | None) -> list[str]:
    """The asked settings a capture already ran with, as `--set` spells them: only those its
    `allocator_settings` record (a capture that records none proves nothing)."""
    settings = settings or {}
    have = recorded(settings)
    out = []
    if asked.expandable_segments is not None and "expandable_segments" in settings and \
            asked.expandable_segments == have.expandable_segments:
        out.append(f"expandable_segments:{asked.expandable_segments}")
    if asked.max_split_size is not None and "max_split_size" in settings and \
            asked.max_split_size == have.max_split_size:
        out.append(f"max_split_size_mb:{asked.max_split_size // MiB}")
    if asked.roundup_divisions is not None and "roundup_power2_divisions" in settings and \
            (have.roundup_divisions or ()) == tuple(d for d in asked.roundup_divisions if d > 1):
        out.append("roundup_power2_divisions as asked")
    return out
