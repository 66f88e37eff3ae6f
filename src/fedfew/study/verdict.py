"""Intervals over seeds and the one rule that turns a claim into a verdict.

The rule (docs/studies.md): a claim "A above B in setting S" is tested by a paired comparison over
seeds. For each seed s both cells ran on the same partition draw and the same fixed test tasks (the
seed decides both), so d_s = acc(A, s) - acc(B, s) removes the task-to-task variation they share.
With n >= 2 seeds, the 95% interval of the mean difference is mean(d) +- t(0.975, n-1) sd(d) / sqrt(n)
(Student's t). The claim **holds** when the whole interval is above 0, is **reversed** when it is
below 0, and is **not resolved** otherwise, or with fewer than 2 paired seeds. A claim with an order
of more than two methods (A > B > C) is judged on each neighbouring pair: it holds when every pair
holds, is reversed when any pair is reversed, and is not resolved otherwise.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from scipy import stats

HOLDS, REVERSED, NOT_RESOLVED = "holds", "reversed", "not resolved"


@dataclass(frozen=True)
class Interval:
    mean: float
    half_width: float | None  # None with a single value
    n: int

    @property
    def low(self) -> float:
        return self.mean - (self.half_width or 0.0)

    @property
    def high(self) -> float:
        return self.mean + (self.half_width or 0.0)


def t_interval(values: Sequence[float], level: float = 0.95) -> Interval:
    """Mean and half-width of the ``level`` Student-t interval of the mean (None for one value)."""
    n = len(values)
    if n == 0:
        raise ValueError("no values")
    mean = sum(values) / n
    if n < 2:
        return Interval(mean, None, n)
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    return Interval(mean, float(stats.t.ppf(0.5 + level / 2, n - 1)) * sd / math.sqrt(n), n)


@dataclass(frozen=True)
class PairVerdict:
    above: str
    below: str
    verdict: str
    difference: Interval | None  # of acc(above) - acc(below), over paired seeds


def compare(above: dict[int, float], below: dict[int, float], above_name: str = "A",
            below_name: str = "B") -> PairVerdict:
    """The verdict on "``above`` is more accurate than ``below``" from their per-seed values."""
    seeds = sorted(set(above) & set(below))
    if not seeds:
        return PairVerdict(above_name, below_name, NOT_RESOLVED, None)
    diff = t_interval([above[s] - below[s] for s in seeds])
    if diff.half_width is None:
        verdict = NOT_RESOLVED
    elif diff.low > 0:
        verdict = HOLDS
    elif diff.high < 0:
        verdict = REVERSED
    else:
        verdict = NOT_RESOLVED
    return PairVerdict(above_name, below_name, verdict, diff)


def judge_order(values: dict[str, dict[int, float]], order: Sequence[str]) -> tuple[str, list[PairVerdict]]:
    """The verdict on ``order[0] > order[1] > ...`` and each neighbouring pair's."""
    pairs = [compare(values.get(a, {}), values.get(b, {}), a, b) for a, b in zip(order, order[1:])]
    verdicts = {p.verdict for p in pairs}
    if verdicts == {HOLDS}:
        return HOLDS, pairs
    if REVERSED in verdicts:
        return REVERSED, pairs
    return NOT_RESOLVED, pairs
