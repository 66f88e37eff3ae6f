"""Store records are checked against what they hold, not their file name (issue 53, item 4): a record
filed under another cell's name (its config_hash edited to match), a record of another study, and a
finished cell whose summary.json was edited are each refused, never shown as this cell's number."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from fedfew.study.grid import cells
from fedfew.study.store import CodeVersion, ResultStore, make_record
from fedfew.study.study_file import load_study
from tests.test_study import DIGITS_STUDY, dumped, run_cli, write_study

ONE_ROW = {**DIGITS_STUDY, "control": None, "no_control": "a test study of one row", "claims": [], "paper": [],
           "seeds": [0, 1], "methods": {"fl-proto": DIGITS_STUDY["methods"]["fl-proto"]}}
HANDMADE = CodeVersion("0.0.0", "handmade0000", None)


def put_seeds(store_dir: Path, study_path: Path, values: dict[int, float]) -> dict[int, Path]:
    """Hand-made records of the smoke budget's cells (seed -> test accuracy); their paths by seed."""
    study, root = load_study(study_path)
    store = ResultStore(store_dir, study.name)
    paths = {}
    for cell in cells(study, root, "smoke"):
        if cell.seed in values:
            paths[cell.seed] = store.put(make_record(study.name, "smoke", cell.method, cell.setting, cell.seed,
                                                     cell.config_hash, dumped(cell), HANDMADE,
                                                     {"test": {"accuracy": values[cell.seed]}}, 60.0))
    return paths


def report(path: Path, store: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    return run_cli(["study", "report", str(path), "--store", str(store), "--budget", "smoke"], capsys)


def test_a_record_filed_under_another_cells_name_is_not_that_cells_number(tmp_path: Path,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    path = write_study(tmp_path, ONE_ROW)
    paths = put_seeds(tmp_path / "store", path, {0: 0.4733, 1: 0.60})
    seed1 = json.loads(paths[1].read_text())
    seed0_hash = json.loads(paths[0].read_text())["config_hash"]
    paths[0].write_text(json.dumps({**seed1, "config_hash": seed0_hash}))  # seed 1's record as seed 0's
    code, out, err = report(path, tmp_path / "store", capsys)
    assert code == 0 and str(paths[0]) in err and "damaged" in err and "hashes to" in err, err
    assert "60.00" not in out.split("|  seed")[0] or "47.33" not in out  # seed 1's number never shown as seed 0's
    assert "1/2 cells" in out or "Not yet run" in out or "1 of 2" in out, out


def test_a_record_whose_seed_disagrees_with_its_config_is_refused(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    path = write_study(tmp_path, ONE_ROW)
    paths = put_seeds(tmp_path / "store", path, {0: 0.47})
    record = json.loads(paths[0].read_text())
    paths[0].write_text(json.dumps({**record, "seed": 1}))
    code, _, err = report(path, tmp_path / "store", capsys)
    assert code == 0 and str(paths[0]) in err and "seed" in err, err


def test_a_record_of_another_study_is_not_used(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_study(tmp_path, ONE_ROW)
    other = write_study(tmp_path, {**ONE_ROW, "name": "other-study"}, "other.yaml")
    paths = put_seeds(tmp_path / "store", other, {0: 0.5})
    mine = tmp_path / "store" / "digits-check"
    mine.mkdir(parents=True)
    shutil.copy(paths[0], mine / paths[0].name)  # the same cell config, filed in this study's store
    code, out, err = report(path, tmp_path / "store", capsys)
    assert code == 0 and "other-study" in err and str(mine / paths[0].name) in err, err
    assert "50.00" not in out


def test_a_finished_cell_whose_summary_was_edited_is_refused(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    path = write_study(tmp_path, {**ONE_ROW, "seeds": [0]})
    args = ["--store", str(tmp_path / "store"), "--runs", str(tmp_path / "runs"), "--budget", "smoke"]
    assert run_cli(["study", "run", str(path), *args], capsys)[0] == 0
    (record_path,) = (tmp_path / "store" / "digits-check").glob("*.json")
    record_path.unlink()  # the record lost: the finished run is read back
    (summary_path,) = (tmp_path / "runs").rglob("summary.json")
    summary = json.loads(summary_path.read_text())
    summary["test"]["accuracy"] = 0.99
    summary_path.write_text(json.dumps(summary))
    code, _, err = run_cli(["study", "run", str(path), *args], capsys)
    assert code == 2 and str(summary_path) in err and "changed" in err, err
    assert not list((tmp_path / "store" / "digits-check").glob("*.json"))


def test_an_older_finished_cells_edited_summary_is_refused_by_its_checkpoint(tmp_path: Path,
                                                                            capsys: pytest.CaptureFixture[str]) -> None:
    """A run folder written before summaries were checksummed: its summary is checked against the last
    test score its checkpoint kept (a run that selected no best round reports that score)."""
    path = write_study(tmp_path, {**ONE_ROW, "seeds": [0]})
    args = ["--store", str(tmp_path / "store"), "--runs", str(tmp_path / "runs"), "--budget", "smoke"]
    assert run_cli(["study", "run", str(path), *args], capsys)[0] == 0
    (record_path,) = (tmp_path / "store" / "digits-check").glob("*.json")
    stored = json.loads(record_path.read_text())["metrics"]["test"]["accuracy"]
    (status_path,) = (tmp_path / "runs").rglob("status.json")
    status = json.loads(status_path.read_text())
    del status["summary_sha256"]  # as an older fedfew wrote it
    status_path.write_text(json.dumps(status))
    assert json.loads((status_path.parent / "checkpoint" / "run.json").read_text())["best"] is None
    record_path.unlink()
    assert run_cli(["study", "run", str(path), *args], capsys)[0] == 0  # unedited: read back as it was
    assert json.loads(record_path.read_text())["metrics"]["test"]["accuracy"] == stored
    record_path.unlink()
    summary_path = status_path.parent / "summary.json"
    summary = json.loads(summary_path.read_text())
    summary["test"]["accuracy"] = 0.99
    summary_path.write_text(json.dumps(summary))
    code, _, err = run_cli(["study", "run", str(path), *args], capsys)
    assert code == 2 and str(summary_path) in err and "last checkpoint" in err, err
