"""``arrays`` (fedfew.data.arrays): an ``.npz`` file or a folder of ``.npy`` files with string labels and
groups, a federated run on them, and bad files named for what they are."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from fedfew.config.validation import load_config
from fedfew.data import DataError, load_dataset
from fedfew.run.experiment import build_experiment
from tests.cli.common import cli_lines
from tests.data.common import run_with_dataset
from tests.run.common import write
from tests.tiny import tiny_config


# -- a text file where an .npz should be ---------------------------------------------------------------
def test_a_text_file_named_npz_is_called_text_not_python_objects(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "data.npz").write_text("x,y\n1,2\n")
    config = {**tiny_config("fl-proto"), "dataset": {"name": "arrays", "options": {"path": str(tmp_path / "data.npz")}}}
    code, lines = cli_lines(capsys, "run", str(write(tmp_path / "c.yaml", config)), "--out", str(tmp_path / "out"))
    assert code == 2 and len(lines) == 1 and "not a numpy file" in lines[0] and "Python objects" not in lines[0]
    import pickle

    (tmp_path / "data.npz").write_bytes(pickle.dumps({"x": 1}))
    code, lines = cli_lines(capsys, "run", str(tmp_path / "c.yaml"), "--out", str(tmp_path / "out"))
    assert code == 2 and "pickled Python objects" in lines[0]


def test_arrays_npz_with_string_labels_and_groups(data_root: Path) -> None:
    data = load_dataset("arrays", data_root, path="blobs.npz")
    assert data.class_names == [f"blob{c}" for c in range(10)]
    assert data.inputs.shape == (120, 6) and data.class_counts().tolist() == [12] * 10
    assert data.extras["group_names"] == ["site0", "site1", "site2"]
    assert torch.bincount(data.groups).tolist() == [40, 40, 40]
    assert {k: len(v) for k, v in data.splits.items()} == {"base": 6, "val": 2, "novel": 2}


def test_arrays_folder_of_npy_images(tmp_path: Path) -> None:
    folder = tmp_path / "arr"
    folder.mkdir()
    x = np.random.default_rng(0).integers(0, 256, (10, 8, 8, 3), dtype=np.uint8)  # NHWC
    np.save(folder / "x.npy", x)
    np.save(folder / "y.npy", np.array([3, 7, 9, 3, 7, 9, 3, 7, 9, 3]))
    data = load_dataset("arrays", tmp_path, path="arr")
    assert data.inputs.shape == (10, 3, 8, 8)
    assert torch.allclose(data.inputs[1, 2], torch.from_numpy(x[1, :, :, 2]).float() / 255)
    assert data.class_names == ["3", "7", "9"] and data.labels.tolist()[:3] == [0, 1, 2]
    resized = load_dataset("arrays", tmp_path, path="arr", image_size=4)
    assert resized.inputs.shape == (10, 3, 4, 4)
    np.save(folder / "class_names.npy", np.array(["zero", "one", "two", "three", "four", "five", "six", "seven",
                                                  "eight", "nine"]))
    named = load_dataset("arrays", tmp_path, path="arr")
    assert named.num_classes == 10 and named.labels.tolist()[:3] == [3, 7, 9] and named.class_names[7] == "seven"


@pytest.mark.parametrize(
    "arrays, words",
    [
        ({"x": np.zeros((4, 2)), "labels": np.zeros(4)}, ["no array 'y'", "labels"]),
        ({"x": np.zeros((4, 2)), "y": np.zeros(3, dtype=int)}, ["'y' has shape (3,)"]),
        ({"x": np.full((4, 2), np.nan), "y": np.zeros(4, dtype=int)}, ["NaN"]),
        ({"x": np.zeros((4, 2)), "y": np.array([{"a": 1}] * 4, dtype=object)}, ["Python objects"]),
        ({"x": np.zeros((4, 2)), "y": np.zeros(4)}, ["'y' has dtype float64"]),
    ],
    ids=["missing key", "length", "nan", "pickled objects", "float labels"],
)
def test_arrays_bad_inputs_are_one_line_errors(tmp_path: Path, arrays: dict[str, np.ndarray], words: list[str]) -> None:
    np.savez(tmp_path / "bad.npz", **arrays)
    with pytest.raises(DataError) as excinfo:
        load_dataset("arrays", tmp_path, path="bad.npz")
    message = str(excinfo.value)
    assert "\n" not in message and "bad.npz" in message
    for word in words:
        assert word in message


def test_run_arrays_with_fractional_split(data_root: Path, tmp_path: Path) -> None:
    dataset = {"name": "arrays", "root": str(data_root),
               "options": {"path": "blobs.npz", "class_split": {"base": 0.5, "val": 0.0, "novel": 0.5, "seed": 2}}}
    code, summary, folder = run_with_dataset(tmp_path, dataset, splits={"val": None})
    assert code == 0 and 0.0 <= summary["test"]["accuracy"] <= 1.0
    experiment = build_experiment(load_config(folder / "config.yaml"))
    assert experiment.val is None and experiment.context.train_classes == experiment.dataset.splits["base"]
    assert len(experiment.dataset.splits["base"]) == 5 and len(experiment.dataset.splits["novel"]) == 5
