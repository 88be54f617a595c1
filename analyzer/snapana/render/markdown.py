"""A ticket or PR body: the verdict and the tables, pasteable into any tracker."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from snapana.render import Options
from snapana.render.check import COLUMNS as CHECK_COLUMNS
from snapana.render.check import CheckView
from snapana.render.scale import COLUMNS as SCALE_COLUMNS
from snapana.render.scale import HELD_COLUMNS, ScaleView
from snapana.render.text_log import TextLogView
from snapana.render.views import CaptureView, DeviceView, DiffView, RanksView
from snapana.render.whatif import COLUMNS as WHATIF_COLUMNS
from snapana.render.whatif import WhatIfView
from snapana.render.wording import GROWTH_HEADING, KNOB_COLUMNS, evidence_note
from snapana.units import fmt_bytes, inert

TOP_GROUPS = 10  # families listed, the rest summed in one row
TOP_SITES = 20  # changed sites in a diff
TOP_SIZES = 12  # rows of the sizes table of a history-less state
#: The most columns a capture's table has: wider, a tracker's page (800 px) scrolls sideways;
#: what does not fit goes into a list under the table.
MAX_COLUMNS = 4

#: Characters escaped wherever they stand: `\\` and `` ` `` (escapes, code spans), `*` and `~`
#: (emphasis, strikethrough), `[` and `]` (links, images, footnotes), `|` (table cells), `&`
#: (entity references), `<` and `>` as entities (raw HTML, `<https://…>` autolinks; an
#: entity never starts a tag or a blockquote). `$` is GitHub's math.
_ESCAPE = str.maketrans({c: "\\" + c for c in "\\`*~[]|&$"} | {"<": "&lt;", ">": "&gt;"})
#: What needs its context: an `_` run that could open or close emphasis (one between two
#: letters or digits cannot); the `:` of `scheme://` and the `.` of `www.` (GFM's autolink
#: extension links them bare); a line's start that would open a block (heading, list item,
#: setext underline or thematic break, ordered list item); a space at either end (markdown
#: drops it, and four at a line's start make a code block) becomes `&#32;`, shown as it is.
_CONTEXT = re.compile(r"_+|:(?=//)|(?<=www)\.|^#{1,6}(?=\s|$)|^[+-](?=\s|$)|^=+(?=\s*$)"
                      r"|^-+(?=\s*$)|^\d{1,9}[.)](?=\s|$)|^ | $", re.IGNORECASE)
#: An e-mail address is linked after escapes are undone (cmark-gfm's autolink post-pass over
#: the joined text), so no escape stops it: an empty comment before its `@` splits the text.
_MAIL = re.compile(r"(?<=[A-Za-z0-9.+_-])@")


def _context(m: re.Match[str]) -> str:
    t, s = m.group(), m.string
    if t == " ":
        return "&#32;"
    if t[0] == "_":
        inside = (0 < m.start() and s[m.start() - 1].isalnum()
                  and m.end() < len(s) and s[m.end()].isalnum())
        return t if inside else "\\_" * len(t)
    if t[0].isdigit():
        return t[:-1] + "\\" + t[-1]
    return "\\" + t  # one backslash before a block's first character undoes the block


def esc(text: str) -> str:
    """Text from an input (a frame's or a file's name, a log's line, a pack's label), or a
    sentence that quotes one, as markdown that shows it as written: no link, image, autolink,
    emphasis, HTML, entity or table cell that the text made, its control, bidi and zero-width
    characters shown escaped (`\\u200b`). The one escaping function of markdown output."""
    text = inert(text, lines=False)
    return _MAIL.sub("<!---->@", _CONTEXT.sub(_context, text.translate(_ESCAPE)))


def _fence(text: str, least: int = 1) -> str:
    """A run of backticks longer than any in `text`: a code span or block it opens is closed
    by its own fence only."""
    return "`" * max(least, max((len(r) for r in re.findall("`+", text)), default=0) + 1)


def code(text: str, cell: bool = True) -> str:
    """A code span (family ids, knobs, sites): shown verbatim, as no markup, entity or
    autolink works inside one; its fence is longer than any run of backticks in the text, and
    in a table `cell` `|` is escaped (GFM unescapes it before the span is read)."""
    text = inert(text, lines=False)
    if not text:
        return ""
    fence = _fence(text)
    pad = " " if text[0] in "` " or text[-1] in "` " else ""
    body = text.replace("|", "\\|") if cell else text
    return f"{fence}{pad}{body}{pad}{fence}"


def _device(out: list[str], d: DeviceView) -> None:
    r = d.report
    out.append(f"### Memory on {esc(d.name)} — {esc(d.moment)}")
    out.append("")
    out.append(f"**Verdict.** {esc(d.lead)}")
    out.append("")
    out.extend(f"- {esc(line)}" for line in d.answer.evidence)
    if d.answer.evidence:
        out.append("")
    for line in (d.job.workload, d.job.settings):
        if line:
            out.append(f"- {esc(line)}")
    if d.job.workload or d.job.settings:
        out.append("")
    out.append("| | |")
    out.append("|---|---:|")
    out.extend(f"| {esc(k)} | {esc(v)} |" for k, v in d.headline)
    out.append("")
    if d.sizes:
        out.append("**Sizes** (no history: what the blocks' sizes say, related sizes together)"
                   + (f". {esc(d.demand)}" if d.demand else ""))
        _table(out, ("blocks of a size", "total", "of allocated", "related size"),
               [(b, t, sh, esc(rel)) for b, t, sh, rel in d.sizes[:TOP_SIZES]])
        out.append("")
    out.append("| what holds memory | bytes | blocks | share |")
    out.append("|---|---:|---:|---:|")
    for g in r.groups[:TOP_GROUPS]:
        share = g.bytes / r.allocated_bytes if r.allocated_bytes else 0.0
        out.append(f"| {code(g.name)} | {fmt_bytes(g.bytes)} | {g.blocks} | {share:.1%} |")
    if len(r.groups) > TOP_GROUPS:
        rest = r.groups[TOP_GROUPS:]
        out.append(f"| {len(rest)} more | {fmt_bytes(sum(g.bytes for g in rest))} | "
                   f"{sum(g.blocks for g in rest)} | |")
    out.append("")  # what does not fit a narrow column: each family's evidence, copies, site
    for g in r.groups[:TOP_GROUPS]:
        said = [esc(x) for x in (evidence_note(g), d.group_notes.get(g.name, "")) if x]
        if g.sites:
            said.append(f"top site {code(str(g.sites[0]['site']), cell=False)}")
        out.append(f"- {code(g.name, cell=False)}: " + "; ".join(said))
    if d.growth:
        out.append("")
        out.append("**How it got there** (each family from the first recorded event):")
        out.append("")
        out.extend(f"- {esc(line)}" for line in d.growth)
    _table(out, ("without family", "bytes", "would the request fit?", "can go"),
           [(code(f), b, esc(res), esc(c)) for f, b, res, c in d.what_ifs])
    _knobs(out, d.knobs)
    if d.causes:  # a list: a verdict or a why may hold a setting no narrow column can wrap
        out += ["", "**Cause checks:**", ""]
        out += [f"- {esc(c)}: **{esc(st)}** — {esc(why)}" for c, st, why in d.causes]
    out += ["", f"**The verdict in full.** {esc(d.verdict)}"]
    for w in r.warnings:
        out.append(f"\n> warning: {esc(w)}")
    out.append("")


def _knobs(out: list[str], knobs: Sequence[Sequence[str]]) -> None:
    """The knobs as a numbered list (the first is the verdict's), each `KNOB_COLUMNS` field
    named: seven columns are wider than a tracker's page, and a list wraps where a table
    scrolls sideways."""
    if not knobs:
        return
    out += ["", "**Knobs** (the first is the verdict's):", ""]
    for i, (k, cost, on, *rest) in enumerate(knobs, 1):
        fields = "; ".join(f"{name}: {esc(value)}" for name, value
                           in zip(KNOB_COLUMNS[3:], rest, strict=True) if value)
        out.append(f"{i}. {code(k, cell=False)} ({esc(cost)}), {KNOB_COLUMNS[2]} {esc(on)} — "
                   f"{fields}")


def capture(view: CaptureView, options: Options) -> str:
    out: list[str] = []
    if view.ranks is not None:
        out.append(ranks(view.ranks, options))
        if view.devices:
            out.append(f"The full report of {esc(view.devices[0].report.path)}:")
            out.append("")
    if view.device_rows:
        out.append("**Devices of this process.**")
        _table(out, view.device_columns[:MAX_COLUMNS],
               [[esc(c) for c in row[:MAX_COLUMNS]] for row in view.device_rows])
        out += [""] + [f"- {esc(row[0])}: " + "; ".join(
            f"{esc(h)} {esc(c)}" for h, c in zip(view.device_columns[MAX_COLUMNS:],
                                                 row[MAX_COLUMNS:], strict=True))
            for row in view.device_rows if len(row) > MAX_COLUMNS]
        out += ["", esc(view.device_note), ""]
    for d in view.devices:
        _device(out, d)
    for c in view.log_checks:
        out += ["", f"**The log beside it: {esc(c.title)}.** {esc(c.verdict)}"]
        _table(out, c.COLUMNS, [[esc(x) for x in row] for row in c.rows])
    return "\n".join(out) + "\n"


def _table(out: list[str], header: tuple[str, ...], rows: Sequence[Sequence[str]]) -> None:
    """Cells come escaped (or as code spans) from the caller; the header is escaped here (a
    rank table's columns may name input files)."""
    if not rows:
        return
    out.append("")
    out.append("| " + " | ".join(esc(h) for h in header) + " |")
    out.append("|" + "---|" * len(header))
    out.extend("| " + " | ".join(row) + " |" for row in rows)


def diff(view: DiffView, options: Options) -> str:
    out = ["### GPU memory: before vs after", "",
           f"- before: {esc(view.before)}", f"- after: {esc(view.after)}", "",
           f"**Verdict.** {esc(view.verdict)}", "", "| | before | after | change |",
           "|---|---:|---:|---:|"]
    out += ["| " + " | ".join(esc(c) for c in row) + " |" for row in view.totals]
    if view.families:
        out += ["", "| family | before | after | change | |", "|---|---:|---:|---:|---|"]
        out += [f"| {code(f)} | " + " | ".join(esc(c) for c in rest) + " |"
                for f, *rest in view.families]
    if view.growth:
        out += ["", f"**{GROWTH_HEADING}:**", ""]
        out += [f"- {esc(line)}" for line in view.growth]
    if view.history_note:
        out += ["", esc(view.history_note)]
    sites = view.sites[:TOP_SITES]
    if sites:
        out += ["", "| family | site | before | after | change | |",
                "|---|---|---:|---:|---:|---|"]
        out += ["| " + " | ".join(esc(c) for c in row) + " |" for row in sites]
    return "\n".join(out) + "\n"


def ranks(view: RanksView, options: Options) -> str:
    out = [f"**{esc(view.headline)}**", "", "| " + " | ".join(esc(c) for c in view.columns) + " |",
           "|" + "---|" * len(view.columns)]
    out += ["| " + " | ".join(esc(c) for c in row) + " |" for row in view.rows]
    return "\n".join(out) + "\n"


def text_log(view: TextLogView, options: Options) -> str:
    """A text log's OOM messages, as a ticket body."""
    out = [f"### GPU out of memory: {esc(view.title)}", "",
           f"**Verdict.** {esc(view.verdict)}" if view.verdict else
           "No out-of-memory message was found in the text."]
    _table(out, view.rank_columns, [[esc(c) for c in row] for row in view.rank_rows])
    for m in view.messages:
        out += ["", f"#### {esc(m.where)}" + (f", GPU {m.device}" if m.device is not None
                                               else ""), "", esc(m.wording)]
        _table(out, ("figure", "as printed"), [(esc(w), esc(v)) for w, v in m.figures])
        if m.split:
            out += ["", esc(m.split)]
        out += [""] + [f"- cause: {esc(c)}" for c in m.causes]
        out += [f"- knob: {code(k, cell=False)} — {esc(why)}" for k, why in m.knobs]
        out += [f"- request: {esc(t)}" for t in m.request]
        out += [f"- knob for the request: {code(k, cell=False)} — {esc(why)}"
                for k, why in m.request_knobs]
        out += [f"- note: {esc(o)}" for o in m.oddities]
    for sec in view.sections:
        out += ["", f"#### {esc(sec.title)}", ""] + [f"- {esc(t)}" for t in sec.sentences]
        _table(out, sec.columns, [[esc(c) for c in row] for row in sec.rows])
        out += [""] + [f"- knob: {code(k, cell=False)} — {esc(why)}" for k, why in sec.knobs]
    out += [""] + [f"- not read: {esc(u)}" for u in view.unrecognised]
    if view.record:
        fence = _fence("\n".join(view.record), 3)
        out += ["", fence, *view.record, fence]
    return "\n".join(out) + "\n"


def _replayed_device(d: Any) -> list[str]:
    """A device of a replayed change (whatif, scale): its heading, proof and verdict."""
    return ["", f"#### Device {d.device}", "", esc(d.proof), "", f"**{esc(d.verdict)}**"]


def whatif(view: WhatIfView, options: Options) -> str:
    out = [f"### What if: {esc(view.change)}", "", esc(view.title)]
    for d in view.devices:
        out += _replayed_device(d)
        _table(out, WHATIF_COLUMNS, [[esc(c) for c in row] for row in d.rows])
    out += [""] + [f"- not simulated: {esc(n)}" for n in view.not_simulated]
    out += ["", f"_{esc(view.footer)}_"]
    return "\n".join(out) + "\n"


def check(view: CheckView, options: Options) -> str:
    out = [f"### snapana budget check: {esc(view.title)}", "", esc(view.where), "",
           f"**{esc(view.verdict)}**"]
    _table(out, CHECK_COLUMNS, [[esc(c) for c in row] for row in view.rows()])
    out += [""] + [f"- {esc(line)}" for line in view.breach_lines()]
    return "\n".join(out) + "\n"


def scale(view: ScaleView, options: Options) -> str:
    out = [f"### What if: {esc(view.change)}", "", esc(view.title)]
    for d in view.devices:
        out += ["", f"#### Device {d.device}", ""]
        out += [x for line in d.head for x in (esc(line), "")]
        out += [esc(d.proof), "", f"**{esc(d.verdict)}**"]
        _table(out, SCALE_COLUMNS, [[esc(c) for c in row] for row in d.rows])
        out += [""] + [f"- {esc(line)}" for line in d.fit]
        out += ["", "Assumed:", ""] + [f"- {esc(line)}" for line in d.assumptions]
        _table(out, HELD_COLUMNS, [[esc(c) for c in row] for row in d.held_fixed])
    out += ["", f"_{esc(view.footer)}_"]
    return "\n".join(out) + "\n"
