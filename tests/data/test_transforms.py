"""Batched image transforms."""

from __future__ import annotations

import pytest
import torch

from fedfew.data import DataError
from fedfew.data.transforms import Compose, Normalize, RandomCropWithPadding, RandomHorizontalFlip, Resize


def images(n: int = 16, c: int = 3, h: int = 8, w: int = 8, seed: int = 0) -> torch.Tensor:
    return torch.rand((n, c, h, w), generator=torch.Generator().manual_seed(seed))


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_flip() -> None:
    x = images()
    flip = RandomHorizontalFlip(p=1.0)
    once = flip(x, gen())
    assert torch.equal(once, x.flip(-1)) and not torch.equal(once, x)
    assert torch.equal(flip(once, gen()), x)
    assert torch.equal(RandomHorizontalFlip(p=0.0)(x, gen()), x)
    half = RandomHorizontalFlip(p=0.5)(images(n=200), gen())
    flipped = (half == images(n=200).flip(-1)).flatten(1).all(1)
    kept = (half == images(n=200)).flatten(1).all(1)
    assert torch.all(flipped | kept) and 50 < int(flipped.sum()) < 150  # per-sample decisions


def test_crop_with_padding() -> None:
    x = images(n=64, h=6, w=6) + 1.0  # > 0 everywhere, so padding shows as 0
    crop = RandomCropWithPadding(6, padding=2)
    out = crop(x, gen())
    assert out.shape == x.shape
    # every output is a shifted window of its own padded image
    padded = torch.nn.functional.pad(x, (2, 2, 2, 2))
    for i in range(len(x)):
        windows = [padded[i, :, t : t + 6, s : s + 6] for t in range(5) for s in range(5)]
        assert any(torch.equal(out[i], w) for w in windows)
    zero_rows = (out == 0).flatten(1).any(1)
    assert 0 < int(zero_rows.sum()) < len(x)  # offsets differ between samples
    assert torch.equal(RandomCropWithPadding(6, padding=0)(x, gen()), x)
    assert RandomCropWithPadding((4, 5), padding=1)(x, gen()).shape == (64, 3, 4, 5)
    with pytest.raises(DataError):
        RandomCropWithPadding(20, padding=1)(x, gen())


def test_normalize_inverse() -> None:
    x = images()
    norm = Normalize([0.5, 0.4, 0.3], [0.2, 0.25, 0.3])
    y = norm(x)
    assert torch.allclose(y[:, 1], (x[:, 1] - 0.4) / 0.25)
    assert torch.allclose(norm.inverse(y), x, atol=1e-6)
    assert torch.allclose(Normalize(0.5, 0.5)(x), x * 2 - 1)
    with pytest.raises(DataError):
        Normalize([0.1, 0.2], [1.0, 1.0])(x)
    with pytest.raises(DataError):
        Normalize(0.0, 0.0)


def test_resize() -> None:
    x = images(h=8, w=8)
    small = Resize(4)(x)
    assert small.shape == (16, 3, 4, 4)
    assert torch.allclose(small[:, :, 0, 0], x[:, :, :2, :2].mean(dim=(-1, -2)))  # area average
    assert Resize((12, 10))(x).shape == (16, 3, 12, 10)
    assert Resize(8)(x) is x


def test_same_seed_same_output() -> None:
    x = images(n=32)
    augment = Compose([RandomCropWithPadding(8, padding=3), RandomHorizontalFlip(), Normalize(0.5, 0.25)])
    a = augment(x, generator=gen(7))
    b = augment(x, generator=gen(7))
    c = augment(x, generator=gen(8))
    assert torch.equal(a, b) and not torch.equal(a, c)
    single = augment(x[0], generator=gen(7))  # an unbatched [C, H, W] image
    assert single.shape == x[0].shape
    assert torch.equal(Compose([lambda t: t * 2])(x), x * 2)
