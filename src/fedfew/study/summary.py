"""A study in one sentence (the ``study:NAME:summary`` docs view, README's "what it found"): which
method is best in how many settings, whether the paired rule separates it from every other method
there, and how far it lies above its own untrained control, all from :func:`fedfew.study.winners.winners`
on the committed store."""

from __future__ import annotations

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


def summary_line(results: StudyResults, study_path: str) -> str:
    """One line: per best method, the settings it is best in (separated from every other method in how
    many), and its margin over its own untrained control (points, range over those settings)."""
    study = results.study
    judged = [(setting, best, tied) for setting, best, tied, _ in winners(results) if best is not None]
    ranked = [m for m in results.methods if study.ranked(m) and m not in study.winners.apart]
    head = (f"{study.title or study.name} (`{study_path}`, {results.budget} budget, "
            f"{results.cells_found}/{results.cells_total} cells, seeds {', '.join(map(str, results.seeds))}; "
            f"{len(ranked)} methods compared)")
    if not judged:
        return f"{head}: no setting complete in the store yet.\n"
    order: list[str] = []
    for _, best, _ in judged:
        if best not in order:
            order.append(best)
    parts = []
    for method in order:
        settings = [(s, tied) for s, best, tied in judged if best == method]
        alone = sum(1 for _, tied in settings if not tied)
        part = (f"{study.label(method)} in {len(settings)} of {len(results.settings)} settings "
                f"({_where([s for s, _ in settings], results.settings)}; separated from every other method "
                f"in {alone})")
        control = own_control(results, method)
        margins = []
        for setting, _ in settings:
            ours, base = results.interval(method, setting), results.interval(control, setting) if control else None
            if ours is not None and base is not None:
                margins.append(ours.mean - base.mean)
        if margins:
            part += (f", {_points(min(margins), max(margins))} points above its own untrained control "
                     f"({study.label(control).removeprefix('(control) ') if control else ''})")
        parts.append(part)
    apart = [study.label(m) for m in study.winners.apart if m in results.methods and study.ranked(m)]
    tail = f"; not compared: {', '.join(apart)} ({study.winners.why})" if apart else ""
    return f"{head}: best (the highest mean over seeds): {'; '.join(parts)}{tail}.\n"
