"""The one on-disk and on-the-wire form of every state: a flat mapping of tensors plus JSON metadata.

A server state, a client's private state, a payload or an upload is any nesting of dicts, lists and
tuples whose leaves are tensors, numbers, strings, booleans or None (an Adam ``state_dict`` with its
integer keys included). :func:`flatten` splits such an object into

* ``tensors``: ``{path: tensor}``, one entry per tensor, keyed by its path in the object
  (``"model/conv.0.weight"``; ``/`` and ``~`` inside keys are escaped as ``~1`` and ``~0``);
* ``skeleton``: a JSON-able copy of the object in which each tensor is ``{"$t": path}``. Dicts with
  keys other than strings become ``{"$map": [[key, value], ...]}`` and tuples ``{"$tuple": [...]}``,
  so :func:`unflatten` gives back exactly the object that was flattened, key types and all.

The same pair is a checkpoint file (safetensors, the skeleton in its header), the bytes a worker
process receives, and what a Flower node keeps in its ``context.state``. Nothing is pickled: loading
a state from elsewhere never runs code.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Hashable, Mapping
from pathlib import Path
from typing import cast

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from fedfew.core.errors import UsageError
from fedfew.core.jsontypes import JSONObject, JSONValue
from fedfew.interface.records import Parts, State

_META_KEY = "fedfew"
FORMAT = "fedfew-state/1"


class StateFormatError(UsageError):
    """A state cannot be written in, or read from, the flat form; the message names where."""


def _escape(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


def _is_plain_key(key: object) -> bool:
    return isinstance(key, str) and not key.startswith("$")


def flatten(obj: object, dedup: bool = True) -> tuple[dict[str, torch.Tensor], JSONValue]:
    """(tensors, skeleton) of ``obj``; see the module docstring. A tensor that occurs twice is stored
    once unless ``dedup`` is False. Raises :class:`StateFormatError` naming the path of a value of any
    other type."""
    tensors: dict[str, torch.Tensor] = {}
    # (storage, offset, shape, stride, dtype): the storage offset is an int or, under torch.compile, a SymInt.
    seen: dict[tuple[int, int | torch.SymInt, tuple[int, ...], tuple[int, ...], torch.dtype], str] = {}

    def walk(value: object, path: str) -> JSONValue:
        if isinstance(value, torch.Tensor):
            tensor = value.detach()
            if tensor.device.type != "cpu":
                tensor = tensor.cpu()
            key = path or "$root"
            # The same tensor twice (a shared anchor) is stored once and referenced twice.
            ident = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape),
                     tuple(tensor.stride()), tensor.dtype)
            if dedup and ident in seen and tensor.numel() > 0:
                return {"$t": seen[ident]}
            seen[ident] = key
            tensors[key] = tensor
            return {"$t": key}
        if isinstance(value, bool) or value is None or isinstance(value, (int, str)):
            return value
        if isinstance(value, float):
            return value if math.isfinite(value) else {"$float": repr(value)}
        if isinstance(value, (np.integer, np.floating, np.bool_)):
            return walk(value.item(), path)
        if isinstance(value, np.ndarray):
            return walk(torch.from_numpy(np.ascontiguousarray(value)), path)
        if isinstance(value, Mapping):
            if all(_is_plain_key(k) for k in value):
                return {k: walk(v, f"{path}/{_escape(k)}" if path else _escape(k)) for k, v in value.items()}
            items: list[JSONValue] = []
            for i, (k, v) in enumerate(value.items()):
                items.append([walk(k, f"{path}/$k{i}"), walk(v, f"{path}/{_escape(str(k))}" if path else _escape(str(k)))])
            return {"$map": items}
        if isinstance(value, tuple):
            return {"$tuple": [walk(v, f"{path}/{i}") for i, v in enumerate(value)]}
        if isinstance(value, list):
            return [walk(v, f"{path}/{i}") for i, v in enumerate(value)]
        raise StateFormatError(f"state value at {path or '(root)'!r} has type {type(value).__name__}, which the "
                               "flat state form cannot hold (use tensors, numbers, strings, lists and dicts)")

    skeleton = walk(obj, "")
    return tensors, skeleton


def unflatten(tensors: Mapping[str, torch.Tensor], skeleton: JSONValue) -> State:
    """The object :func:`flatten` was given, from its tensors and skeleton."""

    def build(node: JSONValue) -> State:
        # The markers' values are what flatten writes (a corrupt skeleton fails on them: from_bytes says so).
        if isinstance(node, dict):
            if "$t" in node and len(node) == 1:
                try:
                    return tensors[cast(str, node["$t"])]
                except KeyError:
                    raise StateFormatError(f"state skeleton names a tensor {node['$t']!r} that is missing") from None
            if "$map" in node and len(node) == 1:
                return {_hashable(build(k)): build(v) for k, v in cast("list[list[JSONValue]]", node["$map"])}
            if "$tuple" in node and len(node) == 1:
                return tuple(build(v) for v in cast("list[JSONValue]", node["$tuple"]))
            if "$float" in node and len(node) == 1:
                return float(cast(str, node["$float"]))
            return {k: build(v) for k, v in node.items()}
        if isinstance(node, list):
            return [build(v) for v in node]
        return node

    return build(skeleton)


def named_parts(obj: object, what: str = "state") -> Parts:
    """``obj`` as named parts (a dict with string keys: a payload, an upload, a server state of parts, a
    result's wire form), or a :class:`StateFormatError` naming ``what``."""
    if isinstance(obj, dict) and all(isinstance(key, str) for key in obj):
        return cast(Parts, obj)
    raise StateFormatError(f"{what} is not a mapping of named parts (got {type(obj).__name__})")


def _hashable(key: State) -> Hashable:
    return tuple(_hashable(k) for k in key) if isinstance(key, (list, tuple)) else key


def _storable(tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Contiguous tensors that share no memory (safetensors refuses aliases)."""
    out: dict[str, torch.Tensor] = {}
    used: set[int] = set()
    for key, tensor in tensors.items():
        tensor = tensor.contiguous()
        ptr = tensor.untyped_storage().data_ptr()
        if ptr in used and tensor.numel() > 0:
            tensor = tensor.clone()
        used.add(tensor.untyped_storage().data_ptr())
        out[key] = tensor
    return out


def to_bytes(obj: object, meta: Mapping[str, object] | None = None) -> bytes:
    """``obj`` as safetensors bytes; the skeleton (and ``meta``) travel in the header."""
    tensors, skeleton = flatten(obj)
    header = {"format": FORMAT, "skeleton": skeleton, "meta": dict(meta or {})}
    return st_save(_storable(tensors), metadata={_META_KEY: json.dumps(header)})


def from_bytes(data: bytes, what: str = "state") -> tuple[State, JSONObject]:
    """(object, meta) from :func:`to_bytes`'s output; a :class:`StateFormatError` naming ``what`` if the
    bytes are not such a state."""
    try:
        tensors = st_load(data)
        header_len = int.from_bytes(data[:8], "little")
        raw = json.loads(data[8:8 + header_len]).get("__metadata__", {}).get(_META_KEY)
    except (SafetensorError, ValueError, UnicodeDecodeError, json.JSONDecodeError, OverflowError) as err:
        raise StateFormatError(f"{what} is not a fedfew state file ({err})") from None
    if raw is None:
        raise StateFormatError(f"{what} is a safetensors file without fedfew's state header")
    try:
        header = json.loads(raw)
        if header.get("format") != FORMAT:
            raise StateFormatError(f"{what} has state format {header.get('format')!r}, expected {FORMAT!r}")
        return unflatten(tensors, header["skeleton"]), header.get("meta", {})
    except (KeyError, TypeError, AttributeError, json.JSONDecodeError) as err:
        raise StateFormatError(f"{what} has a corrupt state header ({err})") from None


def save(path: str | Path, obj: object, meta: Mapping[str, object] | None = None) -> None:
    """Write ``obj`` to ``path`` atomically (a temporary file in the same folder, then a rename)."""
    path = Path(path)
    atomic_write_bytes(path, to_bytes(obj, meta))


def load(path: str | Path) -> tuple[State, JSONObject]:
    """(object, meta) from a file written by :func:`save`."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as err:
        raise StateFormatError(f"cannot read state file {path}: {err.strerror or err}") from None
    return from_bytes(data, what=f"state file {path}")


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write then rename: a reader sees the old file or the new one, never half of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as err:  # a full disk: give back what the half-written file took, and name the file
        tmp.unlink(missing_ok=True)
        raise OSError(err.errno, err.strerror, str(path)) from None


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode())


def nbytes(obj: object) -> int:
    """Bytes of the tensors in ``obj`` as the flat form holds them (each distinct tensor once)."""
    tensors, _ = flatten(obj)
    return sum(t.numel() * t.element_size() for t in tensors.values())


def mismatch(saved: object, expected: object) -> str | None:
    """Where the state ``saved`` differs in form from ``expected`` (another key, tensor shape or
    dtype), as ``path: what``; None when every tensor sits where ``expected`` has one of the same shape.
    Numbers and strings may differ: only the form decides whether one can stand for the other."""
    saved_tensors, saved_skeleton = flatten(saved, dedup=False)
    expected_tensors, expected_skeleton = flatten(expected, dedup=False)
    missing = sorted(set(expected_tensors) - set(saved_tensors))
    extra = sorted(set(saved_tensors) - set(expected_tensors))
    if missing or extra:
        return (f"{missing[0]}: missing" if missing else f"{extra[0]}: not in this model") + \
            f" ({len(missing)} tensors missing, {len(extra)} not in this model)"
    for key in sorted(expected_tensors):
        got, want = saved_tensors[key], expected_tensors[key]
        if got.shape != want.shape or got.dtype != want.dtype:
            return f"{key}: {tuple(got.shape)} {got.dtype} where the model has {tuple(want.shape)} {want.dtype}"
    return None


def to_device(obj: State, device: torch.device | str) -> State:
    """``obj`` with every tensor moved to ``device`` (states read from disk come to the CPU)."""
    if isinstance(obj, torch.Tensor):
        return obj.to(device)
    if isinstance(obj, Mapping):
        return {k: to_device(v, device) for k, v in obj.items()}
    if isinstance(obj, tuple):
        return tuple(to_device(v, device) for v in obj)
    if isinstance(obj, list):
        return [to_device(v, device) for v in obj]
    return obj
