"""Choices made from results (fedfew.study.choose): ``fedfew study choose`` computes the rule from the
store on validation numbers, the F2L combination is the rows its rule chooses, and stored runs without
the metric are said to lack it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from fedfew.config.validation import load_config
from fedfew.study.choose import make_choice
from fedfew.study.collect import collect
from fedfew.study.study_file import load_study
from tests.cli.common import one_line
from tests.study.common import DIGITS_STUDY, REPO, put, run_cli, write_study


def test_choose_on_stored_runs_without_the_metric_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = {**DIGITS_STUDY, "choices": {"step": {"budget": "smoke", "setting": "IID 1-shot",
                                                 "metric": "history.last.val_accuracy", "rule": "positive",
                                                 "against": "fl-maml", "candidates": ["fl-proto"]}}}
    path = write_study(tmp_path, data)
    put(tmp_path / "store", path)
    line = one_line(capsys, "study", "choose", str(path), "step", "--store", str(tmp_path / "store"))
    assert "history.last.val_accuracy" in line and "waits" not in line and "stored" in line, line


def test_study_choose_computes_the_rule_from_the_store(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from fedfew.study.run import run_study

    data = {**DIGITS_STUDY, "set": {**DIGITS_STUDY["set"], "splits.val": "base", "episodes.val_episodes": 4,
                                    "eval.every": 1},
            "choices": {"step": {"budget": "smoke", "setting": "IID 1-shot", "metric": "history.last.val_accuracy",
                                 "rule": "positive", "against": "fl-maml", "candidates": ["fl-proto"]}}}
    path = write_study(tmp_path, data)
    code, out, _ = run_cli(["study", "choose", str(path), "step", "--store", str(tmp_path / "store")], capsys)
    assert code == 1 and "waits for runs" in out  # nothing stored yet: no choice
    study, root = load_study(path)
    run_study(study, root, "smoke", tmp_path / "store", tmp_path / "runs", None, [], False)
    made = make_choice(study, root, tmp_path / "store", "step")
    values = collect(study.model_copy(update={"metric": "history.last.val_accuracy"}), root, tmp_path / "store",
                     "smoke").values
    proto, maml = values[("fl-proto", "IID 1-shot")], values[("fl-maml", "IID 1-shot")]
    difference = {seed: proto[seed] - maml[seed] for seed in (0, 1)}
    assert made.candidates[0].differences == pytest.approx(difference)
    assert made.chosen == (["fl-proto"] if sum(difference.values()) > 0 else [])
    code, out, _ = run_cli(["study", "choose", str(path), "step", "--store", str(tmp_path / "store")], capsys)
    assert code == 0 and "chosen on validation tasks only" in out and "history.last.val_accuracy" in out


def _changes(path: Path) -> set[str]:
    found = re.search(r"^# changes: (.*)$", path.read_text(), flags=re.M)
    assert found, path
    return {c.strip() for c in found.group(1).split(";")}


def test_the_f2l_combination_is_the_rows_its_validation_rule_chooses() -> None:
    """configs/f2l/ledger/combination.yaml = the reference row with exactly the changes of the rows the
    ledger's `choices.combination` picks from the committed store (validation tasks, round 200)."""
    study, root = load_study(REPO / "studies/f2l_ledger.yaml")
    made = make_choice(study, root, REPO / "studies/store", "combination")
    assert not made.missing and made.chosen
    ledger = REPO / "configs/f2l/ledger"
    chosen = set().union(*(_changes(ledger / f"{m}.yaml") for m in made.chosen))
    assert _changes(ledger / "combination.yaml") == chosen
    load_config(ledger / "combination.yaml")  # and it validates
