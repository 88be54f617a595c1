"""Structure-aware mutators, one per input format, and the case generator.

Every case is a pure function of (seed, index): `generate(i, seed)` gives the same case on
every machine with the same seed files, so the deterministic slice in tests/test_fuzz.py and
a campaign's findings reproduce.
"""

from __future__ import annotations

import gzip
import io
import json
import math
import random
import struct
from collections.abc import Callable
from typing import Any

from . import seeds
from .cases import INPUT, SUMMARY, Case
from .pickle_codec import Deep, Laughs, encode, safe_loads

DEPTHS = (50, 1000, 5000, 100_000)
NUMBERS: tuple[Any, ...] = (
    -1, -4096, -(2**31), -(2**63), 2**31, 2**53 + 1, 2**62, 2**63 - 1, 2**63, 2**64, 10**30,
    10**400, math.nan, math.inf, -math.inf, -0.0, 1e308, 0.5, 1.5e300, True, False, 0,
)
STRINGS = ("", "x" * 300, "\x00", "alloc", "free", "free_requested", "free_completed",
           "segment_alloc", "segment_free", "segment_map", "segment_unmap", "oom", "snapshot",
           "active_allocated", "active_pending_free", "inactive", "ALLOC", "alloc\n",
           "é\u202e漢", "\ud800", "0x10", "12", "NaN", "-1", "large", "small")
SNAPSHOT_FIELDS = {
    "segment": ("device", "address", "total_size", "allocated_size", "active_size", "stream",
                "segment_type", "segment_pool_id", "is_expandable", "blocks", "frames"),
    "block": ("size", "requested_size", "state", "address", "frames", "history"),
    "entry": ("action", "addr", "size", "stream", "time_us", "frames", "device_free"),
    "frame": ("filename", "name", "line"),
    "annotation": ("device", "time_us", "stage", "name"),
    "top": ("segments", "device_traces", "allocator_settings", "external_annotations",
            "trace_alloc_overflowed", "user_metadata", "compile_context"),
}


def _rng(seed: int, index: int) -> random.Random:
    return random.Random(f"{seed}:{index}")


# ----- generic tree helpers ------------------------------------------------------------------

def hostile_value(r: random.Random, json_safe: bool = False) -> Any:
    kind = r.random()
    if kind < 0.40:
        return r.choice(NUMBERS)
    if kind < 0.60:
        return r.choice(STRINGS) if r.random() < 0.9 else "s" * r.choice((10**5, 10**6))
    if kind < 0.70:
        return r.choice([None, [], {}, [1, 2], {"a": 1}, [None], [[]]])
    if kind < 0.85:
        return Deep(r.choice(("list", "list", "dict") if json_safe else ("list", "tuple",
                                                                          "dict")),
                    r.choice(DEPTHS), r.choice((None, 1, "alloc")))
    if json_safe:
        return [r.choice(NUMBERS)] * r.choice((10, 10000))
    return Laughs(r.choice(("list", "tuple")), r.choice((20, 40, 60)))


def hostile_key(r: random.Random) -> Any:
    return r.choice((0, -1, 2**70, 1.5, math.nan, None, True, b"k", (1, 2), ("a", ("b",)),
                     Laughs("tuple", 60), Laughs("tuple", 30), Deep("tuple", 100_000),
                     Deep("tuple", 2000), "", "segments", "x" * 1000))


def random_container_path(r: random.Random, tree: Any, max_depth: int = 12
                          ) -> list[tuple[Any, Any]]:
    """A random walk from the root: [(container, key or index), ...]."""
    path = []
    node = tree
    for _ in range(max_depth):
        if isinstance(node, dict) and node:
            key = r.choice(list(node))
        elif isinstance(node, list) and node:
            key = r.randrange(len(node))
        else:
            break
        path.append((node, key))
        node = node[key]
        if r.random() < 0.15:
            break
    return path


def _find_all(tree: Any, pred: Callable[[Any], bool], limit: int = 20000) -> list[Any]:
    found, stack, seen = [], [tree], set()
    while stack and len(seen) < limit:
        o = stack.pop()
        if id(o) in seen:
            continue
        seen.add(id(o))
        if pred(o):
            found.append(o)
        if isinstance(o, dict):
            stack.extend(v for v in o.values() if isinstance(v, (dict, list)))
        elif isinstance(o, list):
            stack.extend(v for v in o if isinstance(v, (dict, list)))
    return found


def mutate_tree(r: random.Random, tree: Any, json_safe: bool = False) -> str:
    """One generic mutation somewhere in the tree; returns its name."""
    path = random_container_path(r, tree)
    if not path:
        return "noop"
    parent, key = path[-1]
    op = r.random()
    if op < 0.45:
        parent[key] = hostile_value(r, json_safe)
        return f"value@{key!r:.30}"
    if op < 0.60 and isinstance(parent, dict):
        del parent[key]
        return f"del@{key!r:.30}"
    if op < 0.70 and isinstance(parent, dict) and not json_safe:
        parent[hostile_key(r)] = parent[key]
        return "key"
    if op < 0.80 and isinstance(parent[key], list):
        lst = parent[key]
        how = r.choice(("empty", "dup", "reverse", "truncate", "repeat"))
        if how == "empty":
            lst.clear()
        elif how == "dup" and lst:
            lst.extend(lst[: r.randint(1, 50)])
        elif how == "reverse":
            lst.reverse()
        elif how == "truncate":
            del lst[r.randint(0, len(lst)):]
        elif how == "repeat" and lst:
            parent[key] = [lst[0]] * r.choice((1000, 100_000))
        return f"list-{how}"
    parent[key] = r.choice(("str", 0, None, [], {}, 1.0))
    return "retype"


# ----- snapshot pickles ----------------------------------------------------------------------

def _snapshot_nodes(tree: Any) -> dict[str, list[dict]]:
    nodes: dict[str, list[dict]] = {k: [] for k in SNAPSHOT_FIELDS}
    if isinstance(tree, dict):
        nodes["top"].append(tree)
    segs = tree.get("segments") if isinstance(tree, dict) else tree
    for seg in segs if isinstance(segs, list) else []:
        if isinstance(seg, dict):
            nodes["segment"].append(seg)
            blocks = seg.get("blocks")
            for b in blocks if isinstance(blocks, list) else []:
                if isinstance(b, dict):
                    nodes["block"].append(b)
    traces = tree.get("device_traces") if isinstance(tree, dict) else None
    for tr in traces if isinstance(traces, list) else []:
        for e in tr if isinstance(tr, list) else []:
            if isinstance(e, dict):
                nodes["entry"].append(e)
                for f in (e.get("frames") or [])[:3] if isinstance(e.get("frames"), list) else []:
                    if isinstance(f, dict):
                        nodes["frame"].append(f)
    ann = tree.get("external_annotations") if isinstance(tree, dict) else None
    for a in ann if isinstance(ann, list) else []:
        if isinstance(a, dict):
            nodes["annotation"].append(a)
    return nodes


def mutate_snapshot(r: random.Random, tree: Any) -> list[str]:
    """1-3 mutations, most aimed at the fields a snapshot's reader uses."""
    names = []
    for _ in range(r.choice((1, 1, 2, 3))):
        nodes = _snapshot_nodes(tree)
        kinds = [k for k, v in nodes.items() if v]
        if not kinds or r.random() < 0.2:
            names.append(mutate_tree(r, tree))
            continue
        kind = r.choice(kinds)
        node = r.choice(nodes[kind])
        field = r.choice(SNAPSHOT_FIELDS[kind])
        special = r.random()
        if kind == "top" and field == "device_traces" and special < 0.3:
            traces = node.get("device_traces")
            if not isinstance(traces, list) or not traces:  # an earlier mutation replaced it
                traces = [[]]
            n = r.choice((2, 17, 100, 5000))
            node["device_traces"] = (traces + [list(traces[0]) if traces and r.random() < 0.5
                                               else [] for _ in range(n)])
            names.append(f"top.device_traces+{n}")
            continue
        if kind == "block" and field == "size" and special < 0.3:
            node["size"] = r.choice((1 << 40, 2**62 - 1, -512, 0))
            names.append("block.size-extreme")
            continue
        if kind == "segment" and field == "blocks" and special < 0.2:
            blocks = node.get("blocks") or []
            node["blocks"] = blocks * r.choice((2, 50))
            names.append("segment.blocks-duplicated")
            continue
        if r.random() < 0.15:
            node[hostile_key(r)] = node.get(field)
            names.append(f"{kind}.hostile-key")
        elif r.random() < 0.15:
            node.pop(field, None)
            names.append(f"{kind}.{field}-missing")
        else:
            node[field] = hostile_value(r)
            names.append(f"{kind}.{field}")
    return names


def _encoder(protocol: int, stdlib: bool, compress: bool) -> Callable[[Any], dict[str, bytes]]:
    def enc(tree: Any) -> dict[str, bytes]:
        data = encode(tree, protocol, stdlib)
        if compress:
            data = gzip.compress(data, 6, mtime=0)
        return {INPUT: data}
    return enc


def byte_mutation(r: random.Random, data: bytes) -> tuple[bytes, str]:
    how = r.random()
    if how < 0.4 and len(data) > 2:
        cut = r.randrange(1, len(data))
        return data[:cut], f"truncate@{cut}"
    if how < 0.8:
        buf = bytearray(data)
        n = r.choice((1, 1, 2, 8, 32))
        lo = 2 if len(buf) > 4 else 0
        for _ in range(n):
            if len(buf) > lo:
                buf[r.randrange(lo, len(buf))] = r.randrange(256)
        return bytes(buf), f"flip{n}"
    if len(data) > 8:
        at = r.randrange(len(data))
        return data[:at] + data[at:at + r.randint(1, 64)] * r.choice((2, 100)) + data[at:], \
            "splice"
    return data + data, "double"


def pickle_case(r: random.Random, corpus: bool = True) -> Case:
    seed_bytes = seeds.pickle_seed_bytes(corpus)
    pick = r.randrange(len(seed_bytes))
    tree = safe_loads(seed_bytes[pick])
    keep = r.choice((4, 16, 64, 64, 256, 2048))
    tree = seeds.reduce_snapshot(tree, keep, r)
    names = mutate_snapshot(r, tree) if r.random() < 0.9 else []
    protocol = r.choice((2, 3, 4, 5))
    enc = _encoder(protocol, r.random() < 0.5, r.random() < 0.2)
    case = Case("pickle", f"seed{pick}/keep{keep}/p{protocol}: " + ",".join(names), enc(tree),
                tree=tree, encode=enc, ext=".pickle")
    if r.random() < 0.12:
        data, how = byte_mutation(r, case.files[INPUT])
        case.files = {INPUT: data}
        case.tree = case.encode = None
        case.name += f" +{how}"
    _maybe_command(r, case)
    return case


# ----- JSON: kineto traces and memory timelines ----------------------------------------------

class BigNum:
    def __init__(self, digits: int, neg: bool = False) -> None:
        self.text = ("-" if neg else "") + "9" * digits


class Spaces:
    def __init__(self, n: int) -> None:
        self.n = n


def dump_json(obj: Any) -> str:
    """json.dumps plus BigNum/Spaces/Deep markers, NaN/Infinity spelled as Python does."""
    parts: list[str] = []
    stack: list[Any] = [obj]
    while stack:
        o = stack.pop()
        if isinstance(o, _Text):
            parts.append(o.s)
        elif isinstance(o, BigNum):
            parts.append(o.text)
        elif isinstance(o, Spaces):
            parts.append(" " * o.n)
        elif isinstance(o, Deep):
            inner = "" if o.leaf is None else json.dumps(o.leaf)
            if o.kind == "dict":
                parts.append('{"a":' * o.depth + "1" + "}" * o.depth)
            else:
                parts.append("[" * o.depth + inner + "]" * o.depth)
        elif isinstance(o, Laughs):
            parts.append("[" + ",".join(["0"] * min(2**o.levels, 100_000)) + "]")
        elif isinstance(o, dict):
            items = list(o.items())
            seq: list[Any] = [_Text("{")]
            for i, (k, v) in enumerate(items):
                if i:
                    seq.append(_Text(","))
                seq.append(_Text(json.dumps(k if isinstance(k, str) else str(k)) + ":"))
                seq.append(v)
            seq.append(_Text("}"))
            stack.extend(reversed(seq))
        elif isinstance(o, (list, tuple)):
            seq = [_Text("[")]
            for i, v in enumerate(o):
                if i:
                    seq.append(_Text(","))
                seq.append(v)
            seq.append(_Text("]"))
            stack.extend(reversed(seq))
        elif isinstance(o, bytes):
            parts.append(json.dumps(o.decode("latin-1")))
        else:
            parts.append(json.dumps(o))
    return "".join(parts)


class _Text:
    __slots__ = ("s",)

    def __init__(self, s: str) -> None:
        self.s = s


def json_value(r: random.Random) -> Any:
    v = hostile_value(r, json_safe=True)
    roll = r.random()
    if roll < 0.15:
        return BigNum(r.choice((30, 400, 5000)), r.random() < 0.3)
    if roll < 0.2:
        return Spaces(r.choice((1000, 10**6)))
    return v


def mutate_json_tree(r: random.Random, tree: Any, fields: dict[str, tuple[str, ...]]) -> str:
    """Aim at the fields the reader uses (`fields`: dict kind -> names), else anywhere."""
    dicts = _find_all(tree, lambda o: isinstance(o, dict), limit=5000)
    if dicts and r.random() < 0.75:
        node = r.choice(dicts)
        names = [n for ns in fields.values() for n in ns]
        name = r.choice(names + list(node)) if node else r.choice(names)
        roll = r.random()
        if roll < 0.1:
            node.pop(name, None)
            return f"del {name}"
        node[name] = json_value(r)
        return f"{name}"
    path = random_container_path(r, tree)
    if not path:
        return "noop"
    parent, key = path[-1]
    if r.random() < 0.7:
        parent[key] = json_value(r)
        return f"value@{key!r:.20}"
    return mutate_tree(r, tree, json_safe=True)


KINETO_FIELDS = {
    "event": ("ph", "cat", "name", "pid", "tid", "ts", "dur", "args"),
    "args": ("Bytes", "Addr", "Total Allocated", "Total Reserved", "Device Type", "Device Id",
             "Call stack"),
    "top": ("traceEvents", "deviceProperties", "schemaVersion"),
    "props": ("id", "name", "totalGlobalMem"),
}


def text_mutation(r: random.Random, text: str) -> tuple[str, str]:
    """Mutations of the JSON text itself."""
    how = r.random()
    if how < 0.2:
        at = text.find(",", r.randrange(max(len(text), 1)))
        at = at if at >= 0 else len(text) // 2
        return text[:at + 1] + " " * r.choice((10**5, 10**7)) + text[at + 1:], "whitespace"
    if how < 0.35:
        d = r.choice((2000, 100_000))
        at = text.find(",", r.randrange(max(len(text), 1)))
        at = at if at >= 0 else len(text) // 2
        return text[:at + 1] + "[" * d + "]" * d + "," + text[at + 1:], f"deep{d}"
    if how < 0.5:
        return text[: r.randrange(max(len(text), 1))], "truncate"
    if how < 0.6:
        return "\ufeff" + text, "bom"
    if how < 0.75:
        at = r.randrange(max(len(text), 1))
        return text[:at] + r.choice(("NaN", "Infinity", "-Infinity", "1e999", "9" * 5000,
                                     '"', "}", "]", "\\", "\x00", "\ud800")) + text[at:], \
            "splice"
    at = text.find(",", r.randrange(max(len(text), 1)))
    at = at if at >= 0 else len(text) // 2
    return text[:at + 1] + '"' + "z" * r.choice((10**6, 10**7)) + '",' + text[at + 1:], \
        "longstr"


def _json_encoder(compress: bool, text_mut: tuple[str, str] | None = None
                  ) -> Callable[[Any], dict[str, bytes]]:
    def enc(tree: Any) -> dict[str, bytes]:
        raw = dump_json(tree).encode("utf-8", "surrogatepass")
        if compress:
            raw = gzip.compress(raw, 6, mtime=0)
        return {INPUT: raw}
    return enc


def json_case(r: random.Random, fmt: str, corpus: bool = True) -> Case:
    texts = seeds.kineto_seed_trees() if fmt == "kineto" else seeds.timeline_seed_texts()
    if not corpus:
        texts = texts[:2]
    pick = r.randrange(len(texts))
    tree = json.loads(texts[pick])
    names = []
    for _ in range(r.choice((1, 1, 2, 3))):
        if fmt == "kineto":
            names.append(mutate_json_tree(r, tree, KINETO_FIELDS))
        else:
            names.append(mutate_tree(r, tree, json_safe=True) if r.random() < 0.5 else
                         _timeline_mutation(r, tree))
    compress = r.random() < 0.3
    enc = _json_encoder(compress)
    case = Case(fmt, f"seed{pick}{' gz' if compress else ''}: " + ",".join(names), enc(tree),
                tree=tree, encode=enc, ext=".json.gz" if compress else ".json")
    if r.random() < 0.25:
        text = dump_json(tree)
        text, how = text_mutation(r, text)
        raw = text.encode("utf-8", "surrogatepass")
        case.files = {INPUT: gzip.compress(raw, 6, mtime=0) if compress else raw}
        case.tree = case.encode = None
        case.name += f" +{how}"
    elif r.random() < 0.05:
        data, how = byte_mutation(r, case.files[INPUT])
        case.files = {INPUT: data}
        case.tree = case.encode = None
        case.name += f" +{how}"
    _maybe_command(r, case)
    return case


def _timeline_mutation(r: random.Random, tree: Any) -> str:
    if not isinstance(tree, list) or not tree:
        return "noop"
    if len(tree) == 2 and all(isinstance(x, list) for x in tree) and tree[0] and \
            not isinstance(tree[0][0], list):  # plot layout
        times, sizes = tree
        i = r.randrange(len(times))
        if r.random() < 0.5:
            times[i] = json_value(r)
            return "plot.time"
        row = sizes[i] if i < len(sizes) and isinstance(sizes[i], list) else None
        if row:
            row[r.randrange(len(row))] = json_value(r)
            return "plot.size"
        sizes.append([json_value(r)] * r.choice((1, 9, 10_000)))
        return "plot.row"
    rec = tree[r.randrange(len(tree))]
    if isinstance(rec, list) and rec:
        slot = r.randrange(len(rec))
        rec[slot] = json_value(r) if r.random() < 0.6 else r.choice((-1, 0, 5, 99, 2**63))
        return f"raw[{slot}]"
    return "noop"


# ----- memray --------------------------------------------------------------------------------

def memray_case(r: random.Random) -> Case:
    captures = seeds.memray_seeds()
    if not captures:
        return hostile_memray(r)
    pick = r.randrange(len(captures))
    data = captures[pick]
    names = []
    how = r.random()
    if how < 0.35:
        cut = r.randrange(1, len(data))
        data = data[:cut]
        names.append(f"truncate@{cut}")
    elif how < 0.85:
        buf = bytearray(data)
        n = r.choice((1, 2, 4, 16, 64))
        header = r.random() < 0.3
        for _ in range(n):
            at = r.randrange(11, min(len(buf), 200)) if header else r.randrange(11, len(buf))
            buf[at] = r.randrange(256)
        data = bytes(buf)
        names.append(f"flip{n}{'h' if header else ''}")
    else:
        data = data[: r.randrange(11, min(len(data), 4096))] + bytes(r.randrange(256) for _ in
                                                                     range(256))
        names.append("garbage-tail")
    return Case("memray", f"seed{pick}: " + ",".join(names), {INPUT: data}, ext=".bin")


def hostile_memray(r: random.Random) -> Case:
    data = b"memray\x00" + struct.pack("<i", r.choice((11, 12, 13, 99, -1))) + bytes(
        r.randrange(256) for _ in range(r.choice((0, 10, 200))))
    return Case("memray", "synthetic header", {INPUT: data}, ext=".bin")


# ----- snapana export folders ----------------------------------------------------------------

EXPORT_DIR = "input-export"


def export_case(r: random.Random) -> Case | None:
    files = seeds.export_seed()
    if files is None:
        return None
    files = dict(files)
    names = []
    roll = r.random()
    if roll < 0.4:
        meta = json.loads(files["snapana-export.json"])
        for _ in range(r.choice((1, 2))):
            names.append("marker:" + mutate_json_tree(r, meta, {"marker": (
                "format", "version", "source", "devices", "capacity_bytes", "metadata",
                "annotations", "allocator_settings", "has_trace", "has_time", "warnings",
                "$ndarray", "dtype", "shape", "$map", "$tuple", "$bytes", "$set",
                "$npscalar")}))
        files["snapana-export.json"] = dump_json(meta).encode("utf-8", "surrogatepass")
    elif roll < 0.85:
        names.append(_mutate_table(r, files))
    else:
        name = r.choice(sorted(files))
        data, how = byte_mutation(r, files[name])
        files[name] = data
        names.append(f"{name}:{how}")
    case = Case("export", ",".join(names), {f"{EXPORT_DIR}/{k}": v for k, v in files.items()},
                input=EXPORT_DIR)
    roll = r.random()
    if roll < 0.1:
        case.argv = ["export", "{input}", "-o", "out-export"]
    elif roll < 0.2:
        case.argv = ["report", "{input}", "-o", "out.html"]
    return case


def _mutate_table(r: random.Random, files: dict[str, bytes]) -> str:
    import polars as pl

    tables = sorted(k for k in files if k.endswith(".parquet"))
    name = r.choice(tables)
    df = pl.read_parquet(io.BytesIO(files[name]))
    if df.width == 0:
        return f"{name}:empty"
    col = r.choice(df.columns)
    try:
        df, desc = _table_edit(r, df, col)
    except Exception:  # noqa: BLE001 - an edit polars refuses for this column: null it
        df, desc = df.with_columns(pl.lit(None).alias(col)), f"{col} null"
    buf = io.BytesIO()
    df.write_parquet(buf)
    files[name] = buf.getvalue()
    return f"{name}:{desc}"


def _table_edit(r: random.Random, df: Any, col: str) -> tuple[Any, str]:
    import polars as pl

    how = r.random()
    if how < 0.2:
        df = df.drop(col)
        desc = f"drop {col}"
    elif how < 0.4:
        df = df.with_columns(pl.col(col).cast(pl.Utf8, strict=False))
        desc = f"{col} as string"
    elif how < 0.5:
        df = df.with_columns(pl.col(col).cast(pl.Float64, strict=False))
        desc = f"{col} as float"
    elif how < 0.75 and df.height:
        value = r.choice((-1, 2**62, -(2**63), 10**9, 0, None))
        try:
            df = df.with_columns(pl.when(pl.int_range(pl.len()) == r.randrange(df.height))
                                 .then(pl.lit(value)).otherwise(pl.col(col)).alias(col))
        except Exception:  # noqa: BLE001 - a type the value does not fit: another mutation
            df = df.with_columns(pl.lit(None).alias(col))
        desc = f"{col}={value}"
    elif how < 0.85:
        df = df.head(0) if r.random() < 0.5 else pl.concat([df, df])
        desc = "rows"
    else:
        df = df.with_columns(pl.lit(None).alias(col))
        desc = f"{col} null"
    return df, desc


# ----- commands ------------------------------------------------------------------------------

def _maybe_command(r: random.Random, case: Case) -> None:
    roll = r.random()
    if roll < 0.06:
        case.argv = ["report", "{input}", "-o", "out.html"]
    elif roll < 0.09:
        case.argv = ["export", "{input}", "-o", "out-export"]
    elif roll < 0.12:
        case.argv = ["summary", "{input}"]
    else:
        case.argv = list(SUMMARY)


# ----- the generator -------------------------------------------------------------------------

FORMATS = {"pickle": 0.40, "kineto": 0.15, "timeline": 0.11, "memray": 0.08, "export": 0.08,
           "sidecar": 0.07, "ranks": 0.07, "hostile": 0.04,
           # issue #27's classes: amplification (memo, repeated keys), impossible allocator
           # states, hostile strings in every field, command-line values and special
           # outputs, real captures re-encoded (refusing one is a finding)
           "amplify": 0.08, "impossible": 0.12, "strings": 0.12, "cli": 0.10, "reseed": 0.08,
           # issue #43's: export tables and memray values that lie about their size; what
           # surrounds the input (failing outputs, odd paths, planted modules, signals)
           "bombs": 0.06, "environment": 0.10,
           # issue #58's: text logs where the readers' patterns look, hostile budgets,
           # CI outputs (--junit, $GITHUB_STEP_SUMMARY) that are not regular files
           "texts": 0.14,
           # issue #66's (round5.py): a planted user cache, markup in names and log lines,
           # digits of other scripts, -o onto links, FIFOs and folders, names that are not
           # UTF-8, bad bytes before an OOM message, hundreds of rank files
           "cache": 0.04, "markdown": 0.05, "digits": 0.04, "targets": 0.04, "names": 0.03,
           "logbytes": 0.05, "manyranks": 0.01}


def generate(index: int, seed: int, formats: tuple[str, ...] = tuple(FORMATS),
             corpus: bool = True) -> Case:
    """Case number `index` of the campaign with `seed`."""
    from .amplify import amplify_case
    from .bombs import bomb_case
    from .cliargs import cli_case
    from .environment import environment_case
    from .hostile import hostile_cases
    from .impossible import impossible_case
    from .ranks import ranks_case
    from .reseed import reseed_case
    from .round5 import STRATEGIES
    from .sidecars import sidecar_case
    from .strings import strings_case
    from .texts import text_case

    r = _rng(seed, index)
    names = [f for f in FORMATS if f in formats]
    fmt = r.choices(names, weights=[FORMATS[f] for f in names])[0]
    if fmt == "pickle":
        return pickle_case(r, corpus)
    if fmt in ("kineto", "timeline"):
        return json_case(r, fmt, corpus)
    if fmt == "memray":
        return memray_case(r)
    if fmt == "export":
        case = export_case(r)
        if case is not None:
            return case
        return pickle_case(r, corpus)
    if fmt == "sidecar":
        return sidecar_case(r) or pickle_case(r, corpus)
    if fmt == "ranks":
        return ranks_case(r)
    if fmt == "amplify":
        return amplify_case(r)
    if fmt == "impossible":
        return impossible_case(r, corpus)
    if fmt == "strings":
        return strings_case(r, corpus)
    if fmt == "cli":
        return cli_case(r)
    if fmt == "reseed":
        return reseed_case(r, corpus)
    if fmt == "bombs":
        return bomb_case(r)
    if fmt == "environment":
        return environment_case(r)
    if fmt == "texts":
        return text_case(r)
    if fmt in STRATEGIES:
        return STRATEGIES[fmt](r)
    cases = hostile_cases()
    return cases[r.randrange(len(cases))]
