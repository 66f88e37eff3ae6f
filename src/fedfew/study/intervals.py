"""The interval figure of a study: per setting (one panel each), every ranked method's mean over seeds
with its 95% interval, beside its **own** untrained control drawn as a grey band (the control row the
method names, else the study's ``control``), and the paper's number as an open diamond. Drawn for the
wide tables (the benchmark, each paper's headline): the ``study:NAME:intervals`` docs view shows it first
and the full table below it, in a collapsible block (:mod:`fedfew.study.docs`).

The SVG carries the values it plots as JSON in its ``<dc:description>`` metadata (:func:`plotted`), so a
test compares a committed figure's data with what the store gives, not its pixels; and it is
deterministic (no date, a fixed hash salt, text as text), so `fedfew study docs` on a clean clone
rewrites nothing.
"""

from __future__ import annotations

import json
import math
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from fedfew.study.collect import StudyResults
from fedfew.study.study_sections import CONTROL

#: Panels per row of the figure.
PANELS_PER_ROW = 4
#: The Dublin Core namespace matplotlib writes an SVG's metadata in.
DC = "{http://purl.org/dc/elements/1.1/}"


def own_control(results: StudyResults, method: str) -> str | None:
    """The control row a method is drawn against: the untrained row it names (``control`` or an
    ``untrained_of`` row made for it), else the study's control, else None."""
    study = results.study
    named = study.methods[method].control
    if named is not None:
        return named
    return CONTROL if study.control is not None and study.budget(results.budget).control else None


def _bounds(results: StudyResults, method: str, setting: str) -> dict[str, float | int | None] | None:
    interval = results.interval(method, setting)
    if interval is None:
        return None
    return {"mean": interval.mean, "low": interval.low, "high": interval.high, "seeds": interval.n}


def plotted(results: StudyResults) -> dict[str, Any]:
    """What the figure draws, from the store's values: {study, budget, settings, rows}, one row per
    (setting, ranked method) with its mean, 95% interval and seeds, its control's, and the paper's number."""
    study = results.study
    paper = study.paper[0] if study.paper else None
    rows = []
    for setting in results.settings:
        for method in results.methods:
            if not study.ranked(method):
                continue
            ours = _bounds(results, method, setting)
            if ours is None:
                continue
            control = own_control(results, method)
            value = paper.values.get(method, {}).get(setting) if paper else None
            rows.append({"setting": setting, "method": method, "label": study.label(method), **ours,
                         "control": control, "control_label": study.label(control) if control else None,
                         "control_bounds": _bounds(results, control, setting) if control else None,
                         "paper": value})
    return {"study": study.name, "budget": results.budget, "settings": list(results.settings),
            "paper_source": paper.source if paper else None, "rows": rows}


def _wrap(label: str, width: int = 34) -> str:
    return "\n".join(textwrap.wrap(label, width)) or label


def interval_figure(results: StudyResults, path: Path) -> bool:
    """Draw the figure into ``path`` (SVG) with its data embedded; False when nothing is stored."""
    data = plotted(results)
    if not data["rows"]:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    study = results.study
    methods = [m for m in results.methods if study.ranked(m) and any(r["method"] == m for r in data["rows"])]
    settings = [s for s in results.settings if any(r["setting"] == s for r in data["rows"])]
    ncols = min(PANELS_PER_ROW, len(settings))
    nrows = math.ceil(len(settings) / ncols)
    height = 0.32 * len(methods) + 1.2
    with plt.rc_context({"svg.hashsalt": "fedfew", "svg.fonttype": "none", "font.size": 8}):
        fig, axes = plt.subplots(nrows, ncols, figsize=(2.6 * ncols + 2.6, height * nrows), squeeze=False,
                                 sharey=True)
        by_cell = {(r["setting"], r["method"]): r for r in data["rows"]}
        for k, ax in enumerate(axes.flat):
            if k >= len(settings):
                ax.set_visible(False)
                continue
            setting = settings[k]
            for y, method in enumerate(methods):
                row = by_cell.get((setting, method))
                if row is None:
                    continue
                band = row["control_bounds"]
                if band is not None:  # the method's own untrained control: its interval as a band, mean as a tick
                    low = band["low"] if band["low"] is not None else band["mean"]
                    high = band["high"] if band["high"] is not None else band["mean"]
                    ax.fill_betweenx([y - 0.42, y + 0.42], low, high, color="0.82", linewidth=0, zorder=1)
                    ax.plot([band["mean"]] * 2, [y - 0.42, y + 0.42], color="0.45", linewidth=0.8, zorder=2)
                below = row["mean"] - row["low"] if row["low"] is not None else 0.0
                above = row["high"] - row["mean"] if row["high"] is not None else 0.0
                ax.errorbar([row["mean"]], [y], xerr=[[max(0.0, below)], [max(0.0, above)]], fmt="o",
                            color="C0", markersize=3.5, capsize=2, linewidth=1, zorder=3)
                if row["paper"] is not None:
                    ax.plot([row["paper"]], [y], marker="D", markerfacecolor="none", markeredgecolor="C3",
                            markersize=4, linestyle="none", zorder=4)
            ax.set_title(setting, fontsize=8)
            ax.grid(axis="x", color="0.92", linewidth=0.6, zorder=0)
            ax.set_ylim(len(methods) - 0.5, -0.5)
            ax.set_yticks(range(len(methods)), [_wrap(study.label(m)) for m in methods])
            ax.tick_params(axis="y", labelsize=7)
        for ax in axes[-1, :]:
            ax.set_xlabel(f"{study.metric.split('.')[-1].replace('_', ' ')} (%)")
        handles = [plt.Line2D([], [], marker="o", color="C0", linestyle="-", markersize=3.5,
                              label="ours: mean and 95% interval over seeds"),
                   plt.Rectangle((0, 0), 1, 1, color="0.82",
                                 label="the method's own untrained control (round 0): 95% interval, mean as a line")]
        if data["paper_source"]:
            handles.append(plt.Line2D([], [], marker="D", markerfacecolor="none", markeredgecolor="C3",
                                      linestyle="none", label=f"paper ({data['paper_source']})"))
        fig.legend(handles=handles, loc="upper center", ncol=len(handles), fontsize=7, frameon=False,
                   bbox_to_anchor=(0.5, 1.0))
        fig.suptitle(f"{study.title or study.name} ({results.budget} budget)", fontsize=9, y=1.04)
        fig.tight_layout(rect=(0, 0, 1, 0.97))
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, format="svg", bbox_inches="tight",
                    metadata={"Date": None, "Title": f"{study.name} ({results.budget})",
                              "Description": json.dumps(data, sort_keys=True)})
        plt.close(fig)
    return True


def read_plotted(path: Path) -> dict[str, Any]:
    """The data a figure drawn by :func:`interval_figure` says it plots (its SVG metadata)."""
    description = ET.parse(path).getroot().find(f".//{DC}description")
    if description is None or description.text is None:
        raise ValueError(f"{path}: no plotted data in its metadata (not drawn by fedfew.study.intervals)")
    loaded: dict[str, Any] = json.loads(description.text)
    return loaded
