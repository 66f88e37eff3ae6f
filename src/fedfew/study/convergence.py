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

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from fedfew.study.collect import StudyResults

#: The rule's defaults: within one point, over the last quarter.
TOLERANCE = 1.0
TAIL = 0.25
#: How a table marks a run whose budget is its cap because it was still rising there.
STILL_RISING = "still rising"


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


def validation_points(rows: Sequence[Mapping[str, object]], key: str = "val_accuracy") -> list[tuple[int, float]]:
    """``(round, key in percent)`` of one run's evaluated rounds (a record's ``history``), where it has one."""
    return [(int(str(row["round"])), 100.0 * float(value)) for row in rows
            if isinstance(value := row.get(key), (int, float)) and math.isfinite(value)]


def convergence_markdown(results: StudyResults, study_path: str, key: str = "val_accuracy") -> str:
    """The rule applied to every stored run of a budget with a validation curve: per method, setting and
    seed, the converged budget, the best validation accuracy and its round, the cap and whether the run
    is still rising there; then the budget's one equal budget (the largest) and the methods still rising.
    The ``:convergence`` docs view (docs/benchmark.md, docs/calibration.md)."""
    budget = results.budget
    found: dict[str, Convergence] = {}
    lines = [f"| method | setting | seed | converged budget (round) | best {key} (%) | at round | cap (round) |",
             "|---|---|---|---|---|---|---|"]
    for (method, setting), per_seed in sorted(results.histories.items(), key=lambda item: results.table_order(item[0])):
        for seed, rows in sorted(per_seed.items()):
            points = validation_points(rows, key)
            if not points:
                continue
            rule = converged_budget(points)
            found[f"{results.study.label(method)}, {setting}, seed {seed}"] = rule
            mark = f" ({STILL_RISING})" if rule.still_rising else ""
            lines.append(f"| {results.study.label(method)} | {setting} | {seed} | {rule.budget}{mark} | "
                         f"{rule.best:.2f} | {rule.best_round} | {rule.cap} |")
    if not found:
        return (f"*No run of the {budget} budget has a {key} curve yet*: `fedfew study run {study_path} --budget "
                f"{budget}`, then `fedfew study docs`.\n")
    largest, still_rising = benchmark_budget(found)
    tail = (f" Still rising at the cap ({STILL_RISING}): {'; '.join(still_rising)}: the budget is capped there."
            if still_rising else " No run is still rising at its cap.")
    return ("\n".join(lines) + f"\n\nThe rule (fedfew.study.convergence: the best {key} in the last quarter of b "
            f"rounds within {TOLERANCE:g} point of the run's best) on the {budget} budget's "
            f"{len(found)} run{'' if len(found) == 1 else 's'}: one equal budget for all, the largest, is "
            f"**{largest} rounds**.{tail}\n")
