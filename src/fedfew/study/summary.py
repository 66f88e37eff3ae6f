"""A study in one sentence (the ``study:NAME:summary`` docs view, README's "what it found"): which
method is best in how many settings, whether the paired rule separates it from every other method
there, and how far it lies above its own untrained control, all from :func:`fedfew.study.winners.winners`
on the committed store."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from fedfew.study.collect import StudyResults
from fedfew.study.intervals import own_control
from fedfew.study.winners import winners


def _where(won: list[str], settings: list[str]) -> str:
    """The settings a method won, a whole group (settings sharing their first word, a dataset) as
    "all 4 Omniglot": ``Omniglot IID 1-shot, ...`` otherwise."""
    groups: dict[str, list[str]] = {}
    for setting in won:
        groups.setdefault(setting.split()[0], []).append(setting)
    parts = []
    for word, members in groups.items():
        of_group = [s for s in settings if s.split()[0] == word]
        parts += [f"all {len(of_group)} {word}"] if len(members) == len(of_group) > 1 else members
    return ", ".join(parts)


def _points(low: float, high: float) -> str:
    return f"{low:.1f}" if f"{low:.1f}" == f"{high:.1f}" else f"{low:.1f} to {high:.1f}"


def _budgets_head(runs: Sequence[StudyResults]) -> str:
    """``cpu budget, 576/576 cells``; budgets side by side as ``budgets A (n/N cells) and B (m/M cells)``."""
    if len(runs) == 1:
        return f"{runs[0].budget} budget, {runs[0].cells_found}/{runs[0].cells_total} cells"
    each = [f"{r.budget} ({r.cells_found}/{r.cells_total} cells)" for r in runs]
    return f"budgets {', '.join(each[:-1])} and {each[-1]}"


def _setting_names(runs: Sequence[StudyResults]) -> dict[tuple[int, str], str]:
    """(index of the results, setting) -> its name in the line: the setting, with its budget added where
    another of the budgets has a setting of the same name."""
    counts = Counter(s for r in runs for s in r.settings)
    return {(i, s): f"{s} at {r.budget}" if counts[s] > 1 else s for i, r in enumerate(runs) for s in r.settings}


def summary_line(results: StudyResults | Sequence[StudyResults], study_path: str) -> str:
    """One line: per best method, the settings it is best in (separated from every other method in how
    many), and its margin over its own untrained control (points, range over those settings).
    Several results (one study's budgets side by side, ``study:NAME@A+B:summary``: the converged
    benchmark's per-dataset budgets) make one line over all their settings; a setting not yet complete
    in the store is named as such, never judged (:func:`fedfew.study.winners.winners`)."""
    runs = [results] if isinstance(results, StudyResults) else list(results)
    study = runs[0].study
    names = _setting_names(runs)
    judged: list[tuple[StudyResults, str, str, str, list[str]]] = []
    pending: list[tuple[StudyResults, str, str]] = []
    for i, r in enumerate(runs):
        for setting, best, tied, _ in winners(r):
            if best is None:
                pending.append((r, names[i, setting], setting))
            else:
                judged.append((r, names[i, setting], setting, best, tied))
    all_settings = list(names.values())
    ranked = [m for m in dict.fromkeys(m for r in runs for m in r.methods) if study.competes(m)]
    seeds = sorted({seed for r in runs for seed in r.seeds})
    head = (f"{study.title or study.name} (`{study_path}`, {_budgets_head(runs)}, "
            f"seeds {', '.join(map(str, seeds))}; {len(ranked)} methods compared)")
    waiting = ("; not yet judged (cells still to run): " + ", ".join(
        f"{name} ({r.missing.get(setting, 0)} to go)" for r, name, setting in pending)) if pending else ""
    if not judged:
        return f"{head}: no setting complete in the store yet{waiting}.\n"
    order: list[str] = []
    for _, _, _, best, _ in judged:
        if best not in order:
            order.append(best)
    parts = []
    for method in order:
        won = [(r, setting, tied) for r, _, setting, best, tied in judged if best == method]
        alone = sum(1 for _, _, tied in won if not tied)
        won_names = [name for _, name, _, best, _ in judged if best == method]
        part = (f"{study.label(method)} in {len(won)} of {len(all_settings)} settings "
                f"({_where(won_names, all_settings)}; separated from every other method "
                f"in {alone})")
        margins = []
        control = None
        for r, setting, _ in won:
            control = own_control(r, method)
            ours, base = r.interval(method, setting), r.interval(control, setting) if control else None
            if ours is not None and base is not None:
                margins.append(ours.mean - base.mean)
        if margins:
            part += (f", {_points(min(margins), max(margins))} points above its own untrained control "
                     f"({study.label(control).removeprefix('(control) ') if control else ''})")
        ceiling = study.winners.ceilings.get(method)
        prices = [] if ceiling is None else [
            top.mean - ours.mean for r, setting, _ in won
            if (ours := r.interval(method, setting)) is not None and (top := r.interval(ceiling, setting)) is not None]
        if ceiling is not None and prices:
            part += (f" and {_points(min(prices), max(prices))} points below its ceiling, "
                     f"{study.label(ceiling)} (the price of federation)")
        parts.append(part)
    apart = [study.label(m) for m in study.winners.apart
             if any(m in r.methods for r in runs) and study.ranked(m)]
    tail = f"; not compared: {', '.join(apart)} ({study.winners.why})" if apart else ""
    return f"{head}: best (the highest mean over seeds): {'; '.join(parts)}{tail}{waiting}.\n"
