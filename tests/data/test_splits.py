"""Class splits for any dataset (fedfew.data.splits): by names, ids and ``rest``, fractional splits
seeded and deterministic, clear errors, and a warning when no class is left for validation."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fedfew.data import DataError, load_dataset
from tests.data.common import run_with_dataset


def test_class_split_by_names_ids_and_rest_on_a_named_dataset() -> None:
    data = load_dataset("digits", class_split={"base": [0, 1, "2", "3"], "val": ["4", 5], "novel": "rest"})
    assert data.splits == {"base": [0, 1, 2, 3], "val": [4, 5], "novel": [6, 7, 8, 9]}
    data = load_dataset("digits", class_split={"base": [9, 8], "novel": [0]})
    assert data.splits == {"base": [8, 9], "val": [], "novel": [0]}
    assert load_dataset("digits").splits["base"] == [0, 1, 2, 3, 4]  # the loader's split stays the default


def test_fractional_class_split_is_seeded_and_deterministic(data_root: Path) -> None:
    spec = {"base": 0.5, "val": 0.25, "novel": 0.25, "seed": 3}
    a = load_dataset("text-csv", data_root, path="news.csv", text_field="body", label_field="topic", class_split=spec)
    b = load_dataset("text-csv", data_root, path="news.csv", text_field="body", label_field="topic", class_split=spec)
    assert a.splits == b.splits and {k: len(v) for k, v in a.splits.items()} == {"base": 16, "val": 8, "novel": 8}
    assert sorted(sum(a.splits.values(), [])) == list(range(32))
    other = load_dataset("digits", class_split={**spec, "seed": 4})
    again = load_dataset("digits", class_split={**spec, "seed": 4})
    assert other.splits == again.splits
    assert load_dataset("digits", class_split=spec).splits != other.splits
    # counts and fractions together, with the rest going to base
    mixed = load_dataset("digits", class_split={"val": 2, "novel": 0.3, "base": "rest"})
    assert {k: len(v) for k, v in mixed.splits.items()} == {"base": 5, "val": 2, "novel": 3}


@pytest.mark.parametrize(
    "spec, words",
    [
        ({"base": [0, 1], "novel": ["seven"]}, ["unknown class 'seven'"]),
        ({"base": [0, 1], "novel": [1, 2]}, ["class '1' (id 1) is listed in both base and novel"]),
        ({"base": [0, 10]}, ["class id 10 is out of range 0..9"]),
        ({"base": 0.9, "novel": 0.01}, ["novel", "no class at all"]),
        ({"base": 0.7, "novel": 0.5}, ["add up to more than 1"]),
        ({"base": [0], "novel": 0.5}, ["not both"]),
        ({"val": [0], "novel": [1]}, ["base split is empty"]),
        ({"base": [0], "test": [1]}, ["unknown key(s) ['test']"]),
        ([0, 1], ["must be a mapping"]),
    ],
    ids=["unknown", "overlap", "id range", "empty fraction", "sum", "lists and numbers", "no base", "key", "type"],
)
def test_bad_class_splits_are_clear_errors(spec: Any, words: list[str]) -> None:
    with pytest.raises(DataError) as excinfo:
        load_dataset("digits", class_split=spec)
    message = str(excinfo.value)
    assert message.startswith("digits: class_split") and "\n" not in message
    for word in words:
        assert word in message


def test_no_validation_classes_warns_once_in_one_line(data_root: Path, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    dataset = {"name": "arrays", "root": str(data_root),
               "options": {"path": "blobs.npz", "class_split": {"base": 5, "novel": 5}}}
    code, summary, _ = run_with_dataset(tmp_path, dataset)
    err = capsys.readouterr().err
    assert code == 0 and summary["selected_round"] == 2
    assert err.startswith("fedfew: warning: dataset 'arrays' has no classes in split 'val'") and err.count("\n") == 1
