"""Generated docs (fedfew.study.docs): the blocks are what the store gives, the committed docs match the
committed store, no interval leaves [0, 100], and docs/results.md leads with the largest budget that
ran."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from fedfew.study.collect import collect
from fedfew.study.docs import MARKER, marker_pattern, render_pages, study_files
from fedfew.study.study_file import load_study
from tests.study.common import DIGITS_STUDY, INTERVAL, REPO, _put, run_cli, write_study


# -- generated docs ------------------------------------------------------------------------------------
def test_docs_blocks_are_what_the_store_gives(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "studies").mkdir()
    (tmp_path / "docs").mkdir()
    write_study(tmp_path / "studies", {**DIGITS_STUDY, "config": str(REPO / "src/fedfew/configs/demo.yaml")},
                "digits.yaml")
    page = tmp_path / "docs" / "page.md"
    page.write_text("# Page\n\n<!-- study:digits-check begin -->\n51.2 typed by hand\n<!-- study:digits-check end -->\n"
                    "after\n")
    assert run_cli(["study", "docs", "--root", str(tmp_path)], capsys)[0] == 0
    text = page.read_text()
    assert "typed by hand" not in text and "*Not yet run at the cpu budget* (12 cells)" in text
    assert text.endswith("<!-- study:digits-check end -->\nafter\n")
    assert render_pages(tmp_path)[page] == text  # what the docs test compares
    compute = tmp_path / "docs" / "compute.md"
    compute.write_text("<!-- studies:compute begin -->\n1 h typed by hand\n<!-- studies:compute end -->\n")
    assert run_cli(["study", "docs", "--root", str(tmp_path)], capsys)[0] == 0
    rows = [line for line in compute.read_text().splitlines() if line.startswith("| ")]
    assert "typed by hand" not in compute.read_text()
    assert rows[1:] == ["| `studies/digits.yaml` | cpu | 0/12 | — | 0.0 | — | — | — |",
                       "| all | | | | 0.0 | 0.0 (runs that recorded it) | | |"]
    # a block at another budget than the docs budget, beside the docs budget's
    page.write_text(text + "<!-- study:digits-check@smoke begin -->\n<!-- study:digits-check@smoke end -->\n")
    assert run_cli(["study", "docs", "--root", str(tmp_path)], capsys)[0] == 0
    text = page.read_text()
    assert "*Not yet run at the cpu budget* (12 cells)" in text and "*Not yet run at the smoke budget*" in text
    assert "--budget smoke`, then" in text
    page.write_text(text.replace("digits-check@smoke", "digits-check@nonesuch"))
    code, _, err = run_cli(["study", "docs", "--root", str(tmp_path)], capsys)
    assert code == 2 and "study:digits-check@nonesuch names no budget" in err and len(err.strip().splitlines()) == 1
    page.write_text(text.replace("<!-- study:digits-check", "<!-- study:nonesuch"))
    code, _, err = run_cli(["study", "docs", "--root", str(tmp_path)], capsys)
    assert code == 2 and "study:nonesuch" in err


def test_committed_docs_match_the_committed_store() -> None:
    """Every docs page's study blocks are exactly what `fedfew study docs` makes from studies/store."""
    pages = render_pages(REPO)
    assert pages, "no docs page has a study block"
    for page, text in pages.items():
        assert page.read_text() == text, f"{page} differs from the store: run `fedfew study docs`"


def _blocks(text: str) -> list[str]:
    """The generated blocks of a page with accuracies (the aggregate view's scores are normalised, not
    accuracies: they may be below 0)."""
    return [m.group(2) for name, at, view in MARKER.findall(text) if view != ":aggregate"
            for m in [marker_pattern(name + at + view).search(text)] if m]


def test_no_accuracy_interval_in_the_docs_leaves_0_100() -> None:
    """Every "mean [low, high]" of every generated block (what the committed-docs test keeps equal to the
    store) is inside [0, 100]."""
    found = 0
    for page in sorted((REPO / "docs").glob("*.md")):
        for block in _blocks(page.read_text()):
            for mean, low, high in (tuple(map(float, m)) for m in INTERVAL.findall(block)):
                found += 1
                assert 0.0 <= low <= high <= 100.0, f"{page.name}: {mean} [{low}, {high}]"
    assert found > 800


def test_results_leads_with_the_largest_budget_that_ran() -> None:
    """In docs/results.md a study shown at several budgets shows first the one whose runs are longest
    (the mean wall time of its stored runs): the paper budget's verdicts before the cpu budget's."""
    text = (REPO / "docs" / "results.md").read_text()
    order: dict[str, list[str]] = {}
    for name, at, _view in MARKER.findall(text):
        order.setdefault(name, []).append(at[1:] if at else "")
    studies = {study.name: (study, root) for study, root in map(load_study, study_files(REPO))}
    several = {name: budgets for name, budgets in order.items() if len(budgets) > 1}
    assert several  # fedfsl-table3, f2l-table1-huffpost, frl-femnist
    for name, budgets in several.items():
        study, root = studies[name]
        seconds = []
        for budget in budgets:  # budgets side by side (A+B): their runs together
            records = [r for one in (budget.split("+") if budget else [""])
                       for r in collect(study, root, root / "studies" / "store", one or None).run_records]
            assert records, f"{name}@{budget} has not run"
            seconds.append(float(np.mean([r.get("wall_seconds", 0.0) for r in records])))
        assert seconds == sorted(seconds, reverse=True), f"{name}: {list(zip(budgets, seconds))}"


def test_a_curve_block_draws_a_number_the_records_keep_at_each_round(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """``study:NAME:curve-KEY``: the figure's link and where each line ends, from the records' histories; before
    any record keeps one, a line saying so; a key no record keeps is one line naming the keys they have."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "studies").mkdir()
    study_path = write_study(tmp_path / "studies", DIGITS_STUDY, "digits.yaml")
    page = tmp_path / "docs" / "page.md"
    page.write_text("<!-- study:digits-check:curve-test_accuracy begin -->\n"
                    "<!-- study:digits-check:curve-test_accuracy end -->\n")
    assert run_cli(["study", "docs", "--root", str(tmp_path)], capsys)[0] == 0
    assert "*No record of the cpu budget keeps its evaluated rounds yet*" in page.read_text()
    _put(tmp_path / "studies" / "store", study_path, "cpu",
         {("fl-proto", "IID 1-shot", 0): 0.5, ("fl-proto", "IID 1-shot", 1): 0.7}, history=True)
    assert run_cli(["study", "docs", "--root", str(tmp_path)], capsys)[0] == 0
    text = page.read_text()
    assert "](studies/digits-check-curve-test_accuracy.png)" in text
    assert "fl-proto, IID 1-shot: 60.00 at round 2 (2 seeds)" in text
    assert (tmp_path / "docs" / "studies" / "digits-check-curve-test_accuracy.png").is_file()
    page.write_text(text.replace("curve-test_accuracy", "curve-val_nonesuch"))
    code, _, err = run_cli(["study", "docs", "--root", str(tmp_path)], capsys)
    assert code == 2 and "'val_nonesuch'" in err and "test_accuracy, train_loss" in err
    assert len(err.strip().splitlines()) == 1


def test_a_curve_block_shows_each_untrained_control_as_a_band(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    """The untrained rows (rounds 0) keep no curve: their round-0 score on the curve's split is a band, in the
    figure and in the text (mean and interval over seeds); a score on another split is not drawn."""
    from tests.study.common import OWN_CONTROL

    (tmp_path / "docs").mkdir()
    (tmp_path / "studies").mkdir()
    study_path = write_study(tmp_path / "studies", OWN_CONTROL, "digits.yaml")
    page = tmp_path / "docs" / "page.md"
    page.write_text("<!-- study:digits-check:curve-test_accuracy begin -->\n"
                    "<!-- study:digits-check:curve-test_accuracy end -->\n")
    store = tmp_path / "studies" / "store"
    _put(store, study_path, "cpu", {("fl-proto", "IID 1-shot", 0): 0.5, ("fl-proto", "IID 1-shot", 1): 0.7}, history=True)
    for seed, accuracy in ((0, 0.3), (1, 0.4)):
        _put(store, study_path, "cpu", {("fl-proto, untrained", "IID 1-shot", seed): accuracy},
             summary={"initial_score": {"accuracy": accuracy, "split": "test"}})
    assert run_cli(["study", "docs", "--root", str(tmp_path)], capsys)[0] == 0
    text = page.read_text()
    assert "The untrained controls' test_accuracy at round 0, the grey bands" in text
    assert "(control) prototypes, IID 1-shot: 35.00 [" in text
    page.write_text("<!-- study:digits-check:curve-val_accuracy begin -->\n<!-- study:digits-check:curve-val_accuracy end -->\n")
    _put(store, study_path, "cpu", {("fl-maml", "IID 1-shot", 0): 0.5}, history=True,
         summary={"initial_score": {"accuracy": 0.2, "split": "val"}})  # trained: no band
    code, _, err = run_cli(["study", "docs", "--root", str(tmp_path)], capsys)
    assert code == 2 and "'val_accuracy'" in err  # the controls' val scores do not make a curve key


def test_a_curve_block_shows_a_one_seed_control_as_a_line(tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """A one-seed budget (the learning curves) has no interval for its controls: the figure draws the
    round-0 score as a line and the text says "(one seed)" rather than failing on the missing bounds."""
    from tests.study.common import OWN_CONTROL

    (tmp_path / "docs").mkdir()
    (tmp_path / "studies").mkdir()
    study_path = write_study(tmp_path / "studies", OWN_CONTROL, "digits.yaml")
    page = tmp_path / "docs" / "page.md"
    page.write_text("<!-- study:digits-check:curve-test_accuracy begin -->\n"
                    "<!-- study:digits-check:curve-test_accuracy end -->\n")
    store = tmp_path / "studies" / "store"
    _put(store, study_path, "cpu", {("fl-proto", "IID 1-shot", 0): 0.5}, history=True)
    _put(store, study_path, "cpu", {("fl-proto, untrained", "IID 1-shot", 0): 0.3},
         summary={"initial_score": {"accuracy": 0.3, "split": "test"}})
    assert run_cli(["study", "docs", "--root", str(tmp_path)], capsys)[0] == 0
    assert "(control) prototypes, IID 1-shot: 30.00 (one seed)" in page.read_text()
    assert (tmp_path / "docs" / "studies" / "digits-check-curve-test_accuracy.png").is_file()
