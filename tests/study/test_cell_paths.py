"""Where a cell's run lives (fedfew.study.cell_paths): a cell stopped before a verified commit continues
its older run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fedfew.study.store import ResultStore
from tests.study.common import DIGITS_STUDY, _as_older_code, run_cli, write_study


def test_a_cell_stopped_before_a_verified_commit_continues_its_older_run(tmp_path: Path,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    from fedfew.study.store import current_code

    study = {**DIGITS_STUDY, "claims": [], "control": None, "no_control": "a test study of one row", "seeds": [0, 1],
             "methods": {"fl-proto": DIGITS_STUDY["methods"]["fl-proto"]}}
    path = write_study(tmp_path, study)
    runs = tmp_path / "runs"
    args = ["--store", str(tmp_path / "store"), "--runs", str(runs), "--budget", "smoke"]
    assert run_cli(["study", "run", str(path), *args], capsys)[0] == 0
    store = ResultStore(tmp_path / "store", "digits-check")
    source = current_code().source
    for folder in (runs / "digits-check").iterdir():  # the runs as the older code left them
        folder.rename(folder.with_name(folder.name.replace(source, "000000000000")))
    _as_older_code(store)
    (seed1,) = [p for p in store.folder.glob("*.json") if json.loads(p.read_text())["seed"] == 1]
    config_hash, stored = json.loads(seed1.read_text())["config_hash"], json.loads(seed1.read_text())["metrics"]
    seed1.unlink()  # seed 1's cell "stopped" before the commit: its run folder is there, its record is not
    code, _, err = run_cli(["study", "verify", str(path), *args, "--runs", str(tmp_path / "again")], capsys)
    assert code == 0, err
    assert run_cli(["study", "run", str(path), *args], capsys)[0] == 0
    assert not (runs / "digits-check" / f"{config_hash}-{source}").exists()  # continued the older folder
    (record,) = [r for r in store.records() if r["config_hash"] == config_hash]
    assert record["code"]["source"] == source and record["metrics"]["test"] == stored["test"]
