"""``fedfew study run``: every cell an ordinary run (run folder, checkpoints, resume, engines), its
result written to the store; cells already stored are skipped and an interrupted cell is resumed."""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import statistics
import sys
import time
from collections.abc import Container, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedfew.config import dump_config
from fedfew.errors import FedfewError, RunInterrupted, UsageError
from fedfew.study.grid import Cell, cells
from fedfew.study.schema import Study, StudyError
from fedfew.study.store import (
    FORMAT,
    CodeVersion,
    ResultStore,
    current_code,
    foreign_codes,
    make_record,
    metric,
    stored_elsewhere,
)

log = logging.getLogger(__name__)


def cell_folder(runs_base: Path, study: Study, cell: Cell, code: CodeVersion) -> Path:
    """The folder that holds the cell's one run folder (made by :func:`fedfew.runner.run_experiment`)."""
    return runs_base / study.name / f"{cell.config_hash}-{code.source}"


def existing_run(folder: Path) -> Path | None:
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


#: The file in a cell's folder that a `fedfew study run` process holds (flock) while it runs the cell,
#: with its pid inside: how processes sharing a study leave each other's cells alone.
CLAIM_FILE = ".claim"


def _owner(fd: int) -> int | str:
    """The pid the claim's holder wrote into it."""
    owner = os.pread(fd, 32, 0).decode(errors="replace").strip()
    return int(owner) if owner.isdigit() else "unknown"


def _try_lock(fd: int, mode: int = fcntl.LOCK_EX) -> bool:
    """Take the claim's lock without waiting (``mode``: LOCK_EX to hold it, LOCK_SH to look); False
    when another process holds it."""
    try:
        fcntl.flock(fd, mode | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


@contextlib.contextmanager
def claim_cell(folder: Path) -> Iterator[int | str | None]:
    """Hold the cell's claim for the ``with`` block: yields None when this process holds it, or the pid
    of the live process that does (another `fedfew study run` sharing the study). The OS releases the
    claim when its holder exits, however it exits, so a stopped process leaves no stale claim."""
    folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder / CLAIM_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        held = not _try_lock(fd)
        if held:  # look again: `fedfew study status` holds a claim for a moment, a run for its whole cell
            time.sleep(0.5)
            held = not _try_lock(fd)
        if held:
            yield _owner(fd)
            return
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        yield None
    finally:
        os.close(fd)  # closing the descriptor releases the flock


def claim_owner(folder: Path) -> int | str | None:
    """The pid of the live process holding the cell's claim (``fedfew study status``), or None. It
    holds the claim only for the moment of the test (:func:`claim_cell` looks twice) and makes no
    folder or file."""
    path = folder / CLAIM_FILE
    if not path.is_file():
        return None
    fd = os.open(path, os.O_RDONLY)
    try:
        return None if _try_lock(fd, fcntl.LOCK_SH) else _owner(fd)
    finally:
        os.close(fd)  # closing the descriptor releases the shared lock the look took


def _run_cell(cell: Cell, folder: Path) -> tuple[dict[str, Any], Path]:
    """Run the cell, resume its interrupted run, or read its finished one; returns the run's summary
    and its run folder."""
    from fedfew.runner import resume_run, run_experiment

    previous = existing_run(folder)
    if previous is not None:
        if run_status(previous).get("status") == "complete" and (previous / "summary.json").is_file():
            return json.loads((previous / "summary.json").read_text()), previous
        log.info("resuming %s in %s", cell.title, previous)
        return resume_run(previous, progress=False), previous
    summary = run_experiment(cell.config, folder, progress=False)
    return summary, Path(summary["folder"])


def metrics_rows(run_folder: Path) -> list[dict[str, Any]]:
    """A run folder's metrics.jsonl, one dict a round (none when the run has not logged one)."""
    path = run_folder / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []


def run_status(run_folder: Path) -> dict[str, Any]:
    """A run folder's status.json (empty when it has none)."""
    path = run_folder / "status.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def evaluated_history(run_folder: Path) -> list[dict[str, Any]]:
    """The rounds of a run's metrics.jsonl that were evaluated, with their numbers only (round, train_*,
    val_*, test_*; not who replied or bytes): what a report draws as curves, kept small in the store."""
    kept = []
    for row in metrics_rows(run_folder):
        if not any(k.startswith(("val_", "test_")) for k in row):
            continue
        kept.append({"round": row["round"], **{k: v for k, v in row.items() if k.startswith(("train_", "val_", "test_"))
                                               and isinstance(v, (int, float)) and not isinstance(v, bool)}})
    return kept


class CellsFailed(FedfewError):
    """Some cells could not run (an impossible partition for one seed, a run in which nothing trained);
    the others went on and are in the store. Exit 2 when any failure is bad input, else 1."""

    def __init__(self, study: str, failed: list[tuple[Cell, FedfewError]], total: int) -> None:
        cell, first = failed[0]
        super().__init__(f"study {study}: {len(failed)} of {total} cells failed (first: {cell.title}: {first}); the "
                         "others are in the store, and the same command runs the failed ones again")
        self.exit_code = 2 if any(isinstance(err, UsageError) for _, err in failed) else 1


def duration(seconds: float) -> str:
    """A time in the unit a person reads it in: s, min or h."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def typical_seconds(store: ResultStore, hashes: set[str]) -> dict[tuple[str, str | None], float]:
    """Median wall time of the stored runs of these cells (``hashes``: the budget's grid, whichever
    sitting's budget name ran them; any code version), by (method, setting) and by (method, None):
    what a pending cell of that method can be expected to take. Copies of another study's runs are
    left out: their time is that study's."""
    by_key: dict[tuple[str, str | None], list[float]] = {}
    for r in store.records():
        if r["config_hash"] not in hashes or "reused_from" in r or not isinstance(r.get("wall_seconds"), (int, float)):
            continue
        for key in ((r["method"], r["setting"]), (r["method"], None)):
            by_key.setdefault(key, []).append(float(r["wall_seconds"]))
    return {key: statistics.median(times) for key, times in by_key.items()}


def runs_to_go(todo: list[Cell], stored: Container[str]) -> list[Cell]:
    """One cell per run whose config hash is not ``stored``: cells that read other numbers of the same
    run (a row's or column's own metric) share it, and the first of them names it."""
    first: dict[str, Cell] = {}
    for cell in todo:
        if cell.config_hash not in stored:
            first.setdefault(cell.config_hash, cell)
    return list(first.values())


def rounds_done(run_folder: Path | None) -> int:
    """The last round a run folder logged: how far an interrupted or running cell has come (0: none)."""
    return max((row.get("round", 0) for row in metrics_rows(run_folder)), default=0) if run_folder else 0


def time_left(remaining: list[Cell], typical: dict[tuple[str, str | None], float], spent: list[float],
              progress: dict[str, int] | None = None) -> float | None:
    """Seconds the ``remaining`` cells can be expected to take in this process: each its method's
    typical stored time (its setting's where there is one), or this sitting's mean per cell for a
    method the store has no time of, times the fraction of its rounds not yet run (``progress``:
    rounds done by config hash, for cells with an interrupted run); None when neither time is known."""
    fallback = sum(spent) / len(spent) if spent else None
    progress = progress or {}
    total = 0.0
    for cell in remaining:
        seconds = typical.get((cell.method, cell.setting), typical.get((cell.method, None), fallback))
        if seconds is None:
            return None
        rounds = cell.config.federation.rounds
        done = min(progress.get(cell.config_hash, 0), rounds)
        total += seconds * (1 - done / rounds) if rounds else seconds
    return total


def run_study(study: Study, root: Path, budget: str, store_base: Path, runs_base: Path,
              seeds: list[int] | None = None, extra: list[str] | None = None, new_code: bool = False,
              out: Any = None, reuse: bool = True) -> dict[str, int]:
    """Run every cell of ``study`` at ``budget`` not yet in the store. A cell whose run another study's
    store already holds (the same config hash and code version) is copied from there, not run again,
    unless ``reuse`` is False. Returns counts (cells, run, skipped, held, reused)."""
    from fedfew.experiment import dataset_cache

    out = out or sys.stderr
    todo = cells(study, root, budget, seeds, extra)  # every config validated before any work
    store = ResultStore(store_base, study.name)
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
    print(f"study {study.name} at budget {budget}: {len(todo)} cells"
          + (f" ({runs} distinct runs)" if runs < len(todo) else "")
          + f", {skipped} already in {store.folder}", file=out, flush=True)
    typical = typical_seconds(store, {c.config_hash for c in todo})
    progress = {c.config_hash: run_progress(c, study, code, store, store_base, runs_base, reuse).rounds_done
                for c in pending}
    expected = time_left(pending, typical, [], progress)
    if pending and expected is not None:  # before the first cell ends, from the store's times of these methods
        print(f"study {study.name}: {len(pending)} runs to go, about {duration(expected)} in one process (the stored "
              "runs' times of the same methods)", file=out, flush=True)
    spent: list[float] = []
    failed: list[tuple[Cell, FedfewError]] = []
    held: list[Cell] = []
    reused = 0
    with dataset_cache():
        for i, cell in enumerate(pending, 1):
            shared = stored_elsewhere(store_base, study.name, cell.config_hash, code) if reuse else None
            if shared is not None and store.get(cell.config_hash, code) is None:
                record = {**shared, "study": study.name, "budget": budget, "method": cell.method,
                          "setting": cell.setting, "seed": cell.seed}
                store.put(record)
                reused += 1
                print(f"[{skipped + i}/{runs}] {cell.title}: {_shown(study, cell, record)}, the same run as {shared['reused_from']} "
                      "(config and code); copied, not run again", file=out, flush=True)
                continue
            start = time.perf_counter()
            folder = resumable_folder(runs_base, study, cell, code, store)
            # Two processes may share a study (disjoint seeds, or the same ones): a cell the other is
            # running is left to it, not failed; the other stores it when it finishes.
            with claim_cell(folder) as owner:
                if owner is not None:
                    held.append(cell)
                    print(f"[{skipped + i}/{runs}] {cell.title}: running in another process (pid {owner}); left "
                          "to it", file=out, flush=True)
                    continue
                if store.get(cell.config_hash, code) is not None:  # another process stored it meanwhile
                    held.append(cell)
                    continue
                try:
                    summary, run_folder = _run_cell(cell, folder)
                except RunInterrupted:
                    print(f"study {study.name}: stopped in cell {cell.title} ({skipped + i - 1}/{runs} done); run "
                          "the same `fedfew study run` again to continue (the cell resumes from its checkpoint)",
                          file=out, flush=True)
                    raise
                except FedfewError as err:  # this cell's own problem (its partition, a failed run): go on
                    failed.append((cell, err))
                    print(f"[{skipped + i}/{runs}] {cell.title}: failed: {err}", file=out, flush=True)
                    continue
                wall = time.perf_counter() - start
                record = _cell_record(study, budget, cell, code, summary, run_folder, wall)
                store.put(record)
            spent.append(wall)
            left = time_left(pending[i:], typical, spent, progress)
            # the run's own time over its sittings (a run read back or resumed: not this sitting's)
            print(f"[{skipped + i}/{runs}] {cell.title}: {_shown(study, cell, record)} in {record['wall_seconds']:.1f} s"
                  + (f"; about {duration(left)} left" if left else ""), file=out, flush=True)
    if held:
        print(f"study {study.name}: {len(held)} cells were running in other processes and are left to them; the "
              "same command after they finish stores any they did not complete", file=out, flush=True)
    if failed:
        raise CellsFailed(study.name, failed, len(todo))
    return {"cells": runs, "run": len(pending) - len(held) - reused, "skipped": skipped, "held": len(held),
            "reused": reused}


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
    if reuse and stored_elsewhere(store_base, study.name, cell.config_hash, code) is not None:
        return RunProgress(folder, None, cell.config.federation.rounds, True)
    run_folder = existing_run(folder)
    return RunProgress(folder, run_folder, rounds_done(run_folder), False)


def _shown(study: Study, cell: Cell, record: dict[str, Any]) -> str:
    """The cell's value in a progress line: its metric (test.accuracy unless the study names another)."""
    path = study.metric_of(cell.method, cell.setting)
    value = metric(record, path)
    return f"{100 * value:.2f}%" if value is not None else f"no {path}"


def _cell_record(study: Study, budget: str, cell: Cell, code: CodeVersion, summary: dict[str, Any],
                 run_folder: Path, wall: float) -> dict[str, Any]:
    """The store record of a finished cell (``wall``: the time to use when the summary has none)."""
    seconds = run_seconds(run_folder, summary) if isinstance(summary.get("seconds"), (int, float)) else wall
    return make_record(study.name, budget, cell.method, cell.setting, cell.seed, cell.config_hash, _config_data(cell),
                       code, summary, seconds, evaluated_history(run_folder))


def run_seconds(run_folder: Path, summary: dict[str, Any]) -> float:
    """The run's time over all its sittings. The summary of a resumed run counts its last sitting's
    rounds twice: ``fedfew.runner._train`` adds the simulator's cumulative seconds at the end (which
    hold that sitting's rounds already) to the sitting's elapsed time, where the cumulative seconds at
    the checkpoint it resumed from were meant. Fixing that line changes the code version of every
    stored record, so it waits for the next batch of such changes (docs/studies.md), and this function
    with it: for a run whose status.json says it was resumed (``resumed``: the round it resumed from),
    the time is the summary's minus the cumulative seconds of metrics.jsonl's last round plus those of
    the resumed round. A run never resumed keeps the summary's seconds."""
    seconds = float(summary["seconds"])
    resumed = run_status(run_folder).get("resumed")
    if not isinstance(resumed, int):
        return seconds
    cumulative = {row["round"]: float(row["seconds"]) for row in metrics_rows(run_folder)
                  if isinstance(row.get("seconds"), (int, float))}
    if not cumulative:
        return seconds
    corrected = seconds - cumulative[max(cumulative)] + cumulative.get(resumed, 0.0)
    return corrected if 0 < corrected <= seconds else seconds


def _config_data(cell: Cell) -> dict[str, Any]:
    import yaml

    return yaml.safe_load(dump_config(cell.config))


class CodeDiffers(FedfewError):
    """``fedfew study verify`` found a re-run cell whose numbers differ from its stored record (exit 1)."""

    exit_code = 1


def same_numbers(before: Any, now: Any) -> bool:
    """Every number of the stored ``before`` is in ``now``, exactly. Keys that ``now`` adds (a metric
    the older code did not report) do not count against equality: they are new, not different."""
    if isinstance(before, dict) and isinstance(now, dict):
        return all(key in now and same_numbers(value, now[key]) for key, value in before.items())
    return bool(before == now)


def verify_study(study: Study, root: Path, budget: str, store_base: Path, runs_base: Path, per_method: int = 1,
                 extra: list[str] | None = None, out: Any = None) -> dict[str, Any]:
    """Re-run ``per_method`` stored cells of each method (the first settings and seeds that have a record)
    with this code and compare their test metrics with the records of the older code that holds most
    of the budget's cells. Every one equal, exactly: the re-run cells' records and an equivalence file
    (the cells as evidence) go into the store, and the older records count as this version's, so a
    commit that does not change these runs' numbers does not send the study back to the start. Any one
    different: nothing is written to the store (a report would otherwise switch to the few new
    records), exit 1; `study run --new-code` then reads the re-run cells' finished runs back."""
    from fedfew.experiment import dataset_cache

    out = out or sys.stderr
    if per_method < 1:
        raise StudyError(f"--per-method: at least 1 cell per method (got {per_method})")
    todo = cells(study, root, budget, None, extra)
    store = ResultStore(store_base, study.name)
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
    print(f"study {study.name} at budget {budget}: re-running {len(chosen)} of the {held[old.key]} cells stored by "
          f"sources {old.source} with sources {code.source}", file=out, flush=True)
    compared, records = [], []
    differ = []
    with dataset_cache():
        for i, cell in enumerate(chosen, 1):
            summary, run_folder = _run_cell(cell, cell_folder(runs_base, study, cell, code))
            record = _cell_record(study, budget, cell, code, summary, run_folder, 0.0)
            records.append(record)
            before, now = old_records[cell.config_hash]["metrics"].get("test"), record["metrics"].get("test")
            same = same_numbers(before, now)
            compared.append({"config_hash": cell.config_hash, "method": cell.method, "setting": cell.setting,
                             "seed": cell.seed, "test": now})
            if not same:
                differ.append(cell)
            shown = (f"{100 * now['accuracy']:.4f}% (stored: {100 * before['accuracy']:.4f}%)"
                     if isinstance(now, dict) and isinstance(before, dict) and "accuracy" in now and "accuracy" in before
                     else f"{now} (stored: {before})")
            print(f"[{i}/{len(chosen)}] {cell.title}: {shown}, {'the same' if same else 'DIFFERENT'}", file=out, flush=True)
    if differ:
        raise CodeDiffers(f"study {study.name}: sources {code.source} gives other numbers than sources {old.source} on "
                          f"{len(differ)} of {len(chosen)} re-run cells (first: {differ[0].title}); nothing recorded as "
                          "equal: run the study again with --new-code")
    for record in records:
        store.put(record)
    path = store.put_equivalence({"format": FORMAT, "study": study.name, "budget": budget, "code": code.to_json(),
                                  "equal_to": old.to_json(), "cells": compared,
                                  "verified": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
    return {"cells": len(chosen), "old": old.source, "new": code.source, "file": str(path)}
