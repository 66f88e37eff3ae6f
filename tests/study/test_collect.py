"""A study's stored numbers as a report reads them (fedfew.study.collect): a budget or a column with its
own metric reads the same runs, and a metric no stored cell has is one line."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedfew.core.errors import UsageError
from fedfew.study.store import ResultStore, metric
from fedfew.study.study_file import load_study
from fedfew.study.study_sections import CONTROL
from tests.cli.common import one_line
from tests.study.common import DIGITS_STUDY, put, run_cli, write_study


def test_a_metric_no_stored_cell_has_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_study(tmp_path, {**DIGITS_STUDY, "metric": "test.nosuch"})
    put(tmp_path / "store", path)
    line = one_line(capsys, "study", "report", str(path), "--store", str(tmp_path / "store"), "--budget", "smoke")
    assert "test.nosuch" in line and "test" in line.split("keep")[-1], line


def test_a_budget_with_its_own_metric_reads_the_last_evaluated_round_of_the_same_runs(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    smoke = {"set": {"federation.rounds": 2, "eval.every": 1, "eval.track_test": True}, "settings": ["IID 1-shot"],
             "seeds": [0]}
    study = {**DIGITS_STUDY, "claims": [], "control": None, "no_control": "a test study of one row",
             "budgets": {"smoke": smoke, "smoke-last": {**smoke, "metric": "history.last.test_accuracy"},
                         "cpu": {}}}
    path = write_study(tmp_path, study)
    store_args = ["--store", str(tmp_path / "store")]
    assert run_cli(["study", "run", str(path), *store_args, "--runs", str(tmp_path / "runs"), "--budget", "smoke"],
                   capsys)[0] == 0
    code, out, err = run_cli(["study", "report", str(path), *store_args, "--budget", "smoke-last"], capsys)
    assert code == 0, err
    assert "2/2 cells in the store" in out and "at the last evaluated round" in out  # the same cells, read again
    for record in ResultStore(tmp_path / "store", "digits-check").records():
        last = record["history"][-1]
        assert last["round"] == 2 and metric(record, "history.last.test_accuracy") == last["test_accuracy"]
        assert metric(record, "history.1.test_accuracy") == record["history"][0]["test_accuracy"]
        label = "FL-MAML" if record["method"] == "fl-maml" else record["method"]
        assert f"| {label} | {100 * last['test_accuracy']:.2f} (1 seed) |" in out
    assert metric({"metrics": {}}, "history.last.test_accuracy") is None  # a record without rounds: no value
    # The untrained control (a round-0 run) evaluated one round, round 0: that is its last round.
    control = {"metrics": {"rounds": 0, "test": {"accuracy": 0.25, "ci95": 0.01}}}
    assert metric(control, "history.last.test_accuracy") == metric(control, "history.0.test_accuracy") == 0.25
    assert metric({"metrics": {"rounds": 3, "test": {"accuracy": 0.5}}}, "history.last.test_accuracy") is None
    bad = write_study(tmp_path, {**study, "budgets": {**study["budgets"], "smoke-last": {"metric": "history.last["}}},
                      "bad.yaml")
    with pytest.raises(UsageError, match="smoke-last"):
        load_study(bad)


def test_a_column_with_its_own_metric_reads_the_same_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A setting with ``metric`` (FedFSL Fig. 6's per-digit columns) shares its cells with the plain
    column: each config runs once, and its column shows the record's value at that path."""
    from fedfew.data import load_dataset

    digits = load_dataset("digits")
    name = digits.class_names[digits.splits["novel"][0]]
    data = {**DIGITS_STUDY, "set": {**DIGITS_STUDY["set"], "eval.per_class": True},
            "settings": {"all": {}, f"class {name}": {"metric": f"test.per_class.{name}"}},
            "budgets": {"smoke": {"set": {"federation.rounds": 1}, "seeds": [0], "methods": ["fl-maml"]},
                        "cpu": {}},
            "paper": [], "claims": []}
    path = write_study(tmp_path, data)
    args = ["--store", str(tmp_path / "store"), "--runs", str(tmp_path / "runs"), "--budget", "smoke"]
    code, _, err = run_cli(["study", "run", str(path), *args], capsys)
    assert code == 0, err
    assert "4 cells (2 distinct runs), 0 already in" in err
    records = ResultStore(tmp_path / "store", "digits-check").records()
    assert len(records) == 2 and len(list((tmp_path / "runs").rglob("status.json"))) == 2  # fl-maml and the control
    trained = next(r for r in records if r["method"] != CONTROL)
    code, out, _ = run_cli(["study", "report", str(path), *args[:2], "--budget", "smoke"], capsys)
    assert code == 0 and "4/4 cells in the store" in out and f"class {name}: `test.per_class.{name}`" in out
    row = next(line for line in out.splitlines() if line.startswith("| FL-MAML |"))
    accuracy, per_class = trained["metrics"]["test"]["accuracy"], trained["metrics"]["test"]["per_class"][name]
    assert row == f"| FL-MAML | {100 * accuracy:.2f} (1 seed) | {100 * per_class:.2f} (1 seed) |"
    # A budget without that column names the study's metric only (not the metric of a column it leaves out).
    data["budgets"]["smoke-all"] = {**data["budgets"]["smoke"], "settings": ["all"]}
    path = write_study(tmp_path, data)
    code, out, _ = run_cli(["study", "report", str(path), *args[:2], "--budget", "smoke-all"], capsys)
    assert code == 0 and "2/2 cells in the store" in out and "Ours: test accuracy (%), mean" in out
    assert "per_class" not in out
