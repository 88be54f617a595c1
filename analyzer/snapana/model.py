"""The normalized capture every source produces and every later stage reads.

Tables are polars DataFrames; frames and stacks are interned because real snapshots share a
few hundred distinct frames across millions of references. Bytes are always Python/polars ints.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import PurePath
from typing import Any, TypeAlias, TypedDict

import polars as pl

from snapana.caching_allocator import ACTIVE_ALLOCATED
from snapana.capture_kinds import CaptureKind
from snapana.limits import MAX_STACK_FRAMES
from snapana.units import inert

#: How a source reports reading: bytes done so far and the total (the file's size).
ReadProgress: TypeAlias = Callable[[int, int], None]

Frame = tuple[str, str, int]  # (filename, function name, line)

#: Stack id 0 is always the empty stack (no frames recorded).
EMPTY_STACK = 0

SEGMENT_SCHEMA = {
    "device": pl.Int64,
    "address": pl.Int64,
    "total_size": pl.Int64,
    "stream": pl.Int64,
    "pool": pl.Utf8,
    "segment_type": pl.Utf8,
    "is_expandable": pl.Boolean,
}

BLOCK_SCHEMA = {
    "device": pl.Int64,
    "address": pl.Int64,
    "size": pl.Int64,
    "requested_size": pl.Int64,
    "state": pl.Utf8,
    "stack_id": pl.Int64,
    "segment_address": pl.Int64,
}

EVENT_SCHEMA = {
    "device": pl.Int64,
    "idx": pl.Int64,
    "action": pl.Utf8,
    "addr": pl.Int64,
    "size": pl.Int64,
    "stream": pl.Int64,
    "time_us": pl.Int64,
    "stack_id": pl.Int64,
    "device_free": pl.Int64,
}

def unsegmented_blocks(device: int, live: dict[int, tuple[int, int]]) -> pl.DataFrame:
    """Blocks table for sources that know live allocations but no allocator segments
    (profiler traces, memory timelines, memray): address -> (size, stack_id), all allocated."""
    n = len(live)
    return pl.DataFrame(
        {"device": [device] * n, "address": list(live),
         "size": [s for s, _ in live.values()], "requested_size": [s for s, _ in live.values()],
         "state": [ACTIVE_ALLOCATED] * n, "stack_id": [sid for _, sid in live.values()],
         "segment_address": [None] * n},
        schema=BLOCK_SCHEMA,
    )


def pool_key(pool_id: Any) -> str:
    """Render a `segment_pool_id` tuple as a stable string key: '0,0' is the default pool."""
    if isinstance(pool_id, (tuple, list)) and len(pool_id) == 2:
        return f"{int(pool_id[0])},{int(pool_id[1])}"
    return "0,0"


class StackTable:
    """Interns frames and stacks: each distinct frame and each distinct stack is stored once."""

    def __init__(self) -> None:
        self.frames: list[Frame] = []
        self._frame_ids: dict[Frame, int] = {}
        self.stacks: list[tuple[int, ...]] = [()]
        self._stack_ids: dict[tuple[int, ...], int] = {(): EMPTY_STACK}
        self._frames_of: dict[int, tuple[Frame, ...]] = {}
        #: stacks cut to their innermost MAX_STACK_FRAMES frames (see `stack_id`)
        self.truncated = 0
        #: each distinct text made inert once (a long name in many frames: once, not per frame)
        self._inert_texts: dict[str, str] = {}

    def frame_id(self, frame: Frame) -> int:
        fid = self._frame_ids.get(frame)
        if fid is None:
            # every source's frames arrive here: their text is made inert once (controls,
            # escape sequences, unpaired surrogates shown escaped), for every later stage
            safe = (self._inert(frame[0]), self._inert(frame[1]), frame[2])
            fid = self._frame_ids.get(safe)
            if fid is None:
                fid = len(self.frames)
                self.frames.append(safe)
                self._frame_ids[safe] = fid
            self._frame_ids[frame] = fid
        return fid

    def _inert(self, text: Any) -> Any:
        if not isinstance(text, str):
            return text
        got = self._inert_texts.get(text)
        if got is None:
            got = self._inert_texts[text] = inert(text, lines=False)
        return got

    def stack_id(self, frame_ids: tuple[int, ...]) -> int:
        if len(frame_ids) > MAX_STACK_FRAMES:
            # one frame referenced a million times through a pickle's memo is a stack no
            # program has; every later stage walks a stack per block, so it is cut (innermost
            # frames kept: they decide the family) and the capture's warnings say so
            frame_ids = tuple(frame_ids[:MAX_STACK_FRAMES])
            self.truncated += 1
        sid = self._stack_ids.get(frame_ids)
        if sid is None:
            sid = len(self.stacks)
            self.stacks.append(frame_ids)
            self._stack_ids[frame_ids] = sid
        return sid

    def stack(self, stack_id: int) -> tuple[Frame, ...]:
        """The frames of a stack, innermost first (built once per stack: every block of the
        capture asks for its stack)."""
        got = self._frames_of.get(stack_id)
        if got is None:
            got = self._frames_of[stack_id] = tuple(self.frames[f]
                                                    for f in self.stacks[stack_id])
        return got

    def frames_df(self) -> pl.DataFrame:
        return pl.DataFrame(
            {
                "frame_id": list(range(len(self.frames))),
                "filename": [f[0] for f in self.frames],
                "name": [f[1] for f in self.frames],
                "line": [f[2] for f in self.frames],
                "is_python": [is_python_frame(f) for f in self.frames],
            },
            schema={"frame_id": pl.Int64, "filename": pl.Utf8, "name": pl.Utf8,
                    "line": pl.Int64, "is_python": pl.Boolean},
        )


def is_python_file(filename: str) -> bool:
    """True for frames the Python interpreter ran: `.py` files and pseudo-files such as
    `<string>`, `<frozen runpy>`, torch.fx's `<eval_with_key>.3` or a source's synthesized
    `<memory_timeline>`. C++ frames (stacks='all') carry `??`, `''` or a `.cpp` name."""
    return filename.endswith(".py") or filename.startswith("<")


def is_python_frame(frame: Frame) -> bool:
    return is_python_file(frame[0])


#: the pseudo-file of a profiler trace's op frames (sources/kineto_trace.py `op_frame`): the
#: frame's function is the operator's schema name (`aten::mm`), not a line of Python
OP_FILE = "<op>"
#: a profiler trace's pseudo-frames (`op_frame`): an op, a Python event with no file:line (a
#: module instance, `nn.Module: GPT2Block_0`) and a user annotation (record_function). They
#: name the op or the layer, not the line that made a block.
PROFILER_FILES = frozenset({OP_FILE, "<python>", "<annotation>"})


def is_kernel_frame(frame: Frame) -> bool:
    """A frame that names a kernel, not a line of code: a C++ frame of a snapshot's stack
    (`at::native::mm`) or a profiler trace's op frame (`aten::mm`). One predicate, so a rule
    keyed on a kernel reads both captures alike."""
    return not is_python_frame(frame) or frame[0] == OP_FILE


class CaptureMetadata(TypedDict, total=False):
    """What a source knows of its capture beyond the tables (issue 68: it was an untyped
    dict): each key, who writes it and what it holds. A dict at run time, so an export
    writes and reads it as before; the type checker holds every read and write to these keys.
    """

    #: device -> its name as the source gives it (kineto's deviceProperties, memray's host)
    device_names: dict[int, str]
    #: device -> the caching allocator's reserved bytes after each event (kineto traces)
    reserved_timeline: dict[int, Any]
    #: device -> {"allocated" / "reserved": per-event totals as the trace printed them}
    kineto_totals: dict[int, dict[str, Any]]
    #: device -> {alloc event position: (op, the op's arguments the cast copied, by dims, and
    #: their bytes)}: an op's casts of its own arguments (kineto traces with record_shapes)
    op_casts: dict[int, dict[int, tuple[str, tuple[int, ...], int]]]
    trace: dict[str, Any]  # the trace's own metadata, bounded
    device_properties: Any  # kineto's deviceProperties, bounded
    sidecar: dict[str, Any]  # the recorder's run facts (reason, rank, versions, ...)
    inventory: dict[int, list[dict[str, Any]]]  # device -> the sidecar's named tensors
    user_metadata: Any  # a snapshot's own, bounded
    compile_context: Any
    memory_timeline_layout: str  # export_memory_timeline's layout ("raw", ...)
    category_families: dict[str, str]  # its categories -> families
    moment: str  # memray: the moment the capture is of ("high_water_mark")
    memray: dict[str, Any]  # memray's metadata, bounded
    memray_snapshots: dict[str, Any]  # memray's RSS / heap series over time


@dataclass
class Capture:
    """One input file, normalized. Sources fill it; nothing downstream reads the file again."""

    source: CaptureKind
    path: str
    stacks: StackTable
    segments: pl.DataFrame
    blocks: pl.DataFrame
    events: pl.DataFrame
    devices: list[int]
    allocator_settings: dict[str, Any] | None = None
    annotations: list[dict[str, Any]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    has_trace: bool = False
    has_time: bool = False
    capacity_bytes: dict[int, int] = field(default_factory=dict)
    metadata: CaptureMetadata = field(default_factory=lambda: CaptureMetadata())
    #: The file name the capture was first read from, where `path` is not it (an export
    #: folder names the snapshot it was exported from); "" otherwise.
    origin: str = ""

    def __post_init__(self) -> None:
        if self.stacks.truncated:
            self.warnings.append(
                f"{self.stacks.truncated} stack(s) deeper than {MAX_STACK_FRAMES} frames were "
                f"cut to their innermost {MAX_STACK_FRAMES}")

    #: `device_events` per device, with the events table it was cut from (every stage asks
    #: for it: replay, attribution, diagnosis; a filter and a sort of millions of rows each)
    _device_events: dict[int, tuple[pl.DataFrame, pl.DataFrame]] = field(
        default_factory=dict, init=False, repr=False, compare=False)

    def __repr__(self) -> str:
        """One line (a notebook saves it; the tables are the attributes)."""
        return (f"<snapana Capture {self.source} {PurePath(self.path).name!r}: devices "
                f"{self.devices}, {self.events.height:,} events, {self.blocks.height:,} "
                "blocks>")

    def device_events(self, device: int) -> pl.DataFrame:
        """The events of one device in trace order; cut once per device (again when
        `events` is replaced)."""
        hit = self._device_events.get(device)
        if hit is None or hit[0] is not self.events:
            hit = self._device_events[device] = (
                self.events, self.events.filter(pl.col("device") == device).sort("idx"))
        return hit[1]

    def device_segments(self, device: int) -> pl.DataFrame:
        return self.segments.filter(pl.col("device") == device)

    def device_blocks(self, device: int) -> pl.DataFrame:
        return self.blocks.filter(pl.col("device") == device)
