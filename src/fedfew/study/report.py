"""``fedfew study report``'s text: the status line (cells, seeds, time, code, environments, reused and
verified records), then the table, the claims and the further tables; the report over several budgets;
the verdicts alone. The parts are :mod:`fedfew.study.tables`, :mod:`fedfew.study.claim_verdicts` and
:mod:`fedfew.study.winners`, from the numbers :func:`fedfew.study.collect.collect` reads from the store."""

from __future__ import annotations

import shlex
from collections.abc import Iterable

from fedfew.run.environment import describe_environments
from fedfew.study.claim_verdicts import (
    CLAIMS_HEADER,
    claims,
    claims_table,
    family_sizes,
    holm_cell,
    pair_links,
)
from fedfew.study.collect import StudyResults
from fedfew.study.study_file import Study
from fedfew.study.table_cells import ACCURACY_INTERVAL, marked_label, table_legend
from fedfew.study.tables import budgets_table, extra_tables, table
from fedfew.study.verdict import ALPHA


def _own_metrics(study: Study, shown: Iterable[str]) -> dict[str, str]:
    """The metrics that the rows or columns ``shown`` name for themselves (a budget that leaves those
    rows out reads the study's metric only)."""
    names = set(shown)
    return {name: row.metric for rows in (study.methods, study.settings) for name, row in rows.items()
            if row.metric and name in names}


def _metrics_named(study: Study, shown: Iterable[str]) -> str:
    """The study's metric in words, or, where the rows or columns ``shown`` name their own, each of them."""
    own = _own_metrics(study, shown)
    if not own:
        return _metric_name(study.metric)
    return "per row or column, " + "; ".join(f"{name}: {_metric_name(path)}" for name, path in own.items()) \
        + f"; otherwise {_metric_name(study.metric)}"


def _metric_name(path: str) -> str:
    """What the table's numbers are, in words where the path is a common one."""
    return {"test.accuracy": "test accuracy (%)",
            "history.last.test_accuracy": "test accuracy (%) at the last evaluated round, not the selected one",
            "initial_score.accuracy": "the untrained model's accuracy (%) on the validation split (its test split "
                                      "where it has none)"}.get(path, f"`{path}` (%)")


def markdown(results: StudyResults, study_path: str, store: str | None = None, in_repository: bool = True) -> str:
    """The report: a status line, the table and the claims (what the docs markers hold). ``store``: the
    ``--store`` it was made from when not the study's default, so the commands it names reproduce it;
    ``in_repository``: the study is one of a repository's (``studies/``), whose docs `fedfew study docs`
    writes, else the report itself is what shows the results."""
    study = results.study
    store_option = f" --store {shlex.quote(store)}" if store else ""
    command = f"fedfew study run {shlex.quote(study_path)} --budget {results.budget}{store_option}"
    report = f"fedfew study report {shlex.quote(study_path)}" + ("" if results.budget == study.docs_budget
                                                                  else f" --budget {results.budget}") + store_option
    if results.cells_found == 0:
        then = f"fedfew study docs{store_option}" if in_repository else report
        return f"*Not yet run at the {results.budget} budget* ({results.cells_total} cells): `{command}`, then `{then}`.\n"
    seeds = results.seeds
    shown = [*results.methods, *results.settings]
    status = (f"Study `{study.name}` at the {results.budget} budget: {results.cells_found}/{results.cells_total} "
              f"cells in the store, seeds {', '.join(map(str, seeds))}, {results.wall_seconds / 60:.1f} min of "
              f"runs, code {results.code.describe() if results.code else '?'}. Ours: {_metrics_named(study, shown)}, "
              f"{ACCURACY_INTERVAL}. Made by `{command}` and `{report}`. "
              f"{describe_environments(results.run_records)}")
    if results.reused:
        status += (f" {sum(results.reused.values())} of its runs are another study's, the same config and code, "
                   f"copied from its store ({', '.join(f'{n} from {name}' for name, n in sorted(results.reused.items()))}; "
                   f"{results.reused_seconds / 60:.1f} min, counted there).")
    older = {src: n for src, n in results.sources.items() if results.code and src != results.code.source}
    if older:
        checks = "; ".join(f"{new} against {old} on {n} re-run cells{'' if exact else ' (within tolerance)'}"
                           for new, old, n, exact in results.verified)
        how = "exactly" if all(exact for *_, exact in results.verified) else \
            "exactly, or within each re-run cell's own 95% interval where the environments differ"
        status += (f" {sum(older.values())} of the {results.cells_found} records were made by older code "
                   f"({', '.join(sorted(older))}), verified to give this version's numbers {how} (sources {checks}; "
                   "`fedfew study verify`).")
    if results.cells_found < results.cells_total:
        status += f" **Incomplete**: {results.cells_total - results.cells_found} cells not yet run."
    if results.cells_without_metric:
        what = "a value at their row's or column's metric" if _own_metrics(study, shown) else f"`{study.metric}`"
        status += f" {results.cells_without_metric} stored cells have no {what} in their run's summary (shown as —)."
    parts = [status, "", table(results)]
    reason = study.no_control_reason(results.budget)
    if reason:
        parts += ["", f"No untrained control row: {reason.rstrip('.')}."]
    verdicts = claims_table(results)
    if verdicts:
        parts += ["", "Claims (paired comparison over seeds):", "", verdicts]
    further = extra_tables(results)
    if further:
        parts += ["", further]
    return "\n".join(parts)


def _budget_note(results: StudyResults) -> str:
    """One budget's status in a report over budgets: cells in the store, seeds, minutes, code."""
    if results.cells_found == 0:
        return f"**{results.budget}**: not yet run ({results.cells_total} cells)"
    seeds = ", ".join(map(str, results.seeds))
    code = results.code.source if results.code else "?"
    return (f"**{results.budget}**: {results.cells_found}/{results.cells_total} cells, seeds {seeds}, "
            f"{results.wall_seconds / 60:.1f} min of runs, sources {code}")


def budgets_markdown(runs: list[StudyResults], study_path: str, store: str | None = None) -> str:
    """The report over several budgets of one study (``study:NAME@a+b`` in the docs, ``study report
    --budgets a,b``): each budget's status and note, the table with budgets as column groups, and each
    budget's verdicts (the claims about the rows and columns it runs) with the budget named."""
    study = runs[0].study
    names = ",".join(r.budget for r in runs)
    store_option = f" --store {shlex.quote(store)}" if store else ""
    lines = [f"Study `{study.name}` at budgets {', '.join(r.budget for r in runs)}. Ours: {_metric_name(study.metric)}, "
             f"{ACCURACY_INTERVAL}; n/a: a row the budget does not run. Made by "
             f"`fedfew study run {shlex.quote(study_path)} --budget B{store_option}` for each budget B and "
             f"`fedfew study report {shlex.quote(study_path)} --budgets {names}{store_option}`.", ""]
    for r in runs:
        note = study.budget(r.budget).note
        lines.append(f"- {_budget_note(r)}" + (f": {note}" if note else ""))
    parts = ["\n".join(lines), "", budgets_table(runs)]
    judged = [(r, j) for r in runs if r.cells_found for j in claims(r)]
    if judged:
        sizes = "; ".join(f"{r.budget}: {family_sizes(claims(r))}" for r in runs if r.cells_found and claims(r))
        rows = [f"Verdicts: raw, each comparison alone (its paired t-test at 5%); Holm, over its family's comparisons "
                f"at that budget (Holm-Bonferroni, family-wise error {ALPHA:.0%}); families {sizes}. docs/studies.md "
                "states the rules.", "",
                "| budget " + CLAIMS_HEADER, "|---|---|---|---|---|---|---|---|"]
        for r, j in judged:
            order = " > ".join(marked_label(r, m, j.claim.setting) for m in j.claim.order)
            rows.append(f"| {r.budget} | {order} | {j.claim.setting} | {j.claim.source or '—'} | **{j.verdict}** | "
                        f"{holm_cell(r, j)} | {pair_links(r, j)} | `{j.id}` |")
        text = "\n".join(rows) + "\n"
        parts += ["", "Claims at each budget (paired comparison over seeds):", "", text + table_legend(text)]
    return "\n".join(parts)


def claims_markdown(results: StudyResults, study_path: str) -> str:
    """The verdicts alone (docs/results.md's summary), with where they come from."""
    study = results.study
    if results.cells_found == 0:
        return (f"*{study.title or study.name}: not yet run at the {results.budget} budget*: "
                f"`fedfew study run {study_path} --budget {results.budget}`.\n")
    seeds = results.seeds
    head = (f"{study.title or study.name} (`{study_path}`, {results.budget} budget, "
            f"{results.cells_found}/{results.cells_total} cells, seeds {', '.join(map(str, seeds))}):")
    return head + "\n\n" + (claims_table(results) or "no claims declared\n")
