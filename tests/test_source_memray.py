"""memray captures: the high-water mark with stacks, and a clear way out of format mismatch."""

from __future__ import annotations

import struct
import sys

import polars as pl
import pytest
from snapana.errors import InputError
from snapana.session import analyse
from snapana.sources import memray_capture

from .conftest import corpus_params, invoke, require

CHUNK = 3 << 20  # 3 MiB, far above anything else the tracked code allocates


def _allocate_and_hold(n: int) -> list[bytearray]:
    return [bytearray(CHUNK) for _ in range(n)]


def _workload() -> None:
    held = _allocate_and_hold(4)  # the peak: 12 MiB alive at once
    del held
    small = _allocate_and_hold(1)
    del small


@pytest.fixture(scope="module")
def capture_file(tmp_path_factory):
    memray = require("memray")
    path = tmp_path_factory.mktemp("memray") / "run.bin"
    with memray.Tracker(str(path)):
        _workload()
    return path


@pytest.mark.memray
def test_real_capture_high_water_mark_is_memrays_peak(capture_file):
    memray = require("memray")
    peak = memray.FileReader(str(capture_file)).metadata.peak_memory
    capture = memray_capture.load(capture_file)
    assert capture.devices == [memray_capture.HOST_DEVICE]
    assert capture.metadata["device_names"] == {-2: "host process"}
    assert int(capture.blocks["size"].sum()) == peak
    assert peak >= 4 * CHUNK
    biggest = capture.blocks.sort("size", descending=True).row(0, named=True)
    assert biggest["size"] >= 4 * CHUNK
    stack = capture.stacks.stack(biggest["stack_id"])
    names = [f[1] for f in stack]
    assert "_allocate_and_hold" in names and "_workload" in names
    assert names.index("_allocate_and_hold") < names.index("_workload")  # innermost first
    assert stack[names.index("_workload")][0].endswith("test_source_memray.py")
    (report,) = analyse(capture)
    assert report.peak_allocated_bytes == peak
    assert report.allocated_bytes == peak
    snaps = capture.metadata["memray_snapshots"]
    assert len(snaps["time_ms"]) == len(snaps["rss"]) >= 1


@pytest.mark.memray
def test_header_of_real_capture(capture_file):
    header = memray_capture.read_header(capture_file)
    assert header.format_version > 0
    if header.format_version in (12, 13):
        # PY_VERSION_HEX of the Python memray was built against: same major.minor
        assert header.python_version.startswith(f"{sys.version_info[0]}.{sys.version_info[1]}.")
        assert header.pid is not None and header.pid > 0


@pytest.mark.memray
def test_convert_round_trip(capture_file, tmp_path):
    from snapana.io.convert import convert_memray

    out = convert_memray(capture_file, tmp_path / "run.parquet")
    assert out.read_bytes()[:4] == b"PAR1"
    direct = memray_capture.load(capture_file)
    again = memray_capture.load(out)
    assert again.blocks.equals(direct.blocks)
    assert again.stacks.frames == direct.stacks.frames
    assert again.metadata["memray"]["peak_memory"] == direct.metadata["memray"]["peak_memory"]
    rows = pl.read_parquet(out)
    assert set(memray_capture.RECORD_SCHEMA) == set(rows.columns)
    assert not list(tmp_path.glob(".run.parquet.*"))  # no temp file left behind


@pytest.mark.parametrize("path", corpus_params("memray", "*.bin"))
def test_corpus_capture_header_names_its_release(path):
    header = memray_capture.read_header(path)
    # the corpus holds captures of memray 1.7 to 1.19 (formats 10 to 12): each names the
    # releases that read it
    assert header.format_version in memray_capture.FORMAT_RELEASES and header.readers
    assert header.compressed
    if header.format_version >= 12:  # PY_VERSION_HEX of the traced interpreter, from 1.19 on
        assert header.python_version.startswith("3.")
    cmd = header.command_line or ""
    assert "memray run" in cmd or "memray/__main__.py run" in cmd  # `memray run` or `-m memray run`


MADE_NOW = "made now"


@pytest.mark.memray
@pytest.mark.parametrize("path", [pytest.param(MADE_NOW, id="made-now"),
                                  *corpus_params("memray", "*.bin")])
def test_a_capture_memray_reads_loads_and_one_it_cannot_says_how_to_convert(path, request):
    """The installed memray's own reader decides which branch, not snapana: a capture it
    reads (the one made by this run's memray always is) loads with memray's own high-water
    mark; one it refuses gets one line naming the releases that read it and the command to
    convert it. Both branches assert: none returns early."""
    memray = require("memray")
    path = request.getfixturevalue("capture_file") if path == MADE_NOW else path
    header = memray_capture.read_header(path)
    try:
        peak = memray.FileReader(str(path)).metadata.peak_memory
    except OSError as exc:  # "incompatible with this version of memray"
        assert "incompatible" in str(exc)
        peak = None
    if peak is None:
        with pytest.raises(InputError) as info:
            memray_capture.load(path)
        msg = str(info.value)
        assert "\n" not in msg
        assert f"format {header.format_version} " in msg and f"memray {header.readers}:" in msg
        assert f"install '{header.pin}' in a separate environment" in msg
        assert "snapana convert" in msg and "pip install" not in msg
        assert path.with_suffix(".parquet").name in msg
    else:
        capture = memray_capture.load(path)
        assert int(capture.blocks["size"].sum()) == peak > 0
        (report,) = analyse(capture)
        assert report.peak_allocated_bytes == peak


def _fake_header(version: int) -> bytes:
    return b"memray\x00" + struct.pack("<i", version) + b"\x00" * 64


@pytest.mark.parametrize("case", ["not_memray", "bad_lz4", "future_format", "empty",
                                  "foreign_parquet", "truncated_header"])
def test_bad_captures_raise_one_line_input_error(tmp_path, case):
    path = tmp_path / "capture.bin"
    words = "memray"
    if case == "not_memray":
        path.write_bytes(b"\x00\x01 definitely not a capture" * 10)
        words = "not a memray capture"
    elif case == "bad_lz4":
        path.write_bytes(b"\x04\x22\x4d\x18\x60\x40\x82\x20\x00\x00\x00" + b"\xff" * 40)
        words = "LZ4"
    elif case == "future_format":
        path.write_bytes(_fake_header(99))
        words = "format 99"
    elif case == "empty":
        path.write_bytes(b"")
        words = "not a memray capture"
    elif case == "foreign_parquet":
        path = tmp_path / "other.parquet"
        pl.DataFrame({"a": [1]}).write_parquet(path)
        words = "not one written by snapana convert"
    else:
        path.write_bytes(b"memray\x00\x0c")
        words = "truncated"
    with pytest.raises(InputError) as info:
        memray_capture.load(path)
    msg = str(info.value)
    assert "\n" not in msg and str(path) in msg and words in msg, msg
    if case == "future_format":
        assert "snapana convert" in msg


def test_lz4_prefix_decoder_handles_overlapping_matches():
    # literals "ab", then a match of length 6 at offset 2 (overlapping): "abababab", then "c"
    block = bytes([0x22]) + b"ab" + bytes([2, 0]) + bytes([0x10]) + b"c"
    frame = b"\x04\x22\x4d\x18" + bytes([0x60, 0x40, 0x82]) + struct.pack("<I", len(block))
    frame += block + struct.pack("<I", 0)
    assert memray_capture.lz4_frame_prefix(frame, 100) == b"ababababc"
    assert memray_capture.lz4_frame_prefix(frame, 5) == b"ababa"


@pytest.mark.memray
def test_cli_convert_then_summary(capture_file, tmp_path):
    out = tmp_path / "cli.parquet"
    result = invoke("convert", str(capture_file), "-o", str(out))
    assert result.returncode == 0, result.stderr
    result = invoke("summary", str(out), "--format", "json")
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("path", corpus_params("memray", "*.bin"))
def test_cli_names_the_fix_for_an_old_capture(path):
    result = invoke("summary", str(path))
    if result.returncode == 0:
        return  # memray 1.19 installed
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    pin = memray_capture.read_header(path).pin
    assert f"install '{pin}' in a separate environment" in lines[0]
    assert "--memray-python" in lines[0]


def test_the_refusal_leads_with_the_route_that_works(tmp_path):
    """Issue 71: the refusal of a capture another memray release wrote led with "install it
    in a separate environment and run there: snapana convert …", where snapana is not
    installed; the route that works is `convert` here, with `--memray-python` pointing at
    that environment's python (memray alone there). It is the one command the line names."""
    from pathlib import Path

    version = min(memray_capture.FORMAT_RELEASES)
    header = memray_capture.MemrayHeader(format_version=version, compressed=False)
    path = Path(tmp_path / "host.bin")
    msg = str(memray_capture.incompatible_error(path, header, "memray is not installed"))
    command = f"{memray_capture.convert_hint(path)} --memray-python ENV/bin/python"
    assert command in msg and "\n" not in msg
    assert msg.count("snapana convert") == 1 and "run there" not in msg
    assert msg.index(f"install '{header.pin}' in a separate environment") < msg.index(command)
