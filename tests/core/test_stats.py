"""fedfew.core.stats, the one statistics module: against published values (Newcombe's Wilson intervals,
Student's sleep data, Holm's adjustment as R's p.adjust gives it, t tables), against the formulas the
numbers path used before it (exactly equal: no stored number may move), and by hand."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
import torch

from fedfew.core import stats
from fedfew.fewshot.evaluation import Score, mean_ci95, wilson, with_interval


# -- published values ----------------------------------------------------------------------------------
@pytest.mark.parametrize("successes, n, low, high", [
    # Newcombe (1998), "Two-sided confidence intervals for the single proportion", Stat. Med. 17:857-872,
    # Table I, method 3 (score interval without continuity correction), to 4 decimals
    (81, 263, 0.2553, 0.3662),
    (15, 148, 0.0624, 0.1605),
    (0, 20, 0.0000, 0.1611),
    (1, 29, 0.0061, 0.1718),
])
def test_wilson_interval_is_newcombes(successes: int, n: int, low: float, high: float) -> None:
    got = stats.wilson(successes, n)
    assert round(got[0], 4) == low and round(got[1], 4) == high


def test_t_quantiles_are_the_tables() -> None:
    # two-sided 95% points of Student's t (any table: df 1, 2, 9, 30)
    for df, value in ((1, 12.706), (2, 4.303), (9, 2.262), (30, 2.042)):
        assert round(stats.t_quantile(0.95, df), 3) == value


def test_paired_t_on_students_sleep_data() -> None:
    """Cushny & Peebles' hours of extra sleep under two drugs (Student 1908; R's ``sleep``): R's
    ``t.test(extra ~ group, data = sleep, paired = TRUE)`` gives t = -4.0621, df = 9, p = 0.002833,
    95% interval -2.4598858 to -0.7001142, mean difference -1.58."""
    drug1 = [0.7, -1.6, -0.2, -1.2, -0.1, 3.4, 3.7, 0.8, 0.0, 2.0]
    drug2 = [1.9, 0.8, 1.1, 0.1, -0.1, 4.4, 5.5, 1.6, 4.6, 3.4]
    test = stats.paired_t([a - b for a, b in zip(drug1, drug2)])
    assert test.mean == pytest.approx(-1.58) and test.n == 10
    assert round(test.p_value, 6) == 0.002833
    assert test.half_width is not None
    assert round(test.mean - test.half_width, 7) == -2.4598858 and round(test.mean + test.half_width, 7) == -0.7001142


def test_holm_adjusts_as_the_literature_does() -> None:
    """Holm (1979)'s step-down procedure on the usual textbook example: p = 0.01, 0.04, 0.03, 0.005 at
    alpha 0.05 rejects the first and the fourth (0.005 < 0.05/4, 0.01 < 0.05/3, 0.03 > 0.05/2 stops);
    R's ``p.adjust(c(0.01, 0.04, 0.03, 0.005), "holm")`` is 0.03 0.06 0.06 0.02."""
    adjusted = stats.holm([0.01, 0.04, 0.03, 0.005])
    assert adjusted == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert [p < 0.05 for p in adjusted] == [True, False, False, True]
    assert stats.holm([0.2]) == [0.2]  # one test: its own p
    assert stats.holm([0.9, 0.8]) == [1.0, 1.0]  # capped at 1
    assert stats.holm([]) == []


# -- the numbers path: exactly the formulas every stored run used ----------------------------------------
def _old_mean_ci95(values: list[float]) -> Score:
    """evaluation.mean_ci95 before fedfew.core.stats, verbatim."""
    v = torch.as_tensor(list(values), dtype=torch.float64)
    std = float(v.std(unbiased=False)) if len(v) > 1 else 0.0
    return Score(float(v.mean()), 1.96 * std / math.sqrt(len(v)), len(v))


def _old_wilson(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """evaluation.wilson before fedfew.core.stats, verbatim."""
    p = successes / n
    denominator = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denominator
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denominator
    return max(0.0, centre - half), min(1.0, centre + half)


def test_run_intervals_are_bit_identical_to_the_formulas_before() -> None:
    rng = random.Random(0)
    for _ in range(2000):
        size = rng.randint(1, 400)
        # episode accuracies: multiples of 1/queries, as a run's are, and arbitrary floats
        queries = rng.choice([5, 25, 75, 3])
        values = [rng.randint(0, queries) / queries for _ in range(size)] if rng.random() < 0.7 else \
            [rng.random() for _ in range(size)]
        new, old = mean_ci95(values), _old_mean_ci95(values)
        assert (new.mean, new.ci95, new.n) == (old.mean, old.ci95, old.n)  # exactly, not approximately
    for _ in range(5000):
        n = rng.randint(1, 20000)
        k = rng.randint(0, n)
        assert wilson(k, n) == _old_wilson(k, n) == stats.wilson(k, n)
    scores = with_interval({"accuracy": 0.3080}, samples=263)
    assert scores["ci_low"] == stats.wilson(81, 263)[0] and scores["ci_method"] == "Wilson, 263 samples"


# -- intervals over seeds ------------------------------------------------------------------------------
def test_t_interval_by_hand() -> None:
    assert stats.t_interval([50.0]) == (50.0, None)
    mean, half = stats.t_interval([1.0, 2.0, 3.0])  # sd 1
    assert mean == 2.0 and half == pytest.approx(4.302652729 / math.sqrt(3))
    with pytest.raises(ValueError):
        stats.t_interval([])


def test_angular_interval_stays_inside_0_1_and_is_t_on_the_angular_scale() -> None:
    p = [0.5, 0.6, 0.7]
    angles = [math.asin(math.sqrt(x)) for x in p]
    centre = sum(angles) / 3
    sd = math.sqrt(sum((a - centre) ** 2 for a in angles) / 2)
    half = 4.302652729749462 * sd / math.sqrt(3)
    low, high = stats.angular_t_interval(p)
    assert low == pytest.approx(math.sin(centre - half) ** 2) and high == pytest.approx(math.sin(centre + half) ** 2)
    # a 56.07 +- 113.48 kind of cell: two seeds far apart; Student's t runs past 0 and 100
    wide = [0.10, 0.99]
    mean, t_half = stats.t_interval(wide)
    assert t_half is not None and mean - t_half < 0 and mean + t_half > 1
    low, high = stats.angular_t_interval(wide)
    assert 0.0 <= low < 0.10 and 0.99 < high <= 1.0
    assert stats.angular_t_interval([1.0, 1.0, 1.0]) == (1.0, 1.0)  # the logit would be infinite here
    assert stats.angular_t_interval([0.0, 0.0]) == (0.0, 0.0)
    assert stats.angular_t_interval([0.3]) is None
    # mirrored data give the mirrored interval
    a, b = stats.angular_t_interval([0.2, 0.3, 0.35]), stats.angular_t_interval([0.8, 0.7, 0.65])
    assert a[0] == pytest.approx(1 - b[1]) and a[1] == pytest.approx(1 - b[0])
    rng = random.Random(1)
    for _ in range(500):
        values = [rng.random() ** rng.choice([0.2, 1, 5]) for _ in range(rng.randint(2, 6))]
        low, high = stats.angular_t_interval(values)
        assert 0.0 <= low <= high <= 1.0
    with pytest.raises(ValueError):
        stats.angular_t_interval([0.5, 1.5])


def test_paired_t_agrees_with_its_interval_and_handles_no_spread() -> None:
    rng = random.Random(2)
    for _ in range(300):
        d = [rng.gauss(1.0, 2.0) for _ in range(rng.randint(2, 5))]
        test = stats.paired_t(d)
        excludes_0 = test.mean - test.half_width > 0 or test.mean + test.half_width < 0
        assert (test.p_value < 0.05) == excludes_0
    assert stats.paired_t([2.0, 2.0, 2.0]).p_value == 0.0  # every seed the same gain: certain
    assert stats.paired_t([0.0, 0.0]).p_value == 1.0  # the same run twice: nothing to see
    assert stats.paired_t([1.0]).p_value is None


# -- the aggregate view's estimators --------------------------------------------------------------------
def test_iqm_ranks_and_probability_of_improvement_by_hand() -> None:
    assert stats.iqm(np.arange(1.0, 9.0)) == pytest.approx(4.5)  # (3 + 4 + 5 + 6) / 4
    assert stats.iqm(np.array([0.0, 0.0, 0.0, 100.0])) == 0.0  # the outlier is cut
    assert stats.iqm(np.array([[1.0, 10.0], [2.0, 20.0], [3.0, 30.0], [4.0, 40.0]]), axis=0) == pytest.approx([2.5, 25.0])
    assert stats.ranks(np.array([3.0, 1.0, 2.0])).tolist() == [1.0, 3.0, 2.0]
    assert stats.ranks(np.array([[5.0, 5.0, 1.0]])).tolist() == [[1.5, 1.5, 3.0]]
    # x = 1, 2, 3 against y = 2, 2, 2: of 9 pairs 3 greater, 3 tied -> 3/9 + 1.5/9
    assert stats.probability_of_improvement(np.array([[1.0, 2.0, 3.0]]), np.array([[2.0, 2.0, 2.0]])) == pytest.approx(0.5)
    # averaged over settings: always above in the first, never in the second
    assert stats.probability_of_improvement(np.array([[9.0], [0.0]]), np.array([[1.0], [1.0]])) == pytest.approx(0.5)


def test_bootstrap_draws_are_seeded_stratified_and_percentile() -> None:
    a = stats.bootstrap_indices(np.random.default_rng(0), 12, 3, 50)
    b = stats.bootstrap_indices(np.random.default_rng(0), 12, 3, 50)
    assert all((x == y).all() for x, y in zip(a, b))
    settings, seeds = a
    assert settings.shape == (50, 12) and seeds.shape == (50, 12, 3)
    assert settings.min() >= 0 and settings.max() <= 11 and seeds.min() >= 0 and seeds.max() <= 2
    low, high = stats.percentile_interval(np.arange(1001.0))
    assert (low, high) == pytest.approx((25.0, 975.0))
