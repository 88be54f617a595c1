"""The restricted unpickler refuses anything that could import or call, before it runs."""

from __future__ import annotations

import pickle
import struct

import pytest
from snapana.errors import InputError, UnsafePickleError
from snapana.sources.torch_snapshot import restricted_load

from .conftest import run_cli


class _MakesFile:
    def __init__(self, target):
        self.target = target

    def __reduce__(self):
        return (open, (str(self.target), "w"))


def test_reduce_that_would_create_a_file_is_refused(tmp_path):
    target = tmp_path / "pwned.txt"
    bad = tmp_path / "evil.pickle"
    bad.write_bytes(pickle.dumps({"segments": [], "x": _MakesFile(target)}, protocol=4))
    with pytest.raises(UnsafePickleError):
        restricted_load(bad)
    assert not target.exists()
    result = run_cli("report", str(bad), "-o", str(tmp_path / "r.html"))
    assert result.returncode == 2
    assert not target.exists()
    assert not (tmp_path / "r.html").exists()
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "refused" in lines[0] and "Traceback" not in result.stderr


def _proto(n: int) -> bytes:
    return b"\x80" + bytes([n])


# Hand-assembled pickles, one per dangerous opcode family.
DANGEROUS = {
    "GLOBAL+REDUCE": _proto(2) + b"cos\nsystem\n(S'touch /tmp/x'\ntR.",
    "STACK_GLOBAL": _proto(4) + b"\x8c\x02os\x94\x8c\x06system\x94\x93\x94.",
    "INST": b"(S'echo hi'\nios\nsystem\n.",
    "OBJ": _proto(2) + b"(cos\nsystem\nS'echo'\no.",
    "NEWOBJ": _proto(2) + b"c__builtin__\nobject\n)\x81.",
    "NEWOBJ_EX": _proto(4) + b"\x8c\x08builtins\x8c\x06object\x93)}\x92.",
    "EXT1": _proto(2) + b"\x82\x01.",
    "PERSID": b"Pfoo\n.",
    "BINPERSID": _proto(2) + b"X\x03\x00\x00\x00foo" + b"Q.",
    "BUILD": _proto(2) + b"c__builtin__\nobject\n)R}b.",
}


@pytest.mark.parametrize("name", sorted(DANGEROUS))
def test_each_dangerous_opcode_is_refused(tmp_path, name):
    path = tmp_path / f"{name}.pickle"
    path.write_bytes(DANGEROUS[name])
    with pytest.raises(InputError):
        restricted_load(path)


@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
def test_every_protocol_of_plain_data_loads(tmp_path, protocol):
    data = {"segments": [], "device_traces": [[{"action": "alloc", "addr": 1, "size": 2,
                                                 "frames": [], "big": 2**70, "f": 1.5}]]}
    path = tmp_path / "ok.pickle"
    path.write_bytes(pickle.dumps(data, protocol=protocol))
    assert restricted_load(path) == data


def test_ext_codes_resolve_through_find_class(tmp_path):
    import copyreg

    copyreg.add_extension("os", "getcwd", 0x7123)
    try:
        path = tmp_path / "ext.pickle"
        path.write_bytes(_proto(2) + b"\x84" + struct.pack("<i", 0x7123) + b")R.")
        with pytest.raises(UnsafePickleError):
            restricted_load(path)
    finally:
        copyreg.remove_extension("os", "getcwd", 0x7123)
