"""The study file (fedfew.study.study_file): a bad file is one line naming the key and the file (a name
that would escape the store, duplicate seeds, empty lists), relative paths start from the study's
root, and every committed study is valid at every budget with a control or a reason."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fedfew.study.docs import study_files
from fedfew.study.grid import cells
from fedfew.study.study_file import load_study
from tests.cli.common import refused
from tests.study.common import (
    DIGITS_STUDY,
    REPO,
    _errors,
    _store_args,
    run_cli,
    write_study,
)


@pytest.mark.parametrize("name", [".", "..", ".hidden", "s" * 101])
def test_a_study_name_that_would_escape_its_store_is_refused(name: str, tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    path = write_study(tmp_path, {**DIGITS_STUDY, "name": name})
    line = refused(capsys, tmp_path / "runs", "study", "run", str(path), "--store", str(tmp_path / "store"),
                   "--runs", str(tmp_path / "runs"), "--budget", "smoke")
    assert "name" in line and str(path) in line, line
    assert not (tmp_path / "store").exists()


@pytest.mark.parametrize("change, expected", [
    ({"mehtods": {}}, "mehtods: unknown key"),
    ({"budgets": {"cpu": {}}}, "needs a 'smoke' budget"),
    ({"budgets": {"smoke": {"sets": {}}}}, "budgets.smoke.sets: unknown key"),
    ({"claims": [{"setting": "IID 1-shot", "order": ["fl-proto", "fedavg"]}]}, "'fedavg' is not one of"),
    ({"claims": [{"setting": "IID 5-shot", "order": ["fl-proto", "fl-maml"]}]}, "'IID 5-shot' is not one of"),
    ({"seeds": ["zero"]}, "seeds.0"),
    ({"methods": "fl-proto"}, "methods"),
    ({"paper": [{"source": "T", "values": {"fl-proto": {"IID": 1.0}}}]}, "'IID' is not one of"),
    ({"metric": "test.local_by_client[1,"}, "metric: 'test.local_by_client[1,' is not a metric path"),
    ({"settings": {"IID 1-shot": {"metric": "test..x"}}}, "settings.IID 1-shot.metric: 'test..x' is not a metric"),
    ({"methods": {"fl-proto": {"metric": "test.ci95"}, "fl-maml": {}},
      "settings": {"IID 1-shot": {"metric": "test.accuracy"}}}, "metric: set it on methods or on settings, not both"),
    ({"tables": [{"metric": "test.x", "title": "x", "methods": ["fedavg"]}]}, "tables[0].methods: 'fedavg' is not one of"),
    ({"tables": [{"metric": "test.x"}]}, "tables.0.title: required key missing"),
])
def test_a_bad_study_file_is_one_line_naming_the_key_and_file(change: dict, expected: str, tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    path = write_study(tmp_path, {**DIGITS_STUDY, **change})
    code, _, err = run_cli(["study", "report", str(path), "--store", str(tmp_path / "store")], capsys)
    assert code == 2 and expected in err and str(path) in err and len(err.strip().splitlines()) == 1


def test_every_committed_study_is_valid_at_every_budget() -> None:
    files = study_files(REPO)
    assert files
    for path in files:
        study, root = load_study(path)
        for budget in study.budgets:
            assert cells(study, root, budget), (path, budget)


@pytest.mark.parametrize("change, expected", [
    ({"seeds": [0, 0]}, "seeds: seed 0 is given twice"),
    ({"budgets": {"smoke": {"seeds": [1, 2, 1]}, "cpu": {}}}, "budgets.smoke.seeds: seed 1 is given twice"),
    ({"budgets": {"smoke": {"seeds": []}, "cpu": {}}}, "budgets.smoke.seeds"),
    ({"budgets": {"smoke": {"methods": []}, "cpu": {}}}, "budgets.smoke.methods"),
    ({"budgets": {"smoke": {"settings": []}, "cpu": {}}}, "budgets.smoke.settings"),
    ({"budgets": {"smoke": {"methods": ["fl-proto", "fl-proto"]}, "cpu": {}}},
     "budgets.smoke.methods: 'fl-proto' is given twice"),
    ({"settings": {}, "budgets": {"smoke": {}, "cpu": {}}}, "settings"),
    ({"methods": []}, "methods"),
    ({"tables": [{"metric": "test.x", "title": "x", "methods": []}]}, "tables.0.methods"),
])
def test_duplicate_seeds_and_empty_lists_are_refused(change: dict[str, Any], expected: str, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    path = write_study(tmp_path, {**DIGITS_STUDY, **change})
    code, _, err = run_cli(["study", "run", str(path), *_store_args(tmp_path)], capsys)
    assert code == 2 and expected in err and str(path) in err and len(_errors(err)) == 1, err
    assert not (tmp_path / "runs").exists()


# -- where a study's relative paths start -----------------------------------------------------------------
def test_relative_paths_start_from_the_studys_root_and_the_docs_say_so(tmp_path: Path) -> None:
    """A study in a folder named ``studies`` takes its paths from the folder above (the repository);
    any other study from its own folder. Its default store is ``<root>/studies/store`` either way."""
    demo = (REPO / "src/fedfew/configs/demo.yaml").read_text()
    for folder, root in ((tmp_path / "repo" / "studies", tmp_path / "repo"), (tmp_path / "mine", tmp_path / "mine")):
        folder.mkdir(parents=True)
        (root / "configs").mkdir(exist_ok=True)
        (root / "configs" / "base.yaml").write_text(demo)
        study, found = load_study(write_study(folder, {**DIGITS_STUDY, "config": "configs/base.yaml"}))
        assert found == root and cells(study, found, "smoke")
    text = " ".join((REPO / "docs/studies.md").read_text().split())
    assert "relative to the repository root" not in text
    assert ("the folder above `studies/` for a study file in a folder named `studies`, else the study file's own "
            "folder") in text
    assert "`<root>/studies/store`" in text


def test_every_repository_block_has_a_control_or_a_reason() -> None:
    for path in sorted((REPO / "studies").glob("*.yaml")):
        study, _ = load_study(path)
        for budget in study.budgets:
            reason = study.no_control_reason(budget)
            assert reason is None or len(reason) > 10, (path.name, budget)
