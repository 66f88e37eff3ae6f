"""How one number of a study's tables is written: the mean over seeds and its interval, the marks a
cell carries (round 0 selected, its privacy guarantee), a method's label marked as its cell is, and
the legends a table with such marks ends with."""

from __future__ import annotations

from collections.abc import Iterable

from fedfew.study.collect import StudyResults
from fedfew.study.study_sections import parse_metric
from fedfew.study.verdict import Bounds, Interval

#: The mark on a cell whose trained runs selected round 0 (:func:`round0_mark`), and what it means.
ROUND0 = "†"
ROUND0_LEGEND = (f"{ROUND0} round 0 selected: the untrained model scored best on validation, so the cell is the "
                 f"untrained model's score, not a trained one's ({ROUND0}k/n: in k of its n seeds).")


def at_selected_round(path: str) -> bool:
    """Whether a metric path reads the selected round's numbers (test.*, selected_score), not the
    last evaluated round's or the initial model's, which a round-0 selection does not change."""
    return parse_metric(path)[0][0] not in ("history", "initial_score", "final_score")


def round0_mark(results: StudyResults, method: str, setting: str, seeds: Iterable[int], path: str) -> str:
    """" †" when every one of ``seeds`` (the cell's values) comes from a trained run that selected round
    0, " †k/n" when k of the n did, "" when none did or ``path`` does not read the selected round."""
    shown = set(seeds)
    k = len(results.round0.get((method, setting), set()) & shown)
    if not k or not at_selected_round(path):
        return ""
    return f" {ROUND0}" if k == len(shown) else f" {ROUND0}{k}/{len(shown)}"


def cell_text(results: StudyResults, method: str, setting: str) -> str:
    """A cell of the main table: mean [interval], marked when its runs selected round 0, with its
    guarantee (epsilon, delta) when its runs were private."""
    seeds = results.values.get((method, setting), {})
    return (format_accuracy(results.interval(method, setting))
            + round0_mark(results, method, setting, seeds, results.study.metric_of(method, setting))
            + privacy_mark(results, method, setting))


def privacy_mark(results: StudyResults, method: str, setting: str) -> str:
    """" (ε 3.99, δ 1e-05)" for a cell whose runs were private: the largest epsilon over its seeds (one
    solved noise multiplier gives every seed the same) and its delta, then, where the accounting
    amplified by sampling, the largest epsilon with no amplification ("ε 12.61 unamplified"), then what
    the guarantee covers; "" for a cell without DP."""
    budgets = results.privacy.get((method, setting))
    if not budgets:
        return ""
    epsilon = max(e for e, _ in budgets.values())
    deltas = sorted({d for _, d in budgets.values()})
    notes = []
    unamplified = results.privacy_no_amplification.get((method, setting), {})
    if unamplified and (worst := max(unamplified.values())) > epsilon + 0.005:  # equal when nothing amplified
        notes.append(f"ε {worst:.2f} {UNAMPLIFIED}")
    notes += sorted(results.privacy_covers.get((method, setting), set()))
    return f" (ε {epsilon:.2f}, δ {'/'.join(f'{d:g}' for d in deltas)}" + "".join(f"; {n}" for n in notes) + ")"


#: Beside a cell's epsilon: the same noise and rounds accounted with no amplification by sampling.
UNAMPLIFIED = "unamplified"


#: Under a table with a private cell: what its (ε, δ) is.
PRIVACY_LEGEND = ("(ε, δ): the cell's client-level differential-privacy guarantee, from its runs' summaries (the "
                  "accountant's epsilon after the rounds run, the largest over seeds; docs/privacy.md); a cell "
                  "without it is not private. A round-0 row under DP has ε 0: it released nothing the clients made. "
                  f"\"ε X {UNAMPLIFIED}\": the same runs' epsilon with no amplification by sampling (the most "
                  "rounds any client took part in, each a full Gaussian release), shown where the accounting "
                  "amplified: what the guarantee is against anyone who learns who took part.")


def marked_label(results: StudyResults, method: str, setting: str) -> str:
    """A method's label where a verdict or a winner uses its cell, marked as the cell is."""
    seeds = results.values.get((method, setting), {})
    return results.study.label(method) + round0_mark(results, method, setting, seeds,
                                                     results.study.metric_of(method, setting))


def table_legend(text: str) -> str:
    """The round-0 legend line when ``text`` (a table) holds a marked cell, and the privacy legend when it
    holds a private one."""
    lines = [ROUND0_LEGEND] if ROUND0 in text else []
    lines += [PRIVACY_LEGEND] if " (ε " in text else []
    return "".join(f"\n{line}\n" for line in lines)


def format_interval(interval: Interval | None) -> str:
    if interval is None:
        return "—"
    if interval.half_width is None:
        return f"{interval.mean:.2f} (1 seed)"
    return f"{interval.mean:.2f} ± {interval.half_width:.2f}"


def format_accuracy(bounds: Bounds | None) -> str:
    """An accuracy over seeds: the mean and its interval inside [0, 100], ``61.00 [48.45, 72.87]``."""
    if bounds is None:
        return "—"
    if bounds.low is None or bounds.high is None:
        return f"{bounds.mean:.2f} (1 seed)"
    return f"{bounds.mean:.2f} [{bounds.low:.2f}, {bounds.high:.2f}]"


#: How the tables' accuracies over seeds are summarised, in words (the status lines).
ACCURACY_INTERVAL = ("mean and 95% interval over seeds [low, high] (Student's t on the angular scale asin √p, "
                     "so it stays inside [0, 100])")
