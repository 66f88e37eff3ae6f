"""The one in-memory labelled dataset type that every loader returns."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import torch

from fedfew.core.errors import UsageError

SPLITS = ("base", "val", "novel")


class DataError(UsageError):
    """A dataset could not be loaded or used as asked; the message says what and how to fix it."""


class DataNotFoundError(DataError, FileNotFoundError):
    """A dataset file is missing; the message names the file and where to get it."""

    def __init__(self, path: object, dataset: str, how_to_get: str) -> None:
        super().__init__(f"{dataset}: missing {path}. {how_to_get}")


@dataclass
class LabelledDataset:
    """Inputs, integer labels and class names held in memory.

    inputs:   images as float32 [n, C, H, W], flat features [n, d], or token ids int64 [n, L].
    labels:   int64 [n], global class ids 0..num_classes-1 (an episode remaps them to 0..N-1).
    groups:   optional int64 [n] writer or user id, for natural partitions (FEMNIST, Sent140).
    lengths:  optional int64 [n] true token counts of padded text.
    splits:   class ids of each standard split: "base" (meta-train), "val", "novel" (meta-test).
    extras:   anything else a loader knows (a vocabulary, pretrained word vectors, the raw texts).
    positions: optional int64 [n] (CPU): the rows of the loaded dataset these samples are; a subset
              of a subset keeps them (None: this is the loaded dataset, row i is position i).
    """

    inputs: torch.Tensor
    labels: torch.Tensor
    class_names: list[str]
    name: str = ""
    groups: torch.Tensor | None = None
    lengths: torch.Tensor | None = None
    splits: dict[str, list[int]] = field(default_factory=dict)
    extras: dict[str, Any] = field(default_factory=dict)
    positions: torch.Tensor | None = None

    def __post_init__(self) -> None:
        n = len(self.labels)
        if self.labels.dtype != torch.int64:
            self.labels = self.labels.long()
        if len(self.inputs) != n:
            raise DataError(f"{self.name}: {len(self.inputs)} inputs but {n} labels")
        for what in ("groups", "lengths"):
            value = getattr(self, what)
            if value is not None and len(value) != n:
                raise DataError(f"{self.name}: {len(value)} {what} but {n} labels")
        if n and (int(self.labels.min()) < 0 or int(self.labels.max()) >= len(self.class_names)):
            raise DataError(
                f"{self.name}: labels must lie in 0..{len(self.class_names) - 1}, "
                f"found {int(self.labels.min())}..{int(self.labels.max())}"
            )
        for split, classes in self.splits.items():
            bad = [c for c in classes if not 0 <= c < len(self.class_names)]
            if bad:
                raise DataError(f"{self.name}: split {split!r} names unknown classes {bad[:5]}")

    def __len__(self) -> int:
        return len(self.labels)

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(self.inputs.shape[1:])

    @property
    def is_text(self) -> bool:
        return not torch.is_floating_point(self.inputs)

    def to(self, device: torch.device | str) -> LabelledDataset:
        """The same samples with their tensors on ``device`` (itself when they already are)."""
        if self.inputs.device == torch.device(device):
            return self
        def move(tensor: torch.Tensor) -> torch.Tensor:
            return tensor.to(device)

        def move_optional(tensor: torch.Tensor | None) -> torch.Tensor | None:
            return None if tensor is None else move(tensor)

        return replace(self, inputs=move(self.inputs), labels=move(self.labels), groups=move_optional(self.groups),
                       lengths=move_optional(self.lengths))

    def subset(self, indices: torch.Tensor | list[int]) -> LabelledDataset:
        """The samples at ``indices``; labels keep their global class ids, ``positions`` their rows
        in the loaded dataset."""
        idx = torch.as_tensor(indices, dtype=torch.long)
        rows = torch.arange(len(self)) if self.positions is None else self.positions
        return replace(
            self,
            positions=rows[idx.cpu()],
            inputs=self.inputs[idx],
            labels=self.labels[idx],
            groups=None if self.groups is None else self.groups[idx],
            lengths=None if self.lengths is None else self.lengths[idx],
        )

    def indices_of_classes(self, classes: list[int] | torch.Tensor) -> torch.Tensor:
        wanted = torch.as_tensor(list(classes), dtype=torch.long)
        return torch.nonzero(torch.isin(self.labels, wanted), as_tuple=True)[0]

    def split(self, name: str) -> LabelledDataset:
        """The samples of one standard class split ("base", "val" or "novel")."""
        if name not in self.splits:
            known = ", ".join(self.splits) or "none"
            raise DataError(f"{self.name}: no class split {name!r} (this dataset has: {known})")
        return self.subset(self.indices_of_classes(self.splits[name]))

    def class_counts(self) -> torch.Tensor:
        return torch.bincount(self.labels, minlength=self.num_classes)

    def summary(self) -> str:
        parts = [f"{self.name}: {len(self)} samples, {self.num_classes} classes, inputs {self.input_shape}"]
        for split, classes in self.splits.items():
            parts.append(f"{split}={len(classes)}")
        if self.groups is not None:
            parts.append(f"groups={int(torch.unique(self.groups).numel())}")
        return " ".join(parts)
