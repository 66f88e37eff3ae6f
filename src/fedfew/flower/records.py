"""fedfew's flat state form in Flower records: tensors as an ArrayRecord of raw arrays, the JSON
skeleton in a ConfigRecord.

Each tensor travels as one :class:`flwr.app.Array` whose ``data`` is exactly the tensor's bytes
(``stype`` ``"fedfew.raw"``: no NumPy header), so the bytes a message carries in arrays equal what the
in-process engine counts (:func:`fedfew.engine.state.payload_bytes`). Shared tensors are not merged:
a payload that holds a tensor twice sends it twice, as it is counted.
"""

from __future__ import annotations

import json
from typing import Any

import torch
from flwr.app import Array, ArrayRecord, ConfigRecord

from fedfew.engine.serialize import flatten, unflatten

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


def to_records(obj: Any) -> tuple[ArrayRecord, ConfigRecord]:
    """(arrays, skeleton) for any state-form object."""
    tensors, skeleton = flatten(obj, dedup=False)
    arrays = ArrayRecord({key: tensor_to_array(t) for key, t in tensors.items()})
    return arrays, ConfigRecord({"skeleton": json.dumps(skeleton)})


def from_records(arrays: ArrayRecord, meta: ConfigRecord) -> Any:
    tensors = {key: array_to_tensor(array) for key, array in arrays.items()}
    return unflatten(tensors, json.loads(str(meta["skeleton"])))


def array_bytes(arrays: ArrayRecord) -> int:
    """Bytes of tensor data carried by ``arrays``."""
    return sum(len(array.data) for array in arrays.values())
