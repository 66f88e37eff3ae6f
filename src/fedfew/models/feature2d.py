"""``feature2d``: a small feature generator with a 2-unit output, for FedFSL's MNIST picture (Fig. 6).

Fan & Huang (section 5.3) draw MNIST test digits in a two-dimensional feature space together with the
classifier's decision regions. This encoder makes that space the model's own: two [conv 3x3, ReLU,
maxpool 2] blocks, a hidden fully connected layer with ReLU, and a linear layer to ``feature_dim``
(2) units with no activation, so the features can take any value in the plane. The paper does not give
the generator's layers; any encoder ending in a 2-unit layer serves the picture.
"""

from __future__ import annotations

from torch import nn

from fedfew.models.base import MODELS, FewShotModel, linear_head


@MODELS.register(
    "feature2d",
    help="2 x [conv3x3, ReLU, maxpool] -> hidden -> 2-d features (FedFSL Fig. 6); options channels, hidden, feature_dim",
)
def feature2d(
    input_shape: tuple[int, ...],
    num_classes: int | None,
    channels: int = 16,
    hidden: int = 64,
    feature_dim: int = 2,
) -> FewShotModel:
    """Encoder to ``feature_dim`` (default 2) linear units; an optional linear head on top."""
    if len(input_shape) != 3:
        raise ValueError(f"feature2d needs image inputs [C, H, W], got shape {input_shape}")
    in_channels, height, width = (int(s) for s in input_shape)
    side_h, side_w = height // 4, width // 4
    if side_h < 1 or side_w < 1:
        raise ValueError(f"feature2d pools twice by 2 and cannot take {height}x{width} inputs")
    if feature_dim < 1 or hidden < 1 or channels < 1:
        raise ValueError("feature2d: channels, hidden and feature_dim must be positive")
    encoder = nn.Sequential(
        nn.Conv2d(in_channels, channels, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(channels, 2 * channels, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(2 * channels * side_h * side_w, hidden),
        nn.ReLU(),
        nn.Linear(hidden, feature_dim),
    )
    return FewShotModel(encoder, feature_dim, linear_head(feature_dim, num_classes))
