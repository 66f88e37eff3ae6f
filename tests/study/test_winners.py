"""What wins where (fedfew.study.winners): the best mean and the methods the paired rule cannot separate
from it, only complete settings, and untrained rows never win."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedfew.core.errors import UsageError
from fedfew.study.collect import collect
from fedfew.study.report import markdown
from fedfew.study.study_file import load_study
from fedfew.study.study_sections import CONTROL
from fedfew.study.winners import winners
from tests.study.common import DIGITS_STUDY, OWN_CONTROL, T1, angular, write_study


def test_winners_are_the_best_mean_and_the_methods_the_paired_rule_cannot_separate(tmp_path: Path) -> None:
    """Hand-made values: in IID 1-shot fl-proto's mean is highest and fl-maml is 2 points below on every
    seed (a paired difference with zero spread: separated); in the other column fl-maml is best and
    fl-proto's differences (+3, -1) straddle 0: not separated. The control is never the best."""
    from fedfew.study.collect import StudyResults
    from fedfew.study.study_file import load_study
    from fedfew.study.winners import winners, winners_markdown

    study, _ = load_study(write_study(tmp_path, DIGITS_STUDY))
    results = StudyResults(study, "cpu", None, cells_total=10, cells_found=10, methods=list(study.methods),
                           settings=list(study.settings))
    results.values = {("fl-proto", "IID 1-shot"): {0: 60.0, 1: 62.0}, ("fl-maml", "IID 1-shot"): {0: 58.0, 1: 60.0},
                      ("fl-proto", "non-IID 1-shot"): {0: 50.0, 1: 52.0},
                      ("fl-maml", "non-IID 1-shot"): {0: 53.0, 1: 51.0},
                      (CONTROL, "IID 1-shot"): {0: 90.0, 1: 90.0}}
    assert winners(results) == [("non-IID 1-shot", "fl-maml", ["fl-proto"], None),
                                ("IID 1-shot", "fl-proto", [], results.interval(CONTROL, "IID 1-shot"))]
    text = winners_markdown(results, "studies/study.yaml")
    assert f"| IID 1-shot | fl-proto: {angular([60, 62], T1)} | none | 90.00 [90.00, 90.00] |" in text
    assert f"| non-IID 1-shot | FL-MAML: {angular([53, 51], T1)} | fl-proto | — |" in text


def test_winners_judge_only_complete_settings_and_leave_apart_rows_out(tmp_path: Path) -> None:
    """A setting with a cell not yet stored has no best (the rows that ran first would win); a row the
    study keeps apart (``winners.apart``: scored by another protocol) is shown in its own column and never
    named best, even with the highest mean."""
    from fedfew.study.collect import StudyResults
    from fedfew.study.study_file import load_study
    from fedfew.study.winners import winners, winners_markdown

    data = {**DIGITS_STUDY, "winners": {"apart": ["fl-proto"], "why": "another protocol"}}
    study, _ = load_study(write_study(tmp_path, data))
    results = StudyResults(study, "cpu", None, cells_total=12, cells_found=9, methods=list(study.methods),
                           settings=list(study.settings), missing={"IID 1-shot": 3})
    results.values = {("fl-proto", "non-IID 1-shot"): {0: 90.0, 1: 92.0},
                      ("fl-maml", "non-IID 1-shot"): {0: 53.0, 1: 51.0},
                      ("fl-maml", "IID 1-shot"): {0: 60.0, 1: 62.0}}
    assert winners(results) == [("non-IID 1-shot", "fl-maml", [], None), ("IID 1-shot", None, [], None)]
    text = winners_markdown(results, "studies/study.yaml")
    assert "| setting | best (mean [95% interval]) | not separated from the best | apart: another protocol |" in text
    assert f"| non-IID 1-shot | FL-MAML: {angular([53, 51], T1)} | none | fl-proto: {angular([90, 92], T1)} | — |" in text
    assert "| IID 1-shot | incomplete (3 cells not yet run) | | fl-proto: — | — |" in text
    bad = {**DIGITS_STUDY, "winners": {"apart": ["fedavg"]}}
    with pytest.raises(UsageError, match="winners.apart: 'fedavg' is not one of"):
        load_study(write_study(tmp_path, bad, name="bad.yaml"))


def test_an_untrained_row_never_wins_and_is_not_ranked(tmp_path: Path) -> None:
    from fedfew.study.run import run_study

    path = write_study(tmp_path, {**OWN_CONTROL, "seeds": [0, 1]})
    study, root = load_study(path)
    run_study(study, root, "smoke", tmp_path / "store", tmp_path / "runs", None, [], False)
    results = collect(study, root, tmp_path / "store", "smoke")
    # the untrained prototypes row has values, yet is never named best
    assert results.values[("fl-proto, untrained", "IID 1-shot")]
    for _, best, tied, _ in winners(results):
        assert best != "fl-proto, untrained" and "fl-proto, untrained" not in tied
    assert "(control) prototypes" in markdown(results, str(path))


def test_a_ceiling_row_never_wins_and_must_name_a_row(tmp_path: Path) -> None:
    """A ceiling (``winners.ceilings``: trained without federation, the centralised twin) is what the
    federated rows are measured against: with the highest mean it is still not named best, and the
    paired rule compares the others without it; an unknown name is an error naming the key."""
    from fedfew.study.collect import StudyResults
    from fedfew.study.summary import summary_line

    data = {**DIGITS_STUDY, "winners": {"ceilings": {"fl-maml": "fl-proto"}}}
    study, _ = load_study(write_study(tmp_path, data))
    assert not study.competes("fl-proto") and study.ranked("fl-proto") and study.competes("fl-maml")
    results = StudyResults(study, "cpu", None, cells_total=4, cells_found=4, methods=list(study.methods),
                           settings=["IID 1-shot"])
    results.values = {("fl-proto", "IID 1-shot"): {0: 95.0, 1: 96.0}, ("fl-maml", "IID 1-shot"): {0: 60.0, 1: 62.0}}
    assert winners(results) == [("IID 1-shot", "fl-maml", [], None)]
    line = summary_line(results, "studies/study.yaml")
    assert "1 methods compared): best (the highest mean over seeds): FL-MAML in 1 of 1 settings" in line
    # the winner's price of federation: its ceiling's mean minus its own, 95.5 - 61.0
    assert "and 34.5 points below its ceiling, fl-proto (the price of federation)" in line
    bad = {**DIGITS_STUDY, "winners": {"ceilings": {"fl-maml": "centralised"}}}
    with pytest.raises(UsageError, match="winners.ceilings: 'centralised' is not one of"):
        load_study(write_study(tmp_path, bad, name="bad.yaml"))


def test_a_row_kept_apart_still_running_does_not_hold_the_verdict_back(tmp_path: Path) -> None:
    """Per-row counts (as collect makes them): a missing cell of a row kept apart cannot change which row
    is best, so the setting is judged; a missing cell of a competing row holds it back."""
    from fedfew.study.collect import StudyResults

    data = {**DIGITS_STUDY, "winners": {"apart": ["fl-proto"], "why": "another protocol"}}
    study, _ = load_study(write_study(tmp_path, data))
    results = StudyResults(study, "cpu", None, cells_total=4, cells_found=3, methods=list(study.methods),
                           settings=["IID 1-shot"], missing={"IID 1-shot": 1},
                           missing_rows={("fl-proto", "IID 1-shot"): 1, ("fl-maml", "IID 1-shot"): 0})
    results.values = {("fl-proto", "IID 1-shot"): {0: 90.0}, ("fl-maml", "IID 1-shot"): {0: 60.0, 1: 62.0}}
    assert winners(results) == [("IID 1-shot", "fl-maml", [], None)]
    results.missing_rows = {("fl-proto", "IID 1-shot"): 0, ("fl-maml", "IID 1-shot"): 1}
    assert winners(results) == [("IID 1-shot", None, [], None)]
