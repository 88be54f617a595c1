"""Issue 66, hostile inputs (fifth round): the pytest marker and the `%%snapana` cell magic.
A marked test where PyTorch is missing is skipped, saying why (or fails with that sentence
under --snapana-require-cuda); a marker the plugin cannot read (families not a mapping, a
family the vocabulary does not know, a positional argument) fails its test with one line
naming it, as `snapana check` refuses the same budget; an option the magic does not take is
one `%%snapana:` line, not argparse's usage and a SystemExit."""

from __future__ import annotations

from pathlib import Path

import pytest

from .test_cell_magic import STAND_IN as KERNEL_STAND_IN
from .test_cell_magic import _run
from .test_pytest_plugin import STAND_IN

#: A conftest for a run where `import torch` fails, as in an install without it, and the
#: real CUDA backend (no stand-in) is used.
NO_TORCH = "import sys\nsys.modules['torch'] = None\n"

MARKED = '''
import pytest

@pytest.mark.cuda_memory(limit="1 GiB")
def test_marked():
    pass

def test_unmarked():
    pass
'''

RUN = ("-p", "no:cacheprovider", "-n", "0", "-rN")


def _failures(result: pytest.RunResult) -> dict[str, list[str]]:
    """Each failed test's report: the lines between its `____ name ____` banner and the
    next banner (or the end of the failures section)."""
    out: dict[str, list[str]] = {}
    name = None
    for line in result.stdout.lines:
        if line.startswith("____") or line.startswith("===="):
            name = line.strip("_= ") if line.startswith("____") else None
            if name is not None:
                out[name] = []
        elif name is not None and line.strip():
            out[name].append(line)
    return out


def test_without_torch_a_marked_test_is_skipped_saying_why(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(NO_TORCH)
    pytester.makepyfile(test_marked=MARKED)
    result = pytester.runpytest_subprocess(*RUN[:-1], "-rs")
    result.assert_outcomes(passed=1, skipped=1)
    text = result.stdout.str()
    assert "ModuleNotFoundError" not in text
    assert "cuda_memory: PyTorch is not installed: no GPU memory to record" in text


def test_without_torch_require_cuda_fails_with_one_line(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(NO_TORCH)
    pytester.makepyfile(test_marked=MARKED)
    result = pytester.runpytest_subprocess(*RUN, "--snapana-require-cuda")
    result.assert_outcomes(passed=1, failed=1)
    assert "ModuleNotFoundError" not in result.stdout.str()
    assert _failures(result)["test_marked"] == [
        "cuda_memory: PyTorch is not installed: no GPU memory to record "
        "(--snapana-require-cuda)"]


@pytest.mark.parametrize("families", ['["kv_cache"]', '"kv_cache"', '[("kv_cache", "1 GiB")]'])
def test_families_not_a_mapping_fails_naming_it(pytester: pytest.Pytester,
                                                 families: str) -> None:
    pytester.makeconftest(STAND_IN)
    pytester.makepyfile(test_marked=f'''
import pytest

@pytest.mark.cuda_memory(families={families})
def test_marked():
    pass
''')
    result = pytester.runpytest_subprocess(*RUN, "--snapana-dir", "mem")
    result.assert_outcomes(failed=1)
    (line,) = _failures(result)["test_marked"]
    assert line.startswith("cuda_memory families= is a mapping of family to size"), line
    assert "AttributeError" not in result.stdout.str()
    assert not (pytester.path / "mem").exists()  # refused before anything was recorded


def test_a_misspelt_family_fails_as_snapana_check_refuses_it(
        pytester: pytest.Pytester) -> None:
    """The family names come from the vocabulary, as a budget file's do: the typo that
    `snapana check --budget` refuses (tests/test_check.py) fails the marked test here."""
    pytester.makeconftest(STAND_IN)
    pytester.makepyfile(test_marked='''
import pytest

@pytest.mark.cuda_memory(families={"kv_cahce": "1 GiB", "kv_cache": "1000 GiB"})
def test_marked():
    pass
''')
    result = pytester.runpytest_subprocess(*RUN)
    result.assert_outcomes(failed=1)
    (line,) = _failures(result)["test_marked"]
    assert line.startswith("cuda_memory families= 'kv_cahce' is not a family (known: "), line
    assert "kv_cache" in line


def test_a_positional_marker_argument_fails_naming_it(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(STAND_IN)
    pytester.makepyfile(test_marked='''
import pytest

@pytest.mark.cuda_memory("2 GiB")
def test_marked():
    pass
''')
    result = pytester.runpytest_subprocess(*RUN)
    result.assert_outcomes(failed=1)
    assert _failures(result)["test_marked"] == [
        "cuda_memory takes limit= and families= by name, not the positional '2 GiB'"]


def test_an_option_the_magic_does_not_take_is_one_line(tmp_path: Path) -> None:
    """argparse's own way (usage and message on stderr, SystemExit(2)) would stop at the
    magic: each bad line is one `%%snapana:` line on stdout, and nothing runs or records."""
    bad = ["--nope", "--budget", "--max-entries lots", "stray", "--help"]
    cells = _run(tmp_path, [KERNEL_STAND_IN + "\n%load_ext snapana"]
                 + [f"%%snapana {line}\nran = True" for line in bad]
                 + ["print(stand_in.calls, 'ran' in dir())"])
    for line, cell in zip(bad, cells[1:-1], strict=True):
        assert [o.output_type for o in cell.outputs] == ["stream"], (line, cell.outputs)
        (said,) = cell.outputs
        assert said["name"] == "stdout" and said["text"].startswith("%%snapana: ") \
            and said["text"].count("\n") == 1, (line, said)
    assert "unrecognized arguments: --nope" in cells[1].outputs[0]["text"]
    out = "".join(o["text"] for o in cells[-1].outputs if o.output_type == "stream")
    assert out.strip() == "[] False"
    assert not (tmp_path / "snapana-memory").exists()
