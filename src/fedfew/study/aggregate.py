"""One view of a study over all its settings (``study:NAME:aggregate``; docs/benchmark.md): per method
the mean rank and an aggregate score, each with a bootstrap 95% interval over seeds and settings, the
probability that the best method beats each other one, and a performance profile.

- **Normalised accuracy**: per setting s and seed k, (acc - c_s) / (b_s - c_s), where c_s is the mean
  over seeds of the setting's untrained control and b_s the highest mean over seeds of any ranked
  method there: 0 is the control, 1 the best method's mean (a run can go above 1 or below 0). The
  reference points are fixed from all the data, as rliable fixes its score normalisations.
- **Aggregate score**: the interquartile mean (IQM) of a method's normalised accuracies over every
  (setting, seed): the mean of the middle half, robust to a few outlying runs (Agarwal et al. 2021).
- **Mean rank**: per setting the methods ranked by their mean over seeds (1 = the best, ties sharing
  the mean rank), averaged over the settings.
- **P(best > X)**: per setting, the chance that a run of the best method (highest aggregate score) is
  more accurate than a run of X (ties count half; every pair of their seeds), averaged over settings.
- **Intervals**: the 2.5% and 97.5% percentiles over :data:`REPS` draws of a two-level bootstrap
  (:func:`fedfew.core.stats.bootstrap_indices`): the settings with replacement, then within each drawn setting
  its seeds with replacement, one seed draw for every method (seeds stay paired). The generator is
  numpy's ``default_rng(SEED)``, so the block is the same on every ``fedfew study docs``.

Rows a study keeps apart (``winners.apart``: scored by another protocol), its ceilings (``winners.ceilings``:
trained without federation), the control and the untrained rows (each method's own control) are not ranked.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fedfew.core import stats
from fedfew.study.collect import StudyResults
from fedfew.study.study_sections import CONTROL

#: Bootstrap draws, and the generator's seed (fixed: the docs block must not change between runs).
REPS = 2000
SEED = 0

#: (point estimate, low, high) of a bootstrap-interval statistic.
Estimate = tuple[float, float, float]


@dataclass(frozen=True)
class Aggregate:
    methods: list[str]  # ranked, by aggregate score, best first
    settings: list[str]
    seeds: list[int]
    best: str
    score: dict[str, Estimate]
    rank: dict[str, Estimate]
    improvement: dict[str, Estimate]  # P(best > method), the best's own left out
    #: (settings, seeds, methods in ``methods`` order): the normalised accuracies
    normalised: np.ndarray
    #: per setting: (control mean, best mean) the normalisation maps to 0 and 1
    references: dict[str, tuple[float, float]]


def _grid(results: StudyResults) -> tuple[list[str], list[int], np.ndarray, np.ndarray] | str:
    """(ranked methods, seeds, accuracies (settings, seeds, methods), control (settings, seeds)), or why
    there is no aggregate."""
    methods = [m for m in results.methods if results.study.competes(m)]
    if results.study.control is None:
        return "no untrained control to normalise against"
    if len(methods) < 2:
        return "fewer than two ranked methods"
    missing = sum(results.missing.values())
    if missing:
        return f"incomplete ({missing} cells not yet run); the aggregate needs every cell"
    cells = [(m, s) for s in results.settings for m in [*methods, CONTROL]]
    seeds = sorted(set.intersection(*(set(results.values.get(cell, {})) for cell in cells)))
    if len(seeds) < 2:
        return "fewer than two seeds common to every cell"
    acc = np.array([[[results.values[(m, s)][k] for m in methods] for k in seeds] for s in results.settings])
    control = np.array([[results.values[(CONTROL, s)][k] for k in seeds] for s in results.settings])
    return methods, seeds, acc, control


def aggregate(results: StudyResults, reps: int = REPS, seed: int = SEED) -> Aggregate | str:
    """The aggregate view of ``results`` (see the module's docstring), or a line saying why there is none."""
    grid = _grid(results)
    if isinstance(grid, str):
        return grid
    methods, seeds, acc, control = grid
    low = control.mean(axis=1)  # (settings,)
    high = acc.mean(axis=1).max(axis=1)
    flat = [s for s, lo, hi in zip(results.settings, low, high) if hi <= lo]
    if flat:
        return f"the control's mean is at or above every method's in {', '.join(flat)}: nothing to normalise by"
    normalised = (acc - low[:, None, None]) / (high - low)[:, None, None]
    n_settings, n_seeds, n_methods = acc.shape

    def score(norm: np.ndarray) -> np.ndarray:  # (..., settings, seeds, methods) -> (..., methods)
        return np.asarray(stats.iqm(norm.reshape(*norm.shape[:-3], n_settings * n_seeds, n_methods), axis=-2))

    def mean_rank(values: np.ndarray) -> np.ndarray:
        return stats.ranks(values.mean(axis=-2)).mean(axis=-2)

    point_score = score(normalised)
    order = sorted(range(n_methods), key=lambda m: -point_score[m])  # ties: the study's order
    best = order[0]

    def improvement(values: np.ndarray, other: int) -> np.ndarray:  # (..., settings, seeds, methods)
        a, b = values[..., best][..., :, None], values[..., other][..., None, :]
        return ((a > b).mean(axis=(-2, -1)) + (a == b).mean(axis=(-2, -1)) / 2).mean(axis=-1)

    rng = np.random.default_rng(seed)
    setting_index, seed_index = stats.bootstrap_indices(rng, n_settings, n_seeds, reps)
    drawn = acc[setting_index[:, :, None], seed_index]  # (reps, settings, seeds, methods)
    drawn_norm = normalised[setting_index[:, :, None], seed_index]
    score_low, score_high = stats.percentile_interval(score(drawn_norm))
    ranks_drawn = mean_rank(drawn)
    rank_low, rank_high = stats.percentile_interval(ranks_drawn)
    point_rank = mean_rank(acc)
    named = [methods[m] for m in order]
    improvements: dict[str, Estimate] = {}
    for m in order[1:]:
        lo, hi = stats.percentile_interval(improvement(drawn, m))
        improvements[methods[m]] = (stats.probability_of_improvement(acc[..., best], acc[..., m]), float(lo), float(hi))
    return Aggregate(
        methods=named, settings=list(results.settings), seeds=seeds, best=methods[best],
        score={methods[m]: (float(point_score[m]), float(score_low[m]), float(score_high[m])) for m in order},
        rank={methods[m]: (float(point_rank[m]), float(rank_low[m]), float(rank_high[m])) for m in order},
        improvement=improvements, normalised=normalised[:, :, order],
        references={s: (float(lo), float(hi)) for s, lo, hi in zip(results.settings, low, high)})


def _est(value: Estimate, digits: int = 2) -> str:
    return f"{value[0]:.{digits}f} [{value[1]:.{digits}f}, {value[2]:.{digits}f}]"


def aggregate_markdown(results: StudyResults, study_path: str, figure_link: str | None = None) -> str:
    """The aggregate block: how it is computed, the table (best aggregate score first) and the figure."""
    study = results.study
    if results.cells_found == 0:
        return (f"*{study.title or study.name}: not yet run at the {results.budget} budget*: "
                f"`fedfew study run {study_path} --budget {results.budget}`.\n")
    view = aggregate(results)
    head = f"Aggregate view of `{study_path}` at the {results.budget} budget"
    if isinstance(view, str):
        return f"{head}: none, {view}.\n"
    apart = [study.label(m) for m in study.winners.apart if m in results.methods]
    ceilings = [study.label(m) for m in study.winners.ceilings.values() if m in results.methods]
    n = len(view.settings) * len(view.seeds)
    lines = [
        f"{head}: {len(view.methods)} methods over its {len(view.settings)} settings x {len(view.seeds)} seeds "
        f"({', '.join(map(str, view.seeds))})" + (f"; not ranked: {', '.join(apart)} ({study.winners.why})" if apart
                                                   else "")
        + (f"; ceilings, not ranked: {', '.join(ceilings)}" if ceilings else "") + ". "
        "**Score**: each run's accuracy normalised in its setting, 0 = the untrained control's mean, 1 = the best "
        f"method's mean, and the interquartile mean (IQM) of a method's {n} normalised runs. **Mean rank**: the "
        "methods ranked per setting by their mean over seeds (1 = best), averaged over the settings. "
        f"**P({study.label(view.best)} > X)**: the chance that a run of the best-scoring method is more accurate "
        "than a run of X in the same setting (ties half), averaged over the settings. Intervals: 95% percentile "
        f"intervals of {REPS} draws of a two-level bootstrap (the settings with replacement, then each drawn "
        f"setting's seeds with replacement, paired across methods; numpy `default_rng({SEED})`). Statistics: "
        "numpy and scipy (`trim_mean`, `rankdata`), already dependencies; rliable would add a package and its "
        "stack for the same three estimators, which `tests/core/test_stats.py` checks by hand. docs/studies.md states "
        "the method.",
        "",
        f"| method | aggregate score (IQM of normalised accuracy) | mean rank (of {len(view.methods)}) | "
        f"P({study.label(view.best)} > method) |",
        "|---|---|---|---|",
    ]
    for m in view.methods:
        chance = _est(view.improvement[m]) if m in view.improvement else "—"
        lines.append(f"| {study.label(m)} | {_est(view.score[m])} | {_est(view.rank[m])} | {chance} |")
    text = "\n".join(lines) + "\n"
    if figure_link:
        text += f"\n![Performance profile: {study.title or study.name}]({figure_link})\n"
    return text


def profile_figure(results: StudyResults, path: Path) -> bool:
    """The performance profile: per method, the fraction of its (setting, seed) runs whose normalised
    accuracy exceeds tau, against tau, with a 95% bootstrap band (the same draws as the table)."""
    view = aggregate(results)
    if isinstance(view, str):
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    norm = view.normalised  # (settings, seeds, methods), methods best first
    taus = np.linspace(min(0.0, float(norm.min())), max(1.0, float(norm.max())), 121)
    rng = np.random.default_rng(SEED)
    setting_index, seed_index = stats.bootstrap_indices(rng, norm.shape[0], norm.shape[1], REPS)
    drawn = norm[setting_index[:, :, None], seed_index].reshape(REPS, -1, norm.shape[2])
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    palette = plt.get_cmap("tab10")
    for i, method in enumerate(view.methods):
        curve = (norm[:, :, i].reshape(-1)[None, :] > taus[:, None]).mean(axis=1)
        band = np.stack([(drawn[:, :, i] > tau).mean(axis=1) for tau in taus], axis=1)  # (reps, taus)
        low, high = stats.percentile_interval(band)
        ax.plot(taus, curve, color=palette(i % 10), label=results.study.label(method),
                linestyle="-" if i < 10 else "--")
        ax.fill_between(taus, low, high, color=palette(i % 10), alpha=0.12)
    ax.axvline(0.0, color="0.5", linewidth=0.8, linestyle=":")
    ax.axvline(1.0, color="0.5", linewidth=0.8, linestyle=":")
    ax.set_xlabel("normalised accuracy tau (0 = the setting's untrained control, 1 = its best method's mean)")
    ax.set_ylabel("fraction of runs (setting x seed) above tau")
    ax.set_title(f"Performance profile: {results.study.title or results.study.name}", fontsize=8)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return True
