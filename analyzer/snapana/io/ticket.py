"""A ticket's attachments in one folder: `card.png` (the picture every tracker shows inline),
`ticket.md` (the markdown body, under GitHub's comment limit), `report.html` (the whole page,
offline), `report.html.zip` (the same page as a tracker takes it: GitHub attaches a .zip, not
an .html) and `summary.json`. Each file is written atomically; an output that is an input is
refused before any work (`check_targets`)."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING

from snapana.io.output import (
    OutputError,
    check_file_target,
    check_folder_target,
    refuse_inputs,
    write_atomic,
)

if TYPE_CHECKING:
    from snapana.render.views import CaptureView

CARD, MARKDOWN, PAGE, ZIPPED, JSON = ("card.png", "ticket.md", "report.html",
                                      "report.html.zip", "summary.json")
TICKET_FILES = (CARD, MARKDOWN, PAGE, ZIPPED, JSON)
#: GitHub's limit on an issue or comment body, in characters.
MARKDOWN_LIMIT = 65_536
#: The body's first line: where the card goes. A tracker uploads an image dropped on it and
#: writes its link there; a relative `![…](card.png)` would be a broken image until then, and
#: an HTML comment shows nothing in the issue if the card is never dropped.
CARD_LINE = (f"<!-- snapana: drop {CARD} (in the ticket folder) on this line: the tracker "
             "uploads it and puts its image here. -->\n\n")
_CUT = (f"\n\n_(cut here to stay under GitHub's 65,536-character limit: {ZIPPED} holds "
        "every section)_\n")
_TAIL = (f"\n---\nAttach from the ticket folder `{CARD}` (the card: drop it on this body's "
         f"first line) and `{ZIPPED}` (the whole report: unzip and open `{PAGE}`, offline); "
         f"`{JSON}` there holds the figures as JSON. Made by snapana.\n")
#: A fixed time in the zip (its earliest): the same report zips to the same bytes.
_ZIP_TIME = (1980, 1, 1, 0, 0, 0)


def check_targets(folder: Path, read: list[Path]) -> list[Path]:
    """The five outputs' paths, refused before any work when one is an input, lies inside
    an input folder, or is not a regular file; the folder must be one, or not exist yet."""
    check_folder_target(folder, replaced=False)
    refuse_inputs(folder, read)
    targets = [folder / name for name in TICKET_FILES]
    for target in targets:
        refuse_inputs(target, read)
        check_file_target(target)
    return targets


def ticket_markdown(view: CaptureView) -> str:
    """The markdown body: the card's line, the summary, and the files to attach, at most
    `MARKDOWN_LIMIT` characters (cut at a line, saying so, where a capture's tables would
    pass it). The headline is said once, in the summary's Verdict line (the card shows it
    too, as a picture)."""
    from snapana.render import render

    body = render(view, "markdown")
    text = CARD_LINE + body + _TAIL
    if len(text) <= MARKDOWN_LIMIT:
        return text
    room = MARKDOWN_LIMIT - len(CARD_LINE) - len(_CUT) - len(_TAIL)
    return CARD_LINE + body[:body.rfind("\n", 0, room)] + _CUT + _TAIL


def zipped(page: str) -> bytes:
    """`report.html` alone in a zip, deflated, with a fixed time: opened, the same bytes as
    the page `snapana report` writes."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        info = zipfile.ZipInfo(PAGE, date_time=_ZIP_TIME)
        info.compress_type = zipfile.ZIP_DEFLATED
        info.external_attr = 0o644 << 16
        archive.writestr(info, page.encode("utf-8"))
    return buffer.getvalue()


def write_ticket(view: CaptureView, folder: Path, file: str) -> list[Path]:
    """Write the five files into `folder` (made when absent; `check_targets` first)."""
    from snapana.render import render
    from snapana.render.card import card_png

    if not view.devices:
        raise OutputError(f"{file}: nothing to put on a card (no device analysed)")
    if not folder.exists():
        parent = folder.parent if str(folder.parent) else Path(".")
        if not parent.is_dir():
            raise OutputError(f"{folder}: folder {parent} does not exist")
        try:  # `check_targets` ran before the work; what stands there may have changed
            folder.mkdir()
        except OSError as exc:
            raise OutputError(f"{folder}: cannot make the folder: {exc.strerror or exc}"
                              ) from None
    card, markdown, page, archive, data = (folder / name for name in TICKET_FILES)
    html = render(view, "html")
    write_atomic(card, card_png(view.devices[0], file))
    write_atomic(markdown, ticket_markdown(view))
    write_atomic(page, html)
    write_atomic(archive, zipped(html))
    write_atomic(data, render(view, "json"))
    return [card, markdown, page, archive, data]
