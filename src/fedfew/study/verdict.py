"""Intervals over seeds and the rule that turns a claim into a verdict, raw and over its family.

The rule (docs/studies.md): a claim "A above B in setting S" is tested by a paired comparison over
seeds. For each seed s both cells ran on the same partition draw and the same fixed test tasks (the
seed decides both), so d_s = acc(A, s) - acc(B, s) removes the task-to-task variation they share.
With n >= 2 seeds, the 95% interval of the mean difference is mean(d) +- t(0.975, n-1) sd(d) / sqrt(n)
(Student's t). The claim **holds** when the whole interval is above 0, is **reversed** when it is
below 0, and is **not resolved** otherwise, or with fewer than 2 paired seeds: the raw verdict, which
is the paired t-test at level 0.05 (two-sided) read on the side of the mean difference.

A study's claims form families (all of its claims, or the ``families`` it declares); the adjusted
verdict tests every comparison of a family at once: Holm's step-down adjustment of the paired t-tests'
p-values (:func:`fedfew.core.stats.holm`), a comparison holding (or reversed) when its adjusted p-value is
below 0.05 and its mean difference is above (below) 0. The family-wise error, the chance that any
"holds" or "reversed" of the family is wrong, stays below 0.05 however many claims it has.

A claim of more than two methods (A > B > C, a *chain*) is judged on each neighbouring pair (its links):
it holds when every link holds, is reversed when any link is reversed, and is not resolved otherwise;
the same rule gives its raw verdict from the links' raw verdicts and its adjusted one from their
adjusted verdicts, and the report shows each link's beside the chain's.

An accuracy's interval over seeds is Student's t on the angular scale asin(sqrt(p)), mapped back
(:func:`fedfew.core.stats.angular_t_interval`): it stays inside [0, 100].
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from fedfew.core import stats

HOLDS, REVERSED, NOT_RESOLVED = "holds", "reversed", "not resolved"
VERDICTS = (HOLDS, REVERSED, NOT_RESOLVED)
#: The family-wise error level of the adjusted verdicts (and the raw test's level).
ALPHA = 0.05


@dataclass(frozen=True)
class Interval:
    """A mean and the half-width of its symmetric Student-t interval (a difference, or a metric that is
    not an accuracy)."""

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
    mean, half = stats.t_interval(values, level)
    return Interval(mean, half, len(values))


@dataclass(frozen=True)
class Bounds:
    """An accuracy's mean over seeds (in percent) and its 95% interval, inside [0, 100]: the angular
    Student-t interval (``low``/``high`` None for one value)."""

    mean: float
    low: float | None
    high: float | None
    n: int


def accuracy_interval(percents: Sequence[float], level: float = 0.95) -> Bounds:
    """The mean of accuracies given in percent and their interval inside [0, 100]
    (:func:`fedfew.core.stats.angular_t_interval`); values a hair outside [0, 100] from float sums are clipped."""
    if not percents:
        raise ValueError("no values")
    mean = sum(percents) / len(percents)
    ends = stats.angular_t_interval([min(1.0, max(0.0, v / 100.0)) for v in percents], level)
    if ends is None:
        return Bounds(mean, None, None, len(percents))
    return Bounds(mean, 100.0 * ends[0], 100.0 * ends[1], len(percents))


@dataclass(frozen=True)
class PairVerdict:
    """One comparison "``above`` is more accurate than ``below``": the raw verdict, the paired difference
    and its p-value, and, once its family is judged (:func:`adjust`), the Holm-adjusted p-value and verdict."""

    above: str
    below: str
    verdict: str
    difference: Interval | None  # of acc(above) - acc(below), over paired seeds
    p_value: float | None = None  # two-sided paired t-test; None with fewer than 2 paired seeds
    adjusted_p: float | None = None
    adjusted: str = NOT_RESOLVED


def compare(above: dict[int, float], below: dict[int, float], above_name: str = "A",
            below_name: str = "B") -> PairVerdict:
    """The raw verdict on "``above`` is more accurate than ``below``" from their per-seed values."""
    seeds = sorted(set(above) & set(below))
    if not seeds:
        return PairVerdict(above_name, below_name, NOT_RESOLVED, None)
    test = stats.paired_t([above[s] - below[s] for s in seeds])
    diff = Interval(test.mean, test.half_width, test.n)
    if diff.half_width is None:
        verdict = NOT_RESOLVED
    elif diff.low > 0:
        verdict = HOLDS
    elif diff.high < 0:
        verdict = REVERSED
    else:
        verdict = NOT_RESOLVED
    return PairVerdict(above_name, below_name, verdict, diff, test.p_value)


def chain_verdict(links: Sequence[str]) -> str:
    """The chain rule: a claim holds when every link holds, is reversed when any link is reversed, and
    is not resolved otherwise."""
    if links and set(links) == {HOLDS}:
        return HOLDS
    if REVERSED in links:
        return REVERSED
    return NOT_RESOLVED


def judge_order(values: dict[str, dict[int, float]], order: Sequence[str]) -> tuple[str, list[PairVerdict]]:
    """The raw verdict on ``order[0] > order[1] > ...`` and each neighbouring pair's."""
    pairs = [compare(values.get(a, {}), values.get(b, {}), a, b) for a, b in zip(order, order[1:])]
    return chain_verdict([p.verdict for p in pairs]), pairs


def adjust(family: Sequence[Sequence[PairVerdict]], alpha: float = ALPHA) -> list[list[PairVerdict]]:
    """Every link of a family of claims (each claim its list of links) with its Holm-adjusted p-value and
    verdict: Holm over the links that have a p-value (fewer than 2 paired seeds: no test, not resolved,
    and not counted in the family's size); a link holds (is reversed) when its adjusted p-value is below
    ``alpha`` and its mean difference is above (below) 0."""
    tested = [(i, j) for i, links in enumerate(family) for j, link in enumerate(links) if link.p_value is not None]
    adjusted_p = stats.holm([family[i][j].p_value for i, j in tested])  # type: ignore[misc]
    out = [[replace(link, adjusted_p=None, adjusted=NOT_RESOLVED) for link in links] for links in family]
    for (i, j), p in zip(tested, adjusted_p):
        link = family[i][j]
        mean = link.difference.mean if link.difference is not None else 0.0
        verdict = NOT_RESOLVED
        if p < alpha and mean > 0:
            verdict = HOLDS
        elif p < alpha and mean < 0:
            verdict = REVERSED
        out[i][j] = replace(link, adjusted_p=p, adjusted=verdict)
    return out
