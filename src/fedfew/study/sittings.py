"""The notes of each sitting of a cell's run, and what a store record keeps of them.

``fedfew study run`` and ``verify`` note every sitting that runs a cell (the first, and each resume) in
the cell folder's :data:`SITTINGS_FILE`: its environment (:mod:`fedfew.run.environment`), wall and CPU
seconds, and the load average at its start and end. The record's environment and CPU time come from
these notes, so a run resumed, or finished in an earlier process and read back, is described by the
processes that ran it, not by the one that stores it."""

from __future__ import annotations

import contextlib
import json
import os
import resource
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TypedDict

from fedfew.config.validation import ExperimentConfig
from fedfew.core.jsontypes import JSONValue
from fedfew.study.store import Usage

#: The file in a cell's folder with one JSON line per sitting of the cell's run.
SITTINGS_FILE = "sittings.jsonl"


class _SittingEnd(TypedDict, total=False):
    """What a sitting's note adds when the sitting ends (:func:`noted_sitting`)."""

    wall_seconds: float
    cpu_seconds: float
    load_average: list[float | None]  # at its start and end


class SittingNote(_SittingEnd):
    """One line of :data:`SITTINGS_FILE`."""

    fresh: bool
    started: str
    environment: Mapping[str, JSONValue]  # fedfew.run.environment.run_environment


def timestamp() -> str:
    """The time now, as notes and equivalence files write it (UTC, to the second)."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def cpu_seconds() -> float:
    """CPU time (user and system) of this process and of its children that have ended (the workers
    engine's processes, joined when their run ends). Beside other work on the machine a run's wall time
    grows with the load; its CPU time far less."""
    # getrusage, not psutil: the same counters, to the microsecond rather than the clock tick
    me, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + children.ru_utime + children.ru_stime


def load_average() -> float | None:
    """The machine's 1-minute load average (None where the OS keeps none)."""
    try:
        return round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):
        return None


@contextlib.contextmanager
def noted_sitting(folder: Path, config: ExperimentConfig, fresh: bool) -> Iterator[None]:
    """Note the ``with`` block as a sitting of the run in the cell folder ``folder`` (``fresh``: it starts
    the run, so the notes start again: notes of a run whose folder is gone are not this run's). A sitting
    that stops (Ctrl-C, a failed round) is noted with the time it took; one killed outright is not, and
    the run then has no complete notes (its record says so rather than guess)."""
    from fedfew.run.environment import run_environment

    notes = folder / SITTINGS_FILE
    if fresh:
        notes.unlink(missing_ok=True)
    sitting: SittingNote = {"fresh": fresh, "started": timestamp(), "environment": run_environment(config)}
    load, wall, cpu = load_average(), time.perf_counter(), cpu_seconds()
    try:
        yield
    finally:
        sitting["wall_seconds"] = round(time.perf_counter() - wall, 2)
        sitting["cpu_seconds"] = round(cpu_seconds() - cpu, 2)
        sitting["load_average"] = [load, load_average()]
        folder.mkdir(parents=True, exist_ok=True)
        with notes.open("a") as f:
            f.write(json.dumps(sitting, sort_keys=True) + "\n")


def run_usage(folder: Path) -> Usage:
    """What a record keeps of the sittings noted in the cell folder ``folder``: ``sittings`` (each one's
    start, wall and CPU seconds, load average at its start and end); when every sitting of the run was
    noted (the first started it), ``cpu_seconds`` over them all and, if they ran in one environment,
    ``environment``; else ``environment_note``, saying why the record has none."""
    from fedfew.run.environment import describe, same_environment

    path = folder / SITTINGS_FILE
    notes: list[SittingNote] = ([json.loads(line) for line in path.read_text().splitlines() if line.strip()]
                                if path.is_file() else [])
    if not notes:
        return {"environment_note": "not recorded: no sitting of this run was noted (run by an older fedfew, or "
                                    "stopped before it could note one)"}
    usage: Usage = {"sittings": [{"started": note.get("started"), "wall_seconds": note.get("wall_seconds"),
                                  "cpu_seconds": note.get("cpu_seconds"), "load_average": note.get("load_average")}
                                 for note in notes]}
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
