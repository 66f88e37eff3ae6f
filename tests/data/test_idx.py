"""MNIST and Fashion-MNIST from IDX files (fedfew.data.idx), written here in the real format, and the
real MNIST test part when ../shared/data is present."""

from __future__ import annotations

import gzip
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

from fedfew.data import DataError, DataNotFoundError, load_dataset
from tests.data.common import assert_corrupt


def write_idx(path: Path, array: np.ndarray, magic: int) -> None:
    header = struct.pack(">I", magic) + b"".join(struct.pack(">I", d) for d in array.shape)
    payload = header + array.astype(np.uint8).tobytes()
    if path.suffix == ".gz":
        with gzip.open(path, "wb") as f:
            f.write(payload)
    else:
        path.write_bytes(payload)


def write_mnist(
    folder: Path, prefix: str, n: int, gz: bool = True, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    images = rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8)
    labels = np.arange(n, dtype=np.uint8) % 10
    ext = ".gz" if gz else ""
    write_idx(folder / f"{prefix}-images-idx3-ubyte{ext}", images, 2051)
    write_idx(folder / f"{prefix}-labels-idx1-ubyte{ext}", labels, 2049)
    return images, labels


@pytest.mark.parametrize("name", ["mnist", "fashion-mnist"])
def test_idx_loaders(tmp_path: Path, name: str) -> None:
    folder = tmp_path / name
    test_images, test_labels = write_mnist(folder, "t10k", 7)
    only_test = load_dataset(name, tmp_path)  # "all" with only the test files present
    assert only_test.inputs.shape == (7, 1, 28, 28) and only_test.inputs.dtype == torch.float32
    assert torch.allclose(only_test.inputs[:, 0], torch.from_numpy(test_images).float() / 255)
    assert only_test.labels.tolist() == test_labels.tolist()
    assert only_test.extras["is_test"].all()
    assert only_test.splits == {"base": [0, 1, 2, 3, 4], "val": [], "novel": [5, 6, 7, 8, 9]}
    with pytest.raises(DataNotFoundError, match="train-images-idx3-ubyte"):
        load_dataset(name, tmp_path, part="train")

    write_mnist(folder, "train", 12, gz=False, seed=1)  # uncompressed files work too
    full = load_dataset(name, tmp_path)
    assert len(full) == 19 and full.extras["is_test"].tolist() == [False] * 12 + [True] * 7
    assert len(load_dataset(name, tmp_path, part="train")) == 12
    assert len(load_dataset(name, tmp_path, part="test")) == 7
    assert len(full.class_names) == 10
    if name == "fashion-mnist":
        assert full.class_names[9] == "Ankle boot"


def test_idx_missing_and_corrupt(tmp_path: Path) -> None:
    with pytest.raises(DataNotFoundError, match="train-images-idx3-ubyte") as err:
        load_dataset("mnist", tmp_path)
    assert "yann.lecun.com" in str(err.value)
    folder = tmp_path / "mnist"
    write_mnist(folder, "t10k", 5)
    (folder / "t10k-labels-idx1-ubyte.gz").unlink()
    with pytest.raises(DataNotFoundError, match="t10k-labels-idx1-ubyte"):
        load_dataset("mnist", tmp_path)
    # images and labels swapped: wrong magic number
    write_idx(folder / "t10k-labels-idx1-ubyte.gz", np.zeros((5, 28, 28)), 2051)
    with pytest.raises(DataError, match="magic") as err:
        load_dataset("mnist", tmp_path)
    assert_corrupt(err, "t10k-labels-idx1-ubyte.gz")
    # truncated data
    write_idx(folder / "t10k-labels-idx1-ubyte.gz", np.zeros(5), 2049)
    blob = gzip.decompress((folder / "t10k-images-idx3-ubyte.gz").read_bytes())
    (folder / "t10k-images-idx3-ubyte.gz").write_bytes(gzip.compress(blob[:-100]))
    with pytest.raises(DataError, match="truncated") as err:
        load_dataset("mnist", tmp_path)
    assert_corrupt(err, "t10k-images-idx3-ubyte.gz")
    # a broken gzip stream
    (folder / "t10k-images-idx3-ubyte.gz").write_bytes(gzip.compress(blob)[:50])
    with pytest.raises(DataError) as err:
        load_dataset("mnist", tmp_path)
    assert_corrupt(err, "t10k-images-idx3-ubyte.gz")
    with pytest.raises(DataError, match="part"):
        load_dataset("mnist", tmp_path, part="validation")


def test_shared_mnist_test_part(shared_data: Path) -> None:
    data = load_dataset("mnist", shared_data, part="test")
    assert data.inputs.shape == (10000, 1, 28, 28)
    assert torch.equal(data.class_counts() > 800, torch.ones(10, dtype=torch.bool))
    assert len(load_dataset("mnist", shared_data)) == 10000  # only the test files are there
