"""What wins where: per setting the method with the highest mean over seeds, the methods the paired rule
does not separate from it, and the control, as rows and as a Markdown table."""

from __future__ import annotations

from fedfew.study.collect import StudyResults
from fedfew.study.study_sections import CONTROL
from fedfew.study.table_cells import cell_text, format_accuracy, marked_label, table_legend
from fedfew.study.verdict import HOLDS, Bounds, compare

#: One setting's row of :func:`winners`: (setting, best method or None, not separated from it, control).
WinnerRow = tuple[str, str | None, list[str], Bounds | None]


def _waiting(results: StudyResults, setting: str) -> int:
    """How many cells of rows that compete (:meth:`Study.competes`) the setting still lacks: a row kept
    apart, a ceiling or a control still running cannot change which row is best, so it does not hold
    the verdict back. Results without the per-row count (made by hand) count every missing cell."""
    if not results.missing_rows:
        return results.missing.get(setting, 0)
    return sum(n for (method, where), n in results.missing_rows.items()
               if where == setting and method != CONTROL and results.study.competes(method))


def winners(results: StudyResults) -> list[WinnerRow]:
    """Per setting: the method with the highest mean over seeds, the methods the paired rule does not
    separate from it (the 95% interval of their per-seed difference to it does not exclude 0), and the
    control. The control, the untrained rows, the study's ``winners.apart`` rows and its ceilings
    (``winners.ceilings``) never win; a setting with a competing row's cell not yet in the store has no
    best (a partial column would crown whichever rows ran first)."""
    out: list[WinnerRow] = []
    for setting in results.settings:
        stored = {m: results.values[(m, setting)] for m in results.methods
                  if results.values.get((m, setting)) and results.study.competes(m)}
        if not stored or _waiting(results, setting):
            out.append((setting, None, [], results.interval(CONTROL, setting)))
            continue
        best = max(stored, key=lambda m: sum(stored[m].values()) / len(stored[m]))  # ties: the first listed
        tied = [m for m in stored if m != best and compare(stored[best], stored[m]).verdict != HOLDS]
        out.append((setting, best, tied, results.interval(CONTROL, setting)))
    return out


def winners_markdown(results: StudyResults, study_path: str) -> str:
    """"What wins where": per setting the best method, the ones not separated from it, the rows kept
    apart (``winners.apart``), the control."""
    study = results.study
    if results.cells_found == 0:
        return (f"*{study.title or study.name}: not yet run at the {results.budget} budget*: "
                f"`fedfew study run {study_path} --budget {results.budget}`.\n")
    apart = [m for m in study.winners.apart if m in results.methods]
    lines = [f"{study.title or study.name} (`{study_path}`, {results.budget} budget, "
             f"{results.cells_found}/{results.cells_total} cells). Best: the highest mean over seeds; "
             "not separated: methods whose paired difference to the best has a 95% interval that includes 0 "
             "(or fewer than 2 paired seeds). A setting is judged once all its cells are in the store."
             + (f" Apart ({study.winners.why}): never compared with the others." if apart else ""), "",
             "| setting | best (mean [95% interval]) | not separated from the best |"
             + (f" apart: {study.winners.why} |" if apart else "") + " untrained control |",
             "|---|---|---|" + ("---|" if apart else "") + "---|"]
    for setting, best, tied, control in winners(results):
        aside = ("; ".join(f"{study.label(m)}: {cell_text(results, m, setting)}" for m in apart) + " | "
                 if apart else "")
        missing = results.missing.get(setting, 0)
        if best is None:
            ran = any(results.values.get((m, setting)) for m in results.methods)
            state = f"incomplete ({missing} cells not yet run)" if ran and missing else \
                "not yet run" if missing else "no row to compare"
            lines.append(f"| {setting} | {state} | | {aside}{format_accuracy(control)} |")
            continue
        shown = f"{study.label(best)}: {cell_text(results, best, setting)}"
        lines.append(f"| {setting} | {shown} | {', '.join(marked_label(results, m, setting) for m in tied) or 'none'} | "
                     f"{aside}{format_accuracy(control)} |")
    text = "\n".join(lines) + "\n"
    return text + table_legend(text)
