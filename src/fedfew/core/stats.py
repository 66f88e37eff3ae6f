"""Every interval and test of fedfew's numbers, in one place, on numpy and scipy (no fedfew imports).

- over test episodes (a run's score): the normal interval ``1.96 std / sqrt(T)`` (:func:`normal_half_width`)
  and, for an accuracy over labelled samples, Wilson's score interval (:func:`wilson`);
- over seeds (a study's cell): Student's t (:func:`t_interval`) and, for an accuracy, the same interval on
  the angular scale ``asin(sqrt(p))``, which stays inside [0, 1] (:func:`angular_t_interval`);
- a claim "A above B": the paired t-test over seeds (:func:`paired_t`) and Holm's step-down adjustment over
  a family of such tests (:func:`holm`);
- the benchmark's aggregate view: the interquartile mean (:func:`iqm`), ranks (:func:`ranks`), the
  probability that one method beats another (:func:`probability_of_improvement`) and a two-level
  bootstrap over settings and seeds (:func:`bootstrap_indices`).

``evaluation`` (a run's numbers) uses the first two, so this module is part of the code version that
keys the result store (``fedfew.core.codeversion``): an edit of code here (not of a docstring or comment)
moves every study's version, to be checked with ``fedfew study verify``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from types import ModuleType

import numpy as np


def _scipy_stats() -> ModuleType:
    """scipy.stats, imported on first use: a run that computes no t-interval never pays its second of
    import time (issue 42)."""
    from scipy import stats

    return stats


#: The two-sided 95% normal quantile few-shot papers write as 1.96 (not 1.959963...): a run's
#: ``ci95`` over test episodes is computed with it, so it stays this literal.
Z95 = 1.96


def normal_half_width(std: float, n: int, z: float = Z95) -> float:
    """``z * std / sqrt(n)``: the half-width of the normal interval of a mean of ``n`` values of
    (population) standard deviation ``std``, as few-shot papers report over test episodes."""
    return z * std / math.sqrt(n)


def wilson(successes: int, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson's score interval for a binomial proportion (95% at z = 1.96): unlike p +- z sqrt(p(1-p)/n)
    it stays inside [0, 1] and does not collapse to a point at 0 or n successes (Newcombe 1998, method 3)."""
    if n <= 0 or not 0 <= successes <= n:
        raise ValueError(f"wilson interval needs 0 <= successes <= n and n > 0 (got {successes} of {n})")
    p = successes / n
    denominator = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denominator
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denominator
    return max(0.0, centre - half), min(1.0, centre + half)


def t_quantile(level: float, df: int) -> float:
    """The two-sided ``level`` quantile of Student's t with ``df`` degrees of freedom (t(0.975, 2) = 4.3027)."""
    return float(_scipy_stats().t.ppf(0.5 + level / 2, df))


def _mean_sd(values: Sequence[float]) -> tuple[float, float]:
    # Plain Python sums, as the study reports always computed them: the same values give the same digits.
    n = len(values)
    mean = sum(values) / n
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))


def t_interval(values: Sequence[float], level: float = 0.95) -> tuple[float, float | None]:
    """(mean, half-width of the ``level`` Student-t interval of the mean); the half-width is None for one
    value (no spread to measure)."""
    n = len(values)
    if n == 0:
        raise ValueError("no values")
    if n < 2:
        return sum(values) / n, None
    mean, sd = _mean_sd(values)
    return mean, t_quantile(level, n - 1) * sd / math.sqrt(n)


def angular_t_interval(fractions: Sequence[float], level: float = 0.95) -> tuple[float, float] | None:
    """A ``level`` interval for the mean of proportions in [0, 1] that stays inside [0, 1]: Student's t on
    the angular scale a = asin(sqrt(p)) (the variance-stabilising transform of a proportion), its ends
    clipped to [0, pi/2] and mapped back by sin(a)^2. Unlike the logit it is finite at 0 and 1 (a cell
    at 100% on every seed is the point [1, 1]). None for fewer than two values."""
    if len(fractions) < 2:
        return None
    if any(not 0.0 <= p <= 1.0 for p in fractions):
        raise ValueError(f"angular interval needs proportions in [0, 1] (got {list(fractions)})")
    angles = [math.asin(math.sqrt(p)) for p in fractions]
    centre, half = t_interval(angles, level)
    assert half is not None
    low, high = max(0.0, centre - half), min(math.pi / 2, centre + half)
    return math.sin(low) ** 2, math.sin(high) ** 2


@dataclass(frozen=True)
class PairedTest:
    """The paired comparison of two methods over seeds: the mean of the per-seed differences, the
    half-width of its Student-t interval and the two-sided p-value of "mean difference = 0"."""

    mean: float
    half_width: float | None  # None with fewer than 2 pairs
    p_value: float | None  # None with fewer than 2 pairs
    n: int


def paired_t(differences: Sequence[float], level: float = 0.95) -> PairedTest:
    """The paired t-test of ``differences`` (a_s - b_s over seeds s): scipy's one-sample t-test against 0,
    two-sided, with the interval of the mean difference. Its p-value is below 1 - ``level`` exactly when
    the interval excludes 0. Differences with no spread give p = 0 (or 1 when they are all 0): scipy
    would divide by zero there."""
    n = len(differences)
    if n == 0:
        raise ValueError("no differences")
    mean, half = t_interval(differences, level)
    if half is None:
        return PairedTest(mean, None, None, n)
    if half == 0.0:
        return PairedTest(mean, half, 1.0 if mean == 0.0 else 0.0, n)
    p = float(_scipy_stats().ttest_1samp(np.asarray(differences, dtype=float), 0.0).pvalue)
    return PairedTest(mean, half, p, n)


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's (1979) step-down adjusted p-values, in the order given: sort ascending, multiply the i-th
    smallest (i = 0, 1, ...) by m - i, carry the running maximum, cap at 1. Hypothesis i is rejected at
    family-wise level alpha when its adjusted p-value is below alpha; with one test it is its own p."""
    m = len(p_values)
    order = sorted(range(m), key=lambda i: p_values[i])
    adjusted = [0.0] * m
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p_values[i]))
        adjusted[i] = running
    return adjusted


def iqm(values: np.ndarray, axis: int | None = None) -> np.ndarray | float:
    """The interquartile mean: the mean of the middle half of the values, a quarter cut from each end
    (scipy's ``trim_mean(x, 0.25)``, as rliable computes it). Robust to a few outlying runs, less noisy
    than the median."""
    result = _scipy_stats().trim_mean(values, 0.25, axis=axis)
    return float(result) if axis is None else result


def ranks(scores: np.ndarray) -> np.ndarray:
    """Ranks along the last axis, 1 for the highest score, ties sharing their mean rank."""
    return _scipy_stats().rankdata(-scores, axis=-1, method="average")


def probability_of_improvement(x: np.ndarray, y: np.ndarray) -> float:
    """P(X > Y) + P(X = Y) / 2 for one draw of X from ``x`` and one of Y from ``y`` (the Mann-Whitney U
    over n_x n_y), averaged over the first axis (settings): shape (settings, runs) each."""
    greater = (x[:, :, None] > y[:, None, :]).mean(axis=(1, 2))
    equal = (x[:, :, None] == y[:, None, :]).mean(axis=(1, 2))
    return float(np.mean(greater + equal / 2))


def bootstrap_indices(rng: np.random.Generator, settings: int, seeds: int, reps: int) -> tuple[np.ndarray, np.ndarray]:
    """``reps`` draws of a two-level bootstrap over a (settings x seeds) grid: the settings drawn with
    replacement, then within each drawn setting its seeds drawn with replacement (stratified: a setting
    keeps its own seeds; one draw of seed indices serves every method, so the methods stay paired on a
    seed's partition and test tasks). Returns (settings index (reps, settings), seeds index (reps,
    settings, seeds))."""
    setting_index = rng.integers(0, settings, size=(reps, settings))
    seed_index = rng.integers(0, seeds, size=(reps, settings, seeds))
    return setting_index, seed_index


def percentile_interval(replicates: np.ndarray, level: float = 0.95, axis: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """The percentile bootstrap interval: the (1 - level) / 2 and (1 + level) / 2 quantiles of the
    replicates along ``axis``."""
    tail = (1 - level) / 2
    return np.quantile(replicates, tail, axis=axis), np.quantile(replicates, 1 - tail, axis=axis)
