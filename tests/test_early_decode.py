"""The decode child started before the CLI imports the pipeline (`commands._early`,
`sources.pickle_child.start_early`): started only for a command line naming one snapshot
pickle, taken by the reader for that very file, and never left running."""

from __future__ import annotations

import ast
import gzip
import os
import pickle
import subprocess
import sys

import pytest
from snapana.commands._early import VALUE_OPTIONS, one_input
from snapana.sources import pickle_child
from snapana.sources.torch_snapshot import from_snapshot_dict, load

from .conftest import raw_load, run_cli
from .test_decode_columns import _same, _snapshot


@pytest.fixture(autouse=True)
def _none_left():
    yield
    pickle_child._end_untaken()


@pytest.fixture
def snap(tmp_path):
    path = tmp_path / "s.pickle"
    path.write_bytes(pickle.dumps(_snapshot(), protocol=4))
    return path


def test_the_options_that_take_a_value_are_the_commands_own():
    """The list `one_input` reads the command line by is the commands' real options."""
    import typer
    from snapana.cli import app

    group = typer.main.get_command(app)
    for name, listed in VALUE_OPTIONS.items():
        command = group.commands[name]  # type: ignore[attr-defined]
        real = {opt for p in command.params if p.param_type_name == "option"
                and not p.is_flag for opt in (*p.opts, *p.secondary_opts)}
        assert real == set(listed), name


def test_one_input_reads_the_command_line_as_the_commands_do(snap, tmp_path):
    s = str(snap)
    assert one_input(["report", s, "-o", "out.html"]) == snap
    assert one_input(["--debug", "summary", "-f", "json", s]) == snap
    assert one_input(["report", "--rules", s, s]) == snap  # the option's value is not the input
    assert one_input(["report", "--device=1", s]) == snap
    assert one_input(["report", "-oout.html", s]) == snap
    assert one_input(["report", s, s]) is None  # two inputs: the rank runner reads them
    assert one_input(["report", str(tmp_path)]) is None  # a folder
    assert one_input(["report", str(tmp_path / "*.pickle")]) is None  # a glob
    assert one_input(["report", s, "--help"]) is None
    assert one_input(["report", s, "--no-such-option"]) is None  # not guessed
    assert one_input(["export", s, "-o", "d"]) is None  # not a command listed
    assert one_input(["report", str(tmp_path / "missing.pickle")]) is None


def test_an_early_child_is_taken_for_that_file_and_reads_the_same(snap):
    pickle_child.start_early(snap)
    assert len(pickle_child._EARLY) == 1
    _same(load(snap), from_snapshot_dict(raw_load(snap), str(snap)))
    assert not pickle_child._EARLY  # taken, not a second decode


def test_a_file_changed_after_the_start_is_decoded_afresh(snap):
    pickle_child.start_early(snap)
    data = _snapshot()
    data["device_traces"][1] = data["device_traces"][1][:3]
    snap.write_bytes(pickle.dumps(data, protocol=4))
    os.utime(snap, ns=(1, 1))  # another modification time: not the file the child read
    assert load(snap).events.height == 3
    assert len(pickle_child._EARLY) == 1  # the stale child was not taken...
    child = next(iter(pickle_child._EARLY.values()))
    pickle_child._end_untaken()  # ...and is ended at exit
    assert child.proc.poll() is not None and not pickle_child._EARLY


@pytest.mark.parametrize("content", [b"not a pickle at all", b'{"traceEvents": []}'])
def test_nothing_starts_for_a_file_that_is_no_pickle(tmp_path, content):
    path = tmp_path / "x.pickle"
    path.write_bytes(content)
    pickle_child.start_early(path)
    assert not pickle_child._EARLY


def test_corrupt_gzip_starts_nothing_and_is_refused_by_the_reader(tmp_path):
    """A gzip stream that breaks in its first block (zlib.error, found by the fuzzer): no
    early start, no exception from it; the command refuses the file in one line."""
    body = bytearray(gzip.compress(b'{"traceEvents": [{"warpSize": 32}]}' * 4))
    body[10] ^= 0x06  # the first deflate block's type: "invalid block type"
    path = tmp_path / "t.json.gz"
    path.write_bytes(bytes(body))
    pickle_child.start_early(path)
    assert not pickle_child._EARLY
    result = run_cli("summary", str(path))
    assert result.returncode == 2, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_a_refused_output_leaves_no_child_running(snap):
    """The command refuses an output that is its input after the decode started early: one
    line, exit 2, the input untouched (the child is ended at exit, `_end_untaken`)."""
    before = snap.read_bytes()
    result = run_cli("report", str(snap), "-o", str(snap))
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1
    assert snap.read_bytes() == before


def test_the_cli_reads_a_snapshot_it_started_early(snap, tmp_path):
    result = run_cli("summary", str(snap), "-f", "json")
    assert result.returncode == 0, result.stderr
    assert '"device": 1' in result.stdout


def test_the_snapana_script_starts_the_decode_before_it_imports_the_cli(snap):
    """The installed `snapana` script's entry point is where `python -m snapana` starts
    too: `start_reading` runs before the CLI (typer, rich, every command: 0.2 s of imports)
    is imported, where the script used to import the CLI first."""
    from importlib.metadata import entry_points

    (entry,) = entry_points(group="console_scripts", name="snapana")
    module, func = entry.module, entry.attr
    code = (
        "import sys\n"
        "import snapana.commands._early as early\n"
        "early.start_reading = lambda argv: print(repr(\n"
        "    (argv, sorted(m for m in ('snapana.cli', 'typer', 'rich') if m in sys.modules))),\n"
        "    file=sys.stderr)\n"
        f"import {module} as entry\n"
        f"sys.argv = ['snapana', 'summary', {str(snap)!r}, '-f', 'json']\n"
        f"entry.{func}()\n"  # it ends the process
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    argv, imported = ast.literal_eval(out.stderr.strip().splitlines()[0])  # the first call
    assert argv == ["summary", str(snap), "-f", "json"]
    assert imported == []
    assert '"device"' in out.stdout  # and the command ran


@pytest.mark.parametrize("args, status, last", [
    (["summary", "{snap}", "-f", "json"], 0, None),
    (["summary", "{missing}"], 2, "missing.pickle"),
    (["summary", "{snap}", "--no-such-option"], 2, "No such option: --no-such-option"),
])
def test_the_script_ends_with_the_commands_status_and_all_it_wrote(snap, tmp_path, args,
                                                                    status, last):
    """`python -m snapana` ends the process at once when the command is over
    (`snapana.__main__._end`): with the command's own exit status and everything it wrote
    flushed: the JSON whole, as the in-process CLI prints it; an error's last line."""
    argv = [a.format(snap=snap, missing=tmp_path / "missing.pickle") for a in args]
    result = run_cli(*argv)
    assert result.returncode == status, result.stderr
    if status == 0:
        from snapana.cli import app
        from typer.testing import CliRunner

        assert result.stdout == CliRunner().invoke(app, argv).stdout
    else:
        assert last in result.stderr.strip().splitlines()[-1], result.stderr
