"""Where a cell's run lives: its cell folder under the runs folder (one per config hash and code version,
holding the cell's one run folder, its claim and its sitting notes), the run folder to continue (this
code's, or an interrupted one of code verified to give the same numbers), and where a run still to go
stands."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from fedfew.study.grid import Cell
from fedfew.study.records import usable_elsewhere
from fedfew.study.run_readback import rounds_done
from fedfew.study.store import CodeVersion, ResultStore
from fedfew.study.study_file import Study

log = logging.getLogger(__name__)


def cell_folder(runs_base: Path, study: Study, cell: Cell, code: CodeVersion) -> Path:
    """The folder that holds the cell's one run folder (made by :func:`fedfew.run.runner.run_experiment`)."""
    return runs_base / study.name / f"{cell.config_hash}-{code.source}"


def existing_run(folder: Path) -> Path | None:
    """The cell folder's run folder (the newest, should there be more than one), or None."""
    runs = sorted(p for p in folder.glob("*") if (p / "config.yaml").is_file()) if folder.is_dir() else []
    return runs[-1] if runs else None


def resumable_folder(runs_base: Path, study: Study, cell: Cell, code: CodeVersion, store: ResultStore) -> Path:
    """This code's folder for the cell, or, where this code has no run of it yet, the folder of an
    interrupted run made by a version verified to give this one's numbers (``fedfew study verify``):
    a long cell stopped before a commit continues after it instead of starting again."""
    folder = cell_folder(runs_base, study, cell, code)
    if existing_run(folder) is not None:
        return folder
    for source in sorted({key.rsplit("+", 1)[-1] for key in store.equal_codes(code)}):  # key: package+source
        older = runs_base / study.name / f"{cell.config_hash}-{source}"
        if existing_run(older) is not None:
            log.info("%s: continuing the run of verified-equal sources %s", cell.title, source)
            return older
    return folder


@dataclass(frozen=True)
class RunProgress:
    """Where a run still to go stands: its cell folder (the claim lives there), its run folder if one
    was started, the rounds it has done, and whether another study's store holds it (copied, not run:
    all its rounds count as done)."""

    folder: Path
    run_folder: Path | None
    rounds_done: int
    copyable: bool


def run_progress(cell: Cell, study: Study, code: CodeVersion, store: ResultStore, store_base: Path, runs_base: Path,
                 reuse: bool = True) -> RunProgress:
    folder = resumable_folder(runs_base, study, cell, code, store)
    if reuse and usable_elsewhere(store_base, study.name, cell.config_hash, code) is not None:
        return RunProgress(folder, None, cell.config.federation.rounds, True)
    run_folder = existing_run(folder)
    return RunProgress(folder, run_folder, rounds_done(run_folder), False)
