"""One cell of a study as an ordinary run (run folder, checkpoints, resume, engines): run it, resume its
interrupted run or read its finished one back, noting each sitting that runs (:mod:`fedfew.study.sittings`),
and make the store record of its result."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TypeGuard

from fedfew.config.validation import dump_config
from fedfew.core.jsontypes import JSONObject
from fedfew.run.folder import RunFolder
from fedfew.study.cell_paths import existing_run
from fedfew.study.grid import Cell
from fedfew.study.run_readback import evaluated_history, finished, read_summary, run_seconds
from fedfew.study.sittings import noted_sitting, run_usage
from fedfew.study.store import CodeVersion, StudyRecord, make_record, metric
from fedfew.study.study_file import Study

log = logging.getLogger(__name__)


def continues(previous: Path | None) -> TypeGuard[Path]:
    """Whether a cell's unfinished run folder has a checkpoint to resume from (without one, the cell
    starts again in a new run folder)."""
    return previous is not None and RunFolder(previous).has_checkpoint()


def run_cell(cell: Cell, folder: Path) -> tuple[JSONObject, Path]:
    """Run the cell in its cell folder ``folder``, resume its interrupted run, or read its finished one;
    returns the run's summary and its run folder."""
    from fedfew.run.results import as_json
    from fedfew.run.runner import resume_run, run_experiment

    previous = existing_run(folder)
    if previous is not None and finished(previous):
        return read_summary(previous), previous
    if continues(previous):
        log.info("resuming %s in %s", cell.title, previous)
        return as_json(resume_run(previous, progress=False)), previous
    if previous is not None:
        # Nothing to continue (no checkpoint): resuming would only repeat the run from round 0 with the
        # config its folder recorded, data folder included, so a cell that failed for want of data
        # would fail again after $FEDFEW_DATA is fixed. A new run folder (the newest, so the one used
        # from now on) takes this process's config; the old one stays for its error.
        log.info("%s: the run in %s left no checkpoint; starting it again", cell.title, previous)
    summary = run_experiment(cell.config, folder, progress=False)
    return as_json(summary), Path(summary["folder"])


def run_noted(cell: Cell, folder: Path) -> tuple[JSONObject, Path]:
    """:func:`run_cell`, noting the sitting in ``folder`` when it runs (a finished run read back adds none)."""
    previous = existing_run(folder)
    if finished(previous):
        return run_cell(cell, folder)
    with noted_sitting(folder, cell.config, fresh=not continues(previous)):
        return run_cell(cell, folder)


def cell_record(study: Study, budget: str, cell: Cell, code: CodeVersion, summary: JSONObject,
                run_folder: Path, wall: float) -> StudyRecord:
    """The store record of a finished cell (``wall``: the time to use when the summary has none), with
    its environment and CPU time from the sittings noted in its cell folder (:func:`run_usage`)."""
    import yaml

    seconds = run_seconds(run_folder, summary) if isinstance(summary.get("seconds"), (int, float)) else wall
    config = yaml.safe_load(dump_config(cell.config))
    return make_record(study.name, budget, cell.method, cell.setting, cell.seed, cell.config_hash, config,
                       code, summary, seconds, evaluated_history(run_folder), run_usage(run_folder.parent))


def shown(study: Study, cell: Cell, record: StudyRecord) -> str:
    """The cell's value in a progress line: its metric (test.accuracy unless the study names another)."""
    path = study.metric_of(cell.method, cell.setting)
    value = metric(record, path)
    return f"{100 * value:.2f}%" if value is not None else f"no {path}"
