"""``fedfew study run``: every cell an ordinary run (run folder, checkpoints, resume, engines), its
result written to the store; cells already stored are skipped and an interrupted cell is resumed."""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import resource
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
from fedfew.study.records import CheckedStore, usable_elsewhere
from fedfew.study.schema import Study, StudyError
from fedfew.study.store import (
    FORMAT,
    CodeVersion,
    ResultStore,
    current_code,
    foreign_codes,
    make_record,
    metric,
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
    typical stored time (its setting's where there is one), or the median of ``spent`` (this sitting's
    run times, its first cell left out by the caller: :func:`sitting_times`) for a method the store has
    no time of, times the fraction of its rounds not yet run (``progress``: rounds done by config hash,
    for cells with an interrupted run); None when neither time is known."""
    fallback = statistics.median(spent) if spent else None
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


def sitting_times(spent: list[float]) -> list[float]:
    """This sitting's run times to estimate the rest from: all but the first, which carries the
    sitting's one-off start-up (a sentence encoder loading and encoding every text, the data cache
    filling); with only the first, none (no estimate rather than that start-up times every cell)."""
    return spent[1:]


def still_mine(cells_left: list[Cell], store: ResultStore, code: CodeVersion,
               where: dict[str, RunProgress]) -> list[Cell]:
    """The cells of ``cells_left`` this process can still expect to run: not stored meanwhile (by
    another process sharing the study) and not claimed by a live other process (its time is theirs)."""
    return [c for c in cells_left if store.get(c.config_hash, code) is None
            and (c.config_hash not in where or claim_owner(where[c.config_hash].folder) is None)]


def run_study(study: Study, root: Path, budget: str, store_base: Path, runs_base: Path,
              seeds: list[int] | None = None, extra: list[str] | None = None, new_code: bool = False,
              out: Any = None, reuse: bool = True) -> dict[str, int]:
    """Run every cell of ``study`` at ``budget`` not yet in the store. A cell whose run another study's
    store already holds (the same config hash and code version) is copied from there, not run again,
    unless ``reuse`` is False. Returns counts (cells, run, skipped, held, reused)."""
    from fedfew.experiment import dataset_cache

    out = out or sys.stderr
    todo = cells(study, root, budget, seeds, extra)  # every config validated before any work
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
    print(f"study {study.name} at budget {budget}: {len(todo)} cells"
          + (f" ({runs} distinct runs)" if runs < len(todo) else "")
          + f", {skipped} already in {store.folder}", file=out, flush=True)
    typical = typical_seconds(store, {c.config_hash for c in todo})
    where = {c.config_hash: run_progress(c, study, code, store, store_base, runs_base, reuse) for c in pending}
    progress = {config_hash: p.rounds_done for config_hash, p in where.items()}
    mine = still_mine(pending, store, code, where)
    expected = time_left(mine, typical, [], progress)
    if pending and expected is not None:  # before the first cell ends, from the store's times of these methods
        elsewhere = len(pending) - len(mine)
        print(f"study {study.name}: {len(pending)} runs to go"
              + (f" ({elsewhere} running in {'another process' if elsewhere == 1 else 'other processes'})"
                 if elsewhere else "")
              + f", about {duration(expected)} in one process (the stored runs' times of the same methods)",
              file=out, flush=True)
    spent: list[float] = []  # the run time of each cell this sitting ran, in order
    failed: list[tuple[Cell, FedfewError]] = []
    held: list[Cell] = []  # claimed by a live other process when reached
    by_others: list[Cell] = []  # stored by another process before this one reached it
    reused = 0
    with dataset_cache():
        for i, cell in enumerate(pending, 1):
            shared = usable_elsewhere(store_base, study.name, cell.config_hash, code) if reuse else None
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
                    by_others.append(cell)
                    print(f"[{skipped + i}/{runs}] {cell.title}: stored by another process meanwhile", file=out,
                          flush=True)
                    continue
                try:
                    summary, run_folder = _run_noted(cell, folder)
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
            spent.append(float(record["wall_seconds"]))  # the run's own time, as the stored times are
            left = time_left(still_mine(pending[i:], store, code, where), typical, sitting_times(spent), progress)
            # the run's own time over its sittings (a run read back or resumed: not this sitting's)
            print(f"[{skipped + i}/{runs}] {cell.title}: {_shown(study, cell, record)} in {record['wall_seconds']:.1f} s"
                  + (f"; about {duration(left)} left" if left else ""), file=out, flush=True)
    # A cell left to another process may be stored by now: it was stored by that process, not left running.
    finished = [c for c in held if store.get(c.config_hash, code) is not None]
    held = [c for c in held if c not in finished]
    by_others += finished
    if by_others:
        print(f"study {study.name}: {len(by_others)} cells were stored by other processes sharing the study (not run "
              "here)", file=out, flush=True)
    if held:
        print(f"study {study.name}: {len(held)} cells were running in other processes and are left to them; the "
              "same command after they finish stores any they did not complete", file=out, flush=True)
    if failed:
        raise CellsFailed(study.name, failed, len(todo))
    return {"cells": runs, "run": len(pending) - len(held) - len(by_others) - reused, "skipped": skipped,
            "held": len(held), "stored_by_others": len(by_others), "reused": reused}


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


def _shown(study: Study, cell: Cell, record: dict[str, Any]) -> str:
    """The cell's value in a progress line: its metric (test.accuracy unless the study names another)."""
    path = study.metric_of(cell.method, cell.setting)
    value = metric(record, path)
    return f"{100 * value:.2f}%" if value is not None else f"no {path}"


def _cell_record(study: Study, budget: str, cell: Cell, code: CodeVersion, summary: dict[str, Any],
                 run_folder: Path, wall: float) -> dict[str, Any]:
    """The store record of a finished cell (``wall``: the time to use when the summary has none), with
    its environment and CPU time from the sittings noted in its cell folder (:func:`run_usage`)."""
    seconds = run_seconds(run_folder, summary) if isinstance(summary.get("seconds"), (int, float)) else wall
    return make_record(study.name, budget, cell.method, cell.setting, cell.seed, cell.config_hash, _config_data(cell),
                       code, summary, seconds, evaluated_history(run_folder), run_usage(run_folder.parent))


#: The file in a cell's folder where ``fedfew study run`` and ``verify`` note each sitting of the cell's
#: run, one JSON line each: its environment (:mod:`fedfew.environment`), wall and CPU seconds, and the
#: load average at its start and end. The record's environment and CPU time come from these notes, so a
#: run resumed, or finished in an earlier process and read back, is described by the processes that ran
#: it, not by the one that stores it.
SITTINGS_FILE = "sittings.jsonl"


def cpu_seconds() -> float:
    """CPU time (user and system) of this process and of its children that have ended (the workers
    engine's processes, joined when their run ends). Beside other work on the machine a run's wall time
    grows with the load; its CPU time far less."""
    me, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + children.ru_utime + children.ru_stime


def load_average() -> float | None:
    """The machine's 1-minute load average (None where the OS keeps none)."""
    try:
        return round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):
        return None


def _finished(run_folder: Path | None) -> bool:
    """A run folder whose run completed: read back, not run (:func:`_run_cell`)."""
    return run_folder is not None and run_status(run_folder).get("status") == "complete" \
        and (run_folder / "summary.json").is_file()


def _run_noted(cell: Cell, folder: Path) -> tuple[dict[str, Any], Path]:
    """:func:`_run_cell`, noting the sitting in ``folder``'s :data:`SITTINGS_FILE` when it runs (a finished
    run read back adds none). A fresh run starts the notes again; a sitting that stops (Ctrl-C, a failed
    round) is noted with the time it took; one killed outright is not, and the run then has no complete
    notes (its record says so rather than guess)."""
    from fedfew.environment import run_environment

    previous = existing_run(folder)
    if _finished(previous):
        return _run_cell(cell, folder)
    notes = folder / SITTINGS_FILE
    if previous is None:  # notes of a run whose folder is gone are not this run's
        notes.unlink(missing_ok=True)
    sitting: dict[str, Any] = {"fresh": previous is None, "started": _now(), "environment": run_environment(cell.config)}
    load, wall, cpu = load_average(), time.perf_counter(), cpu_seconds()
    try:
        return _run_cell(cell, folder)
    finally:
        sitting.update(wall_seconds=round(time.perf_counter() - wall, 2), cpu_seconds=round(cpu_seconds() - cpu, 2),
                       load_average=[load, load_average()])
        folder.mkdir(parents=True, exist_ok=True)
        with notes.open("a") as f:
            f.write(json.dumps(sitting, sort_keys=True) + "\n")


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def run_usage(folder: Path) -> dict[str, Any]:
    """What a record keeps of the sittings noted in the cell folder ``folder``: ``sittings`` (each one's
    start, wall and CPU seconds, load average at its start and end); when every sitting of the run was
    noted (the first started it), ``cpu_seconds`` over them all and, if they ran in one environment,
    ``environment``; else ``environment_note``, saying why the record has none."""
    from fedfew.environment import describe, same_environment

    path = folder / SITTINGS_FILE
    notes = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []
    if not notes:
        return {"environment_note": "not recorded: no sitting of this run was noted (run by an older fedfew, or "
                                    "stopped before it could note one)"}
    usage: dict[str, Any] = {"sittings": [{k: note.get(k) for k in ("started", "wall_seconds", "cpu_seconds",
                                                                    "load_average")} for note in notes]}
    if not notes[0].get("fresh"):
        last = describe(notes[-1].get("environment"))
        usage["environment_note"] = (f"not recorded: the run's first sittings were not noted (run by an older fedfew, "
                                     f"or stopped outright); its last {len(notes)} ran on {last}")
        return usage
    usage["cpu_seconds"] = round(sum(float(note["cpu_seconds"]) for note in notes), 2)
    environments = [note.get("environment") for note in notes]
    if all(same_environment(environments[0], e) for e in environments[1:]):
        usage["environment"] = environments[-1]
    else:
        kinds = list(dict.fromkeys(describe(e) for e in environments))
        usage["environment_note"] = (f"not one environment: the run's {len(notes)} sittings ran on "
                                     + "; ".join(kinds))
    return usage


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


#: How far a re-run cell's metric may be from its record's when the two ran in different environments
#: (or the record's is not recorded): two builds or processors may round the same arithmetic differently,
#: and a drift within the run's own uncertainty over its test tasks changes no reading. Within one
#: environment the code is the only difference, and nothing may differ.
TOLERANCE = "the stored run's 95% interval over its test episodes (metrics.test.ci95)"


@dataclass(frozen=True)
class Drift:
    """One re-run cell against its record: the cell's metric in both (fractions), the tolerance (the
    record's ``test.ci95``), whether every stored test number is the same (:func:`same_numbers`) and
    whether both ran in one recorded environment (:func:`fedfew.environment.same_environment`)."""

    cell: Cell
    metric: str
    stored: float | None
    rerun: float | None
    tolerance: float | None
    exact: bool
    same_environment: bool
    environments: tuple[dict[str, Any] | None, dict[str, Any] | None]  # the record's, the re-run's

    @classmethod
    def of(cls, cell: Cell, path: str, before: dict[str, Any], now: dict[str, Any]) -> Drift:
        from fedfew.environment import same_environment

        if metric(before, path) is None and metric(now, path) is None:
            path = "test.accuracy"  # a metric the runs do not report: their accuracy stands in
        ci95 = metric(before, "test.ci95")
        return cls(cell, path, metric(before, path), metric(now, path), ci95,
                   same_numbers(before["metrics"].get("test"), now["metrics"].get("test")),
                   same_environment(before.get("environment"), now.get("environment")),
                   (before.get("environment"), now.get("environment")))

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
        return (f"{_percent(self.rerun)}% (stored: {_percent(self.stored)}%, {self.metric}), {self.judged}"
                + ("" if self.same_environment or self.exact else " (another environment)"))

    def to_json(self, labels: dict[str, tuple[str, dict[str, Any] | None]]) -> dict[str, Any]:
        c = self.cell
        return {"config_hash": c.config_hash, "method": c.method, "setting": c.setting, "seed": c.seed,
                "metric": self.metric, "stored": self.stored, "rerun": self.rerun, "difference": self.difference,
                "tolerance": self.tolerance, "exact": self.exact, "same_environment": self.same_environment,
                "environments": [labels[_env_id(e)][0] for e in self.environments], "judged": self.judged}


def _percent(value: float | None) -> str:
    return "—" if value is None else f"{100 * value:.4f}"


def _env_id(environment: dict[str, Any] | None) -> str:
    return "" if environment is None else json.dumps(environment, sort_keys=True)


def _environment_labels(records: list[dict[str, Any]]) -> dict[str, tuple[str, dict[str, Any] | None]]:
    """E1, E2, ... for the distinct environments of ``records`` in order of appearance ("not recorded"
    for none), by :func:`_env_id`."""
    labels: dict[str, tuple[str, dict[str, Any] | None]] = {}
    for record in records:
        env = record.get("environment")
        if _env_id(env) not in labels:
            label = "not recorded" if env is None else f"E{sum(1 for k in labels if k) + 1}"
            labels[_env_id(env)] = (label, env)
    return labels


def drift_table(drifts: list[Drift], labels: dict[str, tuple[str, dict[str, Any] | None]]) -> str:
    """The re-run cells against their records (metric values in percent, the difference in points, the
    environments as stored → re-run), then what each environment label stands for and the tolerance."""
    from fedfew.environment import describe

    lines = ["| cell | metric | stored | re-run | difference | tolerance | environments | judged |",
             "|---|---|---|---|---|---|---|---|"]
    for d in drifts:
        difference = "—" if d.difference is None else f"{100 * d.difference:+.4f}"
        stored, rerun = (labels[_env_id(e)][0] for e in d.environments)
        lines.append(f"| {d.cell.title} | {d.metric} | {_percent(d.stored)} | {_percent(d.rerun)} | {difference} | "
                     f"{'—' if d.tolerance is None else f'± {100 * d.tolerance:.4f}'} | {stored} → {rerun} | "
                     f"{d.judged} |")
    lines.append("")
    lines += [f"{label}: {describe(env)}" for label, env in labels.values() if env is not None]
    lines.append(f"In one environment every stored test number must be the same; across environments (or with "
                 f"an environment not recorded) the metric must be within {TOLERANCE}.")
    return "\n".join(lines)


def verify_study(study: Study, root: Path, budget: str, store_base: Path, runs_base: Path, per_method: int = 1,
                 extra: list[str] | None = None, out: Any = None, table_out: Any = None) -> dict[str, Any]:
    """Re-run ``per_method`` stored cells of each method (the first settings and seeds that have a record)
    with this code and compare each with its record of the older code that holds most of the budget's
    cells, like with like (:class:`Drift`): in the record's environment every stored test number must be
    the same, exactly; in another environment, or one the record does not name, the cell's metric must be
    within :data:`TOLERANCE`. Prints the drift table (``table_out``, stdout) and returns the verdict line.
    Every cell passing: the re-run cells' records and an equivalence file (the environments, and each
    cell's numbers and difference, as evidence) go into the store, and the older records count as this
    version's, so a commit that does not change these runs' numbers does not send the study back to the
    start. Any one failing: nothing is written to the store (a report would otherwise switch to the few
    new records), exit 1; `study run --new-code` then reads the re-run cells' finished runs back."""
    from fedfew.experiment import dataset_cache

    out = out or sys.stderr
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
    print(f"study {study.name} at budget {budget}: re-running {len(chosen)} of the {held[old.key]} cells stored by "
          f"sources {old.source} with sources {code.source}", file=out, flush=True)
    shown = study.model_copy(update={"metric": study.budget(budget).metric}) if study.budget(budget).metric else study
    drifts, records = [], []
    with dataset_cache():
        for i, cell in enumerate(chosen, 1):
            summary, run_folder = _run_noted(cell, cell_folder(runs_base, study, cell, code))
            record = _cell_record(study, budget, cell, code, summary, run_folder, 0.0)
            records.append(record)
            drift = Drift.of(cell, shown.metric_of(cell.method, cell.setting), old_records[cell.config_hash], record)
            drifts.append(drift)
            print(f"[{i}/{len(chosen)}] {cell.title}: {drift.line()}", file=out, flush=True)
    labels = _environment_labels([old_records[d.cell.config_hash] for d in drifts] + records)
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
    path = store.put_equivalence({
        "format": FORMAT, "study": study.name, "budget": budget, "code": code.to_json(), "equal_to": old.to_json(),
        "exact": exact == len(drifts), "tolerance": TOLERANCE,
        "environments": {label: env for label, env in labels.values() if env is not None},
        "cells": [d.to_json(labels) for d in drifts], "verified": _now()})
    how = ("exactly" if exact == len(drifts) else
           f"{exact} exactly, {len(drifts) - exact} within {TOLERANCE} across environments")
    verdict = (f"study {study.name}: sources {code.source} gives the numbers of sources {old.source} on all "
               f"{len(chosen)} re-run cells ({how}); the older records count as this version's ({path})")
    return {"cells": len(chosen), "old": old.source, "new": code.source, "file": str(path), "exact": exact,
            "verdict": verdict}
