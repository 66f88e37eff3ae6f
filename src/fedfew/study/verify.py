"""``fedfew study verify``: re-run a few stored cells of a study with this code and compare each with its
record of older code, like with like (:class:`Drift`); print the drift table, and when every cell passes
let the older records count as this version's (an equivalence file in the store)."""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from fedfew.core.errors import FedfewError
from fedfew.core.jsontypes import JSONObject, JSONValue
from fedfew.study.cell import cell_record, run_noted
from fedfew.study.cell_paths import cell_folder
from fedfew.study.grid import Cell, cells
from fedfew.study.records import CheckedStore
from fedfew.study.sittings import timestamp
from fedfew.study.store import FORMAT, Equivalence, StudyRecord, current_code, foreign_codes, metric
from fedfew.study.study_file import Study
from fedfew.study.study_sections import StudyError

#: The progress of `fedfew study verify`, one line per re-run cell, printed as `fedfew study run`'s are
#: (:data:`fedfew.cli.logs.PROGRESS_LOGGERS`).
progress_log = logging.getLogger("fedfew.study")


class CodeDiffers(FedfewError):
    """``fedfew study verify`` found a re-run cell whose numbers differ from its stored record (exit 1)."""

    exit_code = 1


def same_numbers(before: object, now: object) -> bool:
    """Every number of the stored ``before`` is in ``now``, exactly. Keys that ``now`` adds (a metric
    the older code did not report) do not count against equality: they are new, not different."""
    if isinstance(before, dict) and isinstance(now, dict):
        return all(key in now and same_numbers(value, now[key]) for key, value in before.items())
    return bool(before == now)


#: A run's environment as a record holds it (:func:`fedfew.run.environment.run_environment`).
Environment = Mapping[str, JSONValue]


#: How far a re-run cell's metric may be from its record's when the two ran in different environments
#: (or the record's is not recorded): two builds or processors may round the same arithmetic differently,
#: and a drift within the run's own uncertainty over its test tasks changes no reading. Within one
#: environment the code is the only difference, and nothing may differ.
TOLERANCE = "the stored run's 95% interval over its test episodes (metrics.test.ci95)"


@dataclass(frozen=True)
class Drift:
    """One re-run cell against its record: the cell's metric in both (fractions), the tolerance (the
    record's ``test.ci95``), whether every stored test number is the same (:func:`same_numbers`) and
    whether both ran in one recorded environment (:func:`fedfew.run.environment.same_environment`)."""

    cell: Cell
    metric: str
    stored: float | None
    rerun: float | None
    tolerance: float | None
    exact: bool
    same_environment: bool
    environments: tuple[Environment | None, Environment | None]  # the record's, the re-run's
    #: With ``--old-code``, ``before`` is the older code's run here, and this the stored record's metric.
    recorded: float | None = None

    @classmethod
    def of(cls, cell: Cell, path: str, before: StudyRecord, now: StudyRecord, recorded: float | None = None) -> Drift:
        from fedfew.run.environment import same_environment

        if metric(before, path) is None and metric(now, path) is None:
            path = "test.accuracy"  # a metric the runs do not report: their accuracy stands in
        ci95 = metric(before, "test.ci95")
        return cls(cell, path, metric(before, path), metric(now, path), ci95,
                   same_numbers(before["metrics"].get("test"), now["metrics"].get("test")),
                   same_environment(before.get("environment"), now.get("environment")),
                   (before.get("environment"), now.get("environment")), recorded)

    @property
    def difference(self) -> float | None:
        return None if self.stored is None or self.rerun is None else self.rerun - self.stored

    @property
    def passes(self) -> bool:
        if self.exact:
            return True
        if self.same_environment or self.difference is None or self.tolerance is None:
            return False
        return abs(self.difference) <= self.tolerance

    @property
    def judged(self) -> str:
        if self.exact:
            return "the same"
        if self.same_environment:
            return "DIFFERENT"
        return "within tolerance" if self.passes else "OUTSIDE tolerance"

    def line(self) -> str:
        """The cell's progress line: the two values and the judgement."""
        before = "older code here" if self.recorded is not None else "stored"
        return (f"{_percent(self.rerun)}% ({before}: {_percent(self.stored)}%, {self.metric}), {self.judged}"
                + ("" if self.same_environment or self.exact else " (another environment)"))

    def to_json(self, labels: dict[str, tuple[str, Environment | None]]) -> JSONObject:
        c = self.cell
        return {"config_hash": c.config_hash, "method": c.method, "setting": c.setting, "seed": c.seed,
                "metric": self.metric, "stored": self.stored, "rerun": self.rerun, "difference": self.difference,
                "tolerance": self.tolerance, "exact": self.exact, "same_environment": self.same_environment,
                "environments": [labels[_env_id(e)][0] for e in self.environments], "judged": self.judged,
                **({"recorded": self.recorded} if self.recorded is not None else {})}


def _percent(value: float | None) -> str:
    return "—" if value is None else f"{100 * value:.4f}"


def _env_id(environment: Environment | None) -> str:
    return "" if environment is None else json.dumps(environment, sort_keys=True)


def _environment_labels(records: list[StudyRecord]) -> dict[str, tuple[str, Environment | None]]:
    """E1, E2, ... for the distinct environments of ``records`` in order of appearance ("not recorded"
    for none), by :func:`_env_id`."""
    labels: dict[str, tuple[str, Environment | None]] = {}
    for record in records:
        env = record.get("environment")
        if _env_id(env) not in labels:
            label = "not recorded" if env is None else f"E{sum(1 for k in labels if k) + 1}"
            labels[_env_id(env)] = (label, env)
    return labels


def drift_table(drifts: list[Drift], labels: dict[str, tuple[str, Environment | None]]) -> str:
    """The re-run cells against their records (metric values in percent, the difference in points, the
    environments as stored → re-run), then what each environment label stands for and the tolerance."""
    from fedfew.run.environment import describe

    by_tree = any(d.recorded is not None for d in drifts)
    before = "older code here" if by_tree else "stored"
    lines = [f"| cell | metric | {before} | re-run | difference | tolerance | environments | judged |"
             + (" stored (another run of the older code) |" if by_tree else ""),
             "|---|---|---|---|---|---|---|---|" + ("---|" if by_tree else "")]
    for d in drifts:
        difference = "—" if d.difference is None else f"{100 * d.difference:+.4f}"
        stored, rerun = (labels[_env_id(e)][0] for e in d.environments)
        lines.append(f"| {d.cell.title} | {d.metric} | {_percent(d.stored)} | {_percent(d.rerun)} | {difference} | "
                     f"{'—' if d.tolerance is None else f'± {100 * d.tolerance:.4f}'} | {stored} → {rerun} | "
                     f"{d.judged} |" + (f" {_percent(d.recorded)} |" if by_tree else ""))
    lines.append("")
    lines += [f"{label}: {describe(env)}" for label, env in labels.values() if env is not None]
    lines.append(f"In one environment every stored test number must be the same; across environments (or with "
                 f"an environment not recorded) the metric must be within {TOLERANCE}.")
    return "\n".join(lines)


def verify_study(study: Study, root: Path, budget: str, store_base: Path, runs_base: Path, per_method: int = 1,
                 extra: list[str] | None = None, table_out: TextIO | None = None,
                 older_tree: Path | None = None) -> dict[str, int | str]:
    """Re-run ``per_method`` stored cells of each method (the first settings and seeds that have a record)
    with this code and compare each with its record of the older code that holds most of the budget's
    cells, like with like (:class:`Drift`): in the record's environment every stored test number must be
    the same, exactly; in another environment, or one the record does not name, the cell's metric must be
    within :data:`TOLERANCE`. Prints the drift table (``table_out``, stdout) and returns the verdict line.
    Every cell passing: the re-run cells' records and an equivalence file (the environments, and each
    cell's numbers and difference, as evidence) go into the store, and the older records count as this
    version's, so a commit that does not change these runs' numbers does not send the study back to the
    start. Any one failing: nothing is written to the store (a report would otherwise switch to the few
    new records), exit 1; `study run --new-code` then reads the re-run cells' finished runs back.

    ``older_tree``: a checkout of the records' code (:mod:`fedfew.study.verify_tree`); each chosen cell
    is run by it here as well, and this code's re-run is compared with that run, in one environment, so
    exactly, whichever machine made the records (their own values are kept beside, as ``recorded``)."""
    from fedfew.run.experiment import dataset_cache

    if per_method < 1:
        raise StudyError(f"--per-method: at least 1 cell per method (got {per_method})")
    todo = cells(study, root, budget, None, extra)
    store = CheckedStore(store_base, study.name, "left out: verify compares only usable records")
    code = current_code()
    hashes = {c.config_hash for c in todo}
    others = foreign_codes(store, code, hashes)
    if not others:
        raise StudyError(f"study {study.name} at budget {budget}: the store holds no records of other code for these "
                         f"cells ({code.describe()}); nothing to verify")
    held = {v.key: sum(1 for h in store.by_hash(v) if h in hashes) for v in others}
    old = max(others, key=lambda v: held[v.key])
    old_records = store.by_hash(old)
    taken: dict[str, int] = {}
    chosen = []
    for cell in todo:
        if cell.config_hash in old_records and taken.get(cell.method, 0) < per_method:
            taken[cell.method] = taken.get(cell.method, 0) + 1
            chosen.append(cell)
    tree = None
    if older_tree is not None:
        from fedfew.study.verify_tree import check_tree, tree_code

        tree = tree_code(older_tree)
        check_tree(older_tree, tree, old, store.equal_codes(old))
    by_tree = f" and, on this machine, with the older code's checkout {older_tree} (sources {tree.source})" if tree else ""
    progress_log.info(f"study {study.name} at budget {budget}: re-running {len(chosen)} of the {held[old.key]} cells "
                      f"stored by sources {old.source} with sources {code.source}{by_tree}")
    shown = study.model_copy(update={"metric": study.budget(budget).metric}) if study.budget(budget).metric else study
    drifts: list[Drift] = []
    records: list[StudyRecord] = []
    befores: list[StudyRecord] = []  # what each re-run is compared with: its record, or the older code's run here
    with dataset_cache():
        for i, cell in enumerate(chosen, 1):
            summary, run_folder = run_noted(cell, cell_folder(runs_base, study, cell, code))
            record = cell_record(study, budget, cell, code, summary, run_folder, 0.0)
            records.append(record)
            metric_path = shown.metric_of(cell.method, cell.setting)
            if older_tree is not None and tree is not None:
                from fedfew.study.verify_tree import tree_record

                before = tree_record(study, budget, cell, old_records[cell.config_hash], older_tree, tree, runs_base)
                drift = Drift.of(cell, metric_path, before, record,
                                 recorded=metric(old_records[cell.config_hash], metric_path))
            else:
                before = old_records[cell.config_hash]
                drift = Drift.of(cell, metric_path, before, record)
            befores.append(before)
            drifts.append(drift)
            progress_log.info(f"[{i}/{len(chosen)}] {cell.title}: {drift.line()}")
    labels = _environment_labels(befores + records)
    print(drift_table(drifts, labels), file=table_out or sys.stdout, flush=True)
    exact = sum(d.exact for d in drifts)
    failed = [d for d in drifts if not d.passes]
    if failed:
        same_env = sum(d.same_environment for d in failed)
        raise CodeDiffers(f"study {study.name}: sources {code.source} gives other numbers than sources {old.source} on "
                          f"{len(failed)} of {len(chosen)} re-run cells ({same_env} different in the same environment, "
                          f"{len(failed) - same_env} outside {TOLERANCE} across environments; first: "
                          f"{failed[0].cell.title}); nothing recorded as equal: run the study again with --new-code")
    for record in records:
        store.put(record)
    equivalence: Equivalence = {
        "format": FORMAT, "study": study.name, "budget": budget, "code": code.to_json(), "equal_to": old.to_json(),
        "exact": exact == len(drifts), "tolerance": TOLERANCE,
        "environments": {label: env for label, env in labels.values() if env is not None},
        "cells": [d.to_json(labels) for d in drifts], "verified": timestamp()}
    if tree is not None and older_tree is not None:
        equivalence["older_code_run_here"] = {"checkout": str(older_tree), **tree.to_json()}
    path = store.put_equivalence(equivalence)
    how = ("exactly" if exact == len(drifts) else
           f"{exact} exactly, {len(drifts) - exact} within {TOLERANCE} across environments")
    if tree is not None:
        how += f", against the older code's own runs on this machine (sources {tree.source})"
    verdict = (f"study {study.name}: sources {code.source} gives the numbers of sources {old.source} on all "
               f"{len(chosen)} re-run cells ({how}); the older records count as this version's ({path})")
    return {"cells": len(chosen), "old": old.source, "new": code.source, "file": str(path), "exact": exact,
            "verdict": verdict}
