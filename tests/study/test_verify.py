"""``fedfew study verify`` (fedfew.study.verify): older records stand when the numbers are the same,
nothing is recorded when a number differs, new metrics are new, and drift within the interval is
allowed only across environments."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from fedfew.run.environment import describe
from fedfew.study.store import ResultStore
from tests.study.common import DIGITS_STUDY, _as_older_code, run_cli, write_study


def test_verify_lets_older_records_stand_when_the_numbers_are_the_same(tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    study = {**DIGITS_STUDY, "claims": [], "seeds": [0, 1]}
    path = write_study(tmp_path, study)
    args = ["--store", str(tmp_path / "store"), "--runs", str(tmp_path / "runs"), "--budget", "smoke"]
    assert run_cli(["study", "run", str(path), *args], capsys)[0] == 0
    store = ResultStore(tmp_path / "store", "digits-check")
    _as_older_code(store)
    assert run_cli(["study", "run", str(path), *args], capsys)[0] == 2  # other code: refused

    # one cell per method (fl-proto, fl-maml, the control) re-run at this code: the same numbers
    code, out, err = run_cli(["study", "verify", str(path), *args, "--runs", str(tmp_path / "again")], capsys)
    assert code == 0, err
    assert "re-running 3 of the 6 cells stored by sources 000000000000" in err and err.count("the same") == 3
    assert "gives the numbers of sources 000000000000 on all 3 re-run cells" in out
    (equivalence,) = store.equivalences()
    assert equivalence["equal_to"]["source"] == "000000000000" and len(equivalence["cells"]) == 3
    # the study is complete at this version: nothing runs, the report shows all six and says why
    code, _, err = run_cli(["study", "run", str(path), *args], capsys)
    assert code == 0 and "6 already in" in err
    code, out, _ = run_cli(["study", "report", str(path), "--store", str(tmp_path / "store"), "--budget", "smoke"],
                           capsys)
    assert code == 0 and "6/6 cells in the store" in out
    assert "6 of the 6 records were made by older code (000000000000)" in out  # the first runs stand and "on 3 re-run cells" in out


def test_verify_records_nothing_when_a_number_differs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    study = {**DIGITS_STUDY, "claims": [], "control": None, "no_control": "a test study of one row", "seeds": [0],
             "methods": {"fl-proto": DIGITS_STUDY["methods"]["fl-proto"]}}
    path = write_study(tmp_path, study)
    args = ["--store", str(tmp_path / "store"), "--runs", str(tmp_path / "runs"), "--budget", "smoke"]
    assert run_cli(["study", "run", str(path), *args], capsys)[0] == 0
    store = ResultStore(tmp_path / "store", "digits-check")
    (record_path,) = store.folder.glob("*.json")
    record = json.loads(record_path.read_text())
    record["metrics"]["test"]["accuracy"] += 0.01  # what another code's numbers look like
    record_path.write_text(json.dumps(record))
    _as_older_code(store)
    code, _, err = run_cli(["study", "verify", str(path), *args, "--runs", str(tmp_path / "again")], capsys)
    assert code == 1 and "DIFFERENT" in err and "other numbers than sources 000000000000 on 1 of 1" in err
    assert store.equivalences() == [] and len(store.records()) == 1  # nothing written: the report is unchanged
    assert run_cli(["study", "run", str(path), *args], capsys)[0] == 2  # still other code
    code, _, err = run_cli(["study", "verify", str(path), *args, "--per-method", "0"], capsys)
    assert code == 2 and "--per-method" in err


def test_verify_counts_new_metrics_as_new_not_different() -> None:
    from fedfew.study.verify import same_numbers

    stored = {"accuracy": 0.5, "ci95": 0.1, "parts": {"a": 1.0}}
    assert same_numbers(stored, {**stored, "per_class": {"5": 0.9}})  # a key the older code did not report
    assert same_numbers(stored, {**stored, "parts": {"a": 1.0, "b": 2.0}})
    assert not same_numbers(stored, {**stored, "accuracy": 0.5000001})
    assert not same_numbers(stored, {"accuracy": 0.5, "parts": {"a": 1.0}})  # a stored number gone
    assert not same_numbers(stored, {**stored, "parts": {"a": 1.5}})


#: One row, one column, one seed, no control: one cell, seconds to run.
ONE_CELL = {**DIGITS_STUDY, "control": None, "no_control": "a test study of one row", "claims": [], "paper": [], "seeds": [0],
            "methods": {"fl-proto": DIGITS_STUDY["methods"]["fl-proto"]}}


# -- verify: like with like ------------------------------------------------------------------------------
@pytest.fixture
def stored_cell(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[Path, list[str], ResultStore, dict]:
    """One cell run and stored, relabelled as older code's; its run folder is this code's, so `verify`
    reads it back (the same numbers, in seconds) rather than training again."""
    path = write_study(tmp_path, ONE_CELL)
    args = ["--store", str(tmp_path / "store"), "--runs", str(tmp_path / "runs"), "--budget", "smoke"]
    assert run_cli(["study", "run", str(path), *args], capsys)[0] == 0
    store = ResultStore(tmp_path / "store", "digits-check")
    _as_older_code(store)
    (record,) = store.records()
    return path, args, store, record


def _restore(store: ResultStore, record: dict) -> None:
    """The store as it was: only the older record."""
    shutil.rmtree(store.folder)
    store.put(record)


def _with(record: dict, shift_ci95s: float, environment: dict | None | str = "keep") -> dict:
    """``record`` with its test accuracy moved by ``shift_ci95s`` times its interval, in another
    environment (or none: an older record) unless ``keep``."""
    test = record["metrics"]["test"]
    changed = {**record, "metrics": {**record["metrics"], "test": {**test, "accuracy": test["accuracy"]
                                                                    + shift_ci95s * test["ci95"]}}}
    if environment is None:
        changed.pop("environment")
    elif environment != "keep":
        changed["environment"] = environment
    return changed


def test_verify_allows_drift_within_the_interval_only_across_environments(
        stored_cell: tuple[Path, list[str], ResultStore, dict], capsys: pytest.CaptureFixture[str]) -> None:
    path, args, store, record = stored_cell
    elsewhere = {**record["environment"], "cpu_capability": "AVX2", "torch": "2.12.0+cpu"}

    # another environment, half an interval off: within tolerance, recorded as such with the difference
    store.put(_with(record, 0.5, elsewhere))
    code, out, err = run_cli(["study", "verify", str(path), *args], capsys)
    assert code == 0, err
    assert "within tolerance (another environment)" in err
    row = [line for line in out.splitlines() if line.startswith("| fl-proto / IID 1-shot / seed 0 |")]
    assert len(row) == 1 and "| E1 → E2 | within tolerance |" in row[0]
    assert "E1: " + describe(elsewhere) in out and "E2: " + describe(record["environment"]) in out
    assert "(0 exactly, 1 within the stored run's 95% interval" in out.splitlines()[-1]
    (equivalence,) = store.equivalences()
    (cell,) = equivalence["cells"]
    assert equivalence["exact"] is False and set(equivalence["environments"]) == {"E1", "E2"}
    assert cell["difference"] == pytest.approx(-0.5 * record["metrics"]["test"]["ci95"])
    assert cell["environments"] == ["E1", "E2"] and cell["judged"] == "within tolerance" and not cell["exact"]

    # another environment, one and a half intervals off: outside, exit 1, nothing written
    _restore(store, _with(record, 1.5, elsewhere))
    code, out, err = run_cli(["study", "verify", str(path), *args], capsys)
    assert code == 1 and "OUTSIDE tolerance" in out and "1 outside the stored run's 95% interval" in err
    assert store.equivalences() == [] and len(store.records()) == 1

    # the same environment: any difference fails, however small
    _restore(store, _with(record, 0.01))
    code, out, err = run_cli(["study", "verify", str(path), *args], capsys)
    assert code == 1 and "| E1 → E1 | DIFFERENT |" in out and "1 different in the same environment" in err

    # a record from before environments were recorded: judged by the tolerance, its environment named unknown
    _restore(store, _with(record, 0.5, None))
    code, out, err = run_cli(["study", "verify", str(path), *args], capsys)
    assert code == 0, err
    assert "| not recorded → E1 | within tolerance |" in out
    _restore(store, _with(record, 0.0, None))
    code, out, err = run_cli(["study", "verify", str(path), *args], capsys)
    assert code == 0 and "| not recorded → E1 | the same |" in out and "on all 1 re-run cells (exactly)" in out
