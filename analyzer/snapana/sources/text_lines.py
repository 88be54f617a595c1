"""The lines of a text log as its readers match them (issue 58): each cut to
`limits.MAX_LOG_LINE` characters, so that every pattern of the text readers runs over a
bounded span and reading a text is linear in its length, whatever one line holds (a run of
20,000 digits, 5,000 anchors glued together). Shared by every reader of text: the OOM
messages, the tables beside them, vLLM's lines; the note says what was cut."""

from __future__ import annotations

from snapana.limits import MAX_LOG_LINE


def bounded_lines(text: str) -> tuple[list[str], str | None]:
    """`text`'s lines, each at most MAX_LOG_LINE characters, and a note when one was cut."""
    lines = text.splitlines()
    cut = [i for i, line in enumerate(lines) if len(line) > MAX_LOG_LINE]
    for i in cut:
        lines[i] = lines[i][:MAX_LOG_LINE]
    if not cut:
        return lines, None
    return lines, (f"{len(cut):,} line(s) longer than {MAX_LOG_LINE:,} characters (line "
                   f"{cut[0] + 1:,} the first) were read up to their first {MAX_LOG_LINE:,} "
                   "(SNAPANA has this bound in limits.MAX_LOG_LINE)")
