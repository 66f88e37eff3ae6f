"""The convergence rule of the converged benchmark (fedfew.study.convergence), on curves whose answer is
worked out by hand."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedfew.study.convergence import benchmark_budget, converged_budget


def test_a_plateau_converges_at_the_first_budget_whose_last_quarter_is_within_a_point_of_the_best() -> None:
    curve = [(0, 20.0), (10, 60.0), (20, 80.0), (30, 88.0), (40, 90.0), (50, 90.5), (60, 90.2), (70, 90.9), (80, 91.0)]
    found = converged_budget(curve)
    # b = 30: window (22.5, 30] = {88.0} < 91 - 1; b = 40: window (30, 40] = {90.0} >= 90.0: passes
    assert found.budget == 40 and found.best == 91.0 and found.best_round == 80 and found.cap == 80
    assert not found.still_rising  # before the last quarter (rounds <= 60): 90.5 >= 91 - 1


def test_a_curve_still_rising_at_its_cap_is_capped_and_marked() -> None:
    curve = [(10, 50.0), (20, 60.0), (30, 70.0), (40, 80.0)]
    found = converged_budget(curve)
    assert found.still_rising and found.budget == 40  # rounds <= 30 reach 70, the best is 80


def test_the_tolerance_and_the_tail_are_the_rule() -> None:
    curve = [(10, 80.0), (20, 85.0), (30, 86.5), (40, 87.0)]
    assert converged_budget(curve).budget == 30  # (22.5, 30]: 86.5 >= 86
    assert converged_budget(curve, tolerance=0.0).budget == 40
    assert converged_budget(curve, tolerance=2.5).budget == 20  # (15, 20]: 85 >= 84.5
    # a tail of a half: at b = 20 the window (10, 20] = {85}, within 2.5 of 87
    assert converged_budget(curve, tolerance=2.5, tail=0.5).budget == 20


def test_a_noisy_peak_early_counts_as_the_best() -> None:
    curve = [(5, 70.0), (10, 92.0), (15, 85.0), (20, 86.0)]  # the best at round 10, never reached again
    found = converged_budget(curve)
    assert found.budget == 10 and not found.still_rising and found.best_round == 10


@pytest.mark.parametrize("points, message", [([], "no evaluated round"), ([(1, 5.0), (1, 6.0)], "twice")])
def test_bad_curves_are_refused(points: list[tuple[int, float]], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        converged_budget(points)


def test_the_benchmarks_budget_is_the_largest_and_names_the_capped() -> None:
    plateau = converged_budget([(10, 80.0), (20, 90.0), (30, 90.5), (40, 90.6)])
    rising = converged_budget([(10, 50.0), (20, 60.0), (30, 70.0), (40, 80.0)])
    assert plateau.budget == 20
    assert benchmark_budget({"A": plateau, "B": rising}) == (40, ["B"])


def test_the_docs_view_applies_the_rule_to_every_stored_curve(tmp_path: Path) -> None:
    """Two runs of fl-proto with hand-worked curves: seed 0 the plateau above (budget 40), seed 1 still rising
    at its cap of 40; the study's one equal budget is the largest, 40, and seed 1 is marked."""
    from fedfew.study.collect import collect
    from fedfew.study.convergence import convergence_markdown
    from fedfew.study.grid import cells
    from fedfew.study.store import ResultStore, make_record
    from fedfew.study.study_file import load_study
    from tests.study.common import DIGITS_STUDY, HANDMADE, dumped, write_study

    curves = {0: [(10, 60.0), (20, 80.0), (30, 88.0), (40, 90.0), (50, 90.5), (60, 90.2), (70, 90.9), (80, 91.0)],
              1: [(10, 50.0), (20, 60.0), (30, 70.0), (40, 80.0)]}
    path = write_study(tmp_path, DIGITS_STUDY, "digits.yaml")
    study, root = load_study(path)
    empty = convergence_markdown(collect(study, root, tmp_path / "store", "cpu"), "digits.yaml")
    assert empty.startswith("*No run of the cpu budget has a val_accuracy curve yet*")
    store = ResultStore(tmp_path / "store", study.name)
    for cell in cells(study, root, "cpu"):
        if cell.method == "fl-proto" and cell.setting == "IID 1-shot":
            history = [{"round": r, "val_accuracy": v / 100} for r, v in curves[cell.seed]]
            store.put(make_record(study.name, "cpu", cell.method, cell.setting, cell.seed, cell.config_hash,
                                  dumped(cell), HANDMADE, {"test": {"accuracy": 0.5}}, 60.0, history))
    text = convergence_markdown(collect(study, root, tmp_path / "store", "cpu"), "digits.yaml")
    rows = [line for line in text.splitlines() if line.startswith("| fl-proto")]
    assert rows == ["| fl-proto | IID 1-shot | 0 | 40 | 91.00 | 80 | 80 |",
                    "| fl-proto | IID 1-shot | 1 | 40 (still rising) | 80.00 | 40 | 40 |"]
    assert "is **40 rounds**" in text and "Still rising at the cap (still rising): fl-proto, IID 1-shot, seed 1" in text
