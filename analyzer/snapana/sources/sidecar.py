"""The sidecar `snapana record` writes beside each snapshot (`<name>.meta.json`): what the
snapshot itself does not record. Read here, at the input boundary, and folded into the
capture: the device's total memory (so memory outside PyTorch is measured, not guessed),
rank, step, framework versions, and the tensor inventory (which storage is which named
tensor) that attribution ranks above frame rules.

The analyzer never imports the capture code: this module reads the published format only.
What a tensor's role means as a family is the attribution vocabulary's to say
(`inventory_roles` in packs/vocabulary.toml); a source only checks the role is one the
format has.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from snapana.errors import InputError
from snapana.limits import MAX_BYTES, MAX_SIDECAR_BYTES
from snapana.model import Capture

FORMAT = "snapana.record.sidecar"
VERSIONS = (1,)
#: The roles an inventory's tensor record may have, as `snapana record` writes them
#: (`tensor`: seen, role not known).
ROLES = ("parameter", "buffer", "gradient", "optimizer_state", "tensor")
#: The most dimensions a tensor record's shape may list.
MAX_DIMS = 64


def find(snapshot: Path) -> Path | None:
    """The sidecar of a snapshot file, if one lies beside it."""
    name = snapshot.name
    stems = [name.removesuffix(s) for s in (".pickle.gz", ".pickle", ".pkl") if
             name.endswith(s)] + [name]
    for stem in stems:
        candidate = snapshot.with_name(f"{stem}.meta.json")
        try:
            if candidate.is_file():
                return candidate
        except (OSError, ValueError):  # a name the file system cannot hold: no sidecar
            continue
    return None


def _size(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < MAX_BYTES


def tensor_problem(t: Any) -> str | None:
    """Why an inventory entry is not a tensor record as `snapana record` writes it (None:
    it is one). Attribution sorts by `ptr`, sums `nbytes` and puts name, shape and dtype
    into labels, so each is checked here, once, wherever an inventory is read."""
    if not isinstance(t, dict):
        return "is not a tensor record"
    for key in ("ptr", "nbytes"):
        if not _size(t.get(key)):
            return f"`{key}` is not a byte address or count: {t.get(key)!r:.40}"
    if t.get("role") not in ROLES:
        return f"`role` {t.get('role')!r:.40} is not one of {', '.join(ROLES)}"
    for key in ("name", "dtype"):
        if t.get(key) is not None and not isinstance(t[key], str):
            return f"`{key}` is not a string"
    shape = t.get("shape")
    if shape is not None and not (isinstance(shape, (list, tuple)) and len(shape) <= MAX_DIMS
                                  and all(_size(d) for d in shape)):
        return f"`shape` is not a list of at most {MAX_DIMS} sizes"
    return None


def _int_or_none(meta: dict[str, Any], key: str, path: Path) -> int | None:
    value = meta.get(key)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < MAX_BYTES:
        raise InputError(f"{path}: `{key}` must be a non-negative integer, got {value!r:.60}")
    return value


def read(path: Path) -> dict[str, Any]:
    """The sidecar as a checked dict; InputError (one line) when it is not one. Read like
    any input (a regular file only, remembered so no output replaces it); its free-form
    facts (versions, frameworks, ...) bounded like any metadata."""
    from snapana.sources._io import MetaError, open_regular, sanitize
    from snapana.units import inert

    try:
        with open_regular(path) as fh:
            data = fh.read(MAX_SIDECAR_BYTES + 1)
        if len(data) > MAX_SIDECAR_BYTES:
            raise InputError(f"{path}: sidecar larger than {MAX_SIDECAR_BYTES} bytes, "
                             "larger than any real one")
        meta = json.loads(data.decode("utf-8"), parse_constant=lambda c: math.nan)
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise InputError(f"{path}: not a readable sidecar: {str(exc).splitlines()[0]:.120}"
                         ) from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise InputError(f"{path}: not a snapana record sidecar (no format {FORMAT!r})")
    if meta.get("version") not in VERSIONS:
        raise InputError(f"{path}: sidecar version {meta.get('version')!r:.20} is newer than "
                         "this snapana reads; upgrade snapana")
    for key in ("device", "device_total_bytes", "device_free_bytes", "rank", "local_rank",
                "world_size", "step"):
        _int_or_none(meta, key, path)
    inventory = meta.get("inventory")
    if inventory is not None:
        tensors = inventory.get("tensors") if isinstance(inventory, dict) else None
        if not isinstance(tensors, list):
            raise InputError(f"{path}: `inventory.tensors` must be a list")
        for i, t in enumerate(tensors):
            problem = tensor_problem(t)
            if problem:
                raise InputError(f"{path}: inventory entry {i}: {problem}")
        # a tensor's name is shown in every format: inert there (no control sequence, no
        # unpaired surrogate that no UTF-8 output can encode)
        inventory = {**inventory, "tensors": [
            {k: inert(v, lines=False) if isinstance(v, str) else v for k, v in t.items()}
            for t in tensors]}
    try:
        facts = sanitize({k: v for k, v in meta.items() if k != "inventory"}, "sidecar")
    except MetaError as exc:
        raise InputError(f"{path}: {exc}") from None
    return {**facts, "inventory": inventory}


def apply(capture: Capture, meta: dict[str, Any], path: Path) -> None:
    """Fold a sidecar into the capture it describes (capacity, run facts, inventory)."""
    device = meta.get("device")
    if device is None or device not in capture.devices:
        raise InputError(f"{path}: sidecar describes device {device!r}, the snapshot has "
                         f"{capture.devices}")
    total = meta.get("device_total_bytes")
    if total is not None:
        capture.capacity_bytes[device] = total
    facts = {k: meta.get(k) for k in ("reason", "device_name", "rank", "local_rank",
                                      "world_size", "hostname", "pid", "step",
                                      "pytorch_cuda_alloc_conf", "versions", "frameworks")}
    facts["file"] = str(path)
    capture.metadata["sidecar"] = facts
    inventory = meta.get("inventory")
    if inventory:
        capture.metadata.setdefault("inventory", {})[device] = inventory["tensors"]
