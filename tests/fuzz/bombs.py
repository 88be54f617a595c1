"""Inputs whose bytes lie about what they hold (issue 43): an export folder's Parquet table
whose run-length, dictionary or compressed pages spell out to GiBs from a file of KBs, and a
memray capture whose varints carry values past int64. Each must be refused in one line
(exit 2) within the case's memory budget, never abort the process."""

from __future__ import annotations

import io
import random
from typing import Any

from . import seeds
from .cases import Case
from .mutators import EXPORT_DIR, memray_case

#: A varint of 2**64 - 1 (ten bytes: nine with the continuation bit, then 1).
MAX_VARINT = b"\xff" * 9 + b"\x01"


def _rows_bomb(r: random.Random, table: Any) -> tuple[Any, str]:
    """One row of the table repeated millions of times: a run-length page of a few KB."""
    import pyarrow as pa

    n = r.choice((2_000_000, 5_000_000, 20_000_000))
    if table.num_rows == 0:
        return table, "rows: empty table"
    return table.slice(0, 1).take(pa.array([0] * n, pa.int32())), f"rows x{n}"


def _text_bomb(r: random.Random, table: Any) -> tuple[Any, str]:
    """Every row of a text column one long random name: a dictionary of one entry."""
    import pyarrow as pa

    texts = [i for i, f in enumerate(table.schema) if pa.types.is_string(f.type)
             or pa.types.is_large_string(f.type) or pa.types.is_dictionary(f.type)]
    if not texts:
        return _rows_bomb(r, table)
    n = r.choice((50_000, 100_000, 400_000))
    width = r.choice((10_000, 60_000))
    name = "".join(r.choice("abcdefghij") for _ in range(width))
    columns = {}
    for i, f in enumerate(table.schema):
        first = table.column(i).slice(0, 1) if table.num_rows else pa.nulls(1, f.type)
        if i == texts[0]:
            columns[f.name] = pa.DictionaryArray.from_arrays(
                pa.array([0] * n, pa.int32()), pa.array([name]))
        else:
            columns[f.name] = first.take(pa.array([0] * n, pa.int32()))
    return pa.table(columns), f"text {table.schema[texts[0]].name}: {width} chars x{n}"


def _compressed_bomb(r: random.Random, table: Any) -> tuple[Any, str]:
    """Plain pages (no dictionary) of one repeated value: the compression does the lying."""
    table, what = _rows_bomb(r, table)
    return table, what + " plain"


BOMBS = (_rows_bomb, _text_bomb, _compressed_bomb)


def export_bomb_case(r: random.Random) -> Case | None:
    import pyarrow.parquet as pq

    files = seeds.export_seed()
    if files is None:
        return None
    files = dict(files)
    name = r.choice(sorted(k for k in files if k.endswith(".parquet")))
    table = pq.read_table(io.BytesIO(files[name]))
    bomb = r.choice(BOMBS)
    table, what = bomb(r, table)
    buf = io.BytesIO()
    pq.write_table(table, buf, compression=r.choice(("zstd", "snappy", "gzip")),
                   row_group_size=r.choice((table.num_rows or 1, 1 << 20)),
                   use_dictionary=bomb is not _compressed_bomb)
    files[name] = buf.getvalue()
    case = Case("bombs", f"{name}: {what} ({len(files[name]) >> 10} KB)",
                {f"{EXPORT_DIR}/{k}": v for k, v in files.items()}, input=EXPORT_DIR)
    if r.random() < 0.3:
        case.argv = ["report", "{input}", "-o", "out.html"]
    return case


#: The varints of allocation sizes the generated memray seed makes (seeds.memray_seeds:
#: bytearray(1000) is malloc(1001), bytes(5000) malloc(5033)): where they stand, a size.
SIZE_VARINTS = (b"\xe9\x07", b"\xa9\x27")


def memray_overflow_case(r: random.Random) -> Case:
    """A memray capture whose recorded allocation sizes (found by their varints) are
    rewritten to 2**64 - 1, or, in a capture without them, max varints written over records
    wherever they land (a size, an address, a line, a thread id)."""
    # the capture the installed memray wrote (the corpus's are read slowly or refused whole)
    captures = [c for c in seeds.memray_seeds() if c.startswith(b"memray\x00")][:1]
    if not captures:
        return memray_case(r)
    pick = r.randrange(len(captures))
    data = captures[pick]
    sites = sorted(i for v in SIZE_VARINTS for i in _find_all(data, v, start=64))
    n = r.choice((1, 3, 10, 40))
    if sites:
        chosen = sorted(r.sample(sites, min(n, len(sites))), reverse=True)
        buf = bytearray(data)
        for at in chosen:  # from the end: earlier offsets stay valid
            buf[at:at + 2] = MAX_VARINT
        what = f"{len(chosen)} sizes set to 2**64-1"
    else:
        buf = bytearray(data)
        for _ in range(n):
            at = r.randrange(64, max(65, len(buf) - len(MAX_VARINT)))
            buf[at:at + len(MAX_VARINT)] = MAX_VARINT
        what = f"{n} max varints"
    return Case("bombs", f"memray seed{pick}: {what}", {"input": bytes(buf)}, ext=".bin")


def _find_all(data: bytes, needle: bytes, start: int = 0) -> list[int]:
    out, at = [], data.find(needle, start)
    while at >= 0:
        out.append(at)
        at = data.find(needle, at + 1)
    return out


def bomb_case(r: random.Random) -> Case:
    if r.random() < 0.6:
        case = export_bomb_case(r)
        if case is not None:
            return case
    return memray_overflow_case(r)
