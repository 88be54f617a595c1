"""Issue 70: `summary`, `ticket` and `whatif --fit` name the same knobs with the same
(framework) names. A knob's name comes from one place, its pack entry (`[[knob]] knob`);
whatif's next steps are replayed under a generic mechanism (`scaling.toml [[next_step]]`),
and where the summary offers a framework's own knob for that mechanism (`[[same_step]]`:
Megatron's `--recompute-granularity`, transformers' `gradient_checkpointing_enable()`),
whatif names that knob, as the summary does, not the generic one.

Every sample is run, and a handful of corpus captures (corpus-marked): the seq each sample
was made at comes from the simulator's ground truth (its truth.json, the scenario's own
constants); a corpus capture's from its source (SOURCES.md), or a batch is stated."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from snapana.analysis.knobs import load_knobs
from snapana.analysis.scaling import load_rules
from snapana.synth.scenarios import expandable, fsdp

from .conftest import SAMPLES, SNAPSHOTS, invoke

#: the size each sample was made at, from the simulator: its truth.json's chunk loop
#: (`chunks.tokens`: slime), else the scenario's TOKENS; the capacity for a sample with no
#: OOM (none implied): its truth.json's card
_SEQ = {"expandable-segments-oom": expandable.TOKENS, "fsdp-train-step": fsdp.TOKENS}


def _sample_case(path: Path) -> tuple[Path, str, str | None]:
    truth = json.loads(path.with_suffix(".truth.json").read_text())
    tokens = truth.get("chunks", {}).get("tokens") or _SEQ.get(path.stem)
    scale = f"seq={tokens}" if tokens else "batch=1"
    card = None if truth["oom"] else f"{truth['capacity_bytes'] // 2**20}MiB"
    return path, scale, card


SAMPLE_CASES = [pytest.param(*_sample_case(p), id=p.stem)
                for p in sorted(SAMPLES.glob("*.pickle"))]

#: corpus captures whose knob lists hold a next step's mechanism (fused attention,
#: checkpointing, a chunked loss) or a batch knob, at the ctx their source states (SOURCES.md:
#: results/medium_1024_*), on a card a --fit answer lands near the recorded size on (none
#: recorded an OOM): (file, --scale, --capacity)
CORPUS_CASES = [
    ("gpt-medium-ctx1024-train.pickle", "seq=1024", "80GiB"),
    ("gpt-medium-ctx1024-infer.pickle", "batch=1", "20GiB"),
    ("Muduard+LayoutEditing__dump_snapshot.pickle", "batch=2", "12GiB"),
]


def _corpus_params() -> list:
    return [pytest.param(SNAPSHOTS / name, scale, card, id=name,
                         marks=[pytest.mark.corpus,
                                pytest.mark.skipif(not (SNAPSHOTS / name).exists(),
                                                   reason="../shared/corpus absent")])
            for name, scale, card in CORPUS_CASES]


def _flat(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def _in_order(text: str, items: list[str], after: str) -> None:
    """Each of `items` appears in `text` after `after`, in this order."""
    at = text.index(after)
    for item in items:
        found = text.find(item, at)
        assert found >= 0, (item, text[at:at + 600])
        at = found + len(item)


def _step_entry(e: dict) -> tuple[str, str, str]:
    """(the knob's id, its name, the next step replayed) of a whatif next step, in the JSON
    as written before the step and the knob shown were told apart ({"knob": step id,
    "text": its words}) and after ({"id", "knob": its name, "step"})."""
    if "id" in e:
        return e["id"], e["knob"], e["step"]
    return e["knob"], e["text"], e["knob"]


def _check(path: Path, scale: str, card: str | None, tmp_path: Path) -> int:
    """The checks, per device; returns how many next steps were checked against the
    summary's list."""
    names = {k.id: k.knob for k in load_knobs()}  # the one place a name comes from
    rules = load_rules()
    steps = {s.id for s in rules.next_steps}
    summary = json.loads(invoke("summary", str(path), "-f", "json").stdout)["devices"]
    offered = {d["device"]: [(k["id"], k["knob"]) for k in d["diagnosis"]["knobs"]]
               for d in summary}
    for dev, knobs in offered.items():
        assert all(names[i] == n for i, n in knobs), knobs
        if not knobs:
            continue
        # --full text and markdown name the knobs JSON names, in its order
        text = _flat(invoke("summary", str(path), "--full", "--device", str(dev)).stdout)
        _in_order(text, [f"{i}. {_flat(n)}" for i, (_, n) in enumerate(knobs, 1)],
                  "knobs (the first is the verdict's)")
        md = invoke("summary", str(path), "-f", "markdown", "--device", str(dev)).stdout
        _in_order(md, [f"{i}. `{n}`" for i, (_, n) in enumerate(knobs, 1)], "**Knobs**")

    # ticket: ticket.md's knob list and its summary.json are the summary's
    out = tmp_path / "ticket"
    assert invoke("ticket", str(path), "-o", str(out)).returncode == 0
    ticket_json = json.loads((out / "summary.json").read_text())["devices"]
    assert {d["device"]: [(k["id"], k["knob"]) for k in d["diagnosis"]["knobs"]]
            for d in ticket_json} == offered
    md = (out / "ticket.md").read_text()
    listed = re.findall(r"^\d+\. `(.+?)` \(", md.split("**Knobs**", 1)[-1].split("\n\n**")[0],
                        flags=re.M) if "**Knobs**" in md else []
    assert listed in [[n for _, n in k] for k in offered.values()], listed

    # whatif --fit: each next step named by the summary's knob for its mechanism
    args = ["whatif", str(path), "--scale", scale, "--fit", *(["--capacity", card] if card
                                                               else [])]
    run = invoke(*args, "-f", "json")
    assert run.returncode == 0, run.stderr
    words = _flat(invoke(*args, columns=400).stdout)
    md_words = _flat(re.sub(r"\\(.)", r"\1", invoke(*args, "-f", "markdown").stdout))
    checked = 0
    for d in json.loads(run.stdout)["devices"]:
        fit = d["fit"] or {}
        mine = [i for i, _ in offered.get(d["device"], [])]
        for e in fit.get("next_step", []):
            knob, name, step = _step_entry(e)
            assert step in steps and names[knob] == name, e
            assert f"knob {_flat(name)}" in words and f"knob {_flat(name)}" in md_words, name
            linked = [i for i in mine if rules.same_step.get(i) == step]  # a framework's
            if linked or step in mine:
                checked += 1
                assert knob == (linked or [step])[0], (knob, step, mine)
                assert name == dict(offered[d["device"]])[knob]
        said = [k if isinstance(k, str) else k["id"] for k in fit.get("knobs", [])]
        for k in fit.get("knobs", []):
            assert isinstance(k, dict) and k["knob"] == names[k["id"]], k
            assert f"{_flat(k['knob'])} ({k['id']})" in words, k
        if set(said) & set(mine):
            assert set(said) <= set(mine), (said, mine)
    return checked


@pytest.mark.parametrize(("path", "scale", "card"), SAMPLE_CASES)
def test_samples_name_the_same_knobs(path: Path, scale: str, card: str | None,
                                     tmp_path: Path) -> None:
    """Every sample: one name per knob across summary (JSON, --full text, markdown), ticket
    (ticket.md, summary.json) and whatif --fit (JSON, text, markdown)."""
    _check(path, scale, card, tmp_path)


@pytest.mark.parametrize(("sample", "scale", "step", "knob"), [
    ("slime-tp2-chunked-logprob-oom", "seq=8148", "torch.activation_checkpointing",
     "megatron.recompute_granularity"),
    ("expandable-segments-oom", f"seq={expandable.TOKENS}", "torch.activation_checkpointing",
     "transformers.gradient_checkpointing"),
    ("expandable-segments-oom", f"seq={expandable.TOKENS}", "torch.fused_cross_entropy",
     "transformers.liger_kernel"),
])
def test_a_step_is_named_by_the_frameworks_knob(sample: str, scale: str, step: str, knob: str,
                                                tmp_path: Path) -> None:
    """Where the summary offers a framework's own knob for a step's mechanism (Megatron's
    --recompute-granularity; the HF Trainer's gradient_checkpointing_enable() and
    use_liger_kernel, Liger's fused linear cross-entropy: the logits made chunk by chunk),
    whatif --fit replays the step under that knob's name, not the generic one's."""
    path = SAMPLES / f"{sample}.pickle"
    assert _check(path, scale, None, tmp_path) >= 1
    names = {k.id: k.knob for k in load_knobs()}
    out = json.loads(invoke("whatif", str(path), "--scale", scale, "--fit", "-f",
                            "json").stdout)
    shown = [_step_entry(e) for e in out["devices"][0]["fit"]["next_step"]]
    assert (knob, names[knob], step) in shown, shown
    words = _flat(invoke("whatif", str(path), "--scale", scale, "--fit", columns=400).stdout)
    assert f"knob {names[knob]}" in words and f"knob {names[step]}" not in words


@pytest.mark.parametrize(("path", "scale", "card"), _corpus_params())
def test_corpus_captures_name_the_same_knobs(path: Path, scale: str, card: str,
                                             tmp_path: Path) -> None:
    """A handful of corpus captures (fused attention, checkpointing, diffusers' own
    gradient checkpointing): the same checks as the samples'."""
    _check(path, scale, card, tmp_path)
