"""AdFL's CIFAR-10 CNN: three pairs of 3x3 convolutions and three dense layers."""

from __future__ import annotations

from torch import nn

from fedfew.models.base import MODELS, FewShotModel, linear_head


@MODELS.register("adfl_cnn", help="AdFL CNN: 6 x conv3x3 (32,32,64,64,128,128), pool per pair -> 256 -> 128")
def adfl_cnn(
    input_shape: tuple[int, ...],
    num_classes: int | None,
    dense: tuple[int, int] = (256, 128),
) -> FewShotModel:
    """Six 3x3 convolutions (32, 32, 64, 64, 128, 128 channels, padding 1, each followed by ReLU)
    with a 2x2 max-pool after each pair, then three dense layers: flatten -> 256 -> ReLU -> 128 ->
    ReLU (the encoder, 128-d features) -> ``num_classes`` (the head, the third dense layer).

    The dense widths 256 and 128 are this project's choice (option ``dense``); on 32x32x3 CIFAR-10
    the flattened conv output is 128 * 4 * 4 = 2048."""
    if len(input_shape) != 3:
        raise ValueError(f"adfl_cnn needs image inputs [C, H, W], got shape {input_shape}")
    channels, height, width = (int(s) for s in input_shape)
    side_h, side_w = height // 8, width // 8
    if side_h < 1 or side_w < 1:
        raise ValueError(f"adfl_cnn pools three times and cannot take {height}x{width} inputs")
    if len(dense) != 2:
        raise ValueError(f"adfl_cnn's dense option takes two widths, got {dense}")
    layers: list[nn.Module] = []
    previous = channels
    for i, out in enumerate((32, 32, 64, 64, 128, 128)):
        layers += [nn.Conv2d(previous, out, 3, padding=1), nn.ReLU()]
        if i % 2 == 1:
            layers.append(nn.MaxPool2d(2))
        previous = out
    first, second = (int(d) for d in dense)
    layers += [
        nn.Flatten(),
        nn.Linear(128 * side_h * side_w, first),
        nn.ReLU(),
        nn.Linear(first, second),
        nn.ReLU(),
    ]
    return FewShotModel(nn.Sequential(*layers), second, linear_head(second, num_classes))
