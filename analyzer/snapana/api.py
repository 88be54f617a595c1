"""The Jupyter face of snapana: `snapana.load(path)` gives an `Analysis` with DataFrames,
figures and a small HTML repr.

Nothing here computes a number of its own: tables come from the model, `replay`, the
`Attributor` and `analyse`, figures from `render/figures.py`, text from the renderer registry
(`snapana.render`) fed by the same view-models as the CLI. So a notebook, the CLI and the
HTML report always agree.
"""

from __future__ import annotations

import html as _html
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import polars as pl

from snapana.analysis.attribution.assign import Attributor
from snapana.analysis.attribution.engine import RuleSet
from snapana.analysis.diagnosis.findings import DeviceReport, Diagnosis
from snapana.analysis.explain import ExplainedSite
from snapana.analysis.replay import DeviceReplay, Moment
from snapana.caching_allocator import ACTIVE_PENDING_FREE
from snapana.io import tables
from snapana.model import Capture, ReadProgress
from snapana.render.notebook_table import table
from snapana.session import RulesLike, Session, open_capture
from snapana.units import fmt_bytes

if TYPE_CHECKING:
    import plotly.graph_objects as go

    from snapana.analysis.compare import CaptureDiff
    from snapana.render import Format
    from snapana.render.figures import DiffFigureName, FigureName
    from snapana.render.views import CaptureView, DeviceView, DiffView

#: Text in a notebook: the width rich lays tables out in.
_WIDTH = 120


def load(path: str | Path, *, device: int | None = None, rules: RulesLike = None,
         capacity: int | str | None = None, progress: ReadProgress | None = None) -> Analysis:
    """Read any supported artefact (snapshot pickle, profiler trace, memory timeline, memray
    capture, a `snapana export` folder) and analyse one device of it.

    `device` defaults to the first device with an OOM, else the first; `rules` is a RuleSet
    or extra rule-pack files; `capacity` is the device memory (int bytes or '80GiB'), which
    measures memory held outside PyTorch; `progress(done, total)` is told of bytes read.
    """
    return Analysis(open_capture(path, progress), device=device, rules=rules,
                    capacity=capacity)


@dataclass
class State:
    """The allocator state at one moment: attributed live blocks, segments, totals.

    `allocated` counts `active_allocated` blocks; blocks freed but still waiting on a stream
    are in `blocks` with state `active_pending_free` and counted in `pending_free`.
    """

    moment: Moment
    blocks: pl.DataFrame
    segments: pl.DataFrame
    allocated: int
    reserved: int
    pending_free: int

    @property
    def families(self) -> pl.DataFrame:
        return table(tables.families_of_blocks(self.blocks))

    def __repr__(self) -> str:
        return (f"<snapana.State {self.moment.kind} (event {self.moment.idx}): allocated "
                f"{fmt_bytes(self.allocated)}, reserved {fmt_bytes(self.reserved)}, "
                f"{len(self.blocks):,} blocks; .blocks .segments .families>")

    def _repr_html_(self) -> str:
        head = (f"<b>{self.moment.kind}</b> (event {self.moment.idx}): allocated "
                f"{fmt_bytes(self.allocated)}, reserved {fmt_bytes(self.reserved)}, "
                f"pending free {fmt_bytes(self.pending_free)}")
        rows = [(f, fmt_bytes(b), str(n)) for f, b, n in
                self.families.select("family", "bytes", "blocks").iter_rows()]
        return f"<div>{head}{_table(('family', 'bytes', 'blocks'), rows)}</div>"


class Analysis:
    """One device of one capture, analysed: the tables, figures and text a notebook needs.

    Expensive parts (replay, attribution, diagnosis) run on first use and are cached.
    """

    def __init__(self, capture: Capture, *, device: int | None = None, rules: RulesLike = None,
                 capacity: int | str | None = None) -> None:
        self.session = Session(capture, device, rules=rules, capacity=capacity)
        self.capture: Capture = capture
        self.device: int = self.session.device
        self.rules: RuleSet = self.session.rules
        self.capacity: int | None = self.session.capacity

    def __repr__(self) -> str:
        return (f"<snapana.Analysis {self.capture.path!r} device {self.device}: "
                f"{self.device_report.moment.kind}>")

    # ----- the pipeline (computed once, by the session) -----------------------------------------
    @property
    def replay(self) -> DeviceReplay:
        return self.session.replay

    @property
    def attributor(self) -> Attributor:
        return self.session.attributor

    @property
    def device_report(self) -> DeviceReport:
        """What every renderer shows for this device (the CLI's numbers)."""
        return self.session.report

    @property
    def diagnosis(self) -> Diagnosis:
        return self.device_report.diagnosis

    @cached_property
    def view(self) -> CaptureView:
        """What the renderers show for this device (built once)."""
        from snapana.render.views import capture_view

        return capture_view([self.device_report], title=Path(self.capture.path).name)

    @property
    def _device_view(self) -> DeviceView:
        return self.view.devices[0]

    @property
    def verdict(self) -> str:
        """The verdict in full: the arithmetic, the rules and the caveats."""
        return self._device_view.verdict

    @property
    def headline(self) -> str:
        """The answer first: what failed, what holds the memory, the first fix."""
        return self._device_view.lead

    @property
    def evidence(self) -> tuple[str, ...]:
        """At most three short lines under the headline."""
        return self._device_view.answer.evidence

    @property
    def moment(self) -> Moment:
        """The moment of interest: the OOM, else the peak, else the snapshot."""
        return self.device_report.moment

    # ----- tables ------------------------------------------------------------------------------
    @cached_property
    def blocks(self) -> pl.DataFrame:
        """Blocks live at the moment of interest (allocated and pending-free), each with its
        family, label, rule_id, phase, reason and site."""
        return self.at(moment="interest").blocks

    @cached_property
    def events(self) -> pl.DataFrame:
        """This device's trace, in order (empty when no history was recorded)."""
        return table(self.capture.device_events(self.device))

    @cached_property
    def segments(self) -> pl.DataFrame:
        """This device's segments as the capture ends (for a moment, use `at(...).segments`)."""
        return table(self.capture.device_segments(self.device))

    @cached_property
    def frames(self) -> pl.DataFrame:
        return table(self.capture.stacks.frames_df())

    @cached_property
    def stacks(self) -> pl.DataFrame:
        """stack_id, depth, site and the frames as text (innermost first, one per line)."""
        return table(tables.stacks(self.session))

    @cached_property
    def families(self) -> pl.DataFrame:
        """family, bytes, blocks, label, share at the moment of interest: the report's groups."""
        return table(tables.families(self.device_report))

    @cached_property
    def sites(self) -> pl.DataFrame:
        """family, site, bytes, blocks, label, rule_id: the drill-down below `families`."""
        return table(tables.sites(self.device_report))

    @cached_property
    def timeline(self) -> pl.DataFrame:
        """event, time_us, since_start_us, family, bytes: each family's live bytes after
        every event where they change (event -1: before the first event). time_us is the
        trace's own clock, since_start_us the time since its first event (what every figure
        shows); both None without a clock. At any event the families' latest values add up
        to allocated bytes. Empty without history."""
        t = self.device_report.timeline
        if t.families is None:
            return table(pl.DataFrame(schema={"event": pl.Int64, "time_us": pl.Int64,
                                        "since_start_us": pl.Int64, "family": pl.Utf8,
                                        "bytes": pl.Int64}))
        frame = t.families.frame(t.times_us)
        times = self.capture.device_events(self.device)["time_us"].drop_nulls()
        origin = times.min() if len(times) else None
        since = (pl.col("time_us") - origin) if origin is not None else pl.lit(None, pl.Int64)
        return table(frame.with_columns(since.cast(pl.Int64).alias("since_start_us")).select(
            "event", "time_us", "since_start_us", "family", "bytes"))

    def stack(self, stack_id: int) -> list[tuple[str, str, int]]:
        """The frames of one stack, innermost first: (filename, function, line)."""
        return list(self.capture.stacks.stack(stack_id))

    # ----- any moment --------------------------------------------------------------------------
    def at(self, *, event: int | None = None, time: int | None = None,
           moment: Literal["oom", "peak", "end", "interest"] | None = None) -> State:
        """The state after event index `event`, or at time `time` (µs, the trace's clock:
        after the last event at or before it), or at a named moment: 'oom', 'peak', 'end'
        (the snapshot) or 'interest' (OOM, else peak). No argument: the moment of interest."""
        given = sum(x is not None for x in (event, time, moment))
        if given > 1:
            raise ValueError("at(): give one of event=, time=, moment=")
        dr = self.replay
        m = self._moment(dr, event, time, moment or ("interest" if given == 0 else None))
        live = self.session.attributed_blocks(m)
        pending = int(live.filter(pl.col("state") == ACTIVE_PENDING_FREE)["size"].sum())
        return State(m, table(tables.public_blocks(live, self.device)), table(dr.segments_at(m)),
                     dr.allocated_at(m), dr.reserved_at(m), pending)

    def _moment(self, dr: DeviceReplay, event: int | None, time: int | None,
                moment: str | None) -> Moment:
        if event is not None:
            return dr.event(event)
        if time is not None:
            return dr.time(time)
        if moment not in ("oom", "peak", "end", "interest"):
            raise ValueError(f"unknown moment {moment!r} (oom, peak, end, interest)")
        return dr.resolve(moment)

    # ----- figures and text --------------------------------------------------------------------
    def figure(self, name: FigureName = "families") -> go.Figure:
        """A plotly figure: 'families' (treemap), 'timeline', 'families_over_time' (live bytes
        per family, stacked), 'allocations' (each allocation in the window before the
        moment, MemoryViz style; hover a band for its family, size and site, its trace's
        `meta` for its detail and stack), 'segments', 'sites' (top sites)."""
        import plotly.graph_objects as go

        from snapana.render import figures

        return go.Figure(figures.figure(name, self._device_view))

    def explain(self, *, block: int | None = None, family: str | None = None,
                site: str | None = None, limit: int = 10) -> Explanations:
        """Why blocks at the moment of interest got their family: the rule, matched frames
        and near misses, per distinct stack (what `snapana explain` prints). A list of
        `ExplainedSite`, shown as a table."""
        return Explanations(self.session.explain(block=block, family=family, site=site,
                                                 limit=limit))

    def explain_text(self, **selection: Any) -> str:
        """`explain(...)` as the terminal prints it."""
        from snapana.render.views import explain_view

        return _render(explain_view(self.explain(**selection)), "text")

    def summary(self, format: Format = "text") -> str:
        """The `snapana summary` output for this device, in any format of the renderer
        registry (`snapana.render.FORMATS`: 'text', 'markdown', 'json', 'html')."""
        return _render(self.view, format)

    def report(self, path: str | Path, title: str | None = None) -> Path:
        """Write the self-contained HTML report (the same file `snapana report` writes)."""
        from snapana.io.output import write_atomic
        from snapana.render import REPORT_FORMAT
        from snapana.render.views import capture_view

        view = self.view if not title else capture_view([self.device_report], title)
        out = Path(path)
        write_atomic(out, _render(view, REPORT_FORMAT))
        return out

    def ticket(self, out_dir: str | Path) -> list[Path]:
        """Write a ticket's attachments into `out_dir` (the files `snapana ticket` writes):
        card.png, ticket.md, report.html, report.html.zip, summary.json."""
        from snapana.io.ticket import check_targets, write_ticket

        folder = Path(out_dir)
        check_targets(folder, [Path(self.capture.path)])
        return write_ticket(self.view, folder, Path(self.capture.path).name)

    def export(self, out_dir: str | Path) -> Path:
        """Write the capture as a Parquet folder (see `snapana.io.export`)."""
        from snapana.io.export import export

        return export(self.session.devices(), Path(out_dir))

    def explore(self, height: int = 900) -> Explorer:
        """The report with its explorer, inline in a notebook: pick any moment on the family
        timeline, find text in stacks, zoom into every allocation as bands. The same page
        `report` writes (plotly.js inlined, no network), in an iframe: plain HTML, no server,
        no extension."""
        from snapana.render import REPORT_FORMAT

        return Explorer(_render(self.view, REPORT_FORMAT), height)

    def diff(self, other: Analysis) -> Comparison:
        """What changed from this analysis (before) to `other` (after), family by family and
        site by site, at each one's moment of interest."""
        from snapana.analysis.compare import diff_reports

        return Comparison(diff_reports(self.device_report, other.device_report))

    def _repr_html_(self) -> str:
        r, v = self.device_report, self._device_view
        head = (f"<b>snapana</b> — {_html.escape(Path(self.capture.path).name)}, device "
                f"{self.device}, {_html.escape(v.moment)}")
        rows = [(g.name, fmt_bytes(g.bytes), str(g.blocks),
                 f"{g.bytes / r.allocated_bytes:.1%}" if r.allocated_bytes else "", g.label)
                for g in r.groups]
        evidence = "".join(f"<li>{_html.escape(e)}</li>" for e in v.answer.evidence)
        return (f"<div class='snapana'><p>{head}</p>"
                f"<p style='border-left:4px solid {'#d62728' if r.oom else '#3182bd'};"
                f"padding-left:8px'>{_html.escape(v.lead)}</p>"
                + (f"<ul>{evidence}</ul>" if evidence else "")
                + f"<details><summary>The verdict in full</summary>"
                f"<p>{_html.escape(self.verdict)}</p></details>"
                f"{_table(('', ''), v.headline)}"
                f"{_table(('family', 'bytes', 'blocks', 'share', 'label'), rows)}</div>")


@dataclass(frozen=True)
class Explorer:
    """The report page (`Analysis.explore`); a notebook shows it in an iframe, and its plain
    form is one line (a notebook saves each output's text/plain beside its HTML)."""

    html: str = field(repr=False)
    height: int = 900

    def __repr__(self) -> str:
        return (f"<snapana.Explorer: the report page, {len(self.html) / 1e6:.1f} MB; shown "
                "inline in a notebook, or .html to write it>")

    def _repr_html_(self) -> str:
        # srcdoc keeps the page whole and its scripts apart from the notebook's
        return (f'<iframe class="snapana-explorer" srcdoc="{_html.escape(self.html)}" '
                f'style="width:100%;height:{int(self.height)}px;border:1px solid #ddd" '
                'sandbox="allow-scripts"></iframe>')


class Explanations(list[ExplainedSite]):
    """`Analysis.explain`'s answer: a list of `ExplainedSite`, largest first, with a table
    for its plain and HTML forms (not the dataclasses' regexes and frames)."""

    def rows(self) -> list[tuple[str, str, str, str, str]]:
        return [(e.family, fmt_bytes(e.bytes), str(e.blocks),
                 e.explanation.decision.rule_id or e.method or e.evidence, e.site)
                for e in self]

    def __repr__(self) -> str:
        """One line (a notebook saves it); `print()` shows the table."""
        if not self:
            return "<snapana.Explanations: no blocks explained>"
        return (f"<snapana.Explanations: {len(self)} site(s), largest {self[0].family} "
                f"{fmt_bytes(self[0].bytes)} at {self[0].site[:60]}; print() for the table>")

    def __str__(self) -> str:
        """The table: family, bytes, blocks, what decided, site."""
        if not self:
            return "no blocks explained"
        lines = [f"{f:<24} {b:>11} {n:>6}  {r}  {site[:60]}"
                 for f, b, n, r, site in self.rows()]
        return "\n".join([f"{'family':<24} {'bytes':>11} {'blocks':>6}  rule  site", *lines])

    def _repr_html_(self) -> str:
        return _table(("family", "bytes", "blocks", "decided by", "site"), self.rows())


class Comparison:
    """Before vs after (`Analysis.diff`): the numbers in `.diff`, tables, a figure, text."""

    def __init__(self, diff: CaptureDiff) -> None:
        self.diff = diff

    @cached_property
    def view(self) -> DiffView:
        """What the renderers show for this diff (built once)."""
        from snapana.render.views import diff_view

        return diff_view(self.diff)

    @property
    def verdict(self) -> str:
        return self.view.verdict

    def __repr__(self) -> str:
        """One line: the two captures and how the peak moved (a notebook saves it)."""
        from snapana.render.wording import signed

        b, a = self.diff.before, self.diff.after
        return (f"<snapana.Comparison {Path(b.path).name} → {Path(a.path).name}: peak "
                f"allocated {signed(self.diff.peak_change_bytes)}; .verdict .families "
                ".sites .figure()>")

    @cached_property
    def families(self) -> pl.DataFrame:
        """family, before, after, change (bytes), blocks before/after, status."""
        return table(pl.DataFrame(
            [(c.family, c.before_bytes, c.after_bytes, c.change_bytes, c.before_blocks,
              c.after_blocks, c.status) for c in self.diff.families],
            orient="row", schema={"family": pl.Utf8, "before": pl.Int64, "after": pl.Int64,
                                  "change": pl.Int64, "before_blocks": pl.Int64,
                                  "after_blocks": pl.Int64, "status": pl.Utf8}))

    @cached_property
    def sites(self) -> pl.DataFrame:
        """family, site, before, after, change, chunk counts, status (new, vanished, ...)."""
        return table(pl.DataFrame(
            [(c.family, c.site, c.before_bytes, c.after_bytes, c.change_bytes,
              c.before_chunks, c.after_chunks, c.status) for c in self.diff.sites],
            orient="row", schema={"family": pl.Utf8, "site": pl.Utf8, "before": pl.Int64,
                                  "after": pl.Int64, "change": pl.Int64,
                                  "before_chunks": pl.Int64, "after_chunks": pl.Int64,
                                  "status": pl.Utf8}))

    def figure(self, name: DiffFigureName = "change") -> go.Figure:
        """A plotly figure of the diff report: 'change' (per family, a bar each) or
        'families_over_time' (each side's live bytes per family, before above after on one
        x axis; when a side has no history, an empty chart that says which)."""
        import plotly.graph_objects as go

        from snapana.render import figures

        return go.Figure(figures.diff_figure(name, self.view))

    def summary(self, format: Format = "text") -> str:
        """The `snapana diff` output, in any format of the renderer registry."""
        return _render(self.view, format)

    def report(self, path: str | Path) -> Path:
        """Write the self-contained HTML diff report."""
        from snapana.io.output import write_atomic
        from snapana.render import REPORT_FORMAT

        out = Path(path)
        write_atomic(out, _render(self.view, REPORT_FORMAT))
        return out

    def _repr_html_(self) -> str:
        rows = [(c.family, fmt_bytes(c.before_bytes), fmt_bytes(c.after_bytes),
                 fmt_bytes(c.change_bytes, signed=True), c.status)
                for c in self.diff.families if c.change_bytes or c.status != "same"]
        return (f"<div class='snapana'><p><b>snapana diff</b> — "
                f"{_html.escape(self.verdict)}</p>"
                f"{_table(('family', 'before', 'after', 'change', ''), rows)}</div>")


def _render(view: Any, fmt: str) -> str:
    """`view` as `fmt` through the renderer registry, text laid out for a notebook."""
    from snapana.render import Options, render

    return render(view, fmt, Options(width=_WIDTH))


def _table(header: tuple[str, ...], rows: Iterable[tuple[str, ...]]) -> str:
    esc = _html.escape
    head = "".join(f"<th style='text-align:left'>{esc(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td style='text-align:left'>{esc(str(c))}</td>"
                                    for c in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"
