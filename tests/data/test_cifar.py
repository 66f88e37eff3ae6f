"""CIFAR-10, CIFAR-100 and FC100 (fedfew.data.cifar) from small files written here in the real on-disk
format: classes, splits, and missing or corrupt files named."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest
import torch

from fedfew.data import DataError, DataNotFoundError, load_dataset
from tests.data.common import assert_corrupt, assert_splits_partition


def write_cifar_batch(path: Path, n: int, labels: dict[bytes, list[int]], seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    data = rng.integers(0, 256, size=(n, 3072), dtype=np.uint8)
    batch = {b"batch_label": b"batch", b"filenames": [b"img_%d.png" % i for i in range(n)], b"data": data}
    batch.update(labels)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        pickle.dump(batch, f)
    return data


CIFAR10_NAMES = [b"airplane", b"automobile", b"bird", b"cat", b"deer",
                 b"dog", b"frog", b"horse", b"ship", b"truck"]  # fmt: skip


def write_cifar10(root: Path) -> list[np.ndarray]:
    folder = root / "cifar-10-batches-py"
    arrays = [
        write_cifar_batch(folder / f"data_batch_{i}", 2, {b"labels": [i, (i + 5) % 10]}, seed=i)
        for i in range(1, 6)
    ]
    arrays.append(write_cifar_batch(folder / "test_batch", 3, {b"labels": [9, 0, 1]}, seed=9))
    with open(folder / "batches.meta", "wb") as f:
        pickle.dump({b"label_names": CIFAR10_NAMES, b"num_cases_per_batch": 2, b"num_vis": 3072}, f)
    return arrays


def test_cifar10(tmp_path: Path) -> None:
    arrays = write_cifar10(tmp_path)
    data = load_dataset("cifar10", tmp_path)
    assert data.inputs.shape == (13, 3, 32, 32) and data.inputs.dtype == torch.float32
    expected = torch.from_numpy(np.concatenate(arrays).reshape(-1, 3, 32, 32)).float() / 255
    assert torch.allclose(data.inputs, expected)
    assert data.labels.tolist() == [1, 6, 2, 7, 3, 8, 4, 9, 5, 0, 9, 0, 1]
    assert data.class_names[0] == "airplane" and data.class_names[9] == "truck"
    assert data.extras["is_test"].tolist() == [False] * 10 + [True] * 3
    assert data.splits == {"base": list(range(10)), "val": [], "novel": []}
    assert len(load_dataset("cifar10", tmp_path, part="test")) == 3

    (tmp_path / "cifar-10-batches-py" / "data_batch_3").unlink()
    with pytest.raises(DataNotFoundError, match="data_batch_3") as err:
        load_dataset("cifar10", tmp_path)
    assert "cs.toronto.edu/~kriz" in str(err.value)
    assert len(load_dataset("cifar10", tmp_path, part="test")) == 3
    (tmp_path / "cifar-10-batches-py" / "test_batch").write_bytes(b"\x80\x02}q\x00(U\x04data")
    with pytest.raises(DataError) as err:
        load_dataset("cifar10", tmp_path, part="test")
    assert_corrupt(err, "test_batch")
    write_cifar_batch(tmp_path / "cifar-10-batches-py" / "test_batch", 3, {b"labels": [1, 2]}, seed=0)
    with pytest.raises(DataError, match="3 images but 2"):
        load_dataset("cifar10", tmp_path, part="test")


def write_cifar100(root: Path) -> None:
    folder = root / "cifar-100-python"
    fine_to_coarse = {f: f % 20 for f in range(100)}  # superclass c holds fines c, c+20, ..., c+80
    train_fine = list(range(100))
    test_fine = [0, 7, 12]
    for name, fine in (("train", train_fine), ("test", test_fine)):
        labels = {b"fine_labels": fine, b"coarse_labels": [fine_to_coarse[f] for f in fine]}
        write_cifar_batch(folder / name, len(fine), labels, seed=len(fine))
    meta = {b"fine_label_names": [b"fine%d" % i for i in range(100)],
            b"coarse_label_names": [b"coarse%d" % i for i in range(20)]}  # fmt: skip
    with open(folder / "meta", "wb") as f:
        pickle.dump(meta, f)


def test_cifar100_and_fc100(tmp_path: Path) -> None:
    write_cifar100(tmp_path)
    data = load_dataset("cifar100", tmp_path)
    assert data.inputs.shape == (103, 3, 32, 32)
    assert data.class_names[5] == "fine5" and data.extras["coarse_names"][3] == "coarse3"
    assert data.extras["coarse_labels"].tolist()[:3] == [0, 1, 2]
    assert data.extras["is_test"].sum() == 3
    assert [len(data.splits[k]) for k in ("base", "val", "novel")] == [64, 16, 20]
    assert_splits_partition(data.splits, 100)
    assert load_dataset("cifar100", tmp_path).splits == data.splits
    assert load_dataset("cifar100", tmp_path, split_seed=1).splits != data.splits

    fc = load_dataset("fc100", tmp_path)
    assert [len(fc.splits[k]) for k in ("base", "val", "novel")] == [60, 20, 20]
    assert_splits_partition(fc.splits, 100)
    assert fc.splits["novel"] == sorted(c + 20 * k for c in (0, 7, 12, 14) for k in range(5))
    assert fc.splits["val"] == sorted(c + 20 * k for c in (8, 11, 13, 16) for k in range(5))
    assert len(load_dataset("fc100", tmp_path, part="train")) == 100


def test_cifar100_missing_and_corrupt(tmp_path: Path) -> None:
    with pytest.raises(DataNotFoundError, match="meta") as err:
        load_dataset("fc100", tmp_path)
    assert "cifar-100-python.tar.gz" in str(err.value)
    write_cifar100(tmp_path)
    write_cifar_batch(tmp_path / "cifar-100-python" / "test", 2, {b"fine_labels": [1, 2]}, seed=0)
    with pytest.raises(DataError, match="coarse_labels") as err:
        load_dataset("cifar100", tmp_path)
    assert_corrupt(err, "test")
    (tmp_path / "cifar-100-python" / "train").write_bytes(b"not a pickle at all")
    with pytest.raises(DataError) as err:
        load_dataset("cifar100", tmp_path)
    assert_corrupt(err, "train")
