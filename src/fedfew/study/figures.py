"""A study's figures: bars of ours (mean and 95% interval per setting and method, the paper's numbers as
marks), and a history number's curve over rounds, the mean over seeds with its band."""

from __future__ import annotations

import math
import textwrap
from pathlib import Path

from fedfew.study.collect import StudyResults
from fedfew.study.study_sections import CONTROL
from fedfew.study.verdict import Bounds, accuracy_interval, t_interval

#: Settings per panel of a bar figure: a study with more (the benchmark's 12 columns) wraps onto
#: further rows of panels instead of one strip too wide to read.
SETTINGS_PER_PANEL = 4
#: The widest a panel is drawn (inches), however many bars it holds.
MAX_PANEL_WIDTH = 16.0


def setting_panels(settings: list[str], most: int = SETTINGS_PER_PANEL) -> list[list[str]]:
    """The settings in order, cut into the fewest panels of at most ``most`` each, as even as they can
    be (6 settings: 3 + 3, not 4 + 2)."""
    count = max(1, math.ceil(len(settings) / most))
    size, extra = divmod(len(settings), count)
    panels, start = [], 0
    for k in range(count):
        end = start + size + (1 if k < extra else 0)
        panels.append(settings[start:end])
        start = end
    return panels


def figure(results: StudyResults, path: Path) -> bool:
    """Bars of ours (mean, 95% interval) per setting and method, the paper's numbers as markers; at
    most ``SETTINGS_PER_PANEL`` settings a panel, panels stacked, one legend for all."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    study = results.study
    rows = list(results.methods) + ([CONTROL] if study.control is not None else [])
    if not results.values:
        return False
    panels = setting_panels(list(results.settings))
    widest = max(len(panel) for panel in panels)
    width_in = min(MAX_PANEL_WIDTH, max(6.0, 1.2 * widest * max(1, len(rows)) / 2))
    fig, axes = plt.subplots(len(panels), 1, figsize=(width_in, 4 * len(panels)), squeeze=False, sharey=True)
    width = 0.8 / len(rows)
    palette = plt.get_cmap("tab10" if len(results.methods) <= 10 else "tab20")
    handles = []
    for panel, ax in zip(panels, axes[:, 0]):
        for i, method in enumerate(rows):
            xs, means, below, above, paper_x, paper_y = [], [], [], [], [], []
            for j, setting in enumerate(panel):
                interval = results.interval(method, setting)
                x = j + (i - (len(rows) - 1) / 2) * width
                if interval is not None:  # the bar's whisker: its interval inside [0, 100], uneven about the mean
                    xs.append(x)
                    means.append(interval.mean)
                    below.append(max(0.0, interval.mean - interval.low) if interval.low is not None else 0.0)
                    above.append(max(0.0, interval.high - interval.mean) if interval.high is not None else 0.0)
                for p in study.paper[:1]:
                    value = p.values.get(method, {}).get(setting)
                    if value is not None:
                        paper_x.append(x)
                        paper_y.append(value)
            # The same colour for a method in every panel; the control and the untrained rows (each
            # method's own control) grey and hatched, apart from them.
            style = ({"color": "0.85", "edgecolor": "0.3", "hatch": "//"} if not study.ranked(method)
                     else {"color": palette(i % palette.N), **({"hatch": ".."} if i >= palette.N else {})})
            bars = ax.bar(xs, means, width, yerr=[below, above], capsize=3, label=study.label(method), **style)
            if ax is axes[0, 0]:
                handles.append(bars)
            if paper_x:
                ax.plot(paper_x, paper_y, linestyle="none", marker="_", markersize=12,  # the paper's number: a dash
                        color=style["color"])
        ax.set_xticks(range(len(panel)), panel)
        ax.set_xlim(-0.5, widest - 0.5)
    own = any(row.metric for rows in (study.methods, study.settings) for row in rows.values())
    for ax in axes[:, 0]:
        ax.set_ylabel("accuracy (%), each column's metric" if own else f"{study.metric} (%)")
    # Wrapped to the panel's width: a long title runs under the legend beside the panel.
    axes[0, 0].set_title(textwrap.fill(study.title or study.name, width=int(11 * width_in)), fontsize=9)
    # Outside the axes: with a dozen rows a legend inside covers bars.
    fig.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 0.98), frameon=False)
    if study.paper:
        axes[-1, 0].text(0.0, -0.15, f"horizontal marks: paper ({study.paper[0].source})",
                         transform=axes[-1, 0].transAxes, fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return True


def in_percent(key: str) -> bool:
    """Whether a history number is a fraction shown in percent (an accuracy), not a loss or a
    temperature (train_l_mi, train_kd_temperature), which are drawn as they are."""
    return "accuracy" in key


def mean_curve(per_seed: dict[int, list[dict[str, float]]], key: str) -> list[tuple[int, float, float, float]]:
    """(round, mean, low, high: the 95% interval over seeds) at the rounds where every seed's run has
    ``key``: a curve over seeds, for an accuracy in percent with its interval inside [0, 100] (as the
    tables'), else in the number's own unit with Student's t (mean ± the half-width; one seed: no band)."""
    scale = 100.0 if in_percent(key) else 1.0
    by_round: dict[int, dict[int, float]] = {}
    for seed, rows in per_seed.items():
        for row in rows:
            value = row.get(key)
            if isinstance(value, (int, float)) and math.isfinite(value):  # a term a variant switches off: nan
                by_round.setdefault(int(row["round"]), {})[seed] = scale * float(row[key])
    points = []
    for r in sorted(by_round):
        if len(by_round[r]) == len(per_seed):
            values = list(by_round[r].values())
            if in_percent(key):
                bounds = accuracy_interval(values)
                points.append((r, bounds.mean, bounds.mean if bounds.low is None else bounds.low,
                               bounds.mean if bounds.high is None else bounds.high))
            else:
                interval = t_interval(values)
                points.append((r, interval.mean, interval.low, interval.high))
    return points


def untrained_bands(results: StudyResults, setting: str, key: str) -> list[tuple[str, Bounds]]:
    """The untrained rows of ``setting`` whose round-0 score is ``key`` (an accuracy on the curve's split):
    each with its mean and 95% interval over seeds, in percent, in the table's order."""
    bands = []
    for method in [*results.methods, CONTROL]:
        per_seed = results.untrained.get((method, setting), {})
        values = [100.0 * scores[key] for scores in per_seed.values() if key in scores]
        if values and len(values) == len(per_seed):
            bands.append((method, accuracy_interval(values)))
    return bands


def curve_keys(results: StudyResults) -> list[str]:
    """The numbers the stored records of this budget keep at their evaluated rounds (what --curve draws)."""
    return sorted({key for per_seed in results.histories.values() for rows in per_seed.values() for row in rows
                   for key in row if key != "round"})


def curve_figure(results: StudyResults, key: str, path: Path) -> bool:
    """``key`` (a history number such as test_accuracy or train_loss) against the round, one panel per
    setting, one line per method: the mean over seeds with its 95% band. False when no stored record
    of this budget keeps its evaluated rounds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves = {cell: mean_curve(per_seed, key) for cell, per_seed in results.histories.items()}
    curves = {cell: points for cell, points in curves.items() if points}
    if not curves:
        return False
    settings = [s for s in results.settings if any(cell[1] == s for cell in curves)]
    drawn = [m for m in results.methods if any((m, s) in curves for s in settings)]
    # one colour per method (tab20: up to 20 distinguishable); a centralised row (one client) dashed, the
    # ceiling its federated methods are read against
    colours = {m: plt.get_cmap("tab20")(i % 20) for i, m in enumerate(drawn)}
    legend_rows = (len(drawn) + 1) // 2
    height = 3.4 + 0.14 * legend_rows
    fig, axes = plt.subplots(1, len(settings), figsize=(5.0 * len(settings), height), squeeze=False)
    for ax, setting in zip(axes[0], settings):
        for method in drawn:
            points = curves.get((method, setting))
            if not points:
                continue
            rounds, means, lows, highs = zip(*points)
            style = "--" if method in results.one_client else "-"
            ax.plot(rounds, means, style, marker=".", markersize=3, color=colours[method],
                    label=results.study.label(method))
            ax.fill_between(rounds, lows, highs, color=colours[method], alpha=0.15)
        for method, band in untrained_bands(results, setting, key):  # the controls: their round 0, a band
            if band.low is not None and band.high is not None:  # one seed: the line alone, no interval
                ax.axhspan(band.low, band.high, color="grey", alpha=0.12)
            ax.axhline(band.mean, color="grey", linestyle=":", linewidth=1)
            ax.text(0.01, band.mean, results.study.label(method), transform=ax.get_yaxis_transform(), fontsize=5,
                    color="dimgrey", va="bottom")
        ax.set_title(setting, fontsize=9)
        ax.set_xlabel("round")
        ax.set_ylabel(f"{key} (%)" if in_percent(key) else key)
    # the legend below the panels: with a dozen methods it would hide the curves inside one
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=2, fontsize=6, frameon=False)
    fig.suptitle(f"{results.study.title or results.study.name} ({results.budget} budget): mean over seeds, 95% band",
                 fontsize=8, wrap=True)
    fig.tight_layout(rect=(0, (0.14 * legend_rows + 0.1) / height, 1, 0.95))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
