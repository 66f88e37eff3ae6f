"""Store records checked on read (fedfew.study.records): a damaged record is named, left out and run
again; a record filed under another cell's name, or of another study, or whose seed disagrees with
its config is never shown as the cell's number."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from fedfew.study.grid import cells
from fedfew.study.store import ResultStore, make_record
from fedfew.study.study_file import load_study
from tests.study.common import (
    DIGITS_STUDY,
    HANDMADE,
    ONE_ROW,
    _store_args,
    dumped,
    run_cli,
    write_study,
)

ONE_ROW_TWO_SEEDS = {**DIGITS_STUDY, "control": None, "no_control": "a test study of one row", "claims": [], "paper": [],
           "seeds": [0, 1], "methods": {"fl-proto": DIGITS_STUDY["methods"]["fl-proto"]}}


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
    path = write_study(tmp_path, ONE_ROW_TWO_SEEDS)
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
    path = write_study(tmp_path, ONE_ROW_TWO_SEEDS)
    paths = put_seeds(tmp_path / "store", path, {0: 0.47})
    record = json.loads(paths[0].read_text())
    paths[0].write_text(json.dumps({**record, "seed": 1}))
    code, _, err = report(path, tmp_path / "store", capsys)
    assert code == 0 and str(paths[0]) in err and "seed" in err, err


def test_a_record_of_another_study_is_not_used(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_study(tmp_path, ONE_ROW_TWO_SEEDS)
    other = write_study(tmp_path, {**ONE_ROW_TWO_SEEDS, "name": "other-study"}, "other.yaml")
    paths = put_seeds(tmp_path / "store", other, {0: 0.5})
    mine = tmp_path / "store" / "digits-check"
    mine.mkdir(parents=True)
    shutil.copy(paths[0], mine / paths[0].name)  # the same cell config, filed in this study's store
    code, out, err = report(path, tmp_path / "store", capsys)
    assert code == 0 and "other-study" in err and str(mine / paths[0].name) in err, err
    assert "50.00" not in out


# -- damaged store records ------------------------------------------------------------------------------
def test_a_damaged_record_is_named_left_out_and_run_again(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A record whose ``metrics`` was deleted (or any required field missing or of the wrong type, or
    no JSON at all) is not a result: `study status`, `study report` and `study run` each name its path
    in a warning; the report and the status leave it out, and `study run` runs the cell again and
    overwrites the record."""
    budgets = {**ONE_ROW["budgets"], "cpu-again": {"set": {"federation.rounds": 3}}}
    path = write_study(tmp_path, {**ONE_ROW, "seeds": [0, 1], "budgets": budgets})
    args = _store_args(tmp_path)
    assert run_cli(["study", "run", str(path), *args], capsys)[0] == 0
    store = ResultStore(tmp_path / "store", "digits-check")
    files = sorted(store.folder.glob("*.json"))
    assert len(files) == 2
    for damage in ("no metrics", "seed as text", "not JSON"):
        victim = files[0]
        record = json.loads(victim.read_text())
        if damage == "no metrics":
            del record["metrics"]
            victim.write_text(json.dumps(record))
        elif damage == "seed as text":
            victim.write_text(json.dumps({**record, "seed": "zero"}))
        else:
            victim.write_text(victim.read_text()[:40])

        code, out, err = run_cli(["study", "status", str(path), *args], capsys)
        assert code == 0 and str(victim) in err and "damaged" in err, (damage, err)
        assert "digits-check @ smoke: 1/2 runs stored; 1 to go" in out, (damage, out)
        code, out, err = run_cli(["study", "status", str(path), *args[:4]], capsys)  # cpu and cpu-again
        assert code == 0 and err.count(str(victim)) == 1 and "cpu-again" in out, err  # named once, not per budget

        code, out, err = run_cli(["study", "report", str(path), "--store", str(tmp_path / "store"),
                                  "--budget", "smoke"], capsys)
        assert code == 0 and str(victim) in err and "damaged" in err and "unexpected" not in err, (damage, err)
        assert "1/2 cells in the store" in out and "(1 seed)" in out, (damage, out)

        code, out, err = run_cli(["study", "run", str(path), *args], capsys)
        assert code == 0 and str(victim) in err and "damaged" in err, (damage, err)
        assert "1 already in" in err and "1 cells run" in out, (damage, out)
        repaired = json.loads(victim.read_text())
        assert isinstance(repaired["metrics"]["test"]["accuracy"], float) and repaired["seed"] in (0, 1)
        code, out, err = run_cli(["study", "report", str(path), "--store", str(tmp_path / "store"),
                                  "--budget", "smoke"], capsys)
        assert code == 0 and "damaged" not in err and "2/2 cells in the store" in out
