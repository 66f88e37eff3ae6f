"""One cell of a study as an ordinary run (fedfew.study.cell): a cell that failed before its first
checkpoint starts again with this process's data folder."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from fedfew.study.store import ResultStore
from tests.study.common import run_cli, write_study


def test_a_cell_that_failed_before_its_first_checkpoint_starts_again_with_this_processs_data_folder(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """A cell run with $FEDFEW_DATA unset fails (no data) and leaves a run folder recording the data
    folder it looked in; once $FEDFEW_DATA is right, the same command runs the cell into the store
    instead of resuming that folder (nothing to resume: no checkpoint) and failing again."""
    import numpy as np

    data = tmp_path / "data"
    data.mkdir()
    rng = np.random.default_rng(0)
    labels = np.repeat(np.arange(8), 6)
    np.savez(data / "blobs.npz", x=(rng.normal(0, 3, (8, 6))[labels] + rng.normal(0, 0.3, (48, 6))).astype(np.float32),
             y=labels)
    config = {"name": "blobs", "seed": 0, "task": "fewshot",
              "dataset": {"name": "arrays", "options": {"path": "blobs.npz",
                                                        "class_split": {"base": 0.5, "val": 0.0, "novel": 0.5, "seed": 0}}},
              "splits": {"train": "base", "val": None, "test": "novel"},
              "partition": {"name": "iid", "num_clients": 2}, "model": {"name": "mlp", "options": {"hidden": 8}},
              "algorithm": {"name": "fl-proto", "options": {"local_steps": 1}},
              "federation": {"rounds": 1, "clients_per_round": 2},
              "episodes": {"n_way": 2, "k_shot": 1, "q_query": 2, "test_episodes": 6}, "eval": {"every": 1},
              "runtime": {"threads": 1}}
    (tmp_path / "blobs.yaml").write_text(yaml.safe_dump(config))
    study = {"name": "blobs-check", "title": "one cell on blobs", "config": str(tmp_path / "blobs.yaml"),
             "methods": {"fl-proto": {}}, "settings": {"IID": {}}, "seeds": [0], "control": None,
             "no_control": "a test study of one cell", "budgets": {"smoke": {}, "cpu": {}}}
    path = write_study(tmp_path, study)
    args = ["study", "run", str(path), "--store", str(tmp_path / "store"), "--runs", str(tmp_path / "runs"),
            "--budget", "smoke"]
    monkeypatch.setenv("FEDFEW_DATA", str(tmp_path / "nowhere"))
    code, _, err = run_cli(args, capsys)
    assert code == 2 and "1 of 1 cells failed" in err and "nowhere" in err
    monkeypatch.setenv("FEDFEW_DATA", str(data))
    code, _, err = run_cli(args, capsys)
    assert code == 0, err
    (record,) = ResultStore(tmp_path / "store", "blobs-check").records()
    assert 0.0 <= record["metrics"]["test"]["accuracy"] <= 1.0
    (cell_folder,) = (tmp_path / "runs" / "blobs-check").iterdir()
    assert len([p for p in cell_folder.iterdir() if p.is_dir()]) == 2  # the failed run stays, beside the new one
