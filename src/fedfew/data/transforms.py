"""Image transforms as batched torch ops on float tensors [n, C, H, W] (a single [C, H, W] works too).

Random transforms draw from the ``torch.Generator`` passed at call time, so a seeded generator gives
the same output every time. Every transform is vectorised over the batch; none needs torchvision.

    augment = Compose([RandomCropWithPadding(32, 4), RandomHorizontalFlip(), Normalize(mean, std)])
    x = augment(x, generator=torch.Generator().manual_seed(0))
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F

from fedfew.data.dataset import DataError


def _batched(x: torch.Tensor) -> tuple[torch.Tensor, bool]:
    if x.dim() == 3:
        return x.unsqueeze(0), True
    if x.dim() != 4:
        raise DataError(f"transforms take images [n, C, H, W] or [C, H, W], got shape {tuple(x.shape)}")
    return x, False


def _pair(size: int | Sequence[int]) -> tuple[int, int]:
    if isinstance(size, int):
        return size, size
    h, w = size
    return int(h), int(w)


def _rand(n: int, generator: torch.Generator | None, device: torch.device) -> torch.Tensor:
    """n uniform numbers drawn on the generator's device, moved to ``device``."""
    gen_device = generator.device if generator is not None else torch.device("cpu")
    return torch.rand(n, generator=generator, device=gen_device).to(device)


class Transform:
    """A callable on image batches; ``generator`` is used by the random ones."""

    def __call__(self, x: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        batch, single = _batched(x)
        out = self.apply(batch, generator)
        return out[0] if single else out

    def apply(self, x: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
        raise NotImplementedError

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in vars(self).items() if not k.startswith("_"))
        return f"{type(self).__name__}({fields})"


class Normalize(Transform):
    """(x - mean) / std per channel; :meth:`inverse` undoes it."""

    def __init__(self, mean: float | Sequence[float], std: float | Sequence[float]) -> None:
        self.mean = torch.as_tensor(mean, dtype=torch.float32).reshape(-1)
        self.std = torch.as_tensor(std, dtype=torch.float32).reshape(-1)
        if (self.std <= 0).any():
            raise DataError(f"Normalize: std must be positive, got {self.std.tolist()}")

    def _stats(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        channels = x.shape[1]
        for name, value in (("mean", self.mean), ("std", self.std)):
            if value.numel() not in (1, channels):
                raise DataError(f"Normalize: {name} has {value.numel()} values for {channels} channels")
        shape = (1, -1, 1, 1)
        return self.mean.to(x).reshape(shape), self.std.to(x).reshape(shape)

    def apply(self, x: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
        mean, std = self._stats(x)
        return (x - mean) / std

    def inverse(self, x: torch.Tensor) -> torch.Tensor:
        batch, single = _batched(x)
        mean, std = self._stats(batch)
        out = batch * std + mean
        return out[0] if single else out


class Resize(Transform):
    """Resize to ``size`` (int or (h, w)): area averaging when shrinking, else antialiased bilinear."""

    def __init__(self, size: int | Sequence[int]) -> None:
        self.size = _pair(size)

    def apply(self, x: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
        h, w = x.shape[-2:]
        if (h, w) == self.size:
            return x
        if self.size[0] <= h and self.size[1] <= w:
            return F.interpolate(x, size=self.size, mode="area")
        return F.interpolate(x, size=self.size, mode="bilinear", align_corners=False, antialias=True)


class RandomCropWithPadding(Transform):
    """Pad every side by ``padding`` (with ``fill``), then crop ``size`` at a random place per image."""

    def __init__(self, size: int | Sequence[int], padding: int = 0, fill: float = 0.0) -> None:
        self.size = _pair(size)
        self.padding = int(padding)
        self.fill = float(fill)
        if self.padding < 0:
            raise DataError(f"RandomCropWithPadding: padding must be >= 0, not {padding}")

    def apply(self, x: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
        p = self.padding
        padded = F.pad(x, (p, p, p, p), value=self.fill) if p else x
        n, c, h, w = padded.shape
        ch, cw = self.size
        if ch > h or cw > w:
            raise DataError(
                f"RandomCropWithPadding: crop {self.size} is larger than the padded image {(h, w)}"
            )
        top = (_rand(n, generator, x.device) * (h - ch + 1)).long().clamp_(max=h - ch)
        left = (_rand(n, generator, x.device) * (w - cw + 1)).long().clamp_(max=w - cw)
        rows = top[:, None] + torch.arange(ch, device=x.device)  # [n, ch]
        cols = left[:, None] + torch.arange(cw, device=x.device)  # [n, cw]
        batch = torch.arange(n, device=x.device)[:, None, None, None]
        chan = torch.arange(c, device=x.device)[None, :, None, None]
        return padded[batch, chan, rows[:, None, :, None], cols[:, None, None, :]]


class RandomHorizontalFlip(Transform):
    """Mirror each image left-right with probability ``p``."""

    def __init__(self, p: float = 0.5) -> None:
        if not 0.0 <= p <= 1.0:
            raise DataError(f"RandomHorizontalFlip: p must lie in [0, 1], not {p}")
        self.p = float(p)

    def apply(self, x: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
        flip = _rand(len(x), generator, x.device) < self.p
        return torch.where(flip[:, None, None, None], x.flip(-1), x)


class Compose(Transform):
    """Apply ``transforms`` in order, passing the generator to each (plain callables get only x)."""

    def __init__(self, transforms: Sequence[Transform | Callable[[torch.Tensor], torch.Tensor]]) -> None:
        self.transforms = list(transforms)

    def apply(self, x: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
        for t in self.transforms:
            x = t(x, generator) if isinstance(t, Transform) else t(x)
        return x
