"""Text for a terminal: a capture, the ranks of a job, explanations and a diff as plain
aligned columns and wrapped paragraphs that read well at 80 columns and in a CI log (long
words such as knob flags and sites are never cut). Formatting only."""

from __future__ import annotations

import io
import re
import textwrap
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.text import Text

from snapana.analysis.explain import INFERRED, INVENTORY
from snapana.render import Options
from snapana.render.check import COLUMNS as CHECK_COLUMNS
from snapana.render.check import CheckView
from snapana.render.scale import COLUMNS as SCALE_COLUMNS
from snapana.render.scale import HELD_COLUMNS, ScaleView
from snapana.render.text_log import TextLogView, record_hint, settings_line
from snapana.render.whatif import COLUMNS as WHATIF_COLUMNS
from snapana.render.whatif import WhatIfView
from snapana.units import address_text, fmt_bytes, inert

if TYPE_CHECKING:  # the views import the analysis (polars): a text log's page needs neither
    from snapana.render.views import CaptureView, DeviceView, DiffView, ExplainView, RanksView

TOP_GROUPS = 12  # families in the "what holds memory" list
TOP_SITES = 20  # changed sites in a diff
TOP_SIZES = 12  # rows of the sizes table of a history-less state
INDENT = "  "
_FIGURE = re.compile(r"(\d) (B|KiB|MiB|GiB|TiB)\b")


def _console(options: Options) -> Console:
    """A console that writes into a string, `options.width` columns, styled or not."""
    if options.color:
        return Console(file=io.StringIO(), width=options.width, force_terminal=True,
                       force_jupyter=False)
    # force_jupyter=False: in a notebook rich would display the output instead of writing it
    return Console(file=io.StringIO(), width=options.width, color_system=None,
                   force_terminal=False, force_jupyter=False, highlight=False)


def _text(console: Console) -> str:
    out = console.file
    assert isinstance(out, io.StringIO)
    return out.getvalue()


def _wrap(text: str, width: int, first: str, indent: str) -> list[str]:
    """`text` wrapped at spaces to `width` columns, never between a figure and its unit; a
    word wider than the line (a long path) is split where a path splits (`/`, `.`, `:`)."""
    glued = _FIGURE.sub("\\1\u00a0\\2", text)
    lines = [ln.replace("\u00a0", " ") for ln in textwrap.wrap(
        glued, width, initial_indent=first, subsequent_indent=indent,
        break_long_words=False, break_on_hyphens=False) or [first]]
    out: list[str] = []
    for ln in lines:
        lead = first if not out else indent
        if len(ln) <= width:
            out.append(ln)
            continue
        pieces = _split_word(ln[len(lead):], width - len(lead), width - len(indent))
        out += [lead + pieces[0], *(indent + p for p in pieces[1:])]
    return out


#: Where a word too long for its line is split: after a path's separators.
_SPLIT_AFTER = "/.:_,;"


def _split_word(word: str, first: int, rest: int) -> list[str]:
    """`word` in pieces of at most `first` then `rest` characters, each cut after the last
    separator that fits (anywhere, if none does)."""
    pieces: list[str] = []
    room = max(1, first)
    while len(word) > room:
        cut = max((word.rfind(c, 0, room) for c in _SPLIT_AFTER), default=-1) + 1
        cut = cut if cut > room // 3 else room
        pieces.append(word[:cut])
        word = word[cut:]
        room = max(1, rest)
    return [*pieces, word]


def _fold(cell: str, width: int) -> list[str]:
    """A table cell as lines of at most `width` characters."""
    if len(cell) <= width:
        return [cell]
    return _wrap(cell, width, "", "")


#: The narrowest a text column is folded to before the table becomes one record per row.
MIN_CELL = 12


def _table(header: tuple[str, ...], rows: Sequence[Sequence[str]], numeric: set[str],
           width: int) -> list[list[str]]:
    """The header's lines, then each row's: aligned columns within `width`. Text columns
    wider than the room fold (a cell on several lines); figures never do. A table that
    cannot fit that way becomes one record per row ("column: value" lines)."""
    cells = [[str(c) for c in r] for r in [header, *rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    text_cols = [i for i, h in enumerate(header) if h not in numeric]

    def excess() -> int:
        return sum(widths) + 2 * (len(widths) - 1) - width

    # a column of words folds better than one of names: it gives way first, down to half
    weight = [2 if any(" " in r[i] for r in cells[1:]) else 1 for i in range(len(header))]
    while excess() > 0:
        shrinkable = [i for i in text_cols if widths[i] > MIN_CELL]
        if not shrinkable:
            break
        widths[max(shrinkable, key=lambda i: widths[i] * weight[i])] -= 1
    if excess() > 0:
        return [[], *(_record(header, r, width) for r in cells[1:])]
    out = []
    for row in cells:
        folded = [_fold(c, w) for c, w in zip(row, widths, strict=True)]
        lines = []
        for k in range(max(len(f) for f in folded)):
            parts = [f[k] if k < len(f) else "" for f in folded]
            lines.append("  ".join(p.rjust(w) if h in numeric else p.ljust(w) for p, w, h
                                   in zip(parts, widths, header, strict=True)).rstrip())
        out.append(lines)
    return out


def _record(header: tuple[str, ...], row: Sequence[str], width: int) -> list[str]:
    """One row of a table too wide for the terminal: its first cell, then "column: value"."""
    lines = _wrap(row[0], width, "", INDENT)
    for h, c in zip(header[1:], row[1:], strict=True):
        if c:
            lines += _wrap(f"{h}: {c}" if h else c, width, INDENT, INDENT * 2)
    return lines


def _columns(header: tuple[str, ...], rows: Sequence[Sequence[str]],
             numeric: set[str], width: int) -> list[str]:
    """`_table`'s lines, one after another."""
    return [ln for lines in _table(header, rows, numeric, width) for ln in lines]


class _Out:
    """Lines for a terminal of `width` columns: text wraps at spaces and never inside a word,
    so a knob flag or a site is always whole (a word wider than the terminal runs past it
    rather than being cut)."""

    def __init__(self, options: Options) -> None:
        self.console = _console(options)
        self.width = max(40, options.width)
        self.count = 0  # lines written

    def line(self, text: str = "", style: str | None = None) -> None:
        self.console.print(Text(text, style=style or ""), soft_wrap=True)
        self.count += 1

    def para(self, text: str, indent: str = "", first: str | None = None,
             style: str | None = None) -> None:
        for ln in _wrap(text, self.width, indent if first is None else first, indent):
            self.line(ln, style)

    def table(self, header: tuple[str, ...], rows: Sequence[Sequence[str]],
              numeric: set[str], indent: str = INDENT) -> list[list[str]]:
        """Each row's lines (the header's first) of a table that fits this terminal after
        `indent`; `write_table` prints them."""
        return [[indent + ln for ln in lines]
                for lines in _table(header, rows, numeric, self.width - len(indent))]

    def write_table(self, header: tuple[str, ...], rows: Sequence[Sequence[str]],
                    numeric: set[str], indent: str = INDENT) -> None:
        for lines in self.table(header, rows, numeric, indent):
            self.lines(lines)

    def lines(self, lines: Sequence[str], style: str | None = None) -> None:
        for ln in lines:
            self.line(ln, style)

    def heading(self, text: str) -> None:
        self.line()
        self.para(text, INDENT, first="", style="bold")

    def text(self) -> str:
        return _text(self.console)


def _answer(out: _Out, d: DeviceView) -> None:
    """The device's heading, the verdict's headline and its evidence lines."""
    out.para(f"{d.name} — {d.moment}", first="── ", indent="   ",
             style="bold red" if d.report.oom else "bold blue")
    out.para(d.lead, first="Verdict. ")
    for line in d.answer.evidence:
        out.para(line, first=INDENT + "· ", indent=INDENT * 2)


#: Knobs the one-screen summary lists at most (the rest, with their evidence, in --full).
BRIEF_KNOBS = 3
SCREEN_LINES = 24  # a terminal's first screen


def _brief(out: _Out, d: DeviceView, tail: list[str]) -> None:
    """One device on one screen: the answer, the first knob and as many of the next ones as
    the screen holds above the `tail` lines, then the tail."""
    _answer(out, d)
    if d.knobs:
        items = [_wrap(f"{i}. {knob} [{cost}]", out.width, INDENT, INDENT * 3)
                 for i, (knob, cost, *_) in enumerate(d.knobs[:BRIEF_KNOBS], 1)]
        room = SCREEN_LINES - out.count - 1 - len(tail)
        shown = [items[0]]
        for lines in items[1:]:
            if sum(map(len, shown)) + len(lines) > room:
                break
            shown.append(lines)
        more = f"{len(d.knobs)} in all, " if len(d.knobs) > len(shown) else ""
        out.para(f"knobs ({more}--full: what each acts on, its caveat, the replay)",
                 first="", indent=INDENT)
        for lines in shown:
            out.lines(lines)
    out.lines(tail)


#: Where to look next, under a one-screen summary.
NEXT = ("next: --full (every section) · snapana report FILE (the page) · snapana ticket "
        "FILE -o DIR (a card and markdown for a tracker)")


def _device(out: _Out, d: DeviceView) -> None:
    r = d.report
    _answer(out, d)
    out.para(d.verdict, first="In full. ")
    for line in (d.job.workload, d.job.settings):
        if line:
            out.para(line, first=INDENT, indent=INDENT * 3)
    out.heading("figures")
    width = max((len(k) for k, _ in d.headline), default=0)
    for k, v in d.headline:
        out.line(f"{INDENT}{k.ljust(width)}  {v.rjust(10)}")
    if d.sizes:
        out.heading("sizes (no history: what the blocks' sizes say, related sizes together)")
        if d.demand:
            out.para(d.demand, first=INDENT, indent=INDENT)
        _sizes(out, d)
    if not r.groups:
        out.heading("what holds memory: nothing is allocated")
    else:
        _groups(out, d)
    if d.growth:
        out.heading("how it got there (each family from the first recorded event)")
        for line in d.growth:
            out.para(line, first=INDENT, indent=INDENT * 3)
    if d.what_ifs:
        out.heading("what if a family were gone")
        for family, nbytes, result, can_go in d.what_ifs:
            out.para(f"{family} ({nbytes}) — can go: {can_go}", first=INDENT,
                     indent=INDENT * 3)
            out.para(result, indent=INDENT * 3)
    if d.knobs:
        out.heading("knobs (the first is the verdict's)")
        for i, (knob, cost, acts_on, effect, caveat, applies, replay) in enumerate(d.knobs,
                                                                                    1):
            out.para(f"{i}. {knob}", first=INDENT, indent=INDENT * 3)
            out.para(f"[{cost}] acts on {acts_on}: {effect}", indent=INDENT * 3)
            if applies:
                out.para(f"applies: {applies}", indent=INDENT * 3)
            if caveat:
                out.para(f"caveat: {caveat}", indent=INDENT * 3)
            out.para(f"replay: {replay}", indent=INDENT * 3)
    if d.causes:
        out.heading("cause checks")
        for cause, status, why in d.causes:
            out.para(f"{cause} — {status}", first=INDENT, indent=INDENT * 3)
            out.para(why, indent=INDENT * 3)
    for w in r.warnings:
        out.para(f"warning: {w}", indent=INDENT)


def _sizes(out: _Out, d: DeviceView, limit: int = TOP_SIZES) -> None:
    """Each size's blocks and total, related sizes indented under their group's largest."""
    shown = [(INDENT * (2 if relation else 1) + blocks, share, relation)
             for blocks, _, share, relation in d.sizes[:limit]]
    width = max(len(n) for n, _, _ in shown)
    for blocks, share, relation in shown:
        out.line(f"{blocks.ljust(width)}  {share.rjust(6)}")
        if relation:
            out.para(relation, indent=INDENT * 4)
    if len(d.sizes) > len(shown):
        out.line(f"{INDENT}and {len(d.sizes) - limit} more sizes (the JSON lists every one)")


def _groups(out: _Out, d: DeviceView) -> None:
    from snapana.render import wording

    r = d.report
    out.heading("what holds memory" + (" (evidence: how much was inferred)" if any(
        g.inferred_bytes for g in r.groups) else ""))
    rows = [(g.name, fmt_bytes(g.bytes), str(g.blocks),
             f"{g.bytes / r.allocated_bytes:.1%}" if r.allocated_bytes else "0.0%",
             wording.inferred_note(g)) for g in r.groups[:TOP_GROUPS]]
    head, *lines = out.table(("family", "bytes", "blocks", "share", ""), rows,
                             numeric={"bytes", "blocks", "share"})
    out.lines(head)
    for g, row_lines in zip(r.groups[:TOP_GROUPS], lines, strict=True):
        out.lines(row_lines)
        note = d.group_notes.get(g.name, "")
        if note:
            out.para(note, indent=INDENT * 3)
        if g.sites:
            out.para(f"top site: {g.sites[0]['site']}", indent=INDENT * 3)
    rest = r.groups[TOP_GROUPS:]
    if rest:
        out.line(f"{INDENT}{len(rest)} more families, "
                 f"{fmt_bytes(sum(g.bytes for g in rest))}")


def capture(view: CaptureView, options: Options) -> str:
    out = _Out(options)
    if not options.full and view.ranks is None and view.devices:
        return _brief_capture(out, view)
    if view.ranks is not None:
        _ranks(out, view.ranks)
        if view.devices:
            out.heading(f"the full report of {inert(view.devices[0].report.path, lines=False)}")
            out.line()
    if view.device_rows:
        out.heading("devices of this process")
        head, *lines = out.table(view.device_columns[:4],
                                 [row[:4] for row in view.device_rows],
                                 numeric={"peak allocated"})
        out.lines(head, "bold")
        for row, row_lines in zip(view.device_rows, lines, strict=True):
            out.lines(row_lines)
            out.para(f"{view.device_columns[4]} {row[4]}", indent=INDENT * 3)
        out.para(view.device_note, indent=INDENT)
        out.line()
    for i, d in enumerate(view.devices):
        if i:
            out.line()
        _device(out, d)
    for c in view.log_checks:
        out.line()
        out.heading(f"the log beside it: {c.title}")
        out.para(c.verdict, indent=INDENT)
        if c.rows:
            out.write_table(c.COLUMNS, c.rows, set())
    return out.text()


def _brief_capture(out: _Out, view: CaptureView) -> str:
    """One capture on one screen: its first device (the failing one) in brief, a line for
    each other, then where to look next."""
    first, *rest = view.devices
    tail: list[str] = []
    for d in rest:
        top = d.report.groups[0].name if d.report.groups else "nothing allocated"
        tail += _wrap(f"{d.name}: {'OOM' if d.report.oom else 'no OOM'}, "
                      f"{fmt_bytes(d.report.allocated_bytes)} allocated {d.moment} (top: "
                      f"{top})", out.width, "also ", INDENT)
    for c in view.log_checks:  # each log's verdict on the first screen, its rows in --full
        tail += _wrap(c.brief, out.width, "", INDENT)
    _brief(out, first, tail + _wrap(NEXT, out.width, "", ""))
    return out.text()


def _ranks(out: _Out, view: RanksView) -> None:
    out.para(view.headline)
    out.line()
    head = ("rank", "file", "OOM", "reserved", "allocated")
    header, *lines = out.table(head, [row[:5] for row in view.rows],
                               numeric={"reserved", "allocated"})
    out.lines(header, "bold")
    for row, row_lines in zip(view.rows, lines, strict=True):
        out.lines(row_lines)
        extra = "; ".join(x for x in (f"top family {row[5]}" if row[5] != "-" else "", row[6])
                          if x)
        if extra:
            out.para(extra, indent=INDENT * 3)


def ranks(view: RanksView, options: Options) -> str:
    out = _Out(options)
    _ranks(out, view)
    return out.text()


def explain(view: ExplainView, options: Options) -> str:
    """Each explained site: the decision, the matched frames marked, near misses."""
    console = _console(options)
    for it in view.items:
        d = it.explanation.decision
        console.print(f"[bold]{it.site}[/bold]: {it.blocks} block(s), {fmt_bytes(it.bytes)}"
                      f" — e.g. {', '.join(map(address_text, it.addresses))}", highlight=False)
        # the family the blocks ended with comes first; the rules' decision follows it
        if it.evidence == INVENTORY:
            console.print(f"family: {it.family}, named by the recording's tensor inventory "
                          f"— {it.why}", markup=False, highlight=False)
        elif it.evidence == INFERRED and it.method and it.family != d.family:
            console.print(f"family: {it.family}, inferred by the inference stage "
                          f"({it.method}) — {it.why}", markup=False, highlight=False)
            console.print("the rules, which left it unknown for lack of frames:",
                          markup=False, highlight=False)
        console.print(str(it.explanation), markup=False, highlight=False)
        marked = set(d.matched_frames)
        for i, (fname, name, line) in enumerate(it.stack):
            if not (fname.endswith(".py") or i in marked):
                continue
            arrow = "=>" if i in marked else "  "
            console.print(f"  {arrow} {fname}:{line} {name}", markup=False, highlight=False)
        console.print()
    return _text(console)


def diff(view: DiffView, options: Options) -> str:
    from snapana.render import wording

    width = max(40, options.width)
    out = [*_wrap(f"before: {view.before}", width, "", INDENT * 4),
           *_wrap(f"after:  {view.after}", width, "", INDENT * 4), "",
           *_wrap(f"Verdict: {view.verdict}", width, "", INDENT), ""]
    numeric = {"before", "after", "change"}
    out += _columns(("", "before", "after", "change"), view.totals, numeric, width)
    if view.families:
        out += ["", *_columns(("family", "before", "after", "change", ""), view.families,
                              numeric, width)]
    if view.growth:
        out += ["", *_wrap(f"{wording.GROWTH_HEADING}:", width, "", INDENT)]
        for line in view.growth:
            out += _wrap(line, width, INDENT, INDENT * 3)
    if view.history_note:
        out += ["", *_wrap(view.history_note, width, "", "")]
    sites = view.sites[:TOP_SITES]
    if sites:
        out += ["", *_site_rows(sites, numeric, width)]
    return "\n".join(out) + "\n"


def _site_rows(sites: Sequence[Sequence[str]], numeric: set[str], width: int) -> list[str]:
    """The changed sites: each site on its own line (a path is never squeezed into a narrow
    column) with what became of it, then its family and figures as a row under it."""
    head, *rows = _table(("family", "before", "after", "change"),
                         [(f, b, a, c) for f, _, b, a, c, _ in sites], numeric,
                         width - len(INDENT))
    out = ["site, what became of it", *(INDENT + ln for ln in head)]
    for (_, site, *_, note), lines in zip(sites, rows, strict=True):
        out += _wrap(f"{site} — {note}" if note else site, width, "", INDENT * 2)
        out += [INDENT + ln for ln in lines]
    return out


def _text_log_brief(view: TextLogView, out: _Out) -> str:
    """A text log on one screen (issue 69): the verdict, the best knobs (the first of each
    knob's words, the rest in --full), what was not read, a three-line record hint."""
    out.para(f"Verdict. {view.verdict}" if view.verdict else
             "No out-of-memory message was found in the text.")
    knobs = view.best_knobs
    if knobs:
        more = f"{len(knobs)} in all, " if len(knobs) > BRIEF_KNOBS else ""
        out.para(f"knobs ({more}--full: each one's evidence, every figure and cause)",
                 first="", indent=INDENT)
        for i, (knob, why) in enumerate(knobs[:BRIEF_KNOBS], 1):
            out.para(f"{i}. {knob} — {why.split(' — ', 1)[0]}", INDENT * 3, first=INDENT)
        said = settings_line(view)
        if said:
            out.para(said, INDENT * 3, first=INDENT)
    else:
        out.para("--full: every figure, cause and table the text holds", first="")
    shown = view.sections[:BRIEF_KNOBS]
    for sec in shown:
        out.para(f"also read: {sec.title}")
    if len(view.sections) > len(shown):
        out.para(f"… and {len(view.sections) - len(shown)} more tables and lines (--full)")
    if view.unrecognised:
        out.para(f"not read: {len(view.unrecognised)} part(s) of the text (--full says which)")
    for line in record_hint(view.messages) if view.record else ():
        out.para(line)
    return out.text()


def text_log(view: TextLogView, options: Options) -> str:
    """A text log's OOM messages: the verdict, then each message's figures, its sum, its
    causes and knobs; what to record next time. Without `full`, one screen."""
    out = _Out(options)
    if not options.full:
        return _text_log_brief(view, out)
    out.para(f"Verdict. {view.verdict}" if view.verdict else
             "No out-of-memory message was found in the text.")
    if view.rank_rows:
        out.line()
        out.write_table(view.rank_columns, view.rank_rows, {"requested", "free", "reserved"},
                        indent="")
    for m in view.messages:
        out.line()
        out.para(f"── {m.where}" + (f", GPU {m.device}" if m.device is not None else "") +
                 f" — {m.wording}")
        for what, value in m.figures:
            out.para(f"{what:<32} {value}", INDENT)
        if m.split:
            out.para(m.split, INDENT)
        for c in m.causes:
            out.para(f"cause: {c}", INDENT)
        for knob, why in m.knobs:
            out.para(f"knob: {knob} — {why}", INDENT)
        for sentence in m.request:
            out.para(f"request: {sentence}", INDENT)
        for knob, why in m.request_knobs:
            out.para(f"knob for the request: {knob} — {why}", INDENT)
        for o in m.oddities:
            out.para(f"note: {o}", INDENT)
    for sec in view.sections:
        out.line()
        out.para(f"── {sec.title}")
        for sentence in sec.sentences:
            out.para(sentence, INDENT)
        if sec.rows:
            out.write_table(sec.columns, sec.rows, set(sec.columns[sec.numeric_from:]))
        for knob, why in sec.knobs:
            out.para(f"knob: {knob} — {why}", INDENT)
    for u in view.unrecognised:
        out.para(f"not read: {u}")
    out.line()
    for line in view.record:
        out.para(line)
    return out.text()


def _replayed_device(out: _Out, d: Any) -> None:
    """A device of a replayed change (whatif, scale): its heading, proof and verdict."""
    out.line()
    out.heading(f"device {d.device}")
    out.para(d.proof, INDENT)
    out.para(d.verdict, INDENT)


def whatif(view: WhatIfView, options: Options) -> str:
    """Per device: whether the model reproduces the window, what the change does, the two
    runs side by side."""
    out = _Out(options)
    out.para(f"What if: {view.change} — {view.title}")
    for d in view.devices:
        _replayed_device(out, d)
        if d.rows:
            out.write_table(WHATIF_COLUMNS, d.rows, set())
    for n in view.not_simulated:
        out.para(f"not simulated: {n}")
    out.line()
    out.para(view.footer)
    return out.text()


def check(view: CheckView, options: Options) -> str:
    """The verdict, then each budget line: limit, measured, whether it holds."""
    out = _Out(options)
    out.para(f"Budget check: {view.title} — {view.where}")
    out.para(view.verdict)
    out.line()
    out.write_table(CHECK_COLUMNS, view.rows(), set())
    if view.breaches:
        out.line()
        for line in view.breach_lines():
            out.para(line)
    return out.text()


def scale(view: ScaleView, options: Options) -> str:
    """Per device: the proof, the asked size, the largest that fits, the assumptions and
    the blocks held fixed."""
    out = _Out(options)
    out.para(f"What if: {view.change} — {view.title}")
    for d in view.devices:
        out.line()
        out.heading(f"device {d.device}")
        for line in (*d.head, d.proof, d.verdict):
            out.para(line, INDENT)
        out.write_table(SCALE_COLUMNS, d.rows, set())
        for line in d.fit:
            out.para(line, INDENT)
        out.line()
        out.heading("assumed")
        for line in d.assumptions:
            out.para(line, INDENT)
        if d.held_fixed:
            out.line()
            out.heading("held at their recorded size")
            out.write_table(HELD_COLUMNS, d.held_fixed, set())
    out.line()
    out.para(view.footer)
    return out.text()
