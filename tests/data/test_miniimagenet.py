"""mini-ImageNet (fedfew.data.miniimagenet): the pickle caches and the CSV-and-JPEG layout, and missing
or corrupt files named."""

from __future__ import annotations

import csv
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch

from fedfew.data import DataError, DataNotFoundError, load_dataset
from tests.data.common import assert_corrupt

Image = pytest.importorskip("PIL.Image")


def write_mini_pkl(root: Path) -> dict[str, list[str]]:
    folder = root / "miniimagenet"
    folder.mkdir(parents=True, exist_ok=True)
    layout = {"train": ["n02110063", "n01532829"], "val": ["n01855672"], "test": ["n01930112", "n01981276"]}
    value = 0
    for file, wnids in layout.items():
        n = 2 * len(wnids)
        images = np.zeros((n, 84, 84, 3), dtype=np.uint8)
        class_dict = {}
        for k, wnid in enumerate(wnids):
            idx = [k, k + len(wnids)]  # interleaved, as the indices need not be contiguous
            class_dict[wnid] = idx
            for i in idx:
                images[i, :, :, 0] = value  # red channel encodes the class
                images[i, :, :, 2] = 255
            value += 40
        with open(folder / f"mini-imagenet-cache-{file}.pkl", "wb") as f:
            pickle.dump({"image_data": images, "class_dict": class_dict}, f)
    return layout


def test_miniimagenet_pickles(tmp_path: Path) -> None:
    write_mini_pkl(tmp_path)
    data = load_dataset("miniimagenet", tmp_path)
    assert data.inputs.shape == (10, 3, 84, 84) and data.inputs.dtype == torch.float32
    # classes are sorted by WordNet id inside each file
    assert data.class_names == ["n01532829", "n02110063", "n01855672", "n01930112", "n01981276"]
    assert data.splits == {"base": [0, 1], "val": [2], "novel": [3, 4]}
    assert data.labels.tolist() == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]
    red = {0: 40, 1: 0, 2: 80, 3: 120, 4: 160}
    for label, value in red.items():
        chosen = data.inputs[data.labels == label]
        assert torch.allclose(chosen[:, 0], torch.full_like(chosen[:, 0], value / 255))
        assert torch.allclose(chosen[:, 2], torch.ones_like(chosen[:, 2]))  # channels first
    assert data.extras["source"] == "pkl"
    assert load_dataset("miniimagenet", tmp_path, image_size=32).inputs.shape == (10, 3, 32, 32)

    (tmp_path / "miniimagenet" / "mini-imagenet-cache-val.pkl").write_bytes(b"\x80\x04garbage")
    with pytest.raises(DataError) as err:
        load_dataset("miniimagenet", tmp_path)
    assert_corrupt(err, "mini-imagenet-cache-val.pkl")
    (tmp_path / "miniimagenet" / "mini-imagenet-cache-val.pkl").unlink()
    with pytest.raises(DataNotFoundError, match="mini-imagenet-cache-val.pkl"):
        load_dataset("miniimagenet", tmp_path)


def test_miniimagenet_csv_and_jpg(tmp_path: Path) -> None:
    folder = tmp_path / "miniimagenet"
    (folder / "images").mkdir(parents=True)
    layout = {"train": ["n02110063", "n01532829"], "val": ["n01855672"], "test": ["n01930112"]}
    colours = {
        "n02110063": (255, 0, 0),
        "n01532829": (0, 255, 0),
        "n01855672": (0, 0, 255),
        "n01930112": (255, 255, 255),
    }
    for file, wnids in layout.items():
        with open(folder / f"{file}.csv", "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["filename", "label"])
            for wnid in wnids:
                for i in range(2):
                    name = f"{wnid}{i:08d}.jpg"
                    Image.new("RGB", (100, 90), colours[wnid]).save(folder / "images" / name)
                    writer.writerow([name, wnid])
    data = load_dataset("miniimagenet", tmp_path)
    assert data.inputs.shape == (8, 3, 84, 84)
    assert data.class_names == ["n01532829", "n02110063", "n01855672", "n01930112"]
    assert data.splits == {"base": [0, 1], "val": [2], "novel": [3]}
    assert data.extras["source"] == "csv"
    for label, wnid in enumerate(data.class_names):
        mean = data.inputs[data.labels == label].mean(dim=(0, 2, 3))
        assert torch.allclose(mean, torch.tensor(colours[wnid], dtype=torch.float32) / 255, atol=0.03)

    (folder / "images" / "n0185567200000001.jpg").write_bytes(b"\xff\xd8\xff broken jpeg")
    with pytest.raises(DataError) as err:
        load_dataset("miniimagenet", tmp_path)
    assert_corrupt(err, "n0185567200000001.jpg")
    (folder / "images" / "n0185567200000001.jpg").unlink()
    with pytest.raises(DataNotFoundError, match="n0185567200000001.jpg"):
        load_dataset("miniimagenet", tmp_path)


def test_miniimagenet_missing(tmp_path: Path) -> None:
    with pytest.raises(DataNotFoundError, match="mini-imagenet-cache-train.pkl") as err:
        load_dataset("miniimagenet", tmp_path)
    assert "train.csv" in str(err.value)
