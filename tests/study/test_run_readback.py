"""What a cell's run folder says (fedfew.study.run_readback): a resumed run's record counts each sitting
once, and a finished cell whose summary was edited is refused (by its checksum, or by its checkpoint
in an older folder)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.study.common import DIGITS_STUDY, run_cli, write_study


def test_a_resumed_runs_record_counts_each_sitting_once(tmp_path: Path) -> None:
    """A run stopped after round 2 (40 s of rounds so far) and resumed for rounds 3-4 (another 30 s of
    rounds in a sitting of 35 s): the runner's summary before ``seconds_resumed_from`` said 35 + 70 =
    105 s, counting the second sitting's rounds twice; the record takes 40 + 35 = 75 s. A run never
    resumed, or whose summary has ``seconds_resumed_from`` (today's runner), keeps its summary's."""
    from fedfew.study.run_readback import run_seconds

    run = tmp_path / "run"
    run.mkdir()
    rows = [{"round": 1, "seconds": 20.0}, {"round": 2, "seconds": 40.0}, {"round": 3, "seconds": 55.0},
            {"round": 4, "seconds": 70.0}]
    (run / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    (run / "status.json").write_text(json.dumps({"status": "complete", "round": 4}))
    assert run_seconds(run, {"seconds": 75.5}) == 75.5  # never resumed
    (run / "status.json").write_text(json.dumps({"status": "complete", "round": 4, "resumed": 2}))
    assert run_seconds(run, {"seconds": 105.0}) == pytest.approx(75.0)
    (run / "status.json").write_text(json.dumps({"status": "complete", "round": 4, "resumed": 0}))
    assert run_seconds(run, {"seconds": 105.0}) == pytest.approx(35.0)  # resumed from the start: this sitting only
    # A summary that says where its seconds resumed from counts each sitting once already.
    (run / "status.json").write_text(json.dumps({"status": "complete", "round": 4, "resumed": 2}))
    assert run_seconds(run, {"seconds": 75.0, "seconds_resumed_from": 40.0}) == 75.0


ONE_ROW_TWO_SEEDS = {**DIGITS_STUDY, "control": None, "no_control": "a test study of one row", "claims": [], "paper": [],
           "seeds": [0, 1], "methods": {"fl-proto": DIGITS_STUDY["methods"]["fl-proto"]}}


def test_a_finished_cell_whose_summary_was_edited_is_refused(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    path = write_study(tmp_path, {**ONE_ROW_TWO_SEEDS, "seeds": [0]})
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
    path = write_study(tmp_path, {**ONE_ROW_TWO_SEEDS, "seeds": [0]})
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
