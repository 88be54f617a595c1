"""The notebook API: every table is checked against the raw pickle (decoded independently of
snapana), and every view against the renderers the CLI uses."""

from __future__ import annotations

import dataclasses
import html
import json
from collections import Counter
from functools import cached_property
from pathlib import Path

import plotly.graph_objects as go
import polars as pl
import pytest
import snapana
from snapana import sources
from snapana.api import Analysis, Explanations
from snapana.errors import InputError
from snapana.io.tables import families_of_blocks
from snapana.render import render
from snapana.render.views import capture_view
from snapana.session import analyse

from .conftest import SAMPLES, corpus_params, raw_load
from .raw_replay import raw_replay

SAMPLE_FILES = sorted(SAMPLES.glob("*.pickle"))
SAMPLE_PARAMS = [pytest.param(p, id=p.name) for p in SAMPLE_FILES]
ACTIVE = ("active_allocated", "active_pending_free", "active_awaiting_free")
OOM_SAMPLE = SAMPLES / "slime-tp2-chunked-logprob-oom.pickle"


@pytest.fixture(scope="module")
def oom() -> Analysis:
    return snapana.load(OOM_SAMPLE)


def _raw_frames(frames) -> tuple:
    return tuple((str(f.get("filename", "")), str(f.get("name", "")),
                  int(f.get("line", 0) or 0)) for f in frames or [] if isinstance(f, dict))


def _block_frames(b: dict):
    if b.get("frames"):
        return b["frames"]
    hist = b.get("history")
    return (hist[-1].get("frames") or []) if isinstance(hist, list) and hist else []


def _raw(path: Path) -> dict:
    data = raw_load(path)
    return {"segments": data} if isinstance(data, list) else data


def _raw_blocks(raw: dict, device: int) -> list[tuple[int, int, str, tuple]]:
    """(address, size, state, frames) of every block the raw segments list on `device`."""
    out = []
    for seg in raw["segments"]:
        if int(seg.get("device", 0)) != device:
            continue
        addr = int(seg["address"])
        for b in seg.get("blocks", []):
            out.append((int(b.get("address", addr)), int(b["size"]),
                        str(b.get("state", "inactive")), _raw_frames(_block_frames(b))))
            addr += int(b["size"])
    return out


def _check_against_raw(path: Path) -> None:
    raw = _raw(path)
    a = snapana.load(path)
    dev = a.device
    traces = raw.get("device_traces") or []
    trace = traces[dev] if dev < len(traces) else []

    # events: one row per trace entry, same actions
    assert a.events.height == len(trace)
    assert Counter(a.events["action"].to_list()) == Counter(str(e.get("action", ""))
                                                            for e in trace)
    # the default device is the first with an OOM, else the one with the largest peak (an
    # independent replay of the raw trace; the first of equal ones): a GPU the job never
    # used is not the one to open
    oom_devs = [d for d, t in enumerate(traces) if any(e.get("action") == "oom" for e in t)]
    peaks = {d: raw_replay(raw, d).peak for d in a.capture.devices}
    assert dev == (oom_devs[0] if oom_devs else max(peaks, key=lambda d: (peaks[d], -d)))

    # segments: the raw segments of the device, same total
    segs = [s for s in raw["segments"] if int(s.get("device", 0)) == dev]
    assert a.segments.height == len(segs)
    assert int(a.segments["total_size"].sum()) == sum(int(s["total_size"]) for s in segs)

    # stacks: every distinct non-empty raw frame list once, plus the empty stack 0
    distinct = {_raw_frames(_block_frames(b)) for s in raw["segments"]
                for b in s.get("blocks", [])}
    distinct |= {_raw_frames(e.get("frames")) for t in traces for e in t}
    distinct.discard(())
    assert a.stacks.height == len(distinct) + 1
    assert a.stacks["stack_id"].to_list() == list(range(a.stacks.height))

    # blocks at the end: exactly the raw active blocks, with their stacks' frames as text
    blocks = _raw_blocks(raw, dev)
    end = a.at(moment="end")
    if not a.replay.mismatches:
        live = sorted((ad, sz) for ad, sz, st, _ in blocks if st in ACTIVE)
        assert sorted(end.blocks.select("address", "size").iter_rows()) == live
        assert end.allocated == sum(sz for _, sz, st, _ in blocks if st == "active_allocated")
        assert end.pending_free == sum(sz for _, sz, st, _ in blocks
                                       if st in ACTIVE[1:])
    texts = dict(a.stacks.select("stack_id", "frames").iter_rows())
    by_addr = {ad: fr for ad, _, st, fr in blocks if st in ACTIVE}
    for ad, sid in end.blocks.select("address", "stack_id").head(50).iter_rows():
        if ad in by_addr and by_addr[ad]:
            assert texts[sid] == "\n".join(f"{f}:{ln} {n}" for f, n, ln in by_addr[ad])

    # blocks at the moment of interest: the families table is their sum, and the report's
    r = analyse(a.capture, dev)[0]
    assert a.moment == r.moment
    held = a.blocks.filter(pl.col("state") == "active_allocated")
    assert int(held["size"].sum()) == r.allocated_bytes == int(a.families["bytes"].sum())
    assert a.families.select("family", "bytes", "blocks").rows() == [
        (g.name, g.bytes, g.blocks) for g in r.groups]
    assert families_of_blocks(a.blocks).select("family", "bytes", "blocks").rows() == \
        a.families.select("family", "bytes", "blocks").rows()
    assert int(a.sites["bytes"].sum()) == r.allocated_bytes
    assert a.blocks["family"].null_count() == 0

    # the OOM: the last raw `oom` entry, its request
    ooms = [i for i, e in enumerate(trace) if e.get("action") == "oom"]
    if ooms:
        assert a.moment.kind == "oom" and a.moment.idx == ooms[-1]
        assert a.at(moment="oom").moment.idx == ooms[-1]
        assert a.diagnosis.request_bytes == int(trace[ooms[-1]]["size"])


@pytest.mark.parametrize("path", SAMPLE_PARAMS)
def test_tables_match_the_raw_sample(path: Path) -> None:
    _check_against_raw(path)


@pytest.mark.parametrize("path", corpus_params("torch_snapshots", "*.pickle"))
def test_tables_match_the_raw_corpus_snapshot(path: Path) -> None:
    _check_against_raw(path)


def test_every_table_converts_to_pandas(oom: Analysis) -> None:
    for name in ("blocks", "events", "segments", "stacks", "frames", "families", "sites"):
        table = getattr(oom, name)
        df = table.to_pandas()
        assert len(df) == table.height and list(df.columns) == table.columns, name
    assert oom.at(event=10).blocks.to_pandas().shape[0] == oom.at(event=10).blocks.height


def test_at_event_time_and_named_moments(oom: Analysis) -> None:
    dr = oom.replay
    i = oom.moment.idx - 300
    s = oom.at(event=i)
    assert s.moment.idx == i
    assert s.allocated == int(dr.allocated[i])
    assert s.allocated == int(s.blocks.filter(pl.col("state") == "active_allocated")["size"]
                              .sum())
    assert s.reserved == int(dr.reserved[i]) == int(s.segments["total_size"].sum())
    t = oom.events["time_us"][i]
    last_at_t = max(j for j, v in enumerate(oom.events["time_us"].to_list()) if v <= t)
    assert oom.at(time=t).moment.idx == last_at_t
    assert oom.at(time=oom.events["time_us"][0] - 1).moment.idx == -1
    assert oom.at(moment="peak").allocated == dr.peak_allocated_bytes
    assert oom.at(moment="end").moment.idx == dr.n_events - 1
    assert oom.at().moment == oom.moment
    assert s.families["bytes"].sum() == s.allocated
    assert "allocated" in s._repr_html_()
    with pytest.raises(ValueError):
        oom.at(event=1, moment="oom")
    with pytest.raises(ValueError):
        oom.at(event=dr.n_events)
    with pytest.raises(ValueError):
        oom.at(moment="nope")  # type: ignore[arg-type]


def test_no_oom_and_no_timestamps_are_clear_errors() -> None:
    ok = snapana.load(SAMPLES / "slime-tp2-recompute-loss-ok.pickle")
    assert ok.moment.kind == "peak"
    with pytest.raises(ValueError, match="no OOM"):
        ok.at(moment="oom")
    cap = dataclasses.replace(ok.capture, has_time=False)
    with pytest.raises(ValueError, match="no timestamps"):
        Analysis(cap).at(time=0)


def test_figures_reuse_the_report_builders(oom: Analysis) -> None:
    r = oom.device_report
    for name in ("families", "timeline", "segments", "sites"):
        assert isinstance(oom.figure(name), go.Figure)
    treemap = oom.figure("families").data[0]
    assert treemap.values[0] == r.allocated_bytes
    bars = oom.figure("sites")
    assert sum(len(t.y) for t in bars.data) == len(r.top_sites)
    shown = sum(x for t in bars.data for x in t.x)
    assert shown == pytest.approx(sum(s.bytes for s in r.top_sites) / 2**30)
    with pytest.raises(ValueError):
        oom.figure("nope")  # type: ignore[arg-type]


def test_repr_html_is_small_and_has_no_plotly(oom: Analysis) -> None:
    out = oom._repr_html_()
    assert out.index(html.escape(oom.headline)) < out.index("The verdict in full")
    assert "saved_logprob_softmax" in out and "Out of memory" in out
    assert "<script" not in out and "plotly" not in out.lower()
    assert len(out) < 20_000


def test_text_outputs_are_the_renderers(oom: Analysis, tmp_path: Path) -> None:
    view = capture_view(analyse(sources.load(OOM_SAMPLE)), title=OOM_SAMPLE.name)
    assert oom.summary("json") == render(view, "json")
    assert oom.summary("markdown") == render(view, "markdown")
    assert "saved_logprob_softmax" in oom.summary("text")
    out = oom.report(tmp_path / "r.html")
    assert out.read_text() == render(view, "html")
    assert json.loads(oom.summary("json"))["devices"][0]["diagnosis"]["verdict"] == oom.verdict
    with pytest.raises(ValueError):
        oom.summary("xml")  # type: ignore[arg-type]


def test_explain(oom: Analysis) -> None:
    items = oom.explain(family="saved_logprob_softmax")
    assert sum(it.bytes for it in items) == int(
        oom.families.filter(pl.col("family") == "saved_logprob_softmax")["bytes"][0])
    assert "slime.logprob_softmax" in oom.explain_text(family="saved_logprob_softmax")


def test_options_rules_capacity_and_device(tmp_path: Path) -> None:
    pack = tmp_path / "mine.toml"
    pack.write_text('[[rule]]\nid = "mine.softmax"\nfamily = "logits"\nlabel = "mine"\n'
                    'priority = 500\n'
                    'frames = [{ file = "slime/utils/ppo_utils.py", '
                    'function = "vocab_parallel_softmax" }]\n')
    a = snapana.load(OOM_SAMPLE, rules=[pack], capacity="80GiB")
    assert "saved_logprob_softmax" not in a.families["family"].to_list()
    assert a.diagnosis.capacity_bytes == 80 * 2**30
    with pytest.raises(InputError, match="no device 3"):
        snapana.load(OOM_SAMPLE, device=3)


def test_default_device_is_the_first_with_an_oom() -> None:
    cap = sources.load(OOM_SAMPLE)
    # device 1: the same trace; device 0: the trace with its OOM entries renamed
    ev1 = cap.events.with_columns(pl.lit(1, dtype=pl.Int64).alias("device"))
    ev0 = cap.events.with_columns(
        pl.when(pl.col("action") == "oom").then(pl.lit("snapshot"))
        .otherwise(pl.col("action")).alias("action"))
    two = dataclasses.replace(
        cap, devices=[0, 1], events=pl.concat([ev0, ev1]),
        segments=pl.concat([cap.segments, cap.segments.with_columns(
            pl.lit(1, dtype=pl.Int64).alias("device"))]),
        blocks=pl.concat([cap.blocks, cap.blocks.with_columns(
            pl.lit(1, dtype=pl.Int64).alias("device"))]))
    a = Analysis(two)
    assert a.device == 1 and a.moment.kind == "oom"
    b = Analysis(two, device=0)
    assert b.moment.kind == "peak"
    assert a.blocks["device"].unique().to_list() == [1]
    assert a.events.height == b.events.height == cap.events.height


def test_package_root_exports_survive_every_submodule_import(tmp_path: Path) -> None:
    """`import snapana.x` binds `x` on the package: no submodule may share a name with the
    public functions, or `snapana.export(...)` becomes "'module' object is not callable"."""
    import importlib
    import pkgutil

    for info in pkgutil.walk_packages(snapana.__path__, "snapana."):
        if not info.name.endswith("__main__"):  # that one runs the CLI
            importlib.import_module(info.name)
    for name in snapana.__all__:
        assert getattr(snapana, name) is not None
    assert all(callable(getattr(snapana, f)) for f in ("load", "diff", "export"))
    assert snapana.Analysis is Analysis
    a = snapana.load(OOM_SAMPLE)
    out = snapana.export(a, tmp_path / "exp")
    assert snapana.load(out).families["bytes"].sum() == a.families["bytes"].sum()
    assert snapana.export(OOM_SAMPLE, tmp_path / "exp2").is_dir()
    cmp = snapana.diff(OOM_SAMPLE, a)
    assert cmp.families["change"].abs().sum() == 0
    with pytest.raises(AttributeError):
        snapana.nope  # noqa: B018


def test_notebook_outputs_have_a_short_plain_form(oom: Analysis) -> None:
    """Issue 46: a notebook saves every output's text/plain beside its HTML, and a terminal
    IPython prints it: the explorer's is one line (not its 2 MB page), an explanation's a
    small table (not the dataclasses' regexes and frames), each under 1 KB; the HTML forms
    carry the content."""
    from snapana.analysis.explain import ExplainedSite

    page = oom.explore()
    assert len(repr(page)) < 1024 and "Explorer" in repr(page)
    assert len(page.html) > 100_000 and "srcdoc" in page._repr_html_()
    sites = oom.explain(limit=5)
    assert sites and all(isinstance(e, ExplainedSite) for e in sites)
    text = repr(sites)
    assert len(text) < 1024 and sites[0].family in text
    assert "<table" in sites._repr_html_() and sites[0].family in sites._repr_html_()


def test_timeline_counts_from_the_first_event_beside_the_trace_clock(oom: Analysis) -> None:
    """time_us is the trace's clock; since_start_us the same instant counted from the
    device's first recorded event (read here from the raw pickle's trace), as every figure
    and the report count."""
    raw = raw_load(Path(oom.capture.path))
    first = min(e["time_us"] for e in raw["device_traces"][oom.device] if "time_us" in e)
    t = oom.timeline
    assert t.height and (t["since_start_us"] == t["time_us"] - first).all()


#: A plain repr a notebook saves and a terminal prints: one line, and short.
SHORT_REPR = 200


def _api_objects(a: Analysis, b: Analysis) -> dict[str, object]:
    """Every object the public API hands out that is not a table, a figure, text or a path:
    each property of an Analysis and a Comparison (found by walking the classes, so a new
    one is checked too), and what their methods return."""
    import inspect

    out: dict[str, object] = {}
    comparison = a.diff(b)
    for owner, obj in (("Analysis", a), ("Comparison", comparison)):
        for name, attr in inspect.getmembers(type(obj)):
            if name.startswith("_") or not isinstance(attr, property | cached_property):
                continue
            out[f"{owner}.{name}"] = getattr(obj, name)
    sites = a.explain(limit=3)
    out.update({"Analysis": a, "Comparison": comparison, "State": a.at(event=10),
                "Explanations": sites, "ExplainedSite": sites[0],
                "no Explanations": Explanations(), "Explorer": a.explore(),
                "CaptureView.devices[0]": a.view.devices[0]})
    return {k: v for k, v in out.items()
            if not isinstance(v, pl.DataFrame | str | int | tuple | type(None))}


def test_every_api_objects_plain_repr_is_one_short_line(oom: Analysis) -> None:
    """Issue 60: `a.diff(b)` showed `<snapana.api.Comparison at 0x…>`, `a.explain()` a
    table, `a.device_report` a megabyte of dataclass fields. Each is now one line of at most
    SHORT_REPR characters that names what it is; `print(a.explain())` still shows the
    table."""
    after = snapana.load(SAMPLES / "slime-tp2-recompute-loss-ok.pickle")
    objects = _api_objects(oom, after)
    assert {"Analysis.device_report", "Analysis.diagnosis", "Analysis.replay",
            "Analysis.view", "Comparison.view", "Explanations"} <= set(objects)
    for name, obj in objects.items():
        text = repr(obj)
        assert "\n" not in text and len(text) <= SHORT_REPR, (name, text[:300])
        assert type(obj).__name__ in text, (name, text)  # says what it is
    sites = oom.explain(limit=3)
    assert str(sites).count("\n") == len(sites) and sites[0].family in str(sites)
