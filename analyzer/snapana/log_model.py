"""What the readers of text (`sources/oom_text`, `vllm_text`, `log_tables`) read out of a log,
as the findings and renderers see it: an OOM message's figures, vLLM's budget and refusals,
the layout of `memory_summary()`'s table. The normalised text, as `model.py` is the
normalised capture: sources fill it; nothing downstream imports a source for it."""

from __future__ import annotations

from dataclasses import dataclass, field

from snapana.printed import Size

#: The rows of `memory_summary()` read, by their printed name: (key, is a byte figure).
SUMMARY_ROWS = {
    "Allocated memory": ("allocated", True),
    "Active memory": ("active", True),
    "Requested memory": ("requested", True),
    "GPU reserved memory": ("reserved", True),
    "Non-releasable memory": ("non_releasable", True),
    "Allocations": ("allocations", False),
    "Active allocs": ("active_allocs", False),
    "GPU reserved segments": ("segments", False),
    "Non-releasable allocs": ("non_releasable_allocs", False),
    "Oversize allocations": ("oversize_allocations", False),
    "Oversize GPU segments": ("oversize_segments", False),
}
#: The four columns of every row.
SUMMARY_COLUMNS = ("current", "peak", "allocated in all", "freed in all")


@dataclass(frozen=True)
class Dialect:
    """Which PyTorch printed the message: its backend and wording, and the releases that
    print that wording."""

    backend: str  # CUDA or HIP
    wording: str  # a WORDINGS id, or "unrecognised"
    releases: str


@dataclass(frozen=True)
class OomMessage:
    """One OOM message as the text holds it: its figures (None where its wording has no
    such clause), where it stands, and what about it is odd."""

    line: int  # 1-based line of its anchor
    dialect: Dialect
    text: str  # the message, its lines joined, prefixes and escapes removed
    prefix: str  # the log prefix of its first line
    rank: int | None
    device: int | None
    request: Size | None
    capacity: Size | None
    free: Size | None
    allocated: Size | None
    reserved: Size | None  # everything PyTorch's allocator holds (allocated + cached)
    unallocated: Size | None  # reserved but unallocated (cached)
    this_process: Size | None
    private_pools: Size | None
    allowed: Size | None
    processes: tuple[tuple[int, Size], ...]
    #: "Tried to allocate more than 1EB memory": a size bug, with no figure
    exabyte: bool = False
    #: expandable segments were on: the message says so (2.15) or, whole, leaves out the
    #: hint that suggests them (2.14+); None when the text cannot tell
    expandable_on: bool | None = None
    oddities: tuple[str, ...] = field(default=())
    source: str = ""  # the log it was read from (its name, or "standard input")

    @property
    def recognised(self) -> bool:
        """Its wording is one PyTorch prints (else only the clauses found are read)."""
        return self.dialect.wording != "unrecognised"

    @property
    def backend(self) -> str:
        return self.dialect.backend

    @property
    def wording(self) -> str:
        return self.dialect.wording

    @property
    def releases(self) -> str:
        return self.dialect.releases


@dataclass(frozen=True)
class KvBudget:
    """The budget message: what the instance could use and where it went (a paste may hold
    only its second half: no total, utilisation or budget)."""

    line: int
    total: Size | None
    utilization: float | None
    budget: Size | None
    weights: Size | None
    non_torch: Size | None
    activation: Size | None
    kv: Size | None  # may be negative


@dataclass(frozen=True)
class KvRefusal:
    """A vLLM engine that refused to start: the cache had no room, or too little for one
    request of the model's length."""

    line: int
    kind: str  # no_blocks | too_long
    max_model_len: int | None
    needed: Size | None  # KV cache for one request of max_model_len (V1)
    available: Size | None  # KV cache memory there was (V1)
    estimated_len: int | None  # vLLM's own estimate of the longest that fits
    tokens: int | None  # tokens the cache holds (V0)
    #: "Available KV cache memory" lines logged before it (V1), in order
    available_lines: tuple[Size, ...] = ()


#: a setting's value as read from a log (None: printed as None, unset)
SettingValue = int | float | bool | str | None


@dataclass(frozen=True)
class Setting:
    """One setting as the log printed it: its value read (None: printed as None, unset),
    where, and from which format."""

    id: str  # "slime.max_tokens_per_gpu"
    framework: str
    name: str  # the name the framework printed it under ("max_seq_len")
    value: SettingValue
    printed: str
    line: int  # 1-based
    format: str
    source: str = ""  # the log it was read from
