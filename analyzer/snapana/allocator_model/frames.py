"""Interned stack frames, shared the way PyTorch's snapshot pickler shares them.

PyTorch symbolizes each distinct frame once and reuses the same Python objects for every
trace entry and block that refers to it, so pickle's memo stores each frame once. We do the
same so that samples stay small and look like real dumps.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

Frame = tuple[str, int, str]  # (filename, line, name)
FrameDict = dict[str, object]


class FrameTable:
    """Hands out one shared dict per distinct frame and one shared list per distinct stack."""

    def __init__(self) -> None:
        self._frames: dict[Frame, FrameDict] = {}
        self._stacks: dict[tuple[Frame, ...], list[FrameDict]] = {}
        self.empty: list[FrameDict] = []

    def frame(self, frame: Frame) -> FrameDict:
        """The shared dict for one (filename, line, name) frame."""
        d = self._frames.get(frame)
        if d is None:
            filename, line, name = frame
            d = {"filename": filename, "line": line, "name": name}
            self._frames[frame] = d
        return d

    def stack(self, frames: Sequence[Frame] | Iterable[Frame] | None) -> list[FrameDict]:
        """The shared list for a stack given innermost frame first."""
        if not frames:
            return self.empty
        key = tuple(frames)
        lst = self._stacks.get(key)
        if lst is None:
            lst = [self.frame(f) for f in key]
            self._stacks[key] = lst
        return lst
