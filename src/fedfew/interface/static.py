"""What does not cross: tensors both sides already hold.

A model's frozen parameters (``requires_grad`` False: the BiLSTM's or GRU's frozen GloVe table,
typically 78% of its parameters) never change; the server and every client build them the same way
from the same files (``make_model`` with the loader's pretrained vectors). A payload or upload tensor
whose leaf name is a frozen parameter's and whose value is bit-identical to it is therefore not sent:
the receiver puts back its own copy. Bytes sent count only what crosses (:func:`crossing_bytes`), and
the Flower engines leave those tensors out of their messages (:mod:`fedfew.flower.records`), so both
count the same.

A frozen tensor that is *not* identical on both sides (a frozen embedding drawn at random from the
init seed, an average that rounds differently) simply crosses: the check is by value, never assumed.
The receiver checks a digest of each tensor it puts back against the sender's, so two sides that built
different tables (different word-vector files) fail loudly instead of training on different models.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import TYPE_CHECKING

import torch

from fedfew.interface.serialize import flatten

if TYPE_CHECKING:
    from fedfew.interface.algorithm import Algorithm

_ATTRIBUTE = "_fedfew_static_tensors"


class StaticMismatchError(ValueError):
    """The receiver's copy of a frozen tensor differs from the sender's."""


def digest(tensor: torch.Tensor) -> str:
    t = tensor.detach().cpu().contiguous()
    return hashlib.blake2b(t.reshape(-1).view(torch.uint8).numpy().tobytes(), digest_size=12).hexdigest()


def static_tensors(algorithm: Algorithm) -> dict[str, torch.Tensor]:
    """The frozen parameters of ``algorithm``'s model, by name (empty when it has none)."""
    return _static(algorithm)[0]


def static_digests(algorithm: Algorithm) -> dict[str, str]:
    return _static(algorithm)[1]


def _static(algorithm: Algorithm) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    memo = getattr(algorithm, _ATTRIBUTE, None)
    if memo is not None:
        return memo
    tensors: dict[str, torch.Tensor] = {}
    make = getattr(getattr(algorithm, "context", None), "make_model", None)
    if make is not None:
        try:
            model = make(None)
        except Exception:  # a model that needs a class count: look at a classifier
            model = make(max(int(getattr(algorithm.context, "num_classes", 2) or 2), 2))
        tensors = {name: p.detach().cpu().clone() for name, p in model.named_parameters() if not p.requires_grad}
    digests = {name: digest(t) for name, t in tensors.items()}
    setattr(algorithm, _ATTRIBUTE, (tensors, digests))
    return tensors, digests


def leaf_name(path: str) -> str:
    """The last component of a flat-form path (``model/encoder.embedding.weight`` -> the parameter name)."""
    return path.rsplit("/", 1)[-1].replace("~1", "/").replace("~0", "~")


def is_static(path: str, tensor: torch.Tensor, static: Mapping[str, torch.Tensor]) -> bool:
    ref = static.get(leaf_name(path))
    if ref is None or ref.shape != tensor.shape or ref.dtype != tensor.dtype:
        return False
    return torch.equal(ref, tensor.detach().cpu())


def crossing_bytes(obj: object, static: Mapping[str, torch.Tensor]) -> int:
    """Bytes of the tensors in ``obj`` that cross the wire: all but those equal to a static tensor."""
    tensors, _ = flatten(obj, dedup=False)
    return sum(t.numel() * t.element_size() for path, t in tensors.items()
               if not (static and is_static(path, t, static)))
