"""A study's tables in Markdown: the main table (ours, the paper's numbers, the control), the study's
further tables (``tables``) and budgets side by side."""

from __future__ import annotations

from fedfew.study.collect import StudyResults
from fedfew.study.study_sections import CONTROL
from fedfew.study.table_cells import cell_text, format_accuracy, format_interval, round0_mark, table_legend
from fedfew.study.verdict import accuracy_interval, t_interval


def _paper(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}"


def table(results: StudyResults) -> str:
    """Rows: methods (and the control); per setting a column of ours and one per paper source."""
    study = results.study
    header = ["method"]
    for setting in results.settings:
        header.append(f"{setting}: ours")
        header += [f"{setting}: paper ({p.source})" for p in study.paper]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    rows = list(results.methods) + ([CONTROL] if study.control is not None and study.budget(results.budget).control
                                    else [])
    for method in rows:
        row = [study.label(method)]
        for setting in results.settings:
            row.append(cell_text(results, method, setting))
            row += [_paper(p.values.get(method, {}).get(setting)) for p in study.paper]
        lines.append("| " + " | ".join(row) + " |")
    text = "\n".join(lines) + "\n"
    return text + table_legend(text)


def _fmt_number(cell: dict[int, float] | None, percent: bool) -> str:
    """A further table's cell: in percent, as the main table's; otherwise mean ± Student's t."""
    if not cell:
        return "—"
    return format_accuracy(accuracy_interval(list(cell.values()))) if percent else format_interval(t_interval(list(cell.values())))


def extra_tables(results: StudyResults) -> str:
    """The study's further tables (``tables``): per table its title, then its rows (methods) and
    columns (settings) as mean ± 95% interval over seeds; "—" where a run has no such number."""
    parts = []
    for extra, values in zip(results.study.tables, results.extra):
        methods = [m for m in results.methods if extra.methods is None or m in extra.methods]
        settings = [s for s in results.settings if extra.settings is None or s in extra.settings]
        if not methods or not settings:
            continue
        # A fraction shown in percent (scale 100: an accuracy, a success rate) takes the tables' interval
        # inside [0, 100]; any other number (a rank, a correlation, a count) Student's t as it is.
        percent = extra.scale == 100 and all(0.0 <= v <= 100.0 for cell in values.values() for v in cell.values())
        how = "mean [95% interval] over seeds, inside [0, 100]" if percent else "mean ± 95% interval over seeds"
        lines = [f"{extra.title} (`{extra.metric}`{'' if extra.scale == 1 else f' x {extra.scale:g}'}; {how}):", "",
                 "| method | " + " | ".join(settings) + " |", "|" + "---|" * (len(settings) + 1)]
        for method in methods:
            cells = [_fmt_number(values.get((method, s)), percent)
                     + round0_mark(results, method, s, values.get((method, s), {}), extra.metric) for s in settings]
            lines.append(f"| {results.study.label(method)} | " + " | ".join(cells) + " |")
        text = "\n".join(lines) + "\n"
        parts.append(text + table_legend(text))
    return "\n".join(parts)


def budgets_table(runs: list[StudyResults]) -> str:
    """Budgets side by side: rows are the methods any budget runs (study order, the control last); per
    budget a column group of ours, one column per setting that budget runs; then the paper's numbers
    once per setting. A method a budget does not run shows "n/a" in its group (not "—", which is a cell
    of that budget not yet in the store)."""
    study = runs[0].study
    ran = {m for r in runs for m in r.methods}
    rows = [m for m in study.methods if m in ran]
    controls = {r.budget for r in runs if study.control is not None and study.budget(r.budget).control}
    if controls:
        rows.append(CONTROL)
    settings = [s for s in study.settings if any(s in r.settings for r in runs)]
    header = ["method"] + [f"{setting}, {r.budget}: ours" for r in runs for setting in r.settings]
    header += [f"{setting}: paper ({p.source})" for setting in settings for p in study.paper]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for method in rows:
        row = [study.label(method)]
        for r in runs:
            runs_it = r.budget in controls if method == CONTROL else method in r.methods
            row += [cell_text(r, method, setting) if runs_it else "n/a" for setting in r.settings]
        row += [_paper(p.values.get(method, {}).get(setting)) for setting in settings for p in study.paper]
        lines.append("| " + " | ".join(row) + " |")
    text = "\n".join(lines) + "\n"
    return text + table_legend(text)
