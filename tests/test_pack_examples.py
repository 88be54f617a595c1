"""Every ``[[example]]`` of every built-in pack, run through the real rules engine.

A pack states what its rules are for with examples: a short stack (innermost first, as a
snapshot stores it) and the family it must get (optionally the deciding rule and the phase).
Adding a framework is a new pack with its examples; this test picks them up by itself.
"""

from __future__ import annotations

import pytest
from snapana.analysis.attribution import Example, builtin_pack_names, builtin_packs, load_rules

RULES = load_rules()
EXAMPLES = RULES.examples

#: built-in packs without family rules of their own need no example
NO_FAMILY_RULES = {p.name for p in builtin_packs() if not any(r.kind == "family" for r in p.rules)}


@pytest.mark.parametrize("example", EXAMPLES, ids=[e.name for e in EXAMPLES])
def test_example_gets_its_family(example: Example) -> None:
    d = RULES.run_example(example)
    where = f"{example.source} {example.name} ({example.description}): {d.reason}"
    assert d.family == example.family, where
    if example.rule is not None:
        assert d.rule_id == example.rule, where
    if example.phase is not None:
        assert d.phase == example.phase, where


def test_every_pack_with_family_rules_has_an_example() -> None:
    have = {e.pack for e in EXAMPLES}
    missing = set(builtin_pack_names()) - NO_FAMILY_RULES - have
    assert not missing, f"packs without [[example]]: {sorted(missing)}"


def test_examples_name_rules_that_exist() -> None:
    ids = {r.id for r in (*RULES.rules, *RULES.phase_rules, *RULES.for_memory("host").rules)}
    for e in EXAMPLES:
        assert e.rule is None or e.rule in ids, e.name


def test_a_framework_example_is_decided_by_its_own_pack() -> None:
    """A framework's examples show what *its* rules do: the deciding rule is the pack's own
    (the generic ``phases`` pack's examples show phases of rules from ``pytorch``). An
    example of what a pack must *not* claim is ``unknown`` and decided by no rule at all."""
    for e in EXAMPLES:
        decided = RULES.run_example(e).rule_id
        if e.family == "unknown" and e.rule is None:
            assert decided is None, e.name
        elif e.pack != "phases":
            assert decided is not None and decided.split(".")[0] == e.pack, e.name


def test_check_examples_reports_a_failing_user_example(tmp_path) -> None:
    path = tmp_path / "mine.toml"
    path.write_text(
        """
[pack]
name = "mine"

[[example]]
family = "logits"
stack = [{ file = "/home/u/model.py", function = "forward", line = 3 }]
""",
        encoding="utf-8",
    )
    rs = load_rules([path])
    assert RULES.check_examples() == []
    (line,) = rs.check_examples()
    assert line.startswith(f"{path}: example `mine[0]`: expected family logits")
    assert "got family saved_activations" in line and "\n" not in line
