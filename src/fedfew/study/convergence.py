"""The convergence rule of the converged benchmark (ours, not a paper's; docs/benchmark.md, issue 50).

One long run per method records its validation accuracy every few rounds. A budget of b rounds is
*converged* when the best validation accuracy in the last quarter of those b rounds (rounds in
(0.75 b, b]) is within ``tolerance`` (1 point) of the best over the whole long run: training past b
buys less than a point. A method's converged budget is the smallest evaluated b that passes; the
benchmark's is the largest of its methods' (one equal budget for all). A run whose last quarter still
beats everything before it by more than the tolerance is **still rising at its cap**: its budget is
the cap, and the table marks it. Validation numbers only: the test score never enters the choice.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

#: The rule's defaults: within one point, over the last quarter.
TOLERANCE = 1.0
TAIL = 0.25


@dataclass(frozen=True)
class Convergence:
    """What the rule finds in one run's validation curve (accuracies in percent)."""

    #: The smallest evaluated round that passes the rule (the run's last round when it is still rising).
    budget: int
    #: The best validation accuracy over the whole run, and the round of its first occurrence.
    best: float
    best_round: int
    #: The run's last evaluated round: the cap.
    cap: int
    #: The last quarter of the run beats everything before it by more than the tolerance.
    still_rising: bool


def converged_budget(points: Sequence[tuple[int, float]], tolerance: float = TOLERANCE,
                     tail: float = TAIL) -> Convergence:
    """The rule on ``(round, validation accuracy in percent)`` points of one run (any order; rounds
    distinct, round 0 the untrained model if it is there)."""
    if not points:
        raise ValueError("converged_budget: no evaluated round")
    if not 0 < tail < 1 or tolerance < 0:
        raise ValueError(f"converged_budget: tail must lie in (0, 1) and tolerance be >= 0 (got {tail}, {tolerance})")
    ordered = sorted(points)
    rounds = [r for r, _ in ordered]
    if len(set(rounds)) != len(rounds):
        raise ValueError("converged_budget: a round is given twice")
    best = max(v for _, v in ordered)
    best_round = next(r for r, v in ordered if v == best)
    cap = rounds[-1]
    budget = cap
    for b in rounds:
        window = [v for r, v in ordered if (1 - tail) * b < r <= b]
        if window and max(window) >= best - tolerance:
            budget = b
            break
    before_tail = [v for r, v in ordered if r <= (1 - tail) * cap]
    still_rising = bool(before_tail) and max(before_tail) < best - tolerance
    return Convergence(budget=cap if still_rising else budget, best=best, best_round=best_round, cap=cap,
                       still_rising=still_rising)


def benchmark_budget(found: dict[str, Convergence]) -> tuple[int, list[str]]:
    """The one equal budget for all methods (the largest converged budget) and the methods still rising
    at their cap, which the table marks."""
    if not found:
        raise ValueError("benchmark_budget: no method")
    return max(c.budget for c in found.values()), sorted(m for m, c in found.items() if c.still_rising)
