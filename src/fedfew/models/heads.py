"""Heads: the parameter-free prototype classifier (the linear head is plain ``nn.Linear``)."""

from __future__ import annotations

import torch


def class_prototypes(features: torch.Tensor, labels: torch.Tensor, n_classes: int) -> torch.Tensor:
    """Mean feature of each class 0..n_classes-1: [n_classes, d] (Snell et al., eq. 1).

    A class with no sample gets a zero prototype; callers that need to know use ``class_counts``."""
    sums = torch.zeros(n_classes, features.shape[1], dtype=features.dtype, device=features.device)
    sums.index_add_(0, labels, features)
    counts = torch.bincount(labels, minlength=n_classes).clamp_min(1).to(features.dtype)
    return sums / counts.unsqueeze(1)


def prototype_logits(features: torch.Tensor, prototypes: torch.Tensor) -> torch.Tensor:
    """Negative squared Euclidean distance to each prototype: [n, n_classes]."""
    return -torch.cdist(features, prototypes).pow(2)


class PrototypeHead(torch.nn.Module):
    """Classifies by squared Euclidean distance to prototypes set with :meth:`fit`; no parameters."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("prototypes", torch.empty(0), persistent=False)

    def fit(self, features: torch.Tensor, labels: torch.Tensor, n_classes: int) -> PrototypeHead:
        self.prototypes = class_prototypes(features, labels, n_classes)
        return self

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        if self.prototypes.numel() == 0:
            raise RuntimeError("PrototypeHead.fit(support_features, support_labels, n) must come first")
        return prototype_logits(features, self.prototypes)
