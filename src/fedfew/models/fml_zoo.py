"""The five models of Federated Mutual Learning (Shen et al., 2020): ``mlp``, ``lenet5``, ``cnn1``,
``cnn2`` here, and ``resnet18`` in :mod:`fedfew.models.resnet18`.

Every factory takes any [C, H, W] image shape (``mlp`` also a flat [d] shape) and computes the
feature size from it.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from fedfew.models.base import MODELS, FewShotModel, linear_head


def _image_shape(name: str, input_shape: tuple[int, ...]) -> tuple[int, int, int]:
    if len(input_shape) != 3:
        raise ValueError(f"{name} needs image inputs [C, H, W], got shape {input_shape}")
    channels, height, width = (int(s) for s in input_shape)
    return channels, height, width


def _conv_out(size: int, kernel: int, padding: int, stride: int = 1) -> int:
    return (size + 2 * padding - kernel) // stride + 1


@MODELS.register("mlp", help="FedAvg's 2NN: flatten -> 200 -> ReLU -> 200 -> ReLU; option hidden (200)")
def mlp(input_shape: tuple[int, ...], num_classes: int | None, hidden: int = 200) -> FewShotModel:
    """The 2NN of McMahan et al. (2017) on inputs of any shape (flattened): 199,210 parameters on
    784-d MNIST with a 10-class head."""
    in_features = math.prod(int(s) for s in input_shape)
    if in_features < 1:
        raise ValueError(f"mlp needs a non-empty input shape, got {input_shape}")
    encoder = nn.Sequential(
        nn.Flatten(),
        nn.Linear(in_features, hidden),
        nn.ReLU(),
        nn.Linear(hidden, hidden),
        nn.ReLU(),
    )
    return FewShotModel(encoder, hidden, linear_head(hidden, num_classes))


@MODELS.register(
    "lenet5", help="LeNet-5: conv5x5 6 -> pool -> conv5x5 16 -> pool -> 120 -> 84; option padding"
)
def lenet5(input_shape: tuple[int, ...], num_classes: int | None, padding: int | None = None) -> FewShotModel:
    """LeNet-5 with ReLU and max-pooling. ``padding=None`` pads the first conv by 2 for inputs smaller
    than 32 px (so 28x28 MNIST gets the 32x32 geometry) and by 0 otherwise.

    Parameters with a 10-class head: 61,706 on 28x28x1 (as classic 32x32x1 LeNet-5) and 62,006 on
    32x32x3."""
    channels, height, width = _image_shape("lenet5", input_shape)
    if padding is None:
        padding = 2 if min(height, width) < 32 else 0
    side_h, side_w = height, width
    for pad in (padding, 0):
        side_h, side_w = _conv_out(side_h, 5, pad) // 2, _conv_out(side_w, 5, pad) // 2
    if side_h < 1 or side_w < 1:
        raise ValueError(f"lenet5 cannot take {height}x{width} inputs (padding {padding})")
    encoder = nn.Sequential(
        nn.Conv2d(channels, 6, 5, padding=padding),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(6, 16, 5),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(16 * side_h * side_w, 120),
        nn.ReLU(),
        nn.Linear(120, 84),
        nn.ReLU(),
    )
    return FewShotModel(encoder, 84, linear_head(84, num_classes))


def _conv_pool_stack(
    name: str, input_shape: tuple[int, ...], widths: tuple[int, ...], padding: int
) -> tuple[nn.Sequential, int]:
    """[conv3x3, ReLU, maxpool 2] per width, flattened; returns the encoder and its feature size."""
    channels, height, width = _image_shape(name, input_shape)
    layers: list[nn.Module] = []
    side_h, side_w = height, width
    previous = channels
    for out in widths:
        layers += [nn.Conv2d(previous, out, 3, padding=padding), nn.ReLU(), nn.MaxPool2d(2)]
        side_h, side_w = _conv_out(side_h, 3, padding) // 2, _conv_out(side_w, 3, padding) // 2
        previous = out
    if side_h < 1 or side_w < 1:
        raise ValueError(f"{name} cannot take {height}x{width} inputs (padding {padding})")
    layers.append(nn.Flatten())
    return nn.Sequential(*layers), previous * side_h * side_w


@MODELS.register(
    "cnn1", help="2 x [conv3x3 (6, 16 channels), ReLU, maxpool 2] -> flatten; option padding (1)"
)
def cnn1(input_shape: tuple[int, ...], num_classes: int | None, padding: int = 1) -> FewShotModel:
    """Two 3x3 convs with 6 and 16 channels, each with ReLU and 2x2 max-pool, flattened
    (16 * (H/4) * (W/4) features with the default ``padding=1``)."""
    encoder, feature_dim = _conv_pool_stack("cnn1", input_shape, (6, 16), padding)
    return FewShotModel(encoder, feature_dim, linear_head(feature_dim, num_classes))


@MODELS.register("cnn2", help="3 x [conv3x3 128, ReLU, maxpool 2] -> flatten; option padding (1)")
def cnn2(input_shape: tuple[int, ...], num_classes: int | None, padding: int = 1) -> FewShotModel:
    """Three 3x3 convs of 128 channels, each with ReLU and 2x2 max-pool, flattened
    (128 * (H/8) * (W/8) features with the default ``padding=1``, floors taken per pool)."""
    encoder, feature_dim = _conv_pool_stack("cnn2", input_shape, (128, 128, 128), padding)
    return FewShotModel(encoder, feature_dim, linear_head(feature_dim, num_classes))


def _check() -> None:  # pragma: no cover - used interactively
    for name, shape in (
        ("mlp", (784,)),
        ("lenet5", (1, 28, 28)),
        ("cnn1", (3, 32, 32)),
        ("cnn2", (3, 32, 32)),
    ):
        m = MODELS.get(name)(shape, 10)
        print(name, sum(p.numel() for p in m.parameters()), m(torch.zeros(2, *shape)).shape)
