"""ResNet-18 (He et al., 2016) for classification: BasicBlock [2, 2, 2, 2], widths 64-128-256-512."""

from __future__ import annotations

import torch
from torch import nn

from fedfew.models.base import MODELS, FewShotModel, linear_head


class BasicBlock(nn.Module):
    """[conv3x3, BN, ReLU, conv3x3, BN] + shortcut (1x1 conv + BN when the shape changes), ReLU."""

    def __init__(self, in_channels: int, out_channels: int, stride: int, track_running_stats: bool) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(out_channels, track_running_stats=track_running_stats)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_channels, track_running_stats=track_running_stats)
        self.relu = nn.ReLU()
        if stride != 1 or in_channels != out_channels:
            self.shortcut: nn.Module = nn.Sequential(
                nn.Conv2d(in_channels, out_channels, 1, stride=stride, bias=False),
                nn.BatchNorm2d(out_channels, track_running_stats=track_running_stats),
            )
        else:
            self.shortcut = nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + self.shortcut(x))


class ResNet18Encoder(nn.Module):
    """Stem, four stages of two :class:`BasicBlock`, global average pooling -> 512-d features.

    The CIFAR stem is one 3x3 stride-1 conv without max-pool; the ImageNet stem is a 7x7 stride-2
    conv and a 3x3 stride-2 max-pool."""

    def __init__(self, in_channels: int, cifar_stem: bool, track_running_stats: bool) -> None:
        super().__init__()
        if cifar_stem:
            stem: list[nn.Module] = [nn.Conv2d(in_channels, 64, 3, stride=1, padding=1, bias=False)]
        else:
            stem = [nn.Conv2d(in_channels, 64, 7, stride=2, padding=3, bias=False)]
        stem += [nn.BatchNorm2d(64, track_running_stats=track_running_stats), nn.ReLU()]
        if not cifar_stem:
            stem.append(nn.MaxPool2d(3, stride=2, padding=1))
        self.stem = nn.Sequential(*stem)
        stages = []
        previous = 64
        for i, width in enumerate((64, 128, 256, 512)):
            stride = 1 if i == 0 else 2
            stages.append(
                nn.Sequential(
                    BasicBlock(previous, width, stride, track_running_stats),
                    BasicBlock(width, width, 1, track_running_stats),
                )
            )
            previous = width
        self.stages = nn.Sequential(*stages)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.flatten = nn.Flatten()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.flatten(self.pool(self.stages(self.stem(x))))


@MODELS.register("resnet18", help="ResNet-18 -> 512-d; CIFAR stem for inputs <= 64 px; option cifar_stem")
def resnet18(
    input_shape: tuple[int, ...],
    num_classes: int | None,
    cifar_stem: bool | None = None,
    track_running_stats: bool = True,
) -> FewShotModel:
    """ResNet-18 on [C, H, W] images; ``cifar_stem=None`` picks the CIFAR stem when max(H, W) <= 64.

    BatchNorm keeps running statistics (eval mode uses them): this is a classification model.
    With the CIFAR stem and 10 classes it has 11,173,962 parameters."""
    if len(input_shape) != 3:
        raise ValueError(f"resnet18 needs image inputs [C, H, W], got shape {input_shape}")
    in_channels, height, width = input_shape
    if cifar_stem is None:
        cifar_stem = max(height, width) <= 64
    encoder = ResNet18Encoder(in_channels, cifar_stem, track_running_stats)
    return FewShotModel(encoder, 512, linear_head(512, num_classes))
