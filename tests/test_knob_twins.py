"""Issue 70: one knob list entry per mechanism. A framework's own knob and the generic knob
whose mechanism it switches on (`scaling.toml [[same_step]]`: Megatron's
--recompute-granularity and `torch.utils.checkpoint`, the Trainer's use_liger_kernel and a
fused cross-entropy) are one fix: the list names it once, by the framework's knob (its name,
its how-to), keeps what the generic one's evidence said (a figure), and gives the freed place
to the next mechanism. Every format shows that one list: summary JSON / --full / markdown,
ticket.md, the report's knob table.

The links are read here from scaling.toml itself; the samples that listed both twins before
(expandable-segments: the Trainer's two; fsdp: transformers'; slime-tp2-recompute-loss-ok:
Megatron's) are the cases; and, from `[[same_setting]]`, swift-vllm-colocate's one setting
under two names (ms-swift's --vllm_gpu_memory_utilization is vLLM's gpu_memory_utilization)."""

from __future__ import annotations

import html
import json
import re
import sys
from pathlib import Path

import pytest
from snapana.analysis.knobs import fold_twins, load_knobs

from .conftest import SAMPLES, SNAPSHOTS, invoke

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

SCALING = Path(__file__).parents[1] / "analyzer/snapana/analysis/scaling.toml"
#: framework knob id -> the generic knob id of its mechanism, as the data file says
#: (`[[same_step]]`), or the engine's knob a wrapper's knob sets (`[[same_setting]]`)
LINK = {k: t["id"] for table in ("same_step", "same_setting")
        for t in tomllib.loads(SCALING.read_text()).get(table, []) for k in t["knobs"]}
#: samples whose knob list held both twins before (framework knob, generic knob)
TWINS = [
    ("expandable-segments-oom", "transformers.liger_kernel", "torch.fused_cross_entropy"),
    ("expandable-segments-oom", "transformers.gradient_checkpointing",
     "torch.activation_checkpointing"),
    ("fsdp-train-step", "transformers.gradient_checkpointing", "torch.activation_checkpointing"),
    ("slime-tp2-recompute-loss-ok", "megatron.recompute_granularity",
     "torch.activation_checkpointing"),
    # one setting: ms-swift's --vllm_gpu_memory_utilization is vLLM's gpu_memory_utilization
    ("swift-vllm-colocate-oom", "swift.vllm_gpu_memory_utilization",
     "vllm.gpu_memory_utilization"),
]
NAMES = {k.id: k.knob for k in load_knobs()}
REQUIRES = {k.id: k.requires for k in load_knobs()}


def _flat(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def _knobs(sample: str) -> list[dict]:
    out = json.loads(invoke("summary", str(SAMPLES / f"{sample}.pickle"), "-f", "json").stdout)
    return out["devices"][0]["diagnosis"]["knobs"]


@pytest.mark.parametrize("path", sorted(SAMPLES.glob("*.pickle")), ids=lambda p: p.stem)
def test_no_sample_lists_a_mechanism_twice(path: Path) -> None:
    """No knob list holds a generic knob beside a framework knob linked to it."""
    for dev in json.loads(invoke("summary", str(path), "-f", "json").stdout)["devices"]:
        ids = [k["id"] for k in dev["diagnosis"]["knobs"]]
        twice = [(k, LINK[k]) for k in ids if LINK.get(k) in ids]
        assert not twice, (dev["device"], ids)


@pytest.mark.parametrize(("sample", "framework", "generic"), TWINS,
                         ids=[f"{s}-{f}" for s, f, _ in TWINS])
def test_the_frameworks_knob_stands_for_both(sample: str, framework: str, generic: str) -> None:
    """The framework's knob is listed under its own name, says which generic knob it is the
    same mechanism as, and keeps the figure that generic knob's evidence gave (its required
    fact's words, as the summary's facts state them)."""
    out = json.loads(invoke("summary", str(SAMPLES / f"{sample}.pickle"), "-f", "json").stdout)
    d = out["devices"][0]["diagnosis"]
    by_id = {k["id"]: k for k in d["knobs"]}
    assert framework in by_id and generic not in by_id, list(by_id)
    entry = by_id[framework]
    assert entry["knob"] == NAMES[framework]
    assert entry["same_mechanism_as"] == [generic]
    for fact in REQUIRES[generic]:
        assert d["facts"][fact] in entry["applies"], (fact, entry["applies"])


def test_the_freed_place_goes_to_the_next_mechanism() -> None:
    """slime-tp2-recompute-loss-ok listed Megatron's recompute and torch.utils.checkpoint
    among six: the list stays full, with six mechanisms (the one folded away gives its place
    to the next knob, not to nothing)."""
    ids = [k["id"] for k in _knobs("slime-tp2-recompute-loss-ok")]
    assert len(ids) == 6
    assert len({LINK.get(i, i) for i in ids}) == 6, ids


@pytest.mark.parametrize(("sample", "framework", "generic"), TWINS,
                         ids=[f"{s}-{f}" for s, f, _ in TWINS])
def test_every_format_lists_it_once(sample: str, framework: str, generic: str,
                                    tmp_path: Path) -> None:
    """--full text, markdown, ticket.md and the report's knob table name the framework's
    knob and not the generic one."""
    path = str(SAMPLES / f"{sample}.pickle")
    mine, other = _flat(NAMES[framework]), _flat(NAMES[generic])
    full = _flat(invoke("summary", path, "--full").stdout)
    knobs_part = full.split("knobs (the first is the verdict's)", 1)[1]
    md = _flat(invoke("summary", path, "-f", "markdown").stdout).split("**Knobs**", 1)[1]
    assert invoke("ticket", path, "-o", str(tmp_path / "t")).returncode == 0
    ticket = _flat((tmp_path / "t" / "ticket.md").read_text()).split("**Knobs**", 1)[1]
    page = tmp_path / "r.html"
    assert invoke("report", path, "-o", str(page)).returncode == 0
    table = _flat(page.read_text()).split('<table class="knobs">', 1)[1].split("</table>", 1)[0]
    table = _flat(html.unescape(re.sub(r"<[^>]+>", "", table)))
    for text in (knobs_part, md, ticket, table):
        assert mine in text.replace("\\", ""), text[:400]
        assert other not in text.replace("\\", ""), text[:400]


def test_fold_keeps_the_better_place_and_every_other_knob() -> None:
    """The framework's knob takes the earlier of the two places; every other knob keeps its
    order; a generic knob with no linked knob listed stays."""
    by_id = {k.id: k for k in load_knobs()}
    framework = next(k for k, g in LINK.items() if g == "torch.activation_checkpointing")
    listed = [by_id["torch.activation_checkpointing"], by_id["torch.micro_batch"],
              by_id[framework], by_id["torch.fused_cross_entropy"]]
    out, folded = fold_twins(listed)
    assert [k.id for k in out] == [framework, "torch.micro_batch",
                                   "torch.fused_cross_entropy"]
    assert [g.id for g in folded[framework]] == ["torch.activation_checkpointing"]


#: corpus captures whose knob list held both (checked before the fold): a PEFT k-bit
#: fine-tune, not read to write the fold. (Muduard's LayoutEditing dump listed both as well
#: until its autograd-guided sampler was seen to train nothing: no checkpointing knob is
#: offered to it now, tests/test_guided_sampler.py.)
CORPUS_TWINS = [
    ("finetune-no-timestamps.pickle", "peft.kbit_gradient_checkpointing",
     "torch.activation_checkpointing"),
]


@pytest.mark.corpus
@pytest.mark.parametrize(("name", "framework", "generic"), CORPUS_TWINS,
                         ids=[n for n, _, _ in CORPUS_TWINS])
def test_corpus_captures_list_the_mechanism_once(name: str, framework: str,
                                                 generic: str) -> None:
    """Real captures: the framework's knob listed, the generic one folded into it, on the
    device whose list offers it."""
    path = SNAPSHOTS / name
    if not path.exists():
        pytest.skip("../shared/corpus absent")
    devices = json.loads(invoke("summary", str(path), "-f", "json").stdout)["devices"]
    shown = [d for d in devices if framework in [k["id"] for k in d["diagnosis"]["knobs"]]]
    assert shown, [[k["id"] for k in d["diagnosis"]["knobs"]] for d in devices]
    for d in shown:
        by_id = {k["id"]: k for k in d["diagnosis"]["knobs"]}
        assert generic not in by_id and by_id[framework]["same_mechanism_as"] == [generic]
        for fact in REQUIRES[generic]:
            assert d["diagnosis"]["facts"][fact] in by_id[framework]["applies"]


def test_the_verdict_names_a_folded_knob_by_its_framework_twin() -> None:
    """Where the verdict's knob is a generic one folded into a framework's, the verdict names
    the framework's (the knob the list shows), not one the list no longer holds."""
    from snapana.analysis.diagnosis.diagnose import _named_once
    from snapana.analysis.diagnosis.findings import Remedy

    by_id = {k.id: k for k in load_knobs()}
    listed, folded = fold_twins([by_id["torch.fused_cross_entropy"], by_id["torch.micro_batch"],
                                 by_id["transformers.liger_kernel"]])
    remedy = _named_once(Remedy("logits", "saved_activations", None, None,
                                by_id["torch.fused_cross_entropy"], by_id["torch.micro_batch"]),
                         listed, folded)
    assert remedy.excess_knob == by_id["transformers.liger_kernel"] == listed[0]
    assert remedy.alternative_knob == by_id["torch.micro_batch"]


#: a Trainer step that ran out in Qwen2's lm_head (the frames as transformers 4.5x prints
#: them; the message in PyTorch >= 2.1's words)
HF_LOGITS_LOG = """\
Traceback (most recent call last):
  File "/home/u/train.py", line 40, in <module>
    trainer.train()
  File "/usr/lib/python3.10/site-packages/transformers/trainer.py", line 3485, in training_step
    loss = self.compute_loss(model, inputs)
  File "/usr/lib/python3.10/site-packages/transformers/models/qwen2/modeling_qwen2.py", \
line 820, in forward
    logits = self.lm_head(hidden_states[:, slice_indices, :])
  File "/usr/lib/python3.10/site-packages/torch/nn/modules/module.py", line 1736, in \
_wrapped_call_impl
    return self._call_impl(*args, **kwargs)
  File "/usr/lib/python3.10/site-packages/torch/nn/modules/linear.py", line 125, in forward
    return F.linear(input, self.weight, self.bias)
torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 4.64 GiB. GPU 0 has a total \
capacity of 79.19 GiB of which 3.08 GiB is free. Including non-PyTorch memory, this process \
has 76.10 GiB memory in use. Of the allocated memory 74.82 GiB is allocated by PyTorch, and \
172.81 MiB is reserved by PyTorch but unallocated.
"""


def test_a_pasted_traceback_lists_the_mechanism_once(tmp_path: Path) -> None:
    """A log's knobs for the request are chosen from the same packs: Liger's fused linear
    cross-entropy through the Trainer, not also the generic fused cross-entropy."""
    log = tmp_path / "job.log"
    log.write_text(HF_LOGITS_LOG)
    out = _flat(invoke("summary", str(log), "--full").stdout)
    assert f"knob for the request: {_flat(NAMES['transformers.liger_kernel'])}" in out, out
    assert _flat(NAMES["torch.fused_cross_entropy"]) not in out
