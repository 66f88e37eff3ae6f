"""``fedfew study status``: what each study has left at each budget, computed from the store and the
run folders instead of remembered: runs stored, runs another study's store holds (copied, not run,
when the study runs), cells running now in another process and how far they are, interrupted cells
a run would resume, and the compute left, from the stored runs' times of the same methods."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from fedfew.study.cell_paths import run_progress
from fedfew.study.claims import claim_owner
from fedfew.study.estimate import duration, runs_to_go, time_left, typical_seconds
from fedfew.study.grid import Cell, cells
from fedfew.study.records import CheckedStore
from fedfew.study.run_readback import run_status
from fedfew.study.store import CodeVersion, foreign_codes
from fedfew.study.study_file import Study


@dataclass(frozen=True)
class PendingCell:
    """A run of the budget not in the store, and where it stands."""

    cell: Cell
    state: str  # "running", "interrupted", "finished" (not yet stored), "copyable" or "not started"
    rounds_done: int = 0
    owner: int | str | None = None  # the pid of the process running it
    seconds_left: float | None = None  # None: no stored run of its method to go by

    def describe(self) -> str:
        rounds = self.cell.config.federation.rounds
        where = {"running": f"running (pid {self.owner}), round {self.rounds_done}/{rounds}",
                 "interrupted": f"interrupted at round {self.rounds_done}/{rounds}; `study run` resumes it",
                 "finished": "finished, not yet stored; `study run` reads it back",
                 "copyable": "another study's store holds this run; `study run` copies it",
                 "not started": "not started"}[self.state]
        return f"{self.cell.title}: {where}"


@dataclass
class BudgetStatus:
    """One study at one budget."""

    study: str
    budget: str
    runs: int  # distinct runs (cells that read the same run count once)
    stored: int
    other_code: int  # runs stored only by code not verified to give this code's numbers
    pending: list[PendingCell] = field(default_factory=list)
    #: The config hashes of the budget's runs: a budget whose runs are all another's is a piece of it.
    hashes: frozenset[str] = frozenset()

    @property
    def complete(self) -> bool:
        return not self.pending

    @property
    def seconds_left(self) -> float:
        return sum(p.seconds_left or 0.0 for p in self.pending)

    @property
    def unknown(self) -> int:
        """Pending runs without an estimate (their method has no stored run at this budget yet)."""
        return sum(1 for p in self.pending if p.seconds_left is None)


def budget_status(study: Study, root: Path, budget: str, store_base: Path, runs_base: Path,
                  code: CodeVersion, damaged: dict[Path, str] | None = None) -> BudgetStatus:
    todo = cells(study, root, budget)
    store = CheckedStore(store_base, study.name, "counted as not stored; `fedfew study run` runs its cell again",
                         damaged)  # damaged records already named (by this command's other budgets)
    hashes = {c.config_hash for c in todo}
    done = store.by_hash(code)
    foreign = {v.key for v in foreign_codes(store, code, hashes)}
    older = {r["config_hash"] for r in store.records()
             if r["config_hash"] in hashes and r["config_hash"] not in done
             and CodeVersion.from_json(r["code"]).key in foreign}
    typical = typical_seconds(store, hashes)
    pending = runs_to_go(todo, done)
    status = BudgetStatus(study.name, budget, len(hashes), len(hashes) - len(pending), len(older),
                          hashes=frozenset(hashes))
    for cell in pending:
        where = run_progress(cell, study, code, store, store_base, runs_base)
        if where.copyable:
            status.pending.append(PendingCell(cell, "copyable", seconds_left=0.0))
            continue
        left = time_left([cell], typical, [], {cell.config_hash: where.rounds_done})
        owner = claim_owner(where.folder)
        state = ("running" if owner is not None else "not started" if where.run_folder is None
                 else "finished" if run_status(where.run_folder).get("status") == "complete" else "interrupted")
        status.pending.append(PendingCell(cell, state, where.rounds_done, owner, left))
    return status


def _runs(n: int) -> str:
    return f"{n} run" + ("" if n == 1 else "s")


def _left(seconds: float, unknown: int) -> str:
    """The compute left, in words: the estimated part and the runs without an estimate."""
    parts = [f"about {duration(seconds)} of compute in one process"] if seconds > 0 else []
    if unknown:
        parts.append(f"{_runs(unknown)} of methods with no stored time to go by")
    return " + ".join(parts) or "nothing to compute (copies only)"


def status_text(statuses: list[BudgetStatus], every_cell: bool = False, complete_too: bool = False) -> str:
    """One line per study budget with runs to go (and, with ``complete_too``, per complete one), its
    running cells below it (every pending cell with ``every_cell``), and a total."""
    lines = []
    for s in statuses:
        if s.complete:
            if complete_too:
                lines.append(f"{s.study} @ {s.budget}: complete, {s.runs}/{s.runs} runs stored")
            continue
        states: dict[str, int] = {}
        for p in s.pending:
            states[p.state] = states.get(p.state, 0) + 1
        older = f" ({s.other_code} of them stored by other code: `study verify` or `--new-code`)" if s.other_code else ""
        lines.append(f"{s.study} @ {s.budget}: {s.stored}/{s.runs} runs stored; {len(s.pending)} to go{older}: "
                     + ", ".join(f"{n} {state}" for state, n in states.items()) + "; " + _left(s.seconds_left, s.unknown))
        lines += [f"  {p.describe()}" for p in s.pending if every_cell or p.state == "running"]
    whole = [s for s in statuses if piece_of(s, statuses) is None]
    pieces = len(statuses) - len(whole)
    todo = [s for s in whole if not s.complete]
    # Each run once: a piece's runs are its budget's, and two studies never share a store folder.
    runs = {(s.study, p.cell.config_hash): p for s in statuses for p in s.pending}
    total = sum(p.seconds_left or 0.0 for p in runs.values())
    unknown = sum(1 for p in runs.values() if p.seconds_left is None)
    lines.append(f"{len(whole) - len(todo)} of {len(whole)} study budgets complete"
                 + (f" ({pieces} more {'is a piece' if pieces == 1 else 'are pieces'} of one: counted in it)"
                    if pieces else "")
                 + (f"; {_runs(len(runs))} to go in the others: {_left(total, unknown)}" if runs else ""))
    return "\n".join(lines)


def piece_of(status: BudgetStatus, statuses: list[BudgetStatus]) -> BudgetStatus | None:
    """The budget of the same study whose runs include all of ``status``'s (a piece of a budget, such
    as fedfsl_table3's ``cpu-non-IID-1-shot`` of ``cpu``, or another view of the same runs, such as a
    last-round budget), or None. Of two budgets with the same runs, the later one listed is the piece."""
    for other in statuses:
        if other is status or other.study != status.study or not status.hashes <= other.hashes:
            continue
        if status.hashes < other.hashes or statuses.index(other) < statuses.index(status):
            return other
    return None
