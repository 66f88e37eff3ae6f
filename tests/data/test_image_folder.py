"""``image-folder`` (fedfew.data.image_folder): classes, names and the default split, groups from
subfolders or a CSV, RGB and resizing, bad inputs in one line, and a federated run on it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fedfew.config.validation import load_config
from fedfew.data import DataError, load_dataset
from fedfew.run.experiment import build_experiment
from tests.data.common import ANIMALS, WRITERS, rounds_of, run_with_dataset, write_csv, write_image


def test_image_folder_classes_names_and_default_split(data_root: Path) -> None:
    data = load_dataset("image-folder", data_root, path="pets")
    assert data.class_names == ANIMALS
    assert data.inputs.shape == (8 * 3 * 2, 1, 8, 8) and data.inputs.dtype == torch.float32
    assert 0.0 <= float(data.inputs.min()) and float(data.inputs.max()) <= 1.0
    assert data.class_counts().tolist() == [6] * 8
    assert data.groups is None and data.extras["path"] == str(data_root / "pets")
    assert data.extras["files"][:3] == ["ant/w0_0.jpg", "ant/w0_1.png", "ant/w1_0.png"]
    # class ids follow the folder names; brighter classes were written brighter
    means = [float(data.inputs[data.labels == c].mean()) for c in range(8)]
    assert means == sorted(means)
    # default split: 4 / 2 / 2 classes, disjoint, seeded
    sizes = {k: len(v) for k, v in data.splits.items()}
    assert sizes == {"base": 4, "val": 2, "novel": 2}
    assert sorted(sum(data.splits.values(), [])) == list(range(8))
    assert load_dataset("image-folder", data_root, path="pets").splits == data.splits


def test_image_folder_groups_from_subfolders_and_csv(data_root: Path, tmp_path: Path) -> None:
    data = load_dataset("image-folder", data_root, path="pets_by_writer", layout="class/group")
    assert data.extras["group_names"] == WRITERS
    assert torch.bincount(data.groups).tolist() == [16, 16, 16]
    first = data.extras["files"].index("cat/w1/0.png")
    assert data.extras["group_names"][int(data.groups[first])] == "w1"
    # the same groups from a CSV
    csv_path = tmp_path / "groups.csv"
    files = load_dataset("image-folder", data_root, path="pets").extras["files"]
    write_csv(csv_path, [{"file": f, "group": f.split("/")[1].split("_")[0]} for f in files], ["file", "group"])
    by_csv = load_dataset("image-folder", data_root, path="pets", groups_csv=str(csv_path))
    assert by_csv.extras["group_names"] == WRITERS and torch.bincount(by_csv.groups).tolist() == [16, 16, 16]
    # group/class layout: classes collected across groups
    for w in ("x", "y"):
        for animal in ("ant", "bee", "cat"):
            write_image(tmp_path / "gc" / w / animal / "0.png", 0.5)
    gc = load_dataset("image-folder", tmp_path, path="gc", layout="group/class")
    assert gc.class_names == ["ant", "bee", "cat"] and gc.extras["group_names"] == ["x", "y"]


def test_image_folder_rgb_and_resize(tmp_path: Path) -> None:
    write_image(tmp_path / "img" / "a" / "0.png", 0.2, size=(12, 10), mode="RGB")
    write_image(tmp_path / "img" / "a" / "1.png", 0.2, size=(8, 8))
    write_image(tmp_path / "img" / "b" / "0.png", 0.8, size=(16, 16), mode="RGB")
    data = load_dataset("image-folder", tmp_path, path="img", image_size=6)
    assert data.inputs.shape == (3, 3, 6, 6)  # one RGB image makes every image RGB
    grey = load_dataset("image-folder", tmp_path, path="img", image_size=[4, 5], channels=1)
    assert grey.inputs.shape == (3, 1, 4, 5)


@pytest.mark.parametrize(
    "build, words",
    [
        (lambda d: d.mkdir(), ["holds no sub-folders"]),
        (lambda d: write_image(d / "x.png", 0.5), ["holds no sub-folders", "one sub-folder per class"]),
        (lambda d: (d / "cat").mkdir(parents=True), ["cat", "holds no image files"]),
        (lambda d: (d / "cat").mkdir(parents=True) or (d / "cat" / "0.png").write_bytes(b"not a png"),
         ["cannot read image", "0.png"]),
        (lambda d: write_image(d / "cat" / "0.png", 0.5) or write_image(d / "dog" / "0.png", 0.5, size=(9, 8)),
         ["dog/0.png", "9x8", "cat/0.png", "image_size"]),
    ],
    ids=["empty folder", "loose images", "empty class", "unreadable image", "mixed sizes"],
)
def test_image_folder_bad_inputs_are_one_line_errors(tmp_path: Path, build, words: list[str]) -> None:
    folder = tmp_path / "imgs"
    build(folder)
    with pytest.raises(DataError) as excinfo:
        load_dataset("image-folder", tmp_path, path="imgs")
    message = str(excinfo.value)
    assert "\n" not in message and message.startswith("image-folder: ")
    for word in words:
        assert word in message


def test_run_image_folder_with_explicit_split_and_natural_partition(data_root: Path, tmp_path: Path) -> None:
    dataset = {"name": "image-folder", "root": str(data_root),
               "options": {"path": "pets_by_writer", "layout": "class/group",
                           "class_split": {"base": ["ant", "bee", "cat", "dog"], "val": ["eel", "fox"],
                                           "novel": ["gnu", "hen"]}}}  # fmt: skip
    code, summary, folder = run_with_dataset(tmp_path, dataset, partition={"name": "natural", "num_clients": 3})
    assert code == 0 and summary["dataset"] == "image-folder" and summary["rounds"] == 2
    assert 0.0 <= summary["test"]["accuracy"] <= 1.0 and summary["bytes_up"] > 0
    assert [r["round"] for r in rounds_of(folder)] == [1, 2]
    assert all("val_accuracy" in r for r in rounds_of(folder))  # validation classes select the round
    # the natural partition gives each client one writer's images of the base classes
    experiment = build_experiment(load_config(folder / "config.yaml"))
    assert sorted(int(c.train.groups[0]) for c in experiment.clients) == [0, 1, 2]
    for client in experiment.clients:
        assert client.train.groups.unique().numel() == 1 and len(client.train) == 4 * 2  # 4 classes x 2
        assert set(client.train.labels.tolist()) == {0, 1, 2, 3}
