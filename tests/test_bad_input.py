"""Bad input: one clear line on stderr, exit code 2, no traceback, input untouched."""

from __future__ import annotations

import gzip
import hashlib
import json
import pickle

import pytest

from .conftest import run_cli


def _cases(tmp_path):
    cases = {}
    p = tmp_path / "not_a_snapshot.pickle"
    p.write_bytes(pickle.dumps({"weights": [1, 2, 3]}, protocol=4))
    cases["not a snapshot"] = (p, "not a CUDA memory snapshot")
    full = pickle.dumps({"segments": [{"address": 0, "total_size": 2 << 20, "blocks": []}] * 50},
                        protocol=4)
    p = tmp_path / "truncated.pickle"
    p.write_bytes(full[: len(full) // 2])
    cases["truncated"] = (p, "truncated")
    p = tmp_path / "trace.json"
    p.write_text(json.dumps({"traceEvents": []}))
    cases["json"] = (p, "JSON")
    p = tmp_path / "empty.pickle"
    p.write_bytes(b"")
    cases["empty"] = (p, "empty file")
    cases["missing"] = (tmp_path / "nope.pickle", "no such file")
    d = tmp_path / "adir"
    d.mkdir()
    cases["directory"] = (d, "directory")
    p = tmp_path / "evil.pickle"
    p.write_bytes(b"\x80\x02cos\nsystem\n(S'true'\ntR.")
    cases["malicious"] = (p, "refused")
    p = tmp_path / "garbage.bin"
    p.write_bytes(b"\x00\x01\x02 not anything")
    cases["garbage"] = (p, "unrecognised format")
    p = tmp_path / "bad.pickle.gz"
    p.write_bytes(gzip.compress(full)[:40])
    cases["truncated gzip"] = (p, "")
    return cases


@pytest.mark.parametrize("case", ["not a snapshot", "truncated", "json", "empty", "missing",
                                  "directory", "malicious", "garbage", "truncated gzip"])
@pytest.mark.parametrize("command", ["report", "summary"])
def test_bad_input_exits_2_with_one_line(tmp_path, case, command):
    path, words = _cases(tmp_path)[case]
    before = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None
    out = tmp_path / "out.html"
    args = [command, str(path)] + (["-o", str(out)] if command == "report" else [])
    result = run_cli(*args)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    assert str(path.name) in lines[0] and words in lines[0]
    assert not out.exists()
    if before is not None:
        assert hashlib.sha256(path.read_bytes()).hexdigest() == before


def test_unwritable_output_is_one_line(tmp_path):
    snap = tmp_path / "s.pickle"
    snap.write_bytes(pickle.dumps({"segments": []}, protocol=4))
    result = run_cli("report", str(snap), "-o", str(tmp_path / "no" / "such" / "dir.html"))
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1
    assert "does not exist" in result.stderr


@pytest.mark.parametrize("rules,words", [
    ("[[rule]]\nid = 'x'\nfamily = 'no_such_family'\nlabel = 'l'\nframes = [{function = 'f'}]\n",
     "no_such_family"),
    ("[[rule]\nid = 'x'\n", "bad.toml"),
    ("[[rule]]\nid = 'x'\nfamily = 'logits'\nlabel = 'l'\nframes = [{function_re = '('}]\n",
     "x"),
    # the schema's own errors name the path in the file
    ("[[rule]]\nid = 'x'\nfamily = 'logits'\nlabel = 'l'\nframes = [{function = 3}]\n",
     "rule[0].frames[0].function (rule `bad.x`): expected `str | list`, got `int`"),
    ("[[knob]]\nid = 'k'\nknob = 'k'\nfamilies = 'logits'\ndirection = 'lowers'\n"
     "cost = 'free'\neffect = 'e'\nwhy = 1\n", "knob[0].why (knob `k`): unknown field"),
    ("[pack]\nname = 'bad'\nmemory = 'disk'\n",
     "pack.memory: 'disk' is not one of ('device', 'host', 'any')"),
    ("rule = 'x'\n", "rule: expected `list`, got `str`"),
])
def test_bad_rule_file_is_one_line(tmp_path, rules, words):
    snap = tmp_path / "s.pickle"
    snap.write_bytes(pickle.dumps({"segments": []}, protocol=4))
    bad = tmp_path / "bad.toml"
    bad.write_text(rules)
    result = run_cli("summary", str(snap), "--rules", str(bad))
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "bad.toml" in lines[0] and words in lines[0]
    assert "Traceback" not in result.stderr
