"""ResNet-12 (fedfew.models.resnet12): about 12.4 million parameters (counted by hand), custom channels,
and DropBlock only in training."""

from __future__ import annotations

import torch
from torch import nn

from fedfew.models import build_model, count_parameters
from fedfew.models.resnet12 import DropBlock


def resnet12_count_by_hand(in_channels: int = 3, widths=(64, 160, 320, 640)) -> int:
    """Per block: three bias-free 3x3 convs, a bias-free 1x1 shortcut conv, four BatchNorms (2 x out)."""
    total, previous = 0, in_channels
    for out in widths:
        convs = 9 * previous * out + 2 * 9 * out * out
        shortcut = previous * out
        batch_norms = 4 * 2 * out
        total += convs + shortcut + batch_norms
        previous = out
    return total


def test_resnet12_has_about_12_4_million_parameters() -> None:
    expected = resnet12_count_by_hand()
    assert expected == 12_424_320
    model = build_model("resnet12", (3, 84, 84), None)
    measured = count_parameters(model)
    assert abs(measured - expected) <= 0.01 * expected
    assert 12_300_000 <= measured <= 12_500_000
    assert model.feature_dim == 640


def test_resnet12_custom_channels() -> None:
    model = build_model("resnet12", (3, 32, 32), None, channels=(8, 16, 24, 32))
    assert model.feature_dim == 32
    assert count_parameters(model) == resnet12_count_by_hand(3, (8, 16, 24, 32))


def test_dropblock_drops_square_blocks_only_in_training() -> None:
    torch.manual_seed(0)
    drop = DropBlock(0.2, block_size=3)
    x = torch.ones(4, 8, 12, 12)
    assert torch.equal(drop.eval()(x), x)
    out = drop.train()(x)
    dropped = (out == 0).float().mean().item()
    assert 0.05 < dropped < 0.45
    kept = out[out != 0]
    torch.testing.assert_close(kept, torch.full_like(kept, out.numel() / (out != 0).sum().item()))
    # Every dropped pixel lies in a fully dropped 3x3 square inside the map: the mask equals its
    # morphological opening (erode, then dilate) by a 3x3 square.
    zero = (out == 0).float()
    eroded = -nn.functional.max_pool2d(-zero, 3, stride=1)  # 1 where a whole 3x3 window is dropped
    opened = nn.functional.max_pool2d(nn.functional.pad(eroded, (2, 2, 2, 2)), 3, stride=1)
    assert torch.equal(opened, zero)
    assert torch.equal(DropBlock(0.0).train()(x), x)


def test_resnet12_dropblock_is_active_in_training_only() -> None:
    torch.manual_seed(0)
    options = {"channels": (8, 16, 24, 32)}
    plain = build_model("resnet12", (3, 32, 32), None, **options)
    dropping = build_model("resnet12", (3, 32, 32), None, drop_block=0.3, block_size=2, **options)
    dropping.load_state_dict(plain.state_dict())
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(dropping.eval()(x), plain.eval()(x))
        assert not torch.allclose(dropping.train()(x), plain.train()(x))
