"""The card: one PNG a tracker shows inline (GitHub, Jira and Slack refuse or download an
HTML attachment, and show a picture): the verdict's headline, the families at the moment as
bars in their report colours, the first knob with what it buys, device, peak and file.

Drawn with Pillow and its own default font (`ImageFont.load_default(size=...)`: Aileron,
CC0, inside Pillow), offline, with no browser. A layout is computed first (`card_layout`:
every box and its text), then painted (`card_png`), so a test can sample the picture where
the layout says a bar is. Formatting only: every word and figure comes from the view.
"""

from __future__ import annotations

import io
import textwrap
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING, Any

from snapana.units import fmt_bytes

if TYPE_CHECKING:
    from snapana.render.views import CaptureView, DeviceView

WIDTH = 800  # px: legible as it is in a ticket, no scaling
MARGIN = 24
BAR_ROWS = 8  # families drawn; the rest are one "other" bar
BAR_HEIGHT = 22
BAR_GAP = 8
LABEL_WIDTH = 300  # px left of the bars for the family's name and bytes
TEXT = "#1a1a1a"
MUTED = "#555555"
SIZES = {"title": 20, "headline": 17, "body": 15, "small": 13}
OOM_BAND, PEAK_BAND = "#d62728", "#3182bd"

#: Characters the default font has no glyph for, spelled with ones it has.
_SPELLED = str.maketrans({"—": "-", "–": "-", "×": "x", "−": "-", "→": "->", "µ": "u",
                          "·": "-", "…": "...", "‘": "'", "’": "'", "“": '"', "”": '"'})


@dataclass(frozen=True)
class Bar:
    """One family's bar: its name and bytes as the label, its box, its colour."""

    label: str
    colour: str
    box: tuple[int, int, int, int]  # left, top, right, bottom (right exclusive)


@dataclass(frozen=True)
class Line:
    text: str
    xy: tuple[int, int]
    size: str  # a key of SIZES
    colour: str = TEXT


@dataclass(frozen=True)
class CardLayout:
    width: int
    height: int
    band: str  # the title band's colour: red for an OOM
    band_height: int
    lines: tuple[Line, ...]
    bars: tuple[Bar, ...]


@cache
def _font(size: int) -> Any:
    from PIL import ImageFont

    return ImageFont.load_default(size=size)


@cache
def _missing(size: int) -> bytes:
    """The picture of a glyph the font does not have (its notdef box)."""
    return bytes(_font(size).getmask("\uffff"))


def _drawable(text: str, size: int) -> str:
    """`text` with every character the font cannot draw spelled with ones it can, or '?'."""
    text = text.translate(_SPELLED)
    missing = _missing(size)
    return "".join(c if c.isascii() or bytes(_font(size).getmask(c)) != missing else "?"
                   for c in text)


def _wrap(text: str, size: str, width: int, limit: int) -> list[str]:
    """`text` in lines of at most `width` px (at most `limit` lines, the last ending in
    '...' where more was left out)."""
    px = SIZES[size]
    font = _font(px)
    text = _drawable(text, px)
    chars = max(10, int(width / (font.getlength("abcdefghij") / 10)))
    lines = textwrap.wrap(text, chars, break_long_words=True, break_on_hyphens=False)
    while lines and any(font.getlength(ln) > width for ln in lines) and chars > 10:
        chars -= 2
        lines = textwrap.wrap(text, chars, break_long_words=True, break_on_hyphens=False)
    if len(lines) > limit:
        lines = lines[:limit]
        lines[-1] = lines[-1][: max(0, chars - 3)].rstrip() + "..."
    return lines


def card_layout(d: DeviceView, file: str) -> CardLayout:
    """Where everything of the card goes, top to bottom."""
    from snapana.render.views import OTHER_COLOUR, UNKNOWN_COLOUR

    r = d.report
    inner = WIDTH - 2 * MARGIN
    lines: list[Line] = []
    y = 14
    lines.append(Line(_drawable(f"{d.name} - {d.moment}", SIZES["title"]), (MARGIN, y),
                      "title", "#ffffff"))
    y += 38
    band_bottom = y
    y += 14
    for text in _wrap(d.answer.finding, "headline", inner, 5):
        lines.append(Line(text, (MARGIN, y), "headline"))
        y += SIZES["headline"] + 7
    y += 10
    where = d.moment.split(" (")[0]
    lines.append(Line(_drawable(f"What holds the memory {where}", SIZES["body"]), (MARGIN, y),
                      "body", MUTED))
    y += SIZES["body"] + 10
    groups = list(r.groups[:BAR_ROWS])
    rest = r.groups[BAR_ROWS:]
    rows = [(g.name, g.bytes, d.colours.get(g.name, UNKNOWN_COLOUR)) for g in groups]
    if rest:
        rows.append((f"{len(rest)} other families", sum(g.bytes for g in rest), OTHER_COLOUR))
    top = max((b for _, b, _ in rows), default=0)
    total = r.allocated_bytes
    bars = []
    room = inner - LABEL_WIDTH
    for name, nbytes, colour in rows:
        share = f" ({nbytes / total:.0%})" if total else ""
        label = _drawable(f"{name}  {fmt_bytes(nbytes)}{share}", SIZES["small"])
        length = max(3, round(room * nbytes / top)) if top else 3
        left = MARGIN + LABEL_WIDTH
        bars.append(Bar(label, colour, (left, y, left + length, y + BAR_HEIGHT)))
        y += BAR_HEIGHT + BAR_GAP
    if not rows:
        lines.append(Line("nothing is allocated", (MARGIN, y), "body", MUTED))
        y += SIZES["body"] + 10
    y += 8
    for text in _wrap(d.answer.fix, "body", inner, 4):
        lines.append(Line(text, (MARGIN, y), "body"))
        y += SIZES["body"] + 6
    y += 10
    facts = [d.name, f"peak allocated {fmt_bytes(r.peak_allocated_bytes)}"]
    if r.reserved_known and not d.host:
        facts.append(f"reserved {fmt_bytes(r.reserved_bytes)}")
    if r.diagnosis.capacity_bytes:
        facts.append(f"capacity {fmt_bytes(r.diagnosis.capacity_bytes)}")
    for text in _wrap("  |  ".join(facts), "small", inner, 2) + _wrap(file, "small", inner, 2):
        lines.append(Line(text, (MARGIN, y), "small", MUTED))
        y += SIZES["small"] + 5
    y += MARGIN - 5
    return CardLayout(WIDTH, y, OOM_BAND if r.oom else PEAK_BAND, band_bottom, tuple(lines),
                      tuple(bars))


def card_png(d: DeviceView, file: str) -> bytes:
    """The card as PNG bytes."""
    from PIL import Image, ImageDraw

    layout = card_layout(d, file)
    image = Image.new("RGB", (layout.width, layout.height), "#ffffff")
    draw = ImageDraw.Draw(image)
    draw.rectangle((0, 0, layout.width - 1, layout.band_height), fill=layout.band)
    for line in layout.lines:
        draw.text(line.xy, line.text, font=_font(SIZES[line.size]), fill=line.colour)
    for bar in layout.bars:
        left, top, right, bottom = bar.box
        draw.text((MARGIN, top + 3), bar.label, font=_font(SIZES["small"]), fill=TEXT)
        draw.rectangle((left, top, right - 1, bottom - 1), fill=bar.colour)
    draw.rectangle((0, 0, layout.width - 1, layout.height - 1), outline="#cccccc")
    out = io.BytesIO()
    image.save(out, format="PNG", optimize=True)
    return out.getvalue()


def capture(view: CaptureView, options: object) -> bytes:
    """The `png` renderer of a capture view: the card of the device shown first (the one a
    ticket attaches); none analysed is one line, exit 2."""
    from snapana.errors import InputError

    if not view.devices:
        raise InputError(f"{view.title}: nothing to put on a card (no device analysed)")
    return card_png(view.devices[0], view.title)
