"""FEMNIST from LEAF's JSON shards (fedfew.data.leaf), on small shards written here and on the real data
when it is present."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
import torch

from fedfew.data import DataError, DataNotFoundError, load_dataset
from fedfew.data.leaf import read_leaf_shards
from tests.data.common import assert_corrupt


def write_leaf(path: Path, users: dict[str, tuple[list, list]]) -> None:
    shard = {
        "users": list(users),
        "num_samples": [len(y) for _, y in users.values()],
        "user_data": {u: {"x": x, "y": y} for u, (x, y) in users.items()},
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(shard)
    if path.suffix == ".gz":
        with gzip.open(path, "wt") as f:
            f.write(text)
    else:
        path.write_text(text)


def femnist_user(labels: list[int], value: float) -> tuple[list, list]:
    return [[value] * 784 for _ in labels], labels


def write_femnist(root: Path) -> None:
    folder = root / "femnist"
    write_leaf(
        folder / "train" / "all_data_0_niid_05_keep_0_train_9.json.gz",
        {"f0001_01": femnist_user([0, 10, 36], 0.1), "f0002_02": femnist_user([61, 5], 0.2)},
    )
    write_leaf(
        folder / "train" / "all_data_1_niid_05_keep_0_train_9.json", {"f0003_03": femnist_user([1], 0.3)}
    )
    write_leaf(folder / "test" / "all_data_0_niid_05_keep_0_test_9.json.gz",
               {"f0002_02": femnist_user([7], 0.4), "f0001_01": femnist_user([35], 0.5)})  # fmt: skip


def test_femnist(tmp_path: Path) -> None:
    write_femnist(tmp_path)
    data = load_dataset("femnist", tmp_path)
    assert data.inputs.shape == (8, 1, 28, 28) and data.inputs.dtype == torch.float32
    assert data.labels.tolist() == [0, 10, 36, 61, 5, 1, 7, 35]
    assert data.inputs[:, 0, 0, 0].tolist() == pytest.approx([0.1] * 3 + [0.2] * 2 + [0.3, 0.4, 0.5])
    assert data.extras["writers"] == ["f0001_01", "f0002_02", "f0003_03"]
    assert data.groups.tolist() == [0, 0, 0, 1, 1, 2, 1, 0]  # the same writer keeps its id in test
    assert data.extras["is_test"].tolist() == [False] * 6 + [True] * 2
    assert data.class_names[:11] == [str(d) for d in range(10)] + ["A"]
    assert data.class_names[35:37] == ["Z", "a"] and data.class_names[61] == "z"
    assert data.splits == {"base": list(range(10, 62)), "val": [], "novel": list(range(10))}
    assert len(load_dataset("femnist", tmp_path, part="test")) == 2
    users = read_leaf_shards(tmp_path / "femnist" / "train")
    assert [u for u, _, _ in users] == ["f0001_01", "f0002_02", "f0003_03"]


def test_femnist_missing_and_corrupt(tmp_path: Path) -> None:
    with pytest.raises(DataNotFoundError, match="femnist") as err:
        load_dataset("femnist", tmp_path)
    assert "train" in str(err.value) and "TalwalkarLab/leaf" in str(err.value)
    write_femnist(tmp_path)
    with pytest.raises(DataNotFoundError, match="test"):
        load_dataset("femnist", tmp_path / "nowhere", part="test")
    bad = tmp_path / "femnist" / "test" / "all_data_0_niid_05_keep_0_test_9.json.gz"
    with gzip.open(bad, "wt") as f:
        f.write('{"users": ["a"], "user_data": {"a": {"x": [[0.1, ')
    with pytest.raises(DataError) as err:
        load_dataset("femnist", tmp_path)
    assert_corrupt(err, bad.name)
    write_leaf(bad, {"w": ([[0.0] * 784, [0.0] * 784], [1])})
    with pytest.raises(DataError, match="2 inputs but 1 labels"):
        load_dataset("femnist", tmp_path)
    write_leaf(bad, {"w": ([[0.0] * 100], [1])})
    with pytest.raises(DataError, match="784"):
        load_dataset("femnist", tmp_path)


@pytest.fixture(scope="module")
def femnist_shared(shared_data: Path):
    return load_dataset("femnist", shared_data)


def test_shared_femnist(femnist_shared) -> None:
    data = femnist_shared
    is_test = data.extras["is_test"]
    assert int((~is_test).sum()) == 14708 and int(is_test.sum()) == 1685
    assert len(data.extras["writers"]) == 105 and int(data.groups.max()) == 104
    assert set(data.groups[is_test].tolist()) <= set(data.groups[~is_test].tolist())
    assert data.num_classes == 62 and data.inputs.shape[1:] == (1, 28, 28)
    assert 0.0 <= float(data.inputs.min()) and float(data.inputs.max()) <= 1.0
