"""The model contract: ``encoder(x) -> features`` and ``head(features) -> logits``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from fedfew.registry import Registry


class FewShotModel(nn.Module):
    """An encoder and a head. ``head`` is ``nn.Identity`` when the model has no classifier (metric
    methods such as prototypical networks classify by distance instead)."""

    def __init__(self, encoder: nn.Module, feature_dim: int, head: nn.Module | None = None) -> None:
        super().__init__()
        self.encoder = encoder
        self.feature_dim = feature_dim
        self.head = head if head is not None else nn.Identity()
        self.channels_last = False

    def features(self, x: torch.Tensor, *args: Any) -> torch.Tensor:
        if self.channels_last and x.dim() == 4:
            x = x.contiguous(memory_format=torch.channels_last)
        return self.encoder(x, *args)

    def forward(self, x: torch.Tensor, *args: Any) -> torch.Tensor:
        return self.head(self.features(x, *args))


ModelFactory = Callable[..., FewShotModel]
#: name -> factory(input_shape, num_classes, **options) returning a FewShotModel.
MODELS: Registry[ModelFactory] = Registry("model")


def use_channels_last(model: FewShotModel) -> FewShotModel:
    """Store conv weights and feed inputs as NHWC: measured about 1.45x per step for Conv4 on this
    project's 2-core CPU (benchmarks/bench_channels_last.py)."""
    if any(isinstance(m, nn.Conv2d) for m in model.modules()):
        model.to(memory_format=torch.channels_last)
        model.channels_last = True
    return model


def build_model(
    name: str,
    input_shape: tuple[int, ...],
    num_classes: int | None,
    channels_last: bool = True,
    **options: Any,
) -> FewShotModel:
    """Build a registered model; ``num_classes=None`` gives a head-less encoder."""
    factory = MODELS.get(name)
    try:
        model = factory(tuple(input_shape), num_classes, **options)
    except TypeError as err:
        if "unexpected keyword argument" in str(err):
            import inspect

            allowed = [p for p in inspect.signature(factory).parameters if p not in ("input_shape", "num_classes")]
            raise ValueError(
                f"model {name!r} got an unknown option ({err}); it takes: {', '.join(allowed) or 'none'}"
            ) from None
        raise
    return use_channels_last(model) if channels_last else model


def count_parameters(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def linear_head(feature_dim: int, num_classes: int | None) -> nn.Module | None:
    return None if num_classes is None else nn.Linear(feature_dim, num_classes)
