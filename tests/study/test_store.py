"""The result store (fedfew.study.store): a store from other code is refused and left alone, verified
versions count each other's records, metric paths, a record's environment and CPU seconds, and a full
disk named."""

from __future__ import annotations

import errno
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from fedfew.run.environment import COMPARED, describe
from fedfew.study.grid import cells
from fedfew.study.store import ResultStore, make_record, metric
from fedfew.study.study_file import load_study
from fedfew.study.study_sections import StudyError
from tests.study.common import DIGITS_STUDY, HANDMADE, dumped, run_cli, write_study


def test_a_full_disk_in_the_store_names_the_record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_study(tmp_path, DIGITS_STUDY)
    study, root = load_study(path)
    cell = cells(study, root, "smoke")[0]
    record = make_record(study.name, "smoke", cell.method, cell.setting, cell.seed, cell.config_hash, dumped(cell),
                         HANDMADE, {"test": {"accuracy": 0.5}}, 1.0)

    def full(self: Path, *args: Any, **kwargs: Any) -> Any:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Path, "write_text", full)
    with pytest.raises(StudyError, match=r"cannot write store record .*digits-check.*No space left"):
        ResultStore(tmp_path / "store", study.name).put(record)
    assert not list((tmp_path / "store").rglob("*.tmp"))


def test_a_store_from_other_code_is_refused_and_left_alone(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_study(tmp_path, {**DIGITS_STUDY, "control": None, "no_control": "a test study of one row", "claims": [],
                                  "methods": {"fl-proto": DIGITS_STUDY["methods"]["fl-proto"]}, "seeds": [0]})
    args = ["--store", str(tmp_path / "store"), "--runs", str(tmp_path / "runs"), "--budget", "smoke"]
    assert run_cli(["study", "run", str(path), *args], capsys)[0] == 0
    [record_path] = (tmp_path / "store" / "digits-check").glob("*.json")
    record = json.loads(record_path.read_text())
    old = {**record, "code": {**record["code"], "source": "000000000000"}, "finished": "2000-01-01T00:00:00Z"}
    record_path.unlink()
    written = ResultStore(tmp_path / "store", "digits-check").put(old)
    before = written.read_bytes()
    code, _, err = run_cli(["study", "run", str(path), *args], capsys)
    assert code == 2 and "other code" in err and "--new-code" in err and len(err.strip().splitlines()) == 1
    assert written.read_bytes() == before and len(list(written.parent.glob("*.json"))) == 1
    assert run_cli(["study", "run", str(path), *args, "--new-code"], capsys)[0] == 0
    assert len(list(written.parent.glob("*.json"))) == 2 and written.read_bytes() == before
    # the report shows the newest code version's results and says which
    code, out, _ = run_cli(["study", "report", str(path), "--store", str(tmp_path / "store"), "--budget", "smoke"],
                           capsys)
    assert code == 0 and f"sources {record['code']['source']}" in out and "000000000000" not in out


def test_versions_verified_against_one_older_version_count_each_others_records(tmp_path: Path) -> None:
    """B and C were each verified equal to A (C after B, against the version holding most cells):
    for C, B's records count too, and a report names C, the most recently verified."""
    from fedfew.study.store import FORMAT, CodeVersion

    a, b, c = (CodeVersion("0.1.0", source, None) for source in ("aaaaaaaaaaaa", "bbbbbbbbbbbb", "cccccccccccc"))
    store = ResultStore(tmp_path, "chain")
    for cell_hash, code, finished in (("h1", a, "2026-01-01T00:00:00Z"), ("h2", b, "2026-01-02T00:00:00Z")):
        store.put({"format": FORMAT, "config_hash": cell_hash, "code": code.to_json(), "finished": finished,
                   "metrics": {}})
    for new, old, when in ((b, a, "2026-01-02T00:00:00Z"), (c, a, "2026-01-03T00:00:00Z")):
        store.put_equivalence({"code": new.to_json(), "equal_to": old.to_json(), "cells": [], "verified": when})
    assert store.equal_codes(c) == {a.key, b.key} and store.equal_codes(b) == {a.key, c.key}
    assert set(store.by_hash(c)) == {"h1", "h2"}
    assert store.newer_equal(b) == c and store.newer_equal(a) == c
    assert store.equal_codes(CodeVersion("0.1.0", "dddddddddddd", None)) == set()  # unlinked: nothing counts


# -- metric paths: one key, or the mean of chosen keys (FML's per-client scores) -----------------------
def test_a_metric_path_reads_one_key_or_the_mean_of_the_chosen_keys() -> None:
    record = {"metrics": {"test": {"accuracy": 0.5, "local_by_client": {"0": 0.9, "1": 0.6, "2": 0.3, "3": 0.1}}}}
    assert metric(record, "test.accuracy") == 0.5
    assert metric(record, "test.local_by_client.0") == 0.9
    assert metric(record, "test.local_by_client[1,2,3]") == pytest.approx((0.6 + 0.3 + 0.1) / 3)
    assert metric(record, "test.local_by_client[2]") == 0.3
    assert metric(record, "test.local_by_client[1,7]") is None  # never a mean over fewer clients than named
    assert metric(record, "test.local_by_client") is None  # a mapping is not a number
    assert metric(record, "test.accuracy[0]") is None and metric(record, "test.nothing.0") is None


#: One row, one column, one seed, no control: one cell, seconds to run.
ONE_CELL = {**DIGITS_STUDY, "control": None, "no_control": "a test study of one row", "claims": [], "paper": [], "seeds": [0],
            "methods": {"fl-proto": DIGITS_STUDY["methods"]["fl-proto"]}}


# -- the environment and CPU seconds in every record -----------------------------------------------------
def test_a_record_keeps_its_environment_cpu_seconds_and_load(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    from fedfew.config.validation import load_config
    from fedfew.run.environment import run_environment

    path = write_study(tmp_path, ONE_CELL)
    args = ["--store", str(tmp_path / "store"), "--runs", str(tmp_path / "runs"), "--budget", "smoke"]
    assert run_cli(["study", "run", str(path), *args], capsys)[0] == 0
    store = ResultStore(tmp_path / "store", "digits-check")
    (record,) = store.records()
    environment = record["environment"]
    assert environment == run_environment(load_config(record["config"]))
    assert set(COMPARED) <= set(environment) and environment["fedfew"]
    assert environment["threads"] == 1 and environment["precision"] == "fp32" and environment["device"] == "cpu"
    assert environment["torch"] == __import__("torch").__version__ and environment["python"] == sys.version.split()[0]
    (sitting,) = record["sittings"]
    assert 0 < record["cpu_seconds"] == sitting["cpu_seconds"] and sitting["wall_seconds"] > 0
    assert len(sitting["load_average"]) == 2 and all(isinstance(x, float) for x in sitting["load_average"])
    assert "environment_note" not in record
    # the report's header names it
    code, out, _ = run_cli(["study", "report", str(path), "--store", str(tmp_path / "store"), "--budget", "smoke"],
                           capsys)
    assert code == 0 and f"Environment: {describe(environment)} (all 1 run)." in out

    # the run read back (its record lost): described by the sitting that ran it, none added
    (record_path,) = store.folder.glob("*.json")
    record_path.unlink()
    assert run_cli(["study", "run", str(path), *args], capsys)[0] == 0
    (again,) = store.records()
    assert again["sittings"] == record["sittings"] and again["environment"] == environment

    # a record stored before environments were recorded says so, and the report with it
    older = {k: v for k, v in record.items() if k not in ("environment", "sittings", "cpu_seconds")}
    record_path.write_text(json.dumps(older))
    code, out, _ = run_cli(["study", "report", str(path), "--store", str(tmp_path / "store"), "--budget", "smoke"],
                           capsys)
    assert code == 0 and "Environment: not recorded (all 1 run)." in out
