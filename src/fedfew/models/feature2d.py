"""``feature2d``: a small feature generator with a 2-unit output, for FedFSL's MNIST picture (Fig. 6).

Fan & Huang (section 5.3) draw MNIST test digits in a two-dimensional feature space together with the
classifier's decision regions. This encoder makes that space the model's own: its last layer is a
linear layer to ``feature_dim`` (2) units with no activation, so the features can take any value in
the plane. Before it, either (``encoder="conv"``) two [conv 3x3, ReLU, maxpool 2] blocks of
``channels`` and 2 x ``channels`` maps and a hidden layer of ``hidden`` units with ReLU, or
(``encoder="mlp"``, about 4x cheaper per step on CPU) two hidden layers of ``width`` and ``hidden``
units with ReLU. The paper does not give the generator's layers; any encoder ending in a 2-unit layer
serves the picture.
"""

from __future__ import annotations

import math
from typing import Literal

from torch import nn

from fedfew.models.base import MODELS, FewShotModel, linear_head


@MODELS.register(
    "feature2d",
    help="conv or MLP encoder -> 2-d features (FedFSL Fig. 6); options encoder, channels, width, hidden, feature_dim",
)
def feature2d(
    input_shape: tuple[int, ...],
    num_classes: int | None,
    encoder: Literal["conv", "mlp"] = "conv",
    channels: int = 16,
    width: int = 256,
    hidden: int = 64,
    feature_dim: int = 2,
) -> FewShotModel:
    """Encoder to ``feature_dim`` (default 2) linear units; an optional linear head on top."""
    if min(channels, width, hidden, feature_dim) < 1:
        raise ValueError("feature2d: channels, width, hidden and feature_dim must be positive")
    layers: list[nn.Module]
    if encoder == "mlp":
        layers = [nn.Flatten(), nn.Linear(math.prod(int(s) for s in input_shape), width), nn.ReLU(),
                  nn.Linear(width, hidden), nn.ReLU()]
    elif encoder == "conv":
        if len(input_shape) != 3:
            raise ValueError(f"feature2d with encoder='conv' needs image inputs [C, H, W], got shape {input_shape}")
        in_channels, height, width_px = (int(s) for s in input_shape)
        side_h, side_w = height // 4, width_px // 4
        if side_h < 1 or side_w < 1:
            raise ValueError(f"feature2d pools twice by 2 and cannot take {height}x{width_px} inputs")
        layers = [
            nn.Conv2d(in_channels, channels, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(channels, 2 * channels, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear(2 * channels * side_h * side_w, hidden), nn.ReLU(),
        ]
    else:
        raise ValueError(f"feature2d: encoder must be 'conv' or 'mlp', not {encoder!r}")
    layers.append(nn.Linear(hidden, feature_dim))
    return FewShotModel(nn.Sequential(*layers), feature_dim, linear_head(feature_dim, num_classes))
