"""A study's stored numbers at one budget, as a report reads them: :func:`collect` gathers each cell's
value over seeds from the store (the newest code version holding any, and the versions verified to
give its numbers) into :class:`StudyResults`, with what the report says about them (runs, time, code,
round-0 selections, privacy guarantees, curves)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from fedfew.study.grid import Cell, cells
from fedfew.study.records import CheckedStore
from fedfew.study.store import CodeVersion, StudyRecord, as_float, metric
from fedfew.study.study_file import Study
from fedfew.study.verdict import Bounds, accuracy_interval


@dataclass
class StudyResults:
    study: Study
    budget: str
    code: CodeVersion | None
    #: (method or CONTROL, setting) -> {seed: value in percent}
    values: dict[tuple[str, str], dict[int, float]] = field(default_factory=dict)
    cells_total: int = 0
    cells_found: int = 0
    #: Stored cells whose run has no value at the study's metric (e.g. a round-0 control of a metric
    #: only training writes): in the store, so not "not yet run", but shown as "—".
    cells_without_metric: int = 0
    #: The records shown, one per run (cells reading other numbers of one run share it): their
    #: environments are the header's (:func:`fedfew.run.environment.describe_environments`)
    run_records: list[StudyRecord] = field(default_factory=list)
    wall_seconds: float = 0.0
    #: Records copied from other studies' stores (the same run: config and code), by the study that ran
    #: them, and those runs' wall time: counted there, so not in ``wall_seconds``
    reused: dict[str, int] = field(default_factory=dict)
    reused_seconds: float = 0.0
    methods: list[str] = field(default_factory=list)
    #: Stored records shown, by the source hash of the code that made them (more than one where an older
    #: version was verified to give this version's numbers: ``fedfew study verify``)
    sources: dict[str, int] = field(default_factory=dict)
    #: The verifications that let older records stand for this version: (the verifying version's
    #: sources, the older sources it was checked against, cells re-run), oldest check first
    #: (new source, old source, re-run cells, exact): exact unless verify judged other environments by its
    #: tolerance (an equivalence written before tolerances has no ``exact`` field: it was exact)
    verified: list[tuple[str, str, int, bool]] = field(default_factory=list)
    #: (method or CONTROL, setting) -> {seed: the run's evaluated rounds} (records that keep them)
    histories: dict[tuple[str, str], dict[int, list[dict[str, float]]]] = field(default_factory=dict)
    #: (method or CONTROL, setting) -> {seed: {"SPLIT_accuracy": fraction}} of the runs that did not train
    #: (rounds 0: the untrained controls): their round-0 score, which a learning curve draws as a band
    untrained: dict[tuple[str, str], dict[int, dict[str, float]]] = field(default_factory=dict)
    #: Methods whose runs have one client (``partition.num_clients: 1``): centralised rows, which a
    #: learning curve draws as the ceiling (dashed) beside the federated methods
    one_client: set[str] = field(default_factory=set)
    settings: list[str] = field(default_factory=list)
    #: The study's further tables (``tables``), by position: (method, setting) -> {seed: value, scaled}
    extra: list[dict[tuple[str, str], dict[int, float]]] = field(default_factory=list)
    #: setting -> how many of its cells (the control's included) are not in the store
    missing: dict[str, int] = field(default_factory=dict)
    #: (method or CONTROL, setting) -> how many of its cells are not in the store (every row of the
    #: grid, 0 when complete): what a setting still waits for, row by row
    missing_rows: dict[tuple[str, str], int] = field(default_factory=dict)
    #: (method, setting) -> the seeds whose run trained (rounds > 0) yet selected round 0: the untrained
    #: model scored best on validation, so the cell's selected-round numbers are the untrained model's
    round0: dict[tuple[str, str], set[int]] = field(default_factory=dict)
    #: (method, setting) -> {seed: (epsilon, delta)} of the cells whose runs were private (their summary's
    #: ``privacy``): the tables show each such cell's guarantee beside its number
    privacy: dict[tuple[str, str], dict[int, tuple[float, float]]] = field(default_factory=dict)
    #: (method, setting) -> what its private runs' epsilon covers, where their summaries say
    #: (``privacy.covers.short``: the accounting, "epsilon covers the shared model only", seeded noise)
    privacy_covers: dict[tuple[str, str], set[str]] = field(default_factory=dict)
    #: (method, setting) -> {seed: epsilon with no amplification by sampling} of the private cells whose
    #: summary has it (since issue 51): the tables show it beside the epsilon the run's accounting gave
    privacy_no_amplification: dict[tuple[str, str], dict[int, float]] = field(default_factory=dict)

    @property
    def seeds(self) -> list[int]:
        """The seeds of every stored value."""
        return sorted({s for per_seed in self.values.values() for s in per_seed})

    def table_order(self, cell: tuple[str, str]) -> tuple[int, int]:
        """A (method, setting) cell's place as the tables show it: by setting, then by method (a name the
        budget does not list goes first)."""
        method, setting = cell
        return (self.settings.index(setting) if setting in self.settings else -1,
                self.methods.index(method) if method in self.methods else -1)

    def interval(self, method: str, setting: str) -> Bounds | None:
        """The cell's mean accuracy over seeds and its 95% interval inside [0, 100] (None: not stored)."""
        per_seed = self.values.get((method, setting), {})
        return accuracy_interval(list(per_seed.values())) if per_seed else None


def _round0_score(record: StudyRecord) -> dict[str, float] | None:
    """An untrained run's (rounds 0) initial score as a curve's key names it (``val_accuracy``); None for a
    run that trained or whose summary has no initial score."""
    initial = record["metrics"].get("initial_score")
    if record["metrics"].get("rounds") != 0 or not isinstance(initial, dict):
        return None
    accuracy, split = initial.get("accuracy"), initial.get("split")
    if not isinstance(accuracy, (int, float)) or not isinstance(split, str):
        return None
    return {f"{split}_accuracy": float(accuracy)}


#: The accounting's note where every client takes part in every round (the sampling rate is 1): there is
#: no sample to keep secret, whatever the accounting mode, and no amplification to claim.
WHOLE_FEDERATION = "every client in every round"


def _whole_federation(short: str, guarantee: Mapping[str, object]) -> str:
    """A run's one-line qualifier of its epsilon (``covers.short``) as a table shows it: at a sampling rate of
    1 (every client, every round) the Poisson note ("Poisson sample kept secret by the server") says
    something that did not happen, so it reads :data:`WHOLE_FEDERATION` instead."""
    if guarantee.get("sampling_rate") != 1.0:
        return short
    notes = [WHOLE_FEDERATION if "sample" in note else note for note in short.split("; ") if note]
    return "; ".join(notes)

def _by_setting(missing_rows: dict[tuple[str, str], int]) -> dict[str, int]:
    """setting -> its cells not in the store, every row together (``StudyResults.missing``)."""
    missing: dict[str, int] = {}
    for (_, setting), count in missing_rows.items():
        missing[setting] = missing.get(setting, 0) + count
    return missing


def collect(study: Study, root: Path, store_base: Path, budget: str | None = None,
            damaged: dict[Path, str] | None = None) -> StudyResults:
    """The stored values of ``study``'s cells at ``budget`` (default: the docs budget), taken from the
    newest code version that holds any of them."""
    budget = budget or study.docs_budget
    if study.budget(budget).metric:  # a budget that reads other numbers of its runs
        study = study.model_copy(update={"metric": study.budget(budget).metric})
    store = CheckedStore(store_base, study.name, "left out of the report; `fedfew study run` runs its cell again",
                         damaged)  # damaged records already named (by this command's other budgets)
    grid: list[Cell] = cells(study, root, budget)
    code = store.newest_code({c.config_hash for c in grid})  # of this budget's cells, not another budget's
    if code is not None:
        code = store.newer_equal(code)  # a newer version verified to give these records' numbers
    b = study.budget(budget)
    results = StudyResults(study, budget, code, cells_total=len(grid),
                           methods=b.methods or list(study.methods), settings=b.settings or list(study.settings))
    results.extra = [{} for _ in study.tables]
    results.missing_rows = dict(Counter((cell.method, cell.setting) for cell in grid))  # found cells taken off below
    results.missing = _by_setting(results.missing_rows)
    if code is None:
        return results
    records = store.by_hash(code)
    equal = store.equal_codes(code)
    checks = sorted((e for e in store.equivalences() if CodeVersion.from_json(e["equal_to"]).key in equal),
                    key=lambda e: str(e.get("verified", "")))
    results.verified = [(CodeVersion.from_json(e["code"]).source, CodeVersion.from_json(e["equal_to"]).source,
                         len(e["cells"]), bool(e.get("exact", True))) for e in checks]
    counted: set[str] = set()
    for cell in grid:
        record = records.get(cell.config_hash)
        if record is None:
            continue
        results.missing_rows[cell.method, cell.setting] -= 1
        results.cells_found += 1
        if cell.config_hash not in counted:  # cells reading other numbers of one run count its time once
            counted.add(cell.config_hash)
            results.run_records.append(record)
            if record.get("reused_from"):
                origin = str(record["reused_from"]).split("/", 1)[0]
                results.reused[origin] = results.reused.get(origin, 0) + 1
                results.reused_seconds += float(record.get("wall_seconds", 0.0))
            else:
                results.wall_seconds += float(record.get("wall_seconds", 0.0))
        source = record["code"]["source"]
        results.sources[source] = results.sources.get(source, 0) + 1
        if record.get("history"):
            results.histories.setdefault((cell.method, cell.setting), {})[cell.seed] = record["history"]
        if cell.config.partition.num_clients == 1:
            results.one_client.add(cell.method)
        if (score := _round0_score(record)) is not None:
            results.untrained.setdefault((cell.method, cell.setting), {})[cell.seed] = score
        guarantee = record["metrics"].get("privacy")
        if isinstance(guarantee, dict) and isinstance(epsilon := guarantee.get("epsilon"), (int, float)):
            results.privacy.setdefault((cell.method, cell.setting), {})[cell.seed] = (
                float(epsilon), as_float(guarantee["delta"]))
            covers = guarantee.get("covers")  # since issue 51: a dict whose "short" qualifies the epsilon
            covered = _whole_federation(str(covers.get("short", "")) if isinstance(covers, dict) else "", guarantee)
            if covered:
                results.privacy_covers.setdefault((cell.method, cell.setting), set()).add(covered)
            if isinstance(unamplified := guarantee.get("epsilon_no_amplification"), (int, float)):
                results.privacy_no_amplification.setdefault((cell.method, cell.setting), {})[cell.seed] = \
                    float(unamplified)
        selected = record["metrics"].get("selected_round")
        if cell.config.federation.rounds > 0 and selected == 0 and not isinstance(selected, bool):
            results.round0.setdefault((cell.method, cell.setting), set()).add(cell.seed)
        for extra, values in zip(study.tables, results.extra):
            number = metric(record, extra.metric)
            if number is not None:
                values.setdefault((cell.method, cell.setting), {})[cell.seed] = extra.scale * number
        value = metric(record, study.metric_of(cell.method, cell.setting))
        if value is None:
            results.cells_without_metric += 1
            continue
        results.values.setdefault((cell.method, cell.setting), {})[cell.seed] = 100.0 * value
    results.missing = _by_setting(results.missing_rows)
    return results
