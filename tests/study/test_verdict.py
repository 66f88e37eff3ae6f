"""Intervals over seeds and the verdict rule (fedfew.study.verdict): Student's t over seeds, the paired
difference, orders, chains and Holm's adjustment over a family, by hand."""

from __future__ import annotations

import math

import pytest

from fedfew.study.verdict import (
    HOLDS,
    NOT_RESOLVED,
    REVERSED,
    Interval,
    PairVerdict,
    adjust,
    chain_verdict,
    compare,
    judge_order,
    t_interval,
)
from tests.study.common import T1, T2


# -- the verdict rule, by hand ---------------------------------------------------------------------
def test_interval_is_students_t_over_seeds() -> None:
    one = t_interval([50.0])
    assert one.mean == 50.0 and one.half_width is None
    two = t_interval([50.0, 52.0])  # sd = sqrt(2), sd / sqrt(2) = 1
    assert two.mean == 51.0 and two.half_width == pytest.approx(T1)
    three = t_interval([1.0, 2.0, 3.0])  # sd 1
    assert three.half_width == pytest.approx(T2 / math.sqrt(3))


def test_paired_difference_holds_reverses_or_is_not_resolved() -> None:
    a = {0: 60.0, 1: 62.0, 2: 61.0}
    b = {0: 57.0, 1: 58.0, 2: 59.0}
    # d = 3, 4, 2: mean 3, sd 1, half-width 4.3027 / sqrt 3 = 2.484: [0.52, 5.48] excludes 0
    v = compare(a, b, "A", "B")
    assert v.verdict == HOLDS
    assert v.difference.mean == pytest.approx(3.0) and v.difference.half_width == pytest.approx(T2 / math.sqrt(3))
    assert compare(b, a).verdict == REVERSED
    # d = 1, -1, 3: mean 1, sd 2, half-width 4.968: the interval holds 0
    assert compare({0: 51.0, 1: 49.0, 2: 53.0}, {0: 50.0, 1: 50.0, 2: 50.0}).verdict == NOT_RESOLVED
    # The seeds are paired: a large shared seed effect cancels (d = 1, 1.1, 0.9 although the means overlap)
    assert compare({0: 40.0, 1: 60.1, 2: 80.9}, {0: 39.0, 1: 59.0, 2: 80.0}).verdict == HOLDS
    # one paired seed (the others unpaired) is never enough
    assert compare({0: 90.0, 1: 91.0}, {0: 10.0, 2: 11.0}).verdict == NOT_RESOLVED
    assert compare({}, {0: 1.0}).verdict == NOT_RESOLVED


def test_an_order_holds_only_when_every_neighbouring_pair_holds() -> None:
    a, b, c = {0: 3.0, 1: 4.0, 2: 5.0}, {0: 2.0, 1: 3.0, 2: 4.1}, {0: 1.0, 1: 2.0, 2: 3.0}
    assert judge_order({"a": a, "b": b, "c": c}, ["a", "b", "c"])[0] == HOLDS
    noisy = {0: 1.5, 1: 3.5, 2: 2.0}  # b - noisy = 0.5, -0.5, 2.1: not resolved
    verdict, pairs = judge_order({"a": a, "b": b, "n": noisy}, ["a", "b", "n"])
    assert verdict == NOT_RESOLVED and [p.verdict for p in pairs] == [HOLDS, NOT_RESOLVED]
    assert judge_order({"a": a, "b": b, "c": c}, ["a", "c", "b"])[0] == REVERSED


def _link(mean: float, p: float | None, verdict: str = NOT_RESOLVED) -> PairVerdict:
    return PairVerdict("a", "b", verdict, Interval(mean, 1.0, 3), p)


# -- Holm over a family, the chain rule ---------------------------------------------------------------
def test_holm_over_a_family_by_hand() -> None:
    """Four one-link claims with p = 0.01, 0.04, 0.03, 0.005 (R's p.adjust: 0.03, 0.06, 0.06, 0.02): the
    first and the fourth stay resolved on the side of their mean, the others become not resolved; a
    link without a test is left out of the count."""
    family = [[_link(2.0, 0.01, HOLDS)], [_link(1.0, 0.04, HOLDS)], [_link(-1.0, 0.03, REVERSED)],
              [_link(-3.0, 0.005, REVERSED)], [_link(5.0, None)]]
    judged = adjust(family)
    assert [j[0].adjusted_p for j in judged] == pytest.approx([0.03, 0.06, 0.06, 0.02, None])
    assert [j[0].adjusted for j in judged] == [HOLDS, NOT_RESOLVED, NOT_RESOLVED, REVERSED, NOT_RESOLVED]
    assert [j[0].verdict for j in judged] == [HOLDS, HOLDS, REVERSED, REVERSED, NOT_RESOLVED]  # raw kept
    alone = adjust([[_link(1.0, 0.04, HOLDS)]])  # a family of one: Holm is the raw test
    assert alone[0][0].adjusted == HOLDS and alone[0][0].adjusted_p == 0.04


def test_the_chain_rule() -> None:
    assert chain_verdict([HOLDS, HOLDS]) == HOLDS
    assert chain_verdict([HOLDS, NOT_RESOLVED]) == NOT_RESOLVED
    assert chain_verdict([NOT_RESOLVED, REVERSED]) == REVERSED  # one reversed link reverses the chain
    assert chain_verdict([HOLDS, REVERSED]) == REVERSED
    assert chain_verdict([]) == NOT_RESOLVED
    # FRL's chain in the store: the first link not resolved (+2.09 ± 5.47), the second reversed (-9.60 ± 4.58)
    a, b, c = {0: 30.0, 1: 35.0, 2: 31.0}, {0: 29.0, 1: 30.0, 2: 30.0}, {0: 38.0, 1: 40.0, 2: 41.0}
    verdict, pairs = judge_order({"a": a, "b": b, "c": c}, ["a", "b", "c"])
    assert verdict == REVERSED and [p.verdict for p in pairs] == [NOT_RESOLVED, REVERSED]
