"""The pack documentation is generated from the schema and the facts, and stays true: the
committed page is the generator's output, every field of the schema has a description, the
page's example pack loads and its example gets its family, and the facts a knob may name are
the ones the code sets."""

from __future__ import annotations

import re
from pathlib import Path

import msgspec
import pytest
from snapana.analysis.attribution import facts as facts_module
from snapana.analysis.attribution import load_rules, pack_doc
from snapana.analysis.attribution.facts import COMPUTED_FACTS, ComputedFact, fact_ids
from snapana.analysis.attribution.pack_schema import PackFile

ANALYSIS = Path(facts_module.__file__).resolve().parents[1]


def test_the_committed_pack_doc_is_the_generated_one():
    committed = pack_doc.doc_file().read_text(encoding="utf-8")
    assert committed == pack_doc.render(), (
        "packs/README.md is stale: run `python -m snapana.analysis.attribution.pack_doc`")


def _structs(root: type[msgspec.Struct]) -> set[type[msgspec.Struct]]:
    """Every struct reachable from `root` through its fields' types."""
    seen: set[type[msgspec.Struct]] = set()
    todo = [root]
    while todo:
        struct = todo.pop()
        if struct in seen:
            continue
        seen.add(struct)
        for info in msgspec.inspect.type_info(struct).fields:
            stack = [info.type]
            while stack:
                t = stack.pop()
                if isinstance(t, msgspec.inspect.StructType):
                    todo.append(t.cls)
                stack += [getattr(t, a) for a in ("item_type", "type") if hasattr(t, a)]
                stack += list(getattr(t, "types", ()))
    return seen


def test_every_field_of_the_schema_is_documented_on_the_page():
    page = pack_doc.render()
    structs = _structs(PackFile)
    assert structs == {s for _, s in pack_doc.SECTIONS}  # no table left out of the page
    for struct in structs:
        for info in msgspec.inspect.type_info(struct).fields:
            # a row with a type and a description (the last column starts with a word)
            assert re.search(rf"^\| `{info.name}` \| .+ \| .* \| \S", page, re.M), (
                struct.__name__, info.name)


def test_the_example_pack_on_the_page_loads_and_its_example_holds(tmp_path):
    path = tmp_path / "mytrainer.toml"
    path.write_text(pack_doc.EXAMPLE_PACK, encoding="utf-8")
    rules = load_rules([path])
    mine = [e for e in rules.examples if e.pack == "mytrainer"]
    assert len(mine) == 1 and rules.check_examples() == []
    assert [k.id for k in rules.knobs if k.id.startswith("mytrainer.")] == [
        "mytrainer.recompute_loss"]
    # the check can fail: the same example claiming another family is reported
    path.write_text(pack_doc.EXAMPLE_PACK.replace(
        'family = "saved_logprob_softmax"\nrule', 'family = "logits"\nrule'), encoding="utf-8")
    assert len(load_rules([path]).check_examples()) == 1


def test_the_page_lists_exactly_the_facts_a_knob_may_name():
    page = pack_doc.render()
    section = page.split("## Facts")[1].split("\n## ")[0]
    listed = re.findall(r"^\| `([a-z_0-9]+)` \|", section, re.M)
    assert listed == list(fact_ids())


def test_computed_facts_are_set_by_their_declared_names_only():
    """Each computed fact is declared once (facts.py) and set by that declaration in
    analysis/evidence.py, never by a string of its own; and every declared one is set."""
    declared = {name: value for name, value in vars(facts_module).items()
                if isinstance(value, ComputedFact)}
    assert set(declared.values()) == set(COMPUTED_FACTS)
    source = (ANALYSIS / "evidence.py").read_text(encoding="utf-8")
    for name in declared:
        assert re.search(rf"\[{name}\.id\] = ", source), f"{name} is never set"
    ids = "|".join(f.id for f in COMPUTED_FACTS)
    assert not re.search(rf"""\[\s*["']({ids})["']\s*\]\s*=""", source)


@pytest.mark.parametrize("fact", [f.id for f in COMPUTED_FACTS])
def test_a_knob_may_require_each_computed_fact(tmp_path, fact):
    path = tmp_path / "k.toml"
    path.write_text(f"[[knob]]\nid = 'k.k'\nknob = 'k'\nfamilies = 'logits'\n"
                    f"direction = 'lowers'\ncost = 'free'\neffect = 'e'\nrequires = '{fact}'\n")
    (knob,) = [k for k in load_rules([path]).knobs if k.id == "k.k"]
    assert knob.requires == (fact,)


def test_the_packaged_packs_are_within_the_toml_depth_limit():
    """The built-in packs are read without `toml_too_deep` (it costs as much as the TOML
    reader at every start); this is where their depth is checked instead. User packs keep it
    (tests/test_hostile_round4.py)."""
    from snapana.analysis.attribution.engine import _builtin_files
    from snapana.limits import toml_too_deep

    files = _builtin_files()
    assert len(files) > 20
    for name, text in files:
        assert toml_too_deep(text) is None, name
