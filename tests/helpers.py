"""Small builders shared by the engine and algorithm tests (no real data needed)."""

from __future__ import annotations

import torch

from fedfew.data import LabelledDataset
from fedfew.engine import ClientData, Context, EpisodeShape
from fedfew.models import build_model


def blob_dataset(classes: int = 6, per_class: int = 30, dim: int = 8, seed: int = 0,
                 spread: float = 0.3) -> LabelledDataset:
    """Well-separated Gaussian blobs on flat features: base = first half of the classes."""
    g = torch.Generator().manual_seed(seed)
    centres = torch.randn(classes, dim, generator=g) * 3
    labels = torch.arange(classes).repeat_interleave(per_class)
    inputs = centres[labels] + spread * torch.randn(len(labels), dim, generator=g)
    half = classes // 2
    return LabelledDataset(inputs, labels, [str(c) for c in range(classes)], name="blobs",
                           splits={"base": list(range(half)), "val": [], "novel": list(range(half, classes))})


def context_for(data: LabelledDataset, model: str = "mlp", task: str = "fewshot", n_way: int = 3,
                k_shot: int = 1, q_query: int = 5, seed: int = 0, **model_options) -> Context:
    options = {"hidden": 16, **model_options} if model == "mlp" else model_options

    def make_named(name: str, num_classes: int | None, **extra) -> torch.nn.Module:
        return build_model(name, data.input_shape, num_classes, **{**(options if name == model else {}), **extra})

    train = data.splits["base"] if task == "fewshot" else list(range(data.num_classes))
    return Context(seed=seed, make_model=lambda n: make_named(model, n), make_model_named=make_named,
                   input_shape=data.input_shape, num_classes=data.num_classes, train_classes=train,
                   episode=EpisodeShape(n_way, k_shot, q_query), task=task)


def clients_from(data: LabelledDataset, parts: list[torch.Tensor]) -> list[ClientData]:
    return [ClientData(i, data.subset(p)) for i, p in enumerate(parts)]
