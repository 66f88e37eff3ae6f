"""What a run records of its data (fedfew.run.datarecord): the class split, the clients' class counts, and
the source file with its size."""

from __future__ import annotations

import json
from pathlib import Path

from fedfew.config.validation import load_config
from fedfew.run.experiment import build_experiment
from fedfew.run.runner import run_experiment
from tests.tiny import tiny_config

WITH_VAL = {
    "dataset": {"name": "digits", "options": {"class_split": {"base": [0, 1, 2, 3], "val": [4, 5, 6],
                                                              "novel": [7, 8, 9]}}},
    "splits": {"train": "base", "val": "val", "test": "novel"},
    "episodes": {"n_way": 3, "k_shot": 1, "q_query": 3, "test_episodes": 20, "val_episodes": 20},
}


# -- the run records its data ----------------------------------------------------------------
def test_run_folder_records_class_split_and_client_counts(tmp_path: Path) -> None:
    config = load_config(tiny_config("fl-proto", federation={"rounds": 1}, **WITH_VAL))
    summary = run_experiment(config, tmp_path, progress=False)
    record = json.loads((Path(summary["folder"]) / "data.json").read_text())
    assert record["class_split"] == {"base": ["0", "1", "2", "3"], "val": ["4", "5", "6"], "novel": ["7", "8", "9"]}
    assert record["splits_used"] == {"train": "base", "val": "val", "test": "novel"}
    assert record["bundled"] is True and record["samples"] == 1797 and record["classes"] == 10
    experiment = build_experiment(config)
    assert len(record["clients"]) == len(experiment.clients) == 4
    for entry, client in zip(record["clients"], experiment.clients):
        labels = client.train.labels.tolist()
        assert entry["classes"] == {str(c): labels.count(c) for c in sorted(set(labels))}
        assert entry["samples"] == len(labels) and set(entry["classes"]) <= {"0", "1", "2", "3"}
    base_samples = sum(int((experiment.dataset.labels == c).sum()) for c in range(4))
    assert sum(e["samples"] for e in record["clients"]) == base_samples  # every base sample dealt once


def test_data_record_names_the_source_file_and_its_size(tmp_path: Path) -> None:
    import numpy as np

    rng = np.random.default_rng(0)
    path = tmp_path / "data" / "mine.npz"
    path.parent.mkdir()
    np.savez(path, x=rng.random((60, 4)).astype(np.float32), y=np.repeat(np.arange(6), 10))
    config = tiny_config("fl-proto", federation={"rounds": 0}, model={"name": "mlp", "options": {"hidden": 8}},
                         dataset={"name": "arrays", "root": str(tmp_path / "data"),
                                  "options": {"path": "mine.npz",
                                              "class_split": {"base": [0, 1, 2], "val": [], "novel": [3, 4, 5]}}})
    summary = run_experiment(load_config(config), tmp_path / "runs", progress=False)
    record = json.loads((Path(summary["folder"]) / "data.json").read_text())
    assert record["source"] == str(path) and record["source_bytes"] == path.stat().st_size
    assert record["data_folder"] == str((tmp_path / "data").resolve()) and record["samples"] == 60
    assert record["class_split"]["novel"] == ["3", "4", "5"]
