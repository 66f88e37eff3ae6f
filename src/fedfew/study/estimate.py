"""The runs a study has still to go, and how long they can be expected to take in one process: each its
method's typical stored time (or this sitting's run times), times the share of its rounds not yet run."""

from __future__ import annotations

import statistics
from collections.abc import Container

from fedfew.study.grid import Cell
from fedfew.study.store import ResultStore


def duration(seconds: float) -> str:
    """A time in the unit a person reads it in: s, min or h."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def runs_to_go(todo: list[Cell], stored: Container[str]) -> list[Cell]:
    """One cell per run whose config hash is not ``stored``: cells that read other numbers of the same
    run (a row's or column's own metric) share it, and the first of them names it."""
    first: dict[str, Cell] = {}
    for cell in todo:
        if cell.config_hash not in stored:
            first.setdefault(cell.config_hash, cell)
    return list(first.values())


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
