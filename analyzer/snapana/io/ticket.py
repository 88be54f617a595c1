"""A ticket's attachments in one folder: `card.png` (the picture every tracker shows inline),
`ticket.md` (the markdown summary with the card embedded, under GitHub's comment limit),
`report.html` (the whole page, offline) and `summary.json`. Each file is written atomically;
an output that is an input is refused before any work (`check_targets`)."""

from __future__ import annotations

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

CARD, MARKDOWN, PAGE, JSON = "card.png", "ticket.md", "report.html", "summary.json"
TICKET_FILES = (CARD, MARKDOWN, PAGE, JSON)
#: GitHub's limit on an issue or comment body, in characters.
MARKDOWN_LIMIT = 65_536
_CUT = ("\n\n_(cut here to stay under GitHub's 65,536-character limit: report.html holds "
        "every section)_\n")


def check_targets(folder: Path, read: list[Path]) -> list[Path]:
    """The four outputs' paths, refused before any work when one is an input, lies inside
    an input folder, or is not a regular file; the folder must be one, or not exist yet."""
    check_folder_target(folder, replaced=False)
    refuse_inputs(folder, read)
    targets = [folder / name for name in TICKET_FILES]
    for target in targets:
        refuse_inputs(target, read)
        check_file_target(target)
    return targets


def ticket_markdown(view: CaptureView) -> str:
    """The markdown summary under the card, at most `MARKDOWN_LIMIT` characters (cut at a
    line, saying so, where a capture's tables would pass it)."""
    from snapana.render import render
    from snapana.render.markdown import esc

    first = view.devices[0] if view.devices else None
    alt = esc(first.finding) if first else "snapana card"
    head = (f"![{alt}]({CARD})\n\n" if first else "")
    body = render(view, "markdown")
    tail = (f"\n---\nAttached: `{CARD}` (the card above), `{PAGE}` (the whole report: "
            f"opens offline), `{JSON}`. Made by snapana.\n")
    text = head + body + tail
    if len(text) <= MARKDOWN_LIMIT:
        return text
    room = MARKDOWN_LIMIT - len(head) - len(_CUT) - len(tail)
    return head + body[:body.rfind("\n", 0, room)] + _CUT + tail


def write_ticket(view: CaptureView, folder: Path, file: str) -> list[Path]:
    """Write the four files into `folder` (made when absent; `check_targets` first)."""
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
    card, markdown, page, data = (folder / name for name in TICKET_FILES)
    write_atomic(card, card_png(view.devices[0], file))
    write_atomic(markdown, ticket_markdown(view))
    write_atomic(page, render(view, "html"))
    write_atomic(data, render(view, "json"))
    return [card, markdown, page, data]
