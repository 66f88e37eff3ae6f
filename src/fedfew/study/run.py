"""``fedfew study run``: every cell of a study at a budget not yet in the store, each an ordinary run
(:mod:`fedfew.study.cell`) whose record is written to the store; cells already stored are skipped, an
interrupted cell is resumed, a run another study's store holds is copied, and a cell another process
sharing the study has claimed (:mod:`fedfew.study.claims`) is left to it. Progress goes to the
``fedfew.study`` logger, one line per cell, which the command line prints as it is."""

from __future__ import annotations

import difflib
import logging
import time
from pathlib import Path

from fedfew.core.errors import FedfewError, RunInterrupted, UsageError
from fedfew.study.cell import cell_record, run_noted, shown
from fedfew.study.cell_paths import RunProgress, resumable_folder, run_progress
from fedfew.study.claims import claim_cell, claim_owner
from fedfew.study.estimate import duration, runs_to_go, sitting_times, time_left, typical_seconds
from fedfew.study.grid import Cell, cells
from fedfew.study.records import CheckedStore, usable_elsewhere
from fedfew.study.store import CodeVersion, ResultStore, StudyRecord, current_code, foreign_codes
from fedfew.study.study_file import Study
from fedfew.study.study_sections import StudyError

#: The progress of `fedfew study run`: the command's own lines, printed without the ``fedfew:`` of a
#: note (:data:`fedfew.cli.logs.PROGRESS_LOGGERS`).
progress_log = logging.getLogger("fedfew.study")


class CellsFailed(FedfewError):
    """Some cells could not run (an impossible partition for one seed, a run in which nothing trained);
    the others went on and are in the store. Exit 2 when any failure is bad input, else 1."""

    def __init__(self, study: str, failed: list[tuple[Cell, FedfewError]], total: int) -> None:
        cell, first = failed[0]
        super().__init__(f"study {study}: {len(failed)} of {total} cells failed (first: {cell.title}: {first}); the "
                         "others are in the store, and the same command runs the failed ones again")
        self.exit_code = 2 if any(isinstance(err, UsageError) for _, err in failed) else 1


def still_mine(cells_left: list[Cell], store: ResultStore, code: CodeVersion,
               where: dict[str, RunProgress]) -> list[Cell]:
    """The cells of ``cells_left`` this process can still expect to run: not stored meanwhile (by
    another process sharing the study) and not claimed by a live other process (its time is theirs)."""
    return [c for c in cells_left if store.get(c.config_hash, code) is None
            and (c.config_hash not in where or claim_owner(where[c.config_hash].folder) is None)]


def of_methods(todo: list[Cell], methods: list[str] | None, where: str) -> list[Cell]:
    """The cells of the rows ``methods`` (all when None), each name checked against the rows ``where`` has."""
    if methods is None:
        return todo
    rows = list(dict.fromkeys(cell.method for cell in todo))
    for method in methods:
        if method not in rows:
            close = difflib.get_close_matches(method, rows, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise StudyError(f"--method {method!r}: {where} has no such row{hint} (its rows: {', '.join(map(repr, rows))})")
    return [cell for cell in todo if cell.method in methods]


def run_study(study: Study, root: Path, budget: str, store_base: Path, runs_base: Path,
              seeds: list[int] | None = None, extra: list[str] | None = None, new_code: bool = False,
              reuse: bool = True, methods: list[str] | None = None) -> dict[str, int]:
    """Run every cell of ``study`` at ``budget`` not yet in the store (of the rows ``methods`` only, when
    given: a long budget's cheap rows first). A cell whose run another study's store already holds (the
    same config hash and code version) is copied from there, not run again, unless ``reuse`` is False.
    Returns counts (cells, run, skipped, held, reused)."""
    from fedfew.run.experiment import dataset_cache

    todo = of_methods(cells(study, root, budget, seeds, extra), methods, f"study {study.name} at budget {budget}")
    store = CheckedStore(store_base, study.name, "left out: its cell runs again and the record is overwritten")
    code = current_code()
    others = foreign_codes(store, code, (c.config_hash for c in todo))
    if others and not new_code:
        raise StudyError(
            f"store {store.folder} holds results of these cells from other code ({others[0].describe()}); this is "
            f"{code.describe()}. Run again with --new-code to add this version's results beside them (reports "
            "show the newest version), or point --store elsewhere")
    done = store.by_hash(code)
    pending = runs_to_go(todo, done)
    runs = len({c.config_hash for c in todo})
    skipped = runs - len(pending)  # runs, not cells: equal unless cells share a run
    progress_log.info(f"study {study.name} at budget {budget}: {len(todo)} cells"
                      + (f" ({runs} distinct runs)" if runs < len(todo) else "")
                      + f", {skipped} already in {store.folder}")
    typical = typical_seconds(store, {c.config_hash for c in todo})
    where = {c.config_hash: run_progress(c, study, code, store, store_base, runs_base, reuse) for c in pending}
    progress = {config_hash: p.rounds_done for config_hash, p in where.items()}
    mine = still_mine(pending, store, code, where)
    expected = time_left(mine, typical, [], progress)
    if pending and expected is not None:  # before the first cell ends, from the store's times of these methods
        elsewhere = len(pending) - len(mine)
        progress_log.info(f"study {study.name}: {len(pending)} runs to go"
                          + (f" ({elsewhere} running in {'another process' if elsewhere == 1 else 'other processes'})"
                             if elsewhere else "")
                          + f", about {duration(expected)} in one process (the stored runs' times of the same "
                            "methods)")
    spent: list[float] = []  # the run time of each cell this sitting ran, in order
    failed: list[tuple[Cell, FedfewError]] = []
    held: list[Cell] = []  # claimed by a live other process when reached
    by_others: list[Cell] = []  # stored by another process before this one reached it
    reused = 0
    with dataset_cache():
        for i, cell in enumerate(pending, 1):
            shared = usable_elsewhere(store_base, study.name, cell.config_hash, code) if reuse else None
            if shared is not None and store.get(cell.config_hash, code) is None:
                record: StudyRecord = {**shared, "study": study.name, "budget": budget, "method": cell.method,
                                       "setting": cell.setting, "seed": cell.seed}
                store.put(record)
                reused += 1
                progress_log.info(f"[{skipped + i}/{runs}] {cell.title}: {shown(study, cell, record)}, the same run as "
                                  f"{shared['reused_from']} (config and code); copied, not run again")
                continue
            start = time.perf_counter()
            folder = resumable_folder(runs_base, study, cell, code, store)
            # Two processes may share a study (disjoint seeds, or the same ones): a cell the other is
            # running is left to it, not failed; the other stores it when it finishes.
            with claim_cell(folder) as owner:
                if owner is not None:
                    held.append(cell)
                    progress_log.info(f"[{skipped + i}/{runs}] {cell.title}: running in another process (pid {owner}); "
                                      "left to it")
                    continue
                if store.get(cell.config_hash, code) is not None:  # another process stored it meanwhile
                    by_others.append(cell)
                    progress_log.info(f"[{skipped + i}/{runs}] {cell.title}: stored by another process meanwhile")
                    continue
                try:
                    summary, run_folder = run_noted(cell, folder)
                except RunInterrupted:
                    progress_log.info(f"study {study.name}: stopped in cell {cell.title} ({skipped + i - 1}/{runs} "
                                      "done); run the same `fedfew study run` again to continue (the cell resumes "
                                      "from its checkpoint)")
                    raise
                except FedfewError as err:  # this cell's own problem (its partition, a failed run): go on
                    failed.append((cell, err))
                    progress_log.info(f"[{skipped + i}/{runs}] {cell.title}: failed: {err}")
                    continue
                wall = time.perf_counter() - start
                record = cell_record(study, budget, cell, code, summary, run_folder, wall)
                store.put(record)
            spent.append(float(record["wall_seconds"]))  # the run's own time, as the stored times are
            left = time_left(still_mine(pending[i:], store, code, where), typical, sitting_times(spent), progress)
            # the run's own time over its sittings (a run read back or resumed: not this sitting's)
            progress_log.info(f"[{skipped + i}/{runs}] {cell.title}: {shown(study, cell, record)} in "
                              f"{record['wall_seconds']:.1f} s" + (f"; about {duration(left)} left" if left else ""))
    # A cell left to another process may be stored by now: it was stored by that process, not left running.
    finished = [c for c in held if store.get(c.config_hash, code) is not None]
    held = [c for c in held if c not in finished]
    by_others += finished
    if by_others:
        progress_log.info(f"study {study.name}: {len(by_others)} cells were stored by other processes sharing the "
                          "study (not run here)")
    if held:
        progress_log.info(f"study {study.name}: {len(held)} cells were running in other processes and are left to "
                          "them; the same command after they finish stores any they did not complete")
    if failed:
        raise CellsFailed(study.name, failed, len(todo))
    return {"cells": runs, "run": len(pending) - len(held) - len(by_others) - reused, "skipped": skipped,
            "held": len(held), "stored_by_others": len(by_others), "reused": reused}

