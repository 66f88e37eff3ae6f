"""Internal errors, silent acceptances and vague messages of issue 53 (items 11-14, less the privacy
section's, which issue 51 owns): each input is one line naming the key, option or file, exit 2 (or a
warning where the input is legal but suspect), and the reliability page agrees with the code."""

from __future__ import annotations

import errno
import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from fedfew.cli.main import demo_config_path, main
from fedfew.study.grid import cells
from fedfew.study.store import CodeVersion, ResultStore, make_record
from fedfew.study.study_file import load_study
from fedfew.study.study_sections import StudyError
from tests.test_study import DIGITS_STUDY, REPO, dumped, write_study
from tests.tiny import tiny_config

HANDMADE = CodeVersion("0.0.0", "handmade0000", None)


def one_line(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    code = main(list(args))
    err = capsys.readouterr().err
    assert "Traceback" not in err and "unexpected" not in err, err
    lines = [line for line in err.splitlines() if line.strip() and "warning" not in line]
    assert code == 2 and len(lines) == 1, (code, err)
    return lines[0]


def put(store_dir: Path, study_path: Path, budget: str = "smoke", accuracy: float = 0.5) -> None:
    study, root = load_study(study_path)
    store = ResultStore(store_dir, study.name)
    for cell in cells(study, root, budget):
        store.put(make_record(study.name, budget, cell.method, cell.setting, cell.seed, cell.config_hash,
                              dumped(cell), HANDMADE, {"test": {"accuracy": accuracy}}, 60.0))


# -- 11: internal errors become one line ----------------------------------------------------------------
@pytest.mark.parametrize("which", ["--store", "--store/study", "--runs"])
def test_study_run_with_a_file_for_a_folder_is_one_line(which: str, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    path = write_study(tmp_path, DIGITS_STUDY)
    store, runs = tmp_path / "store", tmp_path / "runs"
    target = {"--store": store, "--store/study": store / "digits-check", "--runs": runs}[which]
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text("a file")
    line = one_line(capsys, "study", "run", str(path), "--store", str(store), "--runs", str(runs), "--budget", "smoke")
    assert str(target) in line and which.split("/")[0] in line, line


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


@pytest.mark.parametrize("figure", ["x.xyz", "st"])
def test_a_figure_of_no_type_matplotlib_writes_is_one_line(figure: str, tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    path = write_study(tmp_path, DIGITS_STUDY)
    put(tmp_path / "store", path)
    line = one_line(capsys, "study", "report", str(path), "--store", str(tmp_path / "store"), "--budget", "smoke",
                    "--figure", str(tmp_path / figure))
    assert "--figure" in line and figure in line, line
    assert not list(tmp_path.glob("st*.png"))


# -- 12: silent acceptances -------------------------------------------------------------------------------
@pytest.mark.parametrize("change, expected", [
    ({"claims": [{"setting": "IID 1-shot", "order": ["fl-proto", "fl-proto"]}]}, "given twice"),
    ({"seeds": [True]}, "seeds"),
    ({"paper": [{"source": "T", "values": {"fl-proto": {"IID 1-shot": 6340}}}]}, "paper"),
])
def test_study_values_nobody_meant_are_refused(change: dict[str, Any], expected: str, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    path = write_study(tmp_path, {**DIGITS_STUDY, **change})
    line = one_line(capsys, "study", "report", str(path), "--store", str(tmp_path / "store"))
    assert expected in line and str(path) in line, line


def test_a_metric_no_stored_cell_has_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_study(tmp_path, {**DIGITS_STUDY, "metric": "test.nosuch"})
    put(tmp_path / "store", path)
    line = one_line(capsys, "study", "report", str(path), "--store", str(tmp_path / "store"), "--budget", "smoke")
    assert "test.nosuch" in line and "test" in line.split("keep")[-1], line


@pytest.mark.parametrize("command", ["report", "status"])
def test_a_store_that_is_a_file_is_one_line_not_not_yet_run(command: str, tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    path = write_study(tmp_path, DIGITS_STUDY)
    (tmp_path / "store").write_text("a file")
    line = one_line(capsys, "study", command, str(path), "--store", str(tmp_path / "store"))
    assert "--store" in line and str(tmp_path / "store") in line, line


def text_config(tmp_path: Path, lines: list[str]) -> Path:
    (tmp_path / "t.jsonl").write_text("".join(line + "\n" for line in lines))
    config = tiny_config("fl-proto", dataset={"name": "text-jsonl", "root": str(tmp_path),
                                              "options": {"path": "t.jsonl"}},
                         model={"name": "bilstm", "options": {}})
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def test_a_text_file_whose_every_text_is_empty_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = text_config(tmp_path, [json.dumps({"text": "", "label": i % 10}) for i in range(100)])
    line = one_line(capsys, "run", str(path), "--out", str(tmp_path / "out"))
    assert "empty" in line and "t.jsonl" in line, line


def test_a_text_file_with_many_empty_texts_is_warned_about(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from fedfew.data.registry import load_dataset

    rows = [json.dumps({"text": "" if i % 3 == 0 else f"word{i % 7} other{i}", "label": i % 10}) for i in range(90)]
    (tmp_path / "t.jsonl").write_text("\n".join(rows) + "\n")
    with caplog.at_level("WARNING"):
        load_dataset("text-jsonl", tmp_path, path="t.jsonl")
    assert any("30 of the 90 texts" in r.getMessage() for r in caplog.records), caplog.records


def test_a_text_line_with_a_field_twice_is_refused(tmp_path: Path) -> None:
    from fedfew.data.dataset import DataError
    from fedfew.data.registry import load_dataset

    (tmp_path / "t.jsonl").write_text('{"text": "a b", "label": 1}\n{"text": "c", "label": 1, "label": 2}\n')
    with pytest.raises(DataError, match="line 2 gives the field 'label' twice"):
        load_dataset("text-jsonl", tmp_path, path="t.jsonl")


# -- 13: vague messages ------------------------------------------------------------------------------------
def test_demo_names_the_rows_a_set_cannot_apply_to(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    line = one_line(capsys, "demo", "--out", str(tmp_path), "--set", "privacy.mechanism=central-dp",
                    "--set", "privacy.noise_multiplier=1.0", "--set", "privacy.clip=1.0", "--set", "privacy.delta=1e-5")
    assert "demo's 'local'" in line and "fedfew run" in line, line


def test_choose_on_stored_runs_without_the_metric_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = {**DIGITS_STUDY, "choices": {"step": {"budget": "smoke", "setting": "IID 1-shot",
                                                 "metric": "history.last.val_accuracy", "rule": "positive",
                                                 "against": "fl-maml", "candidates": ["fl-proto"]}}}
    path = write_study(tmp_path, data)
    put(tmp_path / "store", path)
    line = one_line(capsys, "study", "choose", str(path), "step", "--store", str(tmp_path / "store"))
    assert "history.last.val_accuracy" in line and "waits" not in line and "stored" in line, line


@pytest.mark.parametrize("make", ["missing", "empty", "file"])
def test_study_docs_and_status_of_a_root_without_studies_are_one_line(make: str, tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "root"
    if make == "empty":
        root.mkdir()
    elif make == "file":
        root.write_text("x")
    for command in ("docs", "status"):
        line = one_line(capsys, "study", command, "--root", str(root))
        assert "--root" in line and str(root) in line, line


def test_a_set_key_with_an_empty_part_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    line = one_line(capsys, "run", str(demo_config_path()), "--out", str(tmp_path), "--set", ".federation.rounds=1")
    assert "'.federation.rounds'" in line and "empty part" in line and "(top level)" not in line, line


def test_a_table_in_an_unwritable_place_names_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "file").write_text("x")
    line = one_line(capsys, "run", str(demo_config_path()), "--out", str(tmp_path / "out"),
                    "--table", str(tmp_path / "file" / "table"))
    assert "--table" in line and "--out" not in line, line


def test_an_arrays_file_of_one_class_says_how_many_classes_it_has(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    np.savez(tmp_path / "one.npz", x=np.random.default_rng(0).random((50, 1, 8, 8), dtype=np.float32),
             y=np.zeros(50, dtype=np.int64))
    config = tiny_config("fl-proto", dataset={"name": "arrays", "options": {"path": str(tmp_path / "one.npz")}})
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(config))
    line = one_line(capsys, "run", str(tmp_path / "c.yaml"), "--out", str(tmp_path / "out"))
    assert "1 class(es) in all" in line, line


def test_fedfew_data_that_is_a_file_is_called_a_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "data").write_text("x")
    monkeypatch.setenv("FEDFEW_DATA", str(tmp_path / "data"))
    line = one_line(capsys, "run", str(demo_config_path()), "--out", str(tmp_path / "out"), "--set", "dataset.name=mnist")
    assert "$FEDFEW_DATA" in line and "is a file" in line and "missing" not in line, line


# -- 14: the docs agree with the code -------------------------------------------------------------------------
def test_the_reliability_page_gives_the_exit_code_of_a_run_in_which_nothing_trained() -> None:
    from fedfew.engine.simulator import NothingTrainedError

    text = (REPO / "docs" / "reliability.md").read_text()
    rows = [line for line in text.splitlines() if line.startswith("| no client can train")]
    assert rows and all(f"exit {NothingTrainedError.exit_code}" in row for row in rows), rows
    tested = re.search(r"no client can form an episode[^;]*exits (\d)", text)
    assert tested and int(tested.group(1)) == NothingTrainedError.exit_code
