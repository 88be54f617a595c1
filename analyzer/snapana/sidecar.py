"""The sidecar `snapana record` writes beside each snapshot (`<name>.meta.json`): what the
snapshot itself does not record. Read here, at the input boundary, and folded into the
capture: the device's total memory (so memory outside PyTorch is measured, not guessed),
rank, step, framework versions, and the tensor inventory (which storage is which named
tensor) that attribution ranks above frame rules.

The analyzer never imports the capture code: this module reads the published format only.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from snapana.errors import InputError
from snapana.model import Capture
from snapana.units import MAX_BYTES

FORMAT = "snapana.record.sidecar"
VERSIONS = (1,)
MAX_SIDECAR_BYTES = 256 << 20  # an inventory of 10^5 tensors is ~20 MB of JSON
#: What an inventory role means as a family.
ROLE_FAMILY = {"parameter": "parameters", "buffer": "parameters", "gradient": "gradients",
               "optimizer_state": "optimizer_state"}


def find(snapshot: Path) -> Path | None:
    """The sidecar of a snapshot file, if one lies beside it."""
    name = snapshot.name
    stems = [name.removesuffix(s) for s in (".pickle.gz", ".pickle", ".pkl") if
             name.endswith(s)] + [name]
    for stem in stems:
        candidate = snapshot.with_name(f"{stem}.meta.json")
        if candidate.is_file():
            return candidate
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
    any input (a regular file only, remembered so no output replaces it)."""
    from snapana.sources._io import open_regular

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
            if not (isinstance(t, dict) and isinstance(t.get("ptr"), int)
                    and isinstance(t.get("nbytes"), int) and t.get("role") in
                    (*ROLE_FAMILY, "tensor")):
                raise InputError(f"{path}: inventory entry {i} is not a tensor record")
    return meta


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
