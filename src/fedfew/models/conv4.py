"""Conv4: the standard few-shot backbone (Vinyals et al.; Finn et al.; Snell et al.)."""

from __future__ import annotations

import torch
from torch import nn

from fedfew.models.base import MODELS, FewShotModel, linear_head


def conv_block(in_channels: int, out_channels: int, pool: bool, track_running_stats: bool) -> nn.Sequential:
    layers: list[nn.Module] = [
        nn.Conv2d(in_channels, out_channels, 3, padding=1),
        nn.BatchNorm2d(out_channels, track_running_stats=track_running_stats),
        nn.ReLU(inplace=True),
    ]
    if pool:
        layers.append(nn.MaxPool2d(2))
    return nn.Sequential(*layers)


class Conv4Encoder(nn.Sequential):
    """4 x [conv 3x3, BatchNorm, ReLU, maxpool 2]; ``pools`` blocks (from the first) keep their pool.

    ``pools=4`` is the usual 84x84 / 28x28 backbone; ``pools=2`` is the 32x32 variant without the
    last two pools; ``pools=1`` is the default for tiny inputs such as the 8x8 digits, where three
    pools would leave a 1x1x64 bottleneck (prototype accuracy on novel digits fell from 69% to 42% at
    random initialisation). Features are flattened.
    """

    def __init__(self, in_channels: int, hidden: int, pools: int, track_running_stats: bool) -> None:
        blocks = [
            conv_block(in_channels if i == 0 else hidden, hidden, pool=i < pools, track_running_stats=track_running_stats)
            for i in range(4)
        ]
        super().__init__(*blocks, nn.Flatten())


def _spatial_after(size: int, pools: int) -> int:
    for _ in range(pools):
        size //= 2
    return size


@MODELS.register("conv4", help="4 x [conv3x3, BN, ReLU, maxpool]; options hidden (64), pools (4)")
def conv4(
    input_shape: tuple[int, ...],
    num_classes: int | None,
    hidden: int = 64,
    pools: int | None = None,
    track_running_stats: bool = False,
) -> FewShotModel:
    """``track_running_stats=False`` (default) makes BatchNorm always use the batch's statistics, as
    MAML and ProtoNet code do at meta-test (transductive BN), and keeps BN free of buffers to average."""
    if len(input_shape) != 3:
        raise ValueError(f"conv4 needs image inputs [C, H, W], got shape {input_shape}")
    channels, height, width = input_shape
    if pools is None:
        pools = 2 if min(height, width) == 32 else (1 if min(height, width) < 16 else 4)
    side_h, side_w = _spatial_after(height, pools), _spatial_after(width, pools)
    if side_h < 1 or side_w < 1:
        raise ValueError(f"conv4 with {pools} pools cannot take {height}x{width} inputs; use fewer pools")
    encoder = Conv4Encoder(channels, hidden, pools, track_running_stats)
    feature_dim = hidden * side_h * side_w
    return FewShotModel(encoder, feature_dim, linear_head(feature_dim, num_classes))


def _check() -> None:  # pragma: no cover - used interactively
    m = conv4((3, 84, 84), None)
    print(sum(p.numel() for p in m.parameters()), m(torch.zeros(2, 3, 84, 84)).shape)
