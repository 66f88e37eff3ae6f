"""Aggregation helpers: weights that sum to one, and weighted averages of states and tensors."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from fedfew.interface.state import StateDict


def normalise(weights: Sequence[float] | torch.Tensor) -> torch.Tensor:
    """Non-negative weights scaled to sum to one (float64 to keep the sum exact)."""
    w = torch.as_tensor(weights, dtype=torch.float64)
    if w.dim() != 1 or len(w) == 0:
        raise ValueError("need a non-empty 1-D list of weights")
    if bool((w < 0).any()):
        raise ValueError(f"aggregation weights must be non-negative, got {w.tolist()}")
    total = w.sum()
    if total <= 0:
        raise ValueError("aggregation weights sum to zero")
    return w / total


def weights_for(kind: str, num_samples: Sequence[int], num_episodes: Sequence[int],
                given: Sequence[float] | None = None) -> torch.Tensor:
    """Normalised weights by ``kind``: "samples" (n_k, FedAvg), "episodes" (|B_k|, FedFSL eq. 10),
    "uniform" (FML, F2L eq. 2) or "given"."""
    if kind == "samples":
        return normalise(num_samples)
    if kind == "episodes":
        return normalise(num_episodes)
    if kind == "uniform":
        return normalise([1.0] * len(num_samples))
    if kind == "given":
        if given is None:
            raise ValueError("aggregation 'given' needs weights")
        return normalise(given)
    raise ValueError(f"unknown aggregation weighting {kind!r}; use samples, episodes, uniform or given")


def weighted_average(states: Sequence[Mapping[str, torch.Tensor]], weights: Sequence[float] | torch.Tensor) -> StateDict:
    """sum_k w_k * state_k for floating tensors; integer buffers (BN's batch counter) come from
    the first state. Weights are normalised here."""
    if not states:
        raise ValueError("nothing to aggregate")
    w = normalise(weights)
    out: StateDict = {}
    for name, first in states[0].items():
        if torch.is_floating_point(first):
            stacked = torch.stack([s[name].to(torch.float64) for s in states])
            out[name] = torch.tensordot(w, stacked, dims=1).to(first.dtype)
        else:
            out[name] = first.clone()
    return out


def average_tensors(tensors: Sequence[torch.Tensor], weights: Sequence[float] | torch.Tensor) -> torch.Tensor:
    w = normalise(weights).to(tensors[0].dtype)
    return torch.tensordot(w, torch.stack(list(tensors)), dims=1)
