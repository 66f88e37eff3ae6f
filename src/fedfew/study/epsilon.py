"""Accuracy against the privacy budget (``study:NAME:epsilon`` in the docs): for a study whose settings
differ in ``privacy`` alone (studies/privacy_fewshot.yaml), one panel per group of settings that are
otherwise the same, epsilon on the x-axis (no DP at the right, as epsilon = infinity), one line per
method (mean and 95% interval over seeds), and each method's own untrained control as a band of its
colour (its interval; the control does not depend on epsilon, as round 0 releases nothing)."""

from __future__ import annotations

import json
import math
from pathlib import Path

from fedfew.study.collect import StudyResults
from fedfew.study.grid import cells


def setting_epsilons(results: StudyResults, root: Path) -> dict[str, tuple[str, float]]:
    """{setting: (its group, its epsilon)}: the target epsilon of its private cells (infinity without DP),
    and a group shared by the settings whose configs differ only in ``privacy``, named by the first."""
    first: dict[str, tuple[str, float]] = {}
    groups: dict[str, str] = {}
    for cell in cells(results.study, root, results.budget):
        if cell.setting in first or not results.study.ranked(cell.method):
            continue
        config = cell.config
        data = config.model_dump(mode="json")
        for key in ("name", "privacy", "seed"):
            data.pop(key, None)
        key = cell.method + json.dumps(data, sort_keys=True)
        group = groups.setdefault(key, cell.setting)
        privacy = config.privacy
        epsilon = math.inf if not privacy.enabled else float(privacy.target_epsilon or _stored_epsilon(results, cell.setting))
        first[cell.setting] = (group, epsilon)
    return first


def _stored_epsilon(results: StudyResults, setting: str) -> float:
    """A private setting given by its noise multiplier: the largest epsilon its stored runs report."""
    spent = [e for (_, s), seeds in results.privacy.items() if s == setting for e, _ in seeds.values() if e > 0]
    return max(spent) if spent else math.nan


def _group_title(setting: str) -> str:
    """The group's panel title: its first setting's name without the epsilon part (", eps 4")."""
    return setting.rsplit(", eps", 1)[0]


def epsilon_figure(results: StudyResults, root: Path, path: Path) -> bool:
    """Draw the figure at ``path``; False (nothing drawn) when the store holds none of the cells."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not results.values:
        return False
    study = results.study
    placed = setting_epsilons(results, root)
    groups: dict[str, list[str]] = {}
    for setting in results.settings:
        groups.setdefault(placed[setting][0], []).append(setting)
    fig, axes = plt.subplots(1, len(groups), figsize=(3.6 * len(groups), 3.6), squeeze=False, sharey=True)
    palette = plt.get_cmap("tab10")
    methods = [m for m in results.methods if study.ranked(m)]
    for ax, (group, settings) in zip(axes[0], groups.items()):
        # Finite epsilons in increasing order, then no DP: equally spaced (1, 4, 8 and infinity have no
        # common scale); the tick labels give the values.
        ordered = sorted(settings, key=lambda s: placed[s][1])
        xs = list(range(len(ordered)))
        for i, method in enumerate(methods):
            colour = palette(i % palette.N)
            points = [(x, results.interval(method, s)) for x, s in zip(xs, ordered)]
            shown = [(x, b) for x, b in points if b is not None]
            if shown:
                low = [b.mean - (b.low if b.low is not None else b.mean) for _, b in shown]
                high = [(b.high if b.high is not None else b.mean) - b.mean for _, b in shown]
                ax.errorbar([x for x, _ in shown], [b.mean for _, b in shown], yerr=[low, high], color=colour,
                            marker="o", capsize=3, label=study.label(method))
            control = study.methods[method].control
            if control is not None and control in results.methods:
                bands = [(x, results.interval(control, s)) for x, s in zip(xs, ordered)]
                band = [(x, b) for x, b in bands if b is not None]
                if band:
                    ax.fill_between([x for x, _ in band], [b.low if b.low is not None else b.mean for _, b in band],
                                    [b.high if b.high is not None else b.mean for _, b in band], color=colour,
                                    alpha=0.15, linewidth=0, label=study.label(control))
                    ax.plot([x for x, _ in band], [b.mean for _, b in band], color=colour, linestyle=":", linewidth=1)
        ax.set_xticks(xs, [_epsilon_label(placed[s][1]) for s in ordered])
        ax.set_xlabel("ε (δ 1e-5 where private)" if any(math.isfinite(placed[s][1]) for s in ordered) else "ε")
        ax.set_title(_group_title(group), fontsize=9)
    axes[0, 0].set_ylabel(f"{study.metric} (%)")
    handles, labels = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 0.95), frameon=False)
    fig.suptitle(study.title or study.name, fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return True


def _epsilon_label(epsilon: float) -> str:
    return "∞ (no DP)" if math.isinf(epsilon) else f"{epsilon:g}"


def epsilon_markdown(results: StudyResults, image: str) -> str:
    """The docs block: the figure's link and what it shows (the figure itself is drawn by ``docs``)."""
    if not results.values:
        return f"*Not yet run at the {results.budget} budget*: no figure yet.\n"
    return (f"![{results.study.title or results.study.name}: accuracy against epsilon]({image})\n\n"
            f"Accuracy against ε ({results.budget} budget): per method its mean over seeds with the 95% interval, "
            "∞ without DP; the shaded band of the method's colour is its own untrained control (round 0), "
            "whose interval does not depend on ε.\n")
