"""One size parser for the whole product: units are explicit, GB is 10^9 and GiB is 2^30."""

from __future__ import annotations

import pytest
from snapana.analysis.attribution import parse_size
from snapana.units import MAX_DEVICE_BYTES, parse_bytes, parse_capacity


@pytest.mark.parametrize("text, expected", [
    ("80GiB", 80 * 2**30),
    ("80 GiB", 80 * 2**30),
    ("80gib", 80 * 2**30),
    ("80GB", 80 * 10**9),
    ("81920MiB", 81920 * 2**20),
    ("79.25 GB", 79_250_000_000),
    ("1.5GiB", 3 * 2**29),
    ("512B", 512),
    ("4KB", 4000),
    ("2TiB", 2 * 2**40),
])
def test_sizes_with_units(text: str, expected: int) -> None:
    assert parse_bytes(text) == expected
    assert parse_size(text) == expected  # rule packs read sizes the same way


@pytest.mark.parametrize("text, says", [
    ("80", "no unit"),
    ("80G", "unknown unit 'G' (80GiB or 80GB?)"),
    ("80 parsecs", "unknown unit"),
    ("-1GiB", "cannot read"),
    ("GiB", "cannot read"),
    ("", "cannot read"),
    ("1e3GB", "cannot read"),
    ("99999999999TiB", "larger than any memory"),
])
def test_sizes_refused_with_a_reason(text: str, says: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_bytes(text)
    assert says in str(info.value) and "\n" not in str(info.value)


def test_capacity_must_be_a_device_size() -> None:
    assert parse_capacity("80GiB") == 80 * 2**30
    assert parse_capacity(80 * 10**9) == 80 * 10**9
    for bad in ("0GiB", "1TB", MAX_DEVICE_BYTES + 1, "80"):
        with pytest.raises(ValueError):
            parse_capacity(bad)


def test_rule_pack_byte_counts_stay_integers() -> None:
    assert parse_size(4096) == 4096
    with pytest.raises(ValueError):
        parse_size(-1)
    with pytest.raises(ValueError):
        parse_size("4096")  # a string needs its unit, like everywhere else


@pytest.mark.parametrize(("n", "expected"), [
    (1, "1st"), (2, "2nd"), (3, "3rd"), (4, "4th"), (10, "10th"), (11, "11th"),
    (12, "12th"), (13, "13th"), (14, "14th"), (21, "21st"), (22, "22nd"), (23, "23rd"),
    (52, "52nd"), (101, "101st"), (111, "111th"), (112, "112th"), (113, "113th"),
    (1001, "1,001st"),
])
def test_ordinals_are_english(n: int, expected: str) -> None:
    """The table is English's rule written out (teens take "th"), not the function's."""
    from snapana.units import ordinal

    assert ordinal(n) == expected
