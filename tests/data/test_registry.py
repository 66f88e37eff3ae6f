"""The dataset registry and the data folder (fedfew.data.registry): every loader is registered, the data
folder comes from --set, then $FEDFEW_DATA, then ./data, and a missing folder, a folder that is a file
or a bad data file is one line naming it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fedfew.cli.main import demo_config_path, main
from fedfew.data import DATASETS, DataNotFoundError, load_dataset
from tests.cli.common import one_line
from tests.data.common import run_with_dataset, write_arrays


def test_bad_data_files_are_one_line_errors_naming_the_file(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "text").mkdir()
    (tmp_path / "text" / "huffpost.json").write_text("")
    (tmp_path / "omniglot").mkdir()
    (tmp_path / "omniglot" / "images_background.npz").write_bytes(os.urandom(1000))
    for name, file in (("huffpost", "huffpost.json"), ("omniglot", "images_background.npz")):
        code = main(["run", str(demo_config_path()), "--out", str(tmp_path / "out"), "--quiet",
                     "--set", f"dataset.name={name}", "--set", f"dataset.root={tmp_path}"])
        err = capsys.readouterr().err
        assert code == 2 and file in err and len(err.strip().splitlines()) == 1, err


def test_fedfew_data_that_is_a_file_is_called_a_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "data").write_text("x")
    monkeypatch.setenv("FEDFEW_DATA", str(tmp_path / "data"))
    line = one_line(capsys, "run", str(demo_config_path()), "--out", str(tmp_path / "out"), "--set", "dataset.name=mnist")
    assert "$FEDFEW_DATA" in line and "is a file" in line and "missing" not in line, line


def test_all_loaders_registered() -> None:
    for name in ["omniglot", "mnist", "fashion-mnist", "femnist", "cifar10", "cifar100", "fc100",
                 "miniimagenet", "huffpost", "reuters", "20newsgroups", "sent140"]:  # fmt: skip
        assert name in DATASETS


def test_missing_folder_names_the_path_and_the_data_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("FEDFEW_DATA", raising=False)
    with pytest.raises(DataNotFoundError) as excinfo:
        load_dataset("image-folder", path="pets")
    message = str(excinfo.value)
    assert str(Path("data") / "pets") in message and "the default ./data" in message and "\n" not in message
    monkeypatch.setenv("FEDFEW_DATA", str(tmp_path / "elsewhere"))
    with pytest.raises(DataNotFoundError, match=r"\$FEDFEW_DATA"):
        load_dataset("image-folder", path="pets")


def test_data_folder_order_set_then_env_then_dot_data(data_root: Path, tmp_path: Path, monkeypatch) -> None:
    dataset = {"name": "arrays", "options": {"path": "blobs.npz"}}
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("FEDFEW_DATA", str(tmp_path / "nowhere"))
    write_arrays(tmp_path / "data" / "blobs.npz")
    for part in "abc":
        (tmp_path / part).mkdir()
    code, _, _ = run_with_dataset(tmp_path / "a", dataset)
    assert code == 2  # $FEDFEW_DATA wins over ./data, and it has no blobs.npz
    code, summary, _ = run_with_dataset(tmp_path / "b", dataset, "--set", f"dataset.root={data_root}")
    assert code == 0 and summary["dataset"] == "arrays"  # --set beats $FEDFEW_DATA
    monkeypatch.delenv("FEDFEW_DATA")
    code, _, _ = run_with_dataset(tmp_path / "c", dataset)
    assert code == 0  # else ./data
