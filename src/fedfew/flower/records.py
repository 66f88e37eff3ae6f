"""fedfew's flat state form in Flower records: tensors as an ArrayRecord of raw arrays, the JSON
skeleton in a ConfigRecord.

Each tensor travels as one :class:`flwr.app.Array` whose ``data`` is exactly the tensor's bytes
(``stype`` ``"fedfew.raw"``: no NumPy header), so the bytes a message carries in arrays equal what the
in-process engine counts (:func:`fedfew.interface.state.payload_bytes`). Shared tensors are not merged:
a payload that holds a tensor twice sends it twice, as it is counted.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TypeAlias

import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord

from fedfew.interface.algorithm import Parts, State
from fedfew.interface.serialize import flatten, named_parts, unflatten
from fedfew.interface.static import StaticMismatchError, digest, is_static, leaf_name

#: What a RecordDict's item is typed as: fedfew's payloads use the ArrayRecord and ConfigRecord kinds.
# (An explicit TypeAlias: without flwr installed, as in `make lint`, the names are Any and a bare
# assignment would read as a variable.)
Record: TypeAlias = ArrayRecord | MetricRecord | ConfigRecord

STYPE = "fedfew.raw"
_DTYPES = {str(d).removeprefix("torch."): d for d in (
    torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.int16,
    torch.int8, torch.uint8, torch.bool)}


def tensor_to_array(tensor: torch.Tensor) -> Array:
    t = tensor.detach().cpu().contiguous()
    data = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
    return Array(dtype=str(t.dtype).removeprefix("torch."), shape=tuple(t.shape), stype=STYPE, data=data)


def array_to_tensor(array: Array) -> torch.Tensor:
    if array.stype != STYPE:
        raise ValueError(f"array of stype {array.stype!r}: fedfew sends {STYPE!r}")
    dtype = _DTYPES[array.dtype]
    if not array.data:
        return torch.empty(tuple(array.shape), dtype=dtype)
    return torch.frombuffer(bytearray(array.data), dtype=dtype).reshape(tuple(array.shape))


def to_records(obj: object, static: Mapping[str, torch.Tensor] | None = None) -> tuple[ArrayRecord, ConfigRecord]:
    """(arrays, skeleton) for any state-form object. Tensors equal to one of ``static`` (frozen
    parameters the receiver holds too) are left out and named, with their digest, in the skeleton's
    record."""
    tensors, skeleton = flatten(obj, dedup=False)
    kept = {key: t for key, t in tensors.items() if not (static and is_static(key, t, static))}
    arrays = ArrayRecord({key: tensor_to_array(t) for key, t in kept.items()})
    meta = ConfigRecord({"skeleton": json.dumps(skeleton)})
    left_out = {key: digest(t) for key, t in tensors.items() if key not in kept}
    if left_out:
        meta["static"] = json.dumps(left_out)
    return arrays, meta


def from_records(arrays: Record, meta: Record, static: Mapping[str, torch.Tensor] | None = None) -> State:
    if not isinstance(arrays, ArrayRecord) or not isinstance(meta, ConfigRecord):
        raise TypeError(f"a payload is an ArrayRecord and a ConfigRecord, not {type(arrays).__name__} and "
                        f"{type(meta).__name__}")
    tensors = {key: array_to_tensor(array) for key, array in arrays.items()}
    if "static" in meta:
        for key, sent_digest in json.loads(str(meta["static"])).items():
            ref = (static or {}).get(leaf_name(key))
            if ref is None or digest(ref) != sent_digest:
                raise StaticMismatchError(f"{leaf_name(key)!r} was left out as a frozen tensor both sides hold, "
                                          "but this side's copy differs (or it has none): the sides built their "
                                          "models from different files")
            tensors[key] = ref.clone()
    return unflatten(tensors, json.loads(str(meta["skeleton"])))


def parts_from_records(arrays: Record, meta: Record, static: Mapping[str, torch.Tensor] | None = None,
                       what: str = "a payload") -> Parts:
    """:func:`from_records` of named parts: a payload, an upload, a client's scores."""
    return named_parts(from_records(arrays, meta, static), what)


def array_bytes(arrays: Record) -> int:
    """Bytes of tensor data carried by ``arrays``."""
    if not isinstance(arrays, ArrayRecord):
        raise TypeError(f"tensor data travels in an ArrayRecord, not a {type(arrays).__name__}")
    return sum(len(array.data) for array in arrays.values())


def record_int(value: object) -> int:
    """An int read from a record entry (a ConfigRecord's values are typed as every kind a record holds)."""
    if not isinstance(value, (int, float, str)):
        raise TypeError(f"expected a number, got a {type(value).__name__}")
    return int(value)
