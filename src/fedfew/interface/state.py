"""Model state as plain tensor dicts: what is sent, copied in place, averaged and counted."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeVar

import torch
from torch import nn

StateDict = dict[str, torch.Tensor]


ModuleT = TypeVar("ModuleT", bound="nn.Module")

def get_state(model: nn.Module) -> StateDict:
    """Detached copies of every parameter and buffer (what a client would send)."""
    return {name: t.detach().clone() for name, t in model.state_dict().items()}


@torch.no_grad()
def load_state_(model: ModuleT, state: Mapping[str, torch.Tensor]) -> ModuleT:
    """Copy ``state`` into ``model``'s existing tensors in place: one persistent model per process
    instead of a deepcopy per client per round (no allocation, memory format kept)."""
    own = model.state_dict()
    missing = set(own) - set(state)
    if missing:
        raise KeyError(f"state lacks {sorted(missing)[:5]}")
    for name, tensor in own.items():
        tensor.copy_(state[name])
    return model


def payload_bytes(obj: object) -> int:
    """Bytes of every tensor inside ``obj`` (nested dicts, lists, tuples); other values count 0."""
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, Mapping):
        return sum(payload_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(payload_bytes(v) for v in obj)
    return 0


def clone_state(state: Mapping[str, torch.Tensor]) -> StateDict:
    return {k: v.detach().clone() for k, v in state.items()}


def flatten(state: Mapping[str, torch.Tensor]) -> torch.Tensor:
    return torch.cat([t.reshape(-1).float() for t in state.values()])


def state_distance(a: Mapping[str, torch.Tensor], b: Mapping[str, torch.Tensor]) -> float:
    return float(torch.linalg.vector_norm(flatten(a) - flatten(b)))
