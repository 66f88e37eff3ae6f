"""CIFAR-10, CIFAR-100 and FC100 from the official CIFAR "python version" pickle batches.

* CIFAR-10: ``root/cifar-10-batches-py/data_batch_1`` .. ``data_batch_5``, ``test_batch`` and
  ``batches.meta`` (the unpacked ``cifar-10-python.tar.gz``);
* CIFAR-100 and FC100: ``root/cifar-100-python/train``, ``test`` and ``meta`` (the unpacked
  ``cifar-100-python.tar.gz``).

The batches are pickles, loaded with ``load_data_pickle(f, encoding="bytes")``: only load files from the
official source (unpickling can run code).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import numpy as np
import torch

from fedfew.data.dataset import DataError, DataNotFoundError, LabelledDataset
from fedfew.data.omniglot import random_class_split
from fedfew.data.registry import DATASETS
from fedfew.data.safe_pickle import load_data_pickle

CIFAR10_HOW = (
    "Download https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz (from "
    "https://www.cs.toronto.edu/~kriz/cifar.html) and unpack it in {root}."
)
CIFAR100_HOW = (
    "Download https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz (from "
    "https://www.cs.toronto.edu/~kriz/cifar.html) and unpack it in {root}."
)
PARTS = ("train", "test", "all")
#: FC100 (Oreshkin et al. 2018): the 20 superclasses of each split; 60/20/20 fine classes.
FC100_SUPERCLASSES = {
    "base": [1, 2, 3, 4, 5, 6, 9, 10, 15, 17, 18, 19],
    "val": [8, 11, 13, 16],
    "novel": [0, 7, 12, 14],
}


def unpickle(path: Path, dataset: str, how: str) -> dict[bytes, object]:
    """A CIFAR pickle as a dict with bytes keys; missing or unreadable files raise DataError."""
    if not path.is_file():
        raise DataNotFoundError(path, dataset, how)
    try:
        with open(path, "rb") as f:
            content = load_data_pickle(f, encoding="bytes")
    except Exception as err:  # unpickling can fail in many ways; all mean a corrupt file
        raise DataError(f"{dataset}: cannot unpickle {path} ({type(err).__name__}: {err})") from err
    if not isinstance(content, dict):
        raise DataError(f"{dataset}: {path} holds a {type(content).__name__}, expected a dict")
    return {k.encode() if isinstance(k, str) else k: v for k, v in content.items()}


def _field(batch: dict[bytes, object], key: bytes, path: Path, dataset: str) -> object:
    if key not in batch:
        found = ", ".join(k.decode(errors="replace") for k in batch if isinstance(k, bytes))
        raise DataError(f"{dataset}: {path} has no key {key.decode()!r} (found: {found})")
    return batch[key]


def _images(batch: dict[bytes, object], path: Path, dataset: str) -> np.ndarray:
    try:
        data = np.asarray(_field(batch, b"data", path, dataset), dtype=np.uint8)
    except (ValueError, TypeError) as err:
        raise DataError(f"{dataset}: {path} 'data' is not an array of bytes ({err})") from err
    if data.ndim != 2 or data.shape[1] != 3 * 32 * 32:
        raise DataError(f"{dataset}: {path} 'data' has shape {data.shape}, expected [n, 3072]")
    return data.reshape(-1, 3, 32, 32)


def _labels(batch: dict[bytes, object], key: bytes, n: int, high: int, path: Path, dataset: str) -> np.ndarray:
    try:
        labels = np.asarray(_field(batch, key, path, dataset), dtype=np.int64).reshape(-1)
    except (ValueError, TypeError) as err:
        raise DataError(f"{dataset}: {path} {key.decode()!r} is not a list of integers ({err})") from err
    if len(labels) != n:
        raise DataError(f"{dataset}: {path} has {n} images but {len(labels)} {key.decode()!r}")
    if n and (labels.min() < 0 or labels.max() >= high):
        raise DataError(f"{dataset}: {path} {key.decode()!r} must lie in 0..{high - 1}")
    return labels


def _names(meta: dict[bytes, object], key: bytes, path: Path, dataset: str) -> list[str]:
    names = _field(meta, key, path, dataset)
    if not isinstance(names, Iterable):
        raise DataError(f"{dataset}: {path} {key.decode()!r} is not a list of names")
    return [n.decode("utf-8") if isinstance(n, bytes) else str(n) for n in names]


def _check_part(part: str, dataset: str) -> list[str]:
    if part not in PARTS:
        raise DataError(f"{dataset}: part must be one of {PARTS}, not {part!r}")
    return ["train", "test"] if part == "all" else [part]


def _to_float(images: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(images).to(torch.float32).div_(255.0)


@DATASETS.register("cifar10", help="CIFAR-10 python batches; 10 classes, 32x32 RGB (classification)")
def load_cifar10(root: Path, part: str = "all") -> LabelledDataset:
    """CIFAR-10 as float32 [n, 3, 32, 32] in 0..1; ``part`` "train" (50,000), "test" (10,000) or "all".

    A plain classification dataset: splits base = all 10 classes, val = novel = [];
    ``extras["is_test"]`` marks the test samples.
    """
    root = Path(root)
    folder = root / "cifar-10-batches-py"
    how = CIFAR10_HOW.format(root=root)
    meta_path = folder / "batches.meta"
    class_names = _names(unpickle(meta_path, "cifar10", how), b"label_names", meta_path, "cifar10")
    if len(class_names) != 10:
        raise DataError(f"cifar10: {meta_path} names {len(class_names)} classes, expected 10")
    images, labels, is_test = [], [], []
    for p in _check_part(part, "cifar10"):
        names = [f"data_batch_{i}" for i in range(1, 6)] if p == "train" else ["test_batch"]
        for name in names:
            path = folder / name
            batch = unpickle(path, "cifar10", how)
            x = _images(batch, path, "cifar10")
            images.append(x)
            labels.append(_labels(batch, b"labels", len(x), 10, path, "cifar10"))
            is_test.append(torch.full((len(x),), p == "test", dtype=torch.bool))
    return LabelledDataset(
        inputs=_to_float(np.concatenate(images)),
        labels=torch.from_numpy(np.concatenate(labels)),
        class_names=class_names,
        name="cifar10",
        splits={"base": list(range(10)), "val": [], "novel": []},
        extras={"is_test": torch.cat(is_test)},
    )


def _load_cifar100(root: Path, part: str, dataset: str) -> tuple[LabelledDataset, np.ndarray]:
    """CIFAR-100 with fine labels (no splits yet) and each sample's coarse label."""
    root = Path(root)
    folder = root / "cifar-100-python"
    how = CIFAR100_HOW.format(root=root)
    meta_path = folder / "meta"
    meta = unpickle(meta_path, dataset, how)
    fine_names = _names(meta, b"fine_label_names", meta_path, dataset)
    coarse_names = _names(meta, b"coarse_label_names", meta_path, dataset)
    if len(fine_names) != 100 or len(coarse_names) != 20:
        raise DataError(
            f"{dataset}: {meta_path} names {len(fine_names)} fine and {len(coarse_names)} coarse "
            "classes, expected 100 and 20"
        )
    images, fine, coarse, is_test = [], [], [], []
    for p in _check_part(part, dataset):
        path = folder / p
        batch = unpickle(path, dataset, how)
        x = _images(batch, path, dataset)
        images.append(x)
        fine.append(_labels(batch, b"fine_labels", len(x), 100, path, dataset))
        coarse.append(_labels(batch, b"coarse_labels", len(x), 20, path, dataset))
        is_test.append(torch.full((len(x),), p == "test", dtype=torch.bool))
    coarse_all = np.concatenate(coarse)
    data = LabelledDataset(
        inputs=_to_float(np.concatenate(images)),
        labels=torch.from_numpy(np.concatenate(fine)),
        class_names=fine_names,
        name=dataset,
        extras={
            "is_test": torch.cat(is_test),
            "coarse_labels": torch.from_numpy(coarse_all),
            "coarse_names": coarse_names,
        },
    )
    return data, coarse_all


@DATASETS.register("cifar100", help="CIFAR-100 python batches; 100 classes, seeded random 64/16/20 split")
def load_cifar100(
    root: Path,
    part: str = "all",
    split_seed: int = 0,
    num_base: int = 64,
    num_val: int = 16,
    num_novel: int = 20,
) -> LabelledDataset:
    """CIFAR-100 as float32 [n, 3, 32, 32] in 0..1 with the 100 fine labels.

    Splits: a seeded (``split_seed``) random base/val/novel of 64/16/20 fine classes (for the
    superclass-disjoint split use ``fc100``). ``extras``: ``is_test``, ``coarse_labels`` (the 20
    superclasses, per sample), ``coarse_names``.
    """
    data, _ = _load_cifar100(root, part, "cifar100")
    counts = {"base": num_base, "val": num_val, "novel": num_novel}
    data.splits = random_class_split(100, counts, split_seed, "cifar100")
    return data


@DATASETS.register("fc100", help="FC100: CIFAR-100 split by superclass, 60/20/20 fine classes")
def load_fc100(root: Path, part: str = "all") -> LabelledDataset:
    """FC100 (Oreshkin et al. 2018): CIFAR-100's fine classes split by superclass.

    base = fine classes of superclasses {1, 2, 3, 4, 5, 6, 9, 10, 15, 17, 18, 19} (60), val =
    superclasses {8, 11, 13, 16} (20), novel = {0, 7, 12, 14} (20). The fine-to-superclass map is
    read from the data. ``part`` defaults to "all": FC100 uses all 600 images of each class.
    """
    data, coarse = _load_cifar100(root, part, "fc100")
    fine = data.labels.numpy()
    superclass_of: dict[int, int] = {}
    for f, c in zip(fine.tolist(), coarse.tolist()):
        if superclass_of.setdefault(f, c) != c:
            raise DataError(f"fc100: fine class {f} appears with superclasses {superclass_of[f]} and {c}")
    data.splits = {
        split: sorted(f for f, c in superclass_of.items() if c in supers)
        for split, supers in FC100_SUPERCLASSES.items()
    }
    return data
