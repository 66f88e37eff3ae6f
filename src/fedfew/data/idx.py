"""MNIST and Fashion-MNIST from the standard IDX files (each optionally gzipped).

``root/mnist/`` (resp. ``root/fashion-mnist/``) holds ``train-images-idx3-ubyte``,
``train-labels-idx1-ubyte``, ``t10k-images-idx3-ubyte`` and ``t10k-labels-idx1-ubyte``, each either
as is or with ``.gz``.
"""

from __future__ import annotations

import gzip
import zlib
from pathlib import Path

import numpy as np
import torch

from fedfew.data.dataset import DataError, DataNotFoundError, LabelledDataset
from fedfew.data.registry import DATASETS

IMAGES_MAGIC = 2051  # 0x00000803: unsigned bytes, 3 dimensions
LABELS_MAGIC = 2049  # 0x00000801: unsigned bytes, 1 dimension
FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}
PARTS = ("train", "test", "all")

MNIST_HOW = (
    "Download the four IDX files (train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz, "
    "t10k-images-idx3-ubyte.gz, t10k-labels-idx1-ubyte.gz) from http://yann.lecun.com/exdb/mnist/ "
    "(mirror: https://ossci-datasets.s3.amazonaws.com/mnist/) into {folder}."
)
FASHION_HOW = (
    "Download the four IDX files (train-images-idx3-ubyte.gz, ..., t10k-labels-idx1-ubyte.gz) from "
    "https://github.com/zalandoresearch/fashion-mnist (data/fashion/) into {folder}."
)
FASHION_CLASSES = [
    "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
    "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot",
]  # fmt: skip
#: FedFSL's toy split: meta-train on classes 0-4, meta-test on the unseen 5-9.
TOY_SPLITS = {"base": [0, 1, 2, 3, 4], "val": [], "novel": [5, 6, 7, 8, 9]}


def find_file(folder: Path, name: str) -> Path | None:
    """``folder/name`` or ``folder/name.gz``, whichever exists (the plain file first)."""
    for candidate in (folder / name, folder / f"{name}.gz"):
        if candidate.is_file():
            return candidate
    return None


def read_bytes(path: Path, dataset: str) -> bytes:
    """The (gunzipped when the name ends in .gz) contents of ``path``; a broken gzip is a DataError."""
    try:
        if path.suffix == ".gz":
            with gzip.open(path, "rb") as f:
                return f.read()
        return path.read_bytes()
    except (OSError, EOFError, zlib.error) as err:
        raise DataError(f"{dataset}: cannot read {path}: {err}") from err


def read_idx(path: Path, dataset: str, expected_magic: int | None = None) -> np.ndarray:
    """An IDX file of unsigned bytes as a numpy array of the shape its header gives."""
    data = read_bytes(path, dataset)
    if len(data) < 4:
        raise DataError(f"{dataset}: {path} is too short to be an IDX file ({len(data)} bytes)")
    magic = int.from_bytes(data[:4], "big")
    if expected_magic is not None and magic != expected_magic:
        raise DataError(
            f"{dataset}: {path} has magic number {magic}, expected {expected_magic} "
            "(is the file corrupt, or are images and labels swapped?)"
        )
    if data[0] != 0 or data[1] != 0 or data[2] != 0x08:
        raise DataError(f"{dataset}: {path} has magic number {magic}: not an unsigned-byte IDX file")
    ndim = data[3]
    header = 4 + 4 * ndim
    if len(data) < header:
        raise DataError(f"{dataset}: {path} is truncated inside its header")
    dims = [int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim)]
    expected = int(np.prod(dims, dtype=np.int64)) if dims else 0
    if len(data) - header != expected:
        raise DataError(
            f"{dataset}: {path} header says {dims} ({expected} bytes) but it holds "
            f"{len(data) - header} bytes of data (truncated or corrupt file)"
        )
    return np.frombuffer(data, dtype=np.uint8, offset=header).reshape(dims)


def _load_part(folder: Path, part: str, dataset: str, how: str) -> tuple[np.ndarray, np.ndarray]:
    image_name, label_name = FILES[part]
    paths = []
    for name in (image_name, label_name):
        path = find_file(folder, name)
        if path is None:
            raise DataNotFoundError(folder / f"{name}.gz", dataset, how.format(folder=folder))
        paths.append(path)
    images = read_idx(paths[0], dataset, IMAGES_MAGIC)
    labels = read_idx(paths[1], dataset, LABELS_MAGIC)
    if len(images) != len(labels):
        raise DataError(
            f"{dataset}: {paths[0]} holds {len(images)} images but {paths[1]} {len(labels)} labels"
        )
    if len(labels) and int(labels.max()) > 9:
        raise DataError(f"{dataset}: {paths[1]} holds label {int(labels.max())}, expected 0..9")
    return images, labels


def load_idx_dataset(
    root: Path, folder_name: str, dataset: str, class_names: list[str], how: str, part: str = "all"
) -> LabelledDataset:
    """A 10-class IDX dataset: ``part`` "train", "test" or "all" (the parts whose files exist)."""
    if part not in PARTS:
        raise DataError(f"{dataset}: part must be one of {PARTS}, not {part!r}")
    folder = Path(root) / folder_name
    if part == "all":
        wanted = [p for p in ("train", "test") if find_file(folder, FILES[p][0]) is not None]
        wanted = wanted or ["train"]  # nothing there: report the training images as missing
    else:
        wanted = [part]
    loaded = [(p, *_load_part(folder, p, dataset, how)) for p in wanted]
    images = np.concatenate([x for _, x, _ in loaded])
    labels = np.concatenate([y for _, _, y in loaded])
    is_test = torch.cat([torch.full((len(y),), p == "test", dtype=torch.bool) for p, _, y in loaded])
    return LabelledDataset(
        inputs=torch.from_numpy(images.astype(np.float32) / 255.0).reshape(-1, 1, *images.shape[1:]),
        labels=torch.from_numpy(labels.astype(np.int64)),
        class_names=list(class_names),
        name=dataset,
        splits={k: list(v) for k, v in TOY_SPLITS.items()},
        extras={"is_test": is_test, "parts": [p for p, _, _ in loaded]},
    )


@DATASETS.register("mnist", help="MNIST from the IDX files (train and/or t10k); base 0-4, novel 5-9")
def load_mnist(root: Path, part: str = "all") -> LabelledDataset:
    """MNIST, 28x28 grey digits in 0..1 (white strokes on black). ``part``: "train", "test" or "all".

    "all" concatenates the training then the test files, using whichever of the two exist;
    ``extras["is_test"]`` marks the test samples. Splits: FedFSL's base 0-4, novel 5-9.
    """
    return load_idx_dataset(root, "mnist", "mnist", [str(d) for d in range(10)], MNIST_HOW, part)


@DATASETS.register(
    "fashion-mnist", help="Fashion-MNIST from the IDX files (train and/or t10k); base 0-4, novel 5-9"
)
def load_fashion_mnist(root: Path, part: str = "all") -> LabelledDataset:
    """Fashion-MNIST, 28x28 grey clothing images in 0..1; same layout and options as ``mnist``."""
    return load_idx_dataset(root, "fashion-mnist", "fashion-mnist", FASHION_CLASSES, FASHION_HOW, part)
