"""ResNet-12: the few-shot backbone of TADAM, MetaOptNet and FEAT (channels 64-160-320-640)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from fedfew.models.base import MODELS, FewShotModel, linear_head


class DropBlock(nn.Module):
    """DropBlock (Ghiasi et al., 2018): zero contiguous ``block_size`` x ``block_size`` squares of a
    feature map, then rescale the kept activations; the identity in eval mode or at ``drop_rate=0``.

    ``gamma`` (the rate at which blocks start) follows the paper's eq. 1 so that about ``drop_rate`` of the
    activations are dropped; the block is clipped to the feature map when the map is smaller.
    """

    def __init__(self, drop_rate: float = 0.0, block_size: int = 5) -> None:
        super().__init__()
        if not 0.0 <= drop_rate < 1.0:
            raise ValueError(f"drop_rate must be in [0, 1), got {drop_rate}")
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.drop_rate = drop_rate
        self.block_size = block_size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.drop_rate == 0.0:
            return x
        n, c, h, w = x.shape
        size = min(self.block_size, h, w)
        valid = (h - size + 1) * (w - size + 1)
        gamma = self.drop_rate / (size * size) * (h * w) / valid
        # Block corners are sampled where a whole block fits, then grown into blocks by max-pooling.
        corners = torch.bernoulli(
            torch.full((n, c, h - size + 1, w - size + 1), min(gamma, 1.0), device=x.device, dtype=x.dtype)
        )
        corners = F.pad(corners, (size - 1, size - 1, size - 1, size - 1))
        # Padded side h + size - 1, so the pooled map is [n, c, h, w]: pixel i is dropped when a block
        # whose top-left corner is in [i - size + 1, i] was sampled.
        keep = 1.0 - F.max_pool2d(corners, kernel_size=size, stride=1)
        kept = keep.sum()
        scale = keep.numel() / kept.clamp_min(1.0)
        return x * keep * scale

    def extra_repr(self) -> str:
        return f"drop_rate={self.drop_rate}, block_size={self.block_size}"


def _conv_bn(in_channels: int, out_channels: int, track_running_stats: bool) -> list[nn.Module]:
    return [
        nn.Conv2d(in_channels, out_channels, 3, padding=1, bias=False),
        nn.BatchNorm2d(out_channels, track_running_stats=track_running_stats),
    ]


class ResBlock12(nn.Module):
    """3 x [conv3x3, BN, LeakyReLU 0.1] (the last LeakyReLU after adding the 1x1 conv + BN shortcut),
    then maxpool 2 and DropBlock."""

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        track_running_stats: bool,
        drop_block: float = 0.0,
        block_size: int = 5,
    ) -> None:
        super().__init__()
        self.body = nn.Sequential(
            *_conv_bn(in_channels, out_channels, track_running_stats),
            nn.LeakyReLU(0.1),
            *_conv_bn(out_channels, out_channels, track_running_stats),
            nn.LeakyReLU(0.1),
            *_conv_bn(out_channels, out_channels, track_running_stats),
        )
        self.shortcut = nn.Sequential(
            nn.Conv2d(in_channels, out_channels, 1, bias=False),
            nn.BatchNorm2d(out_channels, track_running_stats=track_running_stats),
        )
        self.act = nn.LeakyReLU(0.1)
        self.pool = nn.MaxPool2d(2)
        self.drop = DropBlock(drop_block, block_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.pool(self.act(self.body(x) + self.shortcut(x))))


class ResNet12Encoder(nn.Module):
    """Four :class:`ResBlock12` then global average pooling: [n, C, H, W] -> [n, channels[-1]].

    DropBlock (if any) is used in the last two blocks, as in MetaOptNet and FEAT."""

    def __init__(
        self,
        in_channels: int,
        channels: Sequence[int],
        track_running_stats: bool,
        drop_block: float,
        block_size: int,
    ) -> None:
        super().__init__()
        blocks = []
        previous = in_channels
        for i, width in enumerate(channels):
            rate = drop_block if i >= len(channels) - 2 else 0.0
            blocks.append(ResBlock12(previous, width, track_running_stats, rate, block_size))
            previous = width
        self.blocks = nn.Sequential(*blocks)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.flatten = nn.Flatten()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.flatten(self.pool(self.blocks(x)))


@MODELS.register(
    "resnet12",
    help="ResNet-12 (64-160-320-640, 12.4M params) -> 640-d; options channels, drop_block, block_size",
)
def resnet12(
    input_shape: tuple[int, ...],
    num_classes: int | None,
    channels: Sequence[int] = (64, 160, 320, 640),
    drop_block: float = 0.0,
    block_size: int = 5,
    track_running_stats: bool = False,
) -> FewShotModel:
    """ResNet-12 on [C, H, W] images (H, W >= 16 for the four pools).

    ``track_running_stats=False`` (default, as for ``conv4``) makes BatchNorm use batch statistics
    also in eval mode and keeps it free of buffers to average; pass True for running statistics."""
    if len(input_shape) != 3:
        raise ValueError(f"resnet12 needs image inputs [C, H, W], got shape {input_shape}")
    channels = tuple(int(c) for c in channels)
    if not channels:
        raise ValueError("resnet12 needs at least one block width in channels")
    in_channels, height, width = input_shape
    if min(height, width) < 2 ** len(channels):
        raise ValueError(f"resnet12 with {len(channels)} pools cannot take {height}x{width} inputs")
    encoder = ResNet12Encoder(in_channels, channels, track_running_stats, drop_block, block_size)
    return FewShotModel(encoder, channels[-1], linear_head(channels[-1], num_classes))
