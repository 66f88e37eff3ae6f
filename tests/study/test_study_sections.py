"""The parts of a study file (fedfew.study.study_sections): claims and their ids, families, controls,
choices and the paper's numbers, each refused in one line when it says what nobody meant."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fedfew.study.study_file import load_study
from fedfew.study.study_sections import CONTROL, claim_id
from tests.cli.common import one_line
from tests.study.common import CHAIN, DIGITS_STUDY, OWN_CONTROL, run_cli, write_study


# -- silent acceptances -----------------------------------------------------------------------------------
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


def _one_line_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str], *expected: str) -> None:
    code, _, err = run_cli(argv, capsys)
    lines = [line for line in err.strip().splitlines() if not line.startswith("fedfew: warning:")]
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    for text in expected:
        assert text in lines[0], lines[0]


@pytest.mark.parametrize("change, expected", [
    ({"control": None}, "no untrained control; add one (control: {method: ...}) or say why none applies (no_control"),
    ({"budgets": {**DIGITS_STUDY["budgets"], "cpu": {"control": False}}},
     "budgets.cpu: control: false needs no_control"),
    ({"methods": {**DIGITS_STUDY["methods"], "fl-proto": {"set": DIGITS_STUDY["methods"]["fl-proto"], "control": "fl-maml"}}},
     "methods.fl-proto.control: 'fl-maml' is not one of this study's untrained rows"),
    ({"methods": {**DIGITS_STUDY["methods"], "u": {"untrained_of": "nope"}}},
     "methods.u.untrained_of: 'nope' is not one of this study's trained rows"),
    ({"claims": [{"setting": "IID 1-shot", "order": ["fl-proto", CONTROL]}]},
     "'fl-proto' has its own control 'fl-proto, untrained'; name it"),
])
def test_controls_are_declared_or_explained(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                            change: dict, expected: str) -> None:
    base = OWN_CONTROL if "own control" in expected else DIGITS_STUDY
    path = write_study(tmp_path, {**base, **change})
    _one_line_exit_2(["study", "report", str(path), "--store", str(tmp_path / "s")], capsys, expected, str(path))


# -- choices on validation numbers only ----------------------------------------------------------------
@pytest.mark.parametrize("metric", ["history.last.test_accuracy", "test.accuracy", "final_score", "history.last.train_loss"])
def test_a_choice_reading_anything_but_validation_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                            metric: str) -> None:
    choice = {"budget": "cpu", "setting": "IID 1-shot", "metric": metric, "rule": "best",
              "candidates": ["fl-proto", "fl-maml"]}
    path = write_study(tmp_path, {**DIGITS_STUDY, "choices": {"step": choice}})
    _one_line_exit_2(["study", "report", str(path), "--store", str(tmp_path / "s")], capsys,
                     "choices.step.metric", metric, "not a validation metric")


@pytest.mark.parametrize("change, expected", [
    ({"candidates": ["fl-proto", "nope"]}, "choices.step: 'nope' is not one of"),
    ({"rule": "positive"}, "choices.step.against: rule positive needs the reference row"),
    ({"budget": "paper"}, "choices.step.budget: 'paper' is not one of"),
])
def test_a_choice_names_what_exists(tmp_path: Path, capsys: pytest.CaptureFixture[str], change: dict,
                                    expected: str) -> None:
    choice = {"budget": "cpu", "setting": "IID 1-shot", "metric": "history.last.val_accuracy", "rule": "best",
              "candidates": ["fl-proto", "fl-maml"], **change}
    path = write_study(tmp_path, {**DIGITS_STUDY, "choices": {"step": choice}})
    _one_line_exit_2(["study", "choose", str(path), "step", "--store", str(tmp_path / "s")], capsys, expected)


def test_claim_ids_are_made_from_setting_and_order_and_do_not_move(tmp_path: Path) -> None:
    assert claim_id("IID 1-shot", ["F2L", "FL-MAML"]) == "iid-1-shot:f2l>fl-maml"
    assert claim_id("non-IID (Table 2)", ["frl_linear", CONTROL]) == "non-iid-table-2:frl-linear>control"
    study, _ = load_study(write_study(tmp_path, CHAIN))
    ids = study.claim_ids()
    assert ids == ["iid-1-shot:fl-proto>fl-maml>control", "proto-trained", "non-iid-1-shot:fl-proto>fl-maml"]
    moved, _ = load_study(write_study(tmp_path, {**CHAIN, "claims": CHAIN["claims"][::-1]}, "moved.yaml"))
    assert moved.claim_ids() == ids[::-1]  # an id belongs to its claim, not to its place
    twice = {**CHAIN, "claims": [CHAIN["claims"][2], CHAIN["claims"][2]]}
    study, _ = load_study(write_study(tmp_path, twice, "twice.yaml"))
    assert study.claim_ids() == ["non-iid-1-shot:fl-proto>fl-maml", "non-iid-1-shot:fl-proto>fl-maml~2"]


@pytest.mark.parametrize("change, expected", [
    ({"families": {"f": ["nonesuch"]}}, "families.f: 'nonesuch' is not one of this study's claim ids"),
    ({"families": {"f": ["proto-trained"], "g": ["proto-trained"]}}, "already in family 'f'"),
    ({"families": {"all": ["proto-trained"]}}, "'all' is not a family name"),
    ({"families": {"f": []}}, "families.f"),
    ({"claims": [{"setting": "IID 1-shot", "order": ["fl-proto", CONTROL], "id": "x"},
                 {"setting": "IID 1-shot", "order": ["fl-maml", CONTROL], "id": "x"}]}, "'x' is the id of another claim"),
    ({"claims": [{"setting": "IID 1-shot", "order": ["fl-proto", CONTROL], "id": "has space"}]}, "claims.0.id"),
    ({"claims": [{"setting": "IID 1-shot", "order": ["fl-proto", "nonesuch"]}]}, "'nonesuch' is not one of"),
])
def test_bad_claims_and_families_are_one_line_exit_2(change: dict, expected: str, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    path = write_study(tmp_path, {**CHAIN, **change})
    code, _, err = run_cli(["study", "report", str(path), "--store", str(tmp_path / "store")], capsys)
    assert code == 2 and expected in err and str(path) in err and len(err.strip().splitlines()) == 1, err
