"""``fedfew study report``: the table (ours: mean and 95% interval over seeds; the paper's numbers
with their table; the untrained control), a verdict per claim, raw and Holm-adjusted over its family
(:mod:`fedfew.study.verdict`), and a figure, all computed from the store."""

from __future__ import annotations

import math
import shlex
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from fedfew.run.environment import describe_environments
from fedfew.study.grid import Cell, cells
from fedfew.study.records import CheckedStore
from fedfew.study.store import CodeVersion, StudyRecord, as_float, metric
from fedfew.study.study_file import CONTROL, Claim, Study, parse_metric
from fedfew.study.verdict import (
    ALPHA,
    HOLDS,
    Bounds,
    Interval,
    PairVerdict,
    accuracy_interval,
    adjust,
    chain_verdict,
    compare,
    judge_order,
    t_interval,
)


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
    settings: list[str] = field(default_factory=list)
    #: The study's further tables (``tables``), by position: (method, setting) -> {seed: value, scaled}
    extra: list[dict[tuple[str, str], dict[int, float]]] = field(default_factory=list)
    #: setting -> how many of its cells (the control's included) are not in the store
    missing: dict[str, int] = field(default_factory=dict)
    #: (method, setting) -> the seeds whose run trained (rounds > 0) yet selected round 0: the untrained
    #: model scored best on validation, so the cell's selected-round numbers are the untrained model's
    round0: dict[tuple[str, str], set[int]] = field(default_factory=dict)
    #: (method, setting) -> {seed: (epsilon, delta)} of the cells whose runs were private (their summary's
    #: ``privacy``): the tables show each such cell's guarantee beside its number
    privacy: dict[tuple[str, str], dict[int, tuple[float, float]]] = field(default_factory=dict)
    #: (method, setting) -> what its private runs' epsilon covers, where their summaries say
    #: (``privacy.covers.short``: the accounting, "epsilon covers the shared model only", seeded noise)
    privacy_covers: dict[tuple[str, str], set[str]] = field(default_factory=dict)

    @property
    def seeds(self) -> list[int]:
        """The seeds of every stored value."""
        return sorted({s for per_seed in self.values.values() for s in per_seed})

    def interval(self, method: str, setting: str) -> Bounds | None:
        """The cell's mean accuracy over seeds and its 95% interval inside [0, 100] (None: not stored)."""
        per_seed = self.values.get((method, setting), {})
        return accuracy_interval(list(per_seed.values())) if per_seed else None


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
    results.missing = dict(Counter(cell.setting for cell in grid))  # each found cell is taken off below
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
        results.missing[cell.setting] -= 1
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
        guarantee = record["metrics"].get("privacy")
        if isinstance(guarantee, dict) and isinstance(epsilon := guarantee.get("epsilon"), (int, float)):
            results.privacy.setdefault((cell.method, cell.setting), {})[cell.seed] = (
                float(epsilon), as_float(guarantee["delta"]))
            covers = guarantee.get("covers")  # since issue 51: a dict whose "short" qualifies the epsilon
            covered = str(covers.get("short", "")) if isinstance(covers, dict) else ""
            if covered:
                results.privacy_covers.setdefault((cell.method, cell.setting), set()).add(covered)
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
    return results


#: The mark on a cell whose trained runs selected round 0 (:func:`round0_mark`), and what it means.
ROUND0 = "†"
ROUND0_LEGEND = (f"{ROUND0} round 0 selected: the untrained model scored best on validation, so the cell is the "
                 f"untrained model's score, not a trained one's ({ROUND0}k/n: in k of its n seeds).")


def at_selected_round(path: str) -> bool:
    """Whether a metric path reads the selected round's numbers (test.*, selected_score), not the
    last evaluated round's or the initial model's, which a round-0 selection does not change."""
    return parse_metric(path)[0][0] not in ("history", "initial_score", "final_score")


def round0_mark(results: StudyResults, method: str, setting: str, seeds: Iterable[int], path: str) -> str:
    """" †" when every one of ``seeds`` (the cell's values) comes from a trained run that selected round
    0, " †k/n" when k of the n did, "" when none did or ``path`` does not read the selected round."""
    shown = set(seeds)
    k = len(results.round0.get((method, setting), set()) & shown)
    if not k or not at_selected_round(path):
        return ""
    return f" {ROUND0}" if k == len(shown) else f" {ROUND0}{k}/{len(shown)}"


def _cell(results: StudyResults, method: str, setting: str) -> str:
    """A cell of the main table: mean [interval], marked when its runs selected round 0, with its
    guarantee (epsilon, delta) when its runs were private."""
    seeds = results.values.get((method, setting), {})
    return (_fmt_accuracy(results.interval(method, setting))
            + round0_mark(results, method, setting, seeds, results.study.metric_of(method, setting))
            + privacy_mark(results, method, setting))


def privacy_mark(results: StudyResults, method: str, setting: str) -> str:
    """" (ε 3.99, δ 1e-05)" for a cell whose runs were private: the largest epsilon over its seeds (one
    solved noise multiplier gives every seed the same) and its delta; "" for a cell without DP."""
    budgets = results.privacy.get((method, setting))
    if not budgets:
        return ""
    epsilon = max(e for e, _ in budgets.values())
    deltas = sorted({d for _, d in budgets.values()})
    covered = "; ".join(sorted(results.privacy_covers.get((method, setting), set())))
    return f" (ε {epsilon:.2f}, δ {'/'.join(f'{d:g}' for d in deltas)}" + (f"; {covered}" if covered else "") + ")"


#: Under a table with a private cell: what its (ε, δ) is.
PRIVACY_LEGEND = ("(ε, δ): the cell's client-level differential-privacy guarantee, from its runs' summaries (the "
                  "accountant's epsilon after the rounds run, the largest over seeds; docs/privacy.md); a cell "
                  "without it is not private. A round-0 row under DP has ε 0: it released nothing the clients made.")


def _marked(results: StudyResults, method: str, setting: str) -> str:
    """A method's label where a verdict or a winner uses its cell, marked as the cell is."""
    seeds = results.values.get((method, setting), {})
    return results.study.label(method) + round0_mark(results, method, setting, seeds,
                                                     results.study.metric_of(method, setting))


def _legend(text: str) -> str:
    """The round-0 legend line when ``text`` (a table) holds a marked cell, and the privacy legend when it
    holds a private one."""
    lines = [ROUND0_LEGEND] if ROUND0 in text else []
    lines += [PRIVACY_LEGEND] if " (ε " in text else []
    return "".join(f"\n{line}\n" for line in lines)


def _fmt(interval: Interval | None) -> str:
    if interval is None:
        return "—"
    if interval.half_width is None:
        return f"{interval.mean:.2f} (1 seed)"
    return f"{interval.mean:.2f} ± {interval.half_width:.2f}"


def _fmt_accuracy(bounds: Bounds | None) -> str:
    """An accuracy over seeds: the mean and its interval inside [0, 100], ``61.00 [48.45, 72.87]``."""
    if bounds is None:
        return "—"
    if bounds.low is None or bounds.high is None:
        return f"{bounds.mean:.2f} (1 seed)"
    return f"{bounds.mean:.2f} [{bounds.low:.2f}, {bounds.high:.2f}]"


#: How the tables' accuracies over seeds are summarised, in words (the status lines).
ACCURACY_INTERVAL = ("mean and 95% interval over seeds [low, high] (Student's t on the angular scale asin √p, "
                     "so it stays inside [0, 100])")


def _paper(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}"


def table(results: StudyResults) -> str:
    """Rows: methods (and the control); per setting a column of ours and one per paper source."""
    study = results.study
    header = ["method"]
    for setting in results.settings:
        header.append(f"{setting}: ours")
        header += [f"{setting}: paper ({p.source})" for p in study.paper]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    rows = list(results.methods) + ([CONTROL] if study.control is not None and study.budget(results.budget).control
                                    else [])
    for method in rows:
        row = [study.label(method)]
        for setting in results.settings:
            row.append(_cell(results, method, setting))
            row += [_paper(p.values.get(method, {}).get(setting)) for p in study.paper]
        lines.append("| " + " | ".join(row) + " |")
    text = "\n".join(lines) + "\n"
    return text + _legend(text)


def _fmt_number(cell: dict[int, float] | None, percent: bool) -> str:
    """A further table's cell: in percent, as the main table's; otherwise mean ± Student's t."""
    if not cell:
        return "—"
    return _fmt_accuracy(accuracy_interval(list(cell.values()))) if percent else _fmt(t_interval(list(cell.values())))


def extra_tables(results: StudyResults) -> str:
    """The study's further tables (``tables``): per table its title, then its rows (methods) and
    columns (settings) as mean ± 95% interval over seeds; "—" where a run has no such number."""
    parts = []
    for extra, values in zip(results.study.tables, results.extra):
        methods = [m for m in results.methods if extra.methods is None or m in extra.methods]
        settings = [s for s in results.settings if extra.settings is None or s in extra.settings]
        if not methods or not settings:
            continue
        # A fraction shown in percent (scale 100: an accuracy, a success rate) takes the tables' interval
        # inside [0, 100]; any other number (a rank, a correlation, a count) Student's t as it is.
        percent = extra.scale == 100 and all(0.0 <= v <= 100.0 for cell in values.values() for v in cell.values())
        how = "mean [95% interval] over seeds, inside [0, 100]" if percent else "mean ± 95% interval over seeds"
        lines = [f"{extra.title} (`{extra.metric}`{'' if extra.scale == 1 else f' x {extra.scale:g}'}; {how}):", "",
                 "| method | " + " | ".join(settings) + " |", "|" + "---|" * (len(settings) + 1)]
        for method in methods:
            cells = [_fmt_number(values.get((method, s)), percent)
                     + round0_mark(results, method, s, values.get((method, s), {}), extra.metric) for s in settings]
            lines.append(f"| {results.study.label(method)} | " + " | ".join(cells) + " |")
        text = "\n".join(lines) + "\n"
        parts.append(text + _legend(text))
    return "\n".join(parts)


@dataclass(frozen=True)
class JudgedClaim:
    """A claim judged at one budget: its raw verdict (each link's paired test alone) and its adjusted one
    (Holm over its family's comparisons at this budget), each link with both."""

    claim: Claim
    id: str
    family: str
    verdict: str
    adjusted: str
    pairs: list[PairVerdict]
    #: The family at this budget: its claims, and its comparisons with a test (what Holm counts).
    family_claims: int
    family_tests: int


def claims(results: StudyResults) -> list[JudgedClaim]:
    """Each claim's verdicts, for the claims whose methods and setting this budget runs (a budget that
    runs a few rows, such as a study's first piece, shows only the claims about them); a family is the
    claims of it this budget shows, judged together."""
    study = results.study
    shown = set(results.methods) | ({CONTROL} if study.control is not None and study.budget(results.budget).control
                                     else set())
    families = study.family_of()
    judged: list[tuple[Claim, str, list[PairVerdict]]] = []
    for claim, cid in zip(study.claims, study.claim_ids()):
        if not set(claim.order) <= shown or claim.setting not in results.settings:
            continue
        values = {m: results.values.get((m, claim.setting), {}) for m in claim.order}
        judged.append((claim, cid, judge_order(values, claim.order)[1]))
    adjusted: dict[str, list[PairVerdict]] = {}
    for family in dict.fromkeys(families[cid] for _, cid, _ in judged):
        members = [(cid, pairs) for _, cid, pairs in judged if families[cid] == family]
        adjusted.update(zip([cid for cid, _ in members], adjust([pairs for _, pairs in members])))
    size = Counter(families[cid] for _, cid, _ in judged)
    tests = Counter(families[cid] for cid in adjusted for p in adjusted[cid] if p.p_value is not None)
    return [JudgedClaim(claim, cid, families[cid], chain_verdict([p.verdict for p in adjusted[cid]]),
                        chain_verdict([p.adjusted for p in adjusted[cid]]), adjusted[cid], size[families[cid]],
                        tests[families[cid]])
            for claim, cid, _ in judged]


def _p(value: float | None) -> str:
    if value is None:
        return "no test"
    return "< 0.001" if value < 0.001 else f"{value:.3f}"


def _links(results: StudyResults, judged: JudgedClaim) -> str:
    """Each link's paired difference with its p-value, raw and Holm-adjusted; a chain's links also with
    their verdicts (raw / Holm), beside the chain's."""
    study = results.study
    chain = len(judged.pairs) > 1
    parts = []
    for p in judged.pairs:
        text = (f"{study.label(p.above)} − {study.label(p.below)}: {_fmt(p.difference)} "
                f"(p {_p(p.p_value)}, Holm {_p(p.adjusted_p)})")
        parts.append(text + (f": {p.verdict} / {p.adjusted}" if chain else ""))
    return "; ".join(parts)


def _holm_cell(results: StudyResults, judged: JudgedClaim) -> str:
    return f"**{judged.adjusted}**" + (f" ({judged.family})" if results.study.families else "")


def _count(n: int, what: str) -> str:
    return f"{n} {what}" + ("" if n == 1 else "s")


def family_sizes(judged: list[JudgedClaim]) -> str:
    """``all``: 6 claims, 8 comparisons with a test (each family of ``judged``)."""
    sizes = {j.family: (j.family_claims, j.family_tests) for j in judged}
    return "; ".join(f"`{name}`: {_count(n, 'claim')}, {_count(k, 'comparison')} with a test"
                     for name, (n, k) in sizes.items())


def families_line(judged: list[JudgedClaim]) -> str:
    """How many claims and comparisons each family has at this budget, and what Holm's adjustment does."""
    plural = len({j.family for j in judged}) > 1
    chains = any(len(j.pairs) > 1 for j in judged)
    return (f"Verdicts: raw, each comparison alone (its paired t-test at 5%); Holm, over its family's comparisons "
            f"(Holm-Bonferroni, family-wise error {ALPHA:.0%}). {'Families' if plural else 'Family'} at this "
            f"budget: {family_sizes(judged)}."
            + (" A chain A > B > C holds when every link holds, is reversed when any link is reversed, and is not "
               "resolved otherwise." if chains else "") + " docs/studies.md states the rules.")


CLAIMS_HEADER = ("| claim | setting | source | verdict (raw) | verdict (Holm) | paired difference (points, 95% "
                 "interval over seeds; p raw, Holm) | id |")


def claims_table(results: StudyResults) -> str:
    judged = claims(results)
    if not judged:
        return ""
    lines = [families_line(judged), "", CLAIMS_HEADER, "|---|---|---|---|---|---|---|"]
    for j in judged:
        order = " > ".join(_marked(results, m, j.claim.setting) for m in j.claim.order)
        lines.append(f"| {order} | {j.claim.setting} | {j.claim.source or '—'} | **{j.verdict}** | "
                     f"{_holm_cell(results, j)} | {_links(results, j)} | `{j.id}` |")
    text = "\n".join(lines) + "\n"
    return text + _legend(text)


#: One setting's row of :func:`winners`: (setting, best method or None, not separated from it, control).
WinnerRow = tuple[str, str | None, list[str], Bounds | None]


def winners(results: StudyResults) -> list[WinnerRow]:
    """Per setting: the method with the highest mean over seeds, the methods the paired rule does not
    separate from it (the 95% interval of their per-seed difference to it does not exclude 0), and the
    control. The control, the untrained rows and the study's ``winners.apart`` rows never win; a setting with any cell not
    yet in the store has no best (a partial column would crown whichever rows ran first)."""
    apart = set(results.study.winners.apart)
    out: list[WinnerRow] = []
    for setting in results.settings:
        stored = {m: results.values[(m, setting)] for m in results.methods
                  if results.values.get((m, setting)) and m not in apart and results.study.ranked(m)}
        if not stored or results.missing.get(setting):
            out.append((setting, None, [], results.interval(CONTROL, setting)))
            continue
        best = max(stored, key=lambda m: sum(stored[m].values()) / len(stored[m]))  # ties: the first listed
        tied = [m for m in stored if m != best and compare(stored[best], stored[m]).verdict != HOLDS]
        out.append((setting, best, tied, results.interval(CONTROL, setting)))
    return out


def winners_markdown(results: StudyResults, study_path: str) -> str:
    """"What wins where": per setting the best method, the ones not separated from it, the rows kept
    apart (``winners.apart``), the control."""
    study = results.study
    if results.cells_found == 0:
        return (f"*{study.title or study.name}: not yet run at the {results.budget} budget*: "
                f"`fedfew study run {study_path} --budget {results.budget}`.\n")
    apart = [m for m in study.winners.apart if m in results.methods]
    lines = [f"{study.title or study.name} (`{study_path}`, {results.budget} budget, "
             f"{results.cells_found}/{results.cells_total} cells). Best: the highest mean over seeds; "
             "not separated: methods whose paired difference to the best has a 95% interval that includes 0 "
             "(or fewer than 2 paired seeds). A setting is judged once all its cells are in the store."
             + (f" Apart ({study.winners.why}): never compared with the others." if apart else ""), "",
             "| setting | best (mean [95% interval]) | not separated from the best |"
             + (f" apart: {study.winners.why} |" if apart else "") + " untrained control |",
             "|---|---|---|" + ("---|" if apart else "") + "---|"]
    for setting, best, tied, control in winners(results):
        aside = ("; ".join(f"{study.label(m)}: {_cell(results, m, setting)}" for m in apart) + " | "
                 if apart else "")
        missing = results.missing.get(setting, 0)
        if best is None:
            ran = any(results.values.get((m, setting)) for m in results.methods)
            state = f"incomplete ({missing} cells not yet run)" if ran and missing else \
                "not yet run" if missing else "no row to compare"
            lines.append(f"| {setting} | {state} | | {aside}{_fmt_accuracy(control)} |")
            continue
        shown = f"{study.label(best)}: {_cell(results, best, setting)}"
        lines.append(f"| {setting} | {shown} | {', '.join(_marked(results, m, setting) for m in tied) or 'none'} | "
                     f"{aside}{_fmt_accuracy(control)} |")
    text = "\n".join(lines) + "\n"
    return text + _legend(text)


def _own_metrics(study: Study, shown: Iterable[str]) -> dict[str, str]:
    """The metrics that the rows or columns ``shown`` name for themselves (a budget that leaves those
    rows out reads the study's metric only)."""
    names = set(shown)
    return {name: row.metric for rows in (study.methods, study.settings) for name, row in rows.items()
            if row.metric and name in names}


def _metrics_named(study: Study, shown: Iterable[str]) -> str:
    """The study's metric in words, or, where the rows or columns ``shown`` name their own, each of them."""
    own = _own_metrics(study, shown)
    if not own:
        return _metric_name(study.metric)
    return "per row or column, " + "; ".join(f"{name}: {_metric_name(path)}" for name, path in own.items()) \
        + f"; otherwise {_metric_name(study.metric)}"


def _metric_name(path: str) -> str:
    """What the table's numbers are, in words where the path is a common one."""
    return {"test.accuracy": "test accuracy (%)",
            "history.last.test_accuracy": "test accuracy (%) at the last evaluated round, not the selected one",
            "initial_score.accuracy": "the untrained model's accuracy (%) on the validation split (its test split "
                                      "where it has none)"}.get(path, f"`{path}` (%)")


def markdown(results: StudyResults, study_path: str, store: str | None = None, in_repository: bool = True) -> str:
    """The report: a status line, the table and the claims (what the docs markers hold). ``store``: the
    ``--store`` it was made from when not the study's default, so the commands it names reproduce it;
    ``in_repository``: the study is one of a repository's (``studies/``), whose docs `fedfew study docs`
    writes, else the report itself is what shows the results."""
    study = results.study
    store_option = f" --store {shlex.quote(store)}" if store else ""
    command = f"fedfew study run {shlex.quote(study_path)} --budget {results.budget}{store_option}"
    report = f"fedfew study report {shlex.quote(study_path)}" + ("" if results.budget == study.docs_budget
                                                                  else f" --budget {results.budget}") + store_option
    if results.cells_found == 0:
        then = f"fedfew study docs{store_option}" if in_repository else report
        return f"*Not yet run at the {results.budget} budget* ({results.cells_total} cells): `{command}`, then `{then}`.\n"
    seeds = results.seeds
    shown = [*results.methods, *results.settings]
    status = (f"Study `{study.name}` at the {results.budget} budget: {results.cells_found}/{results.cells_total} "
              f"cells in the store, seeds {', '.join(map(str, seeds))}, {results.wall_seconds / 60:.1f} min of "
              f"runs, code {results.code.describe() if results.code else '?'}. Ours: {_metrics_named(study, shown)}, "
              f"{ACCURACY_INTERVAL}. Made by `{command}` and `{report}`. "
              f"{describe_environments(results.run_records)}")
    if results.reused:
        status += (f" {sum(results.reused.values())} of its runs are another study's, the same config and code, "
                   f"copied from its store ({', '.join(f'{n} from {name}' for name, n in sorted(results.reused.items()))}; "
                   f"{results.reused_seconds / 60:.1f} min, counted there).")
    older = {src: n for src, n in results.sources.items() if results.code and src != results.code.source}
    if older:
        checks = "; ".join(f"{new} against {old} on {n} re-run cells{'' if exact else ' (within tolerance)'}"
                           for new, old, n, exact in results.verified)
        how = "exactly" if all(exact for *_, exact in results.verified) else \
            "exactly, or within each re-run cell's own 95% interval where the environments differ"
        status += (f" {sum(older.values())} of the {results.cells_found} records were made by older code "
                   f"({', '.join(sorted(older))}), verified to give this version's numbers {how} (sources {checks}; "
                   "`fedfew study verify`).")
    if results.cells_found < results.cells_total:
        status += f" **Incomplete**: {results.cells_total - results.cells_found} cells not yet run."
    if results.cells_without_metric:
        what = "a value at their row's or column's metric" if _own_metrics(study, shown) else f"`{study.metric}`"
        status += f" {results.cells_without_metric} stored cells have no {what} in their run's summary (shown as —)."
    parts = [status, "", table(results)]
    reason = study.no_control_reason(results.budget)
    if reason:
        parts += ["", f"No untrained control row: {reason.rstrip('.')}."]
    verdicts = claims_table(results)
    if verdicts:
        parts += ["", "Claims (paired comparison over seeds):", "", verdicts]
    further = extra_tables(results)
    if further:
        parts += ["", further]
    return "\n".join(parts)


def _budget_note(results: StudyResults) -> str:
    """One budget's status in a report over budgets: cells in the store, seeds, minutes, code."""
    if results.cells_found == 0:
        return f"**{results.budget}**: not yet run ({results.cells_total} cells)"
    seeds = ", ".join(map(str, results.seeds))
    code = results.code.source if results.code else "?"
    return (f"**{results.budget}**: {results.cells_found}/{results.cells_total} cells, seeds {seeds}, "
            f"{results.wall_seconds / 60:.1f} min of runs, sources {code}")


def budgets_table(runs: list[StudyResults]) -> str:
    """Budgets side by side: rows are the methods any budget runs (study order, the control last); per
    budget a column group of ours, one column per setting that budget runs; then the paper's numbers
    once per setting. A method a budget does not run shows "n/a" in its group (not "—", which is a cell
    of that budget not yet in the store)."""
    study = runs[0].study
    ran = {m for r in runs for m in r.methods}
    rows = [m for m in study.methods if m in ran]
    controls = {r.budget for r in runs if study.control is not None and study.budget(r.budget).control}
    if controls:
        rows.append(CONTROL)
    settings = [s for s in study.settings if any(s in r.settings for r in runs)]
    header = ["method"] + [f"{setting}, {r.budget}: ours" for r in runs for setting in r.settings]
    header += [f"{setting}: paper ({p.source})" for setting in settings for p in study.paper]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for method in rows:
        row = [study.label(method)]
        for r in runs:
            runs_it = r.budget in controls if method == CONTROL else method in r.methods
            row += [_cell(r, method, setting) if runs_it else "n/a" for setting in r.settings]
        row += [_paper(p.values.get(method, {}).get(setting)) for setting in settings for p in study.paper]
        lines.append("| " + " | ".join(row) + " |")
    text = "\n".join(lines) + "\n"
    return text + _legend(text)


def budgets_markdown(runs: list[StudyResults], study_path: str, store: str | None = None) -> str:
    """The report over several budgets of one study (``study:NAME@a+b`` in the docs, ``study report
    --budgets a,b``): each budget's status and note, the table with budgets as column groups, and each
    budget's verdicts (the claims about the rows and columns it runs) with the budget named."""
    study = runs[0].study
    names = ",".join(r.budget for r in runs)
    store_option = f" --store {shlex.quote(store)}" if store else ""
    lines = [f"Study `{study.name}` at budgets {', '.join(r.budget for r in runs)}. Ours: {_metric_name(study.metric)}, "
             f"{ACCURACY_INTERVAL}; n/a: a row the budget does not run. Made by "
             f"`fedfew study run {shlex.quote(study_path)} --budget B{store_option}` for each budget B and "
             f"`fedfew study report {shlex.quote(study_path)} --budgets {names}{store_option}`.", ""]
    for r in runs:
        note = study.budget(r.budget).note
        lines.append(f"- {_budget_note(r)}" + (f": {note}" if note else ""))
    parts = ["\n".join(lines), "", budgets_table(runs)]
    judged = [(r, j) for r in runs if r.cells_found for j in claims(r)]
    if judged:
        sizes = "; ".join(f"{r.budget}: {family_sizes(claims(r))}" for r in runs if r.cells_found and claims(r))
        rows = [f"Verdicts: raw, each comparison alone (its paired t-test at 5%); Holm, over its family's comparisons "
                f"at that budget (Holm-Bonferroni, family-wise error {ALPHA:.0%}); families {sizes}. docs/studies.md "
                "states the rules.", "",
                "| budget " + CLAIMS_HEADER, "|---|---|---|---|---|---|---|---|"]
        for r, j in judged:
            order = " > ".join(_marked(r, m, j.claim.setting) for m in j.claim.order)
            rows.append(f"| {r.budget} | {order} | {j.claim.setting} | {j.claim.source or '—'} | **{j.verdict}** | "
                        f"{_holm_cell(r, j)} | {_links(r, j)} | `{j.id}` |")
        text = "\n".join(rows) + "\n"
        parts += ["", "Claims at each budget (paired comparison over seeds):", "", text + _legend(text)]
    return "\n".join(parts)


def claims_markdown(results: StudyResults, study_path: str) -> str:
    """The verdicts alone (docs/results.md's summary), with where they come from."""
    study = results.study
    if results.cells_found == 0:
        return (f"*{study.title or study.name}: not yet run at the {results.budget} budget*: "
                f"`fedfew study run {study_path} --budget {results.budget}`.\n")
    seeds = results.seeds
    head = (f"{study.title or study.name} (`{study_path}`, {results.budget} budget, "
            f"{results.cells_found}/{results.cells_total} cells, seeds {', '.join(map(str, seeds))}):")
    return head + "\n\n" + (claims_table(results) or "no claims declared\n")


#: Settings per panel of a bar figure: a study with more (the benchmark's 12 columns) wraps onto
#: further rows of panels instead of one strip too wide to read.
SETTINGS_PER_PANEL = 4
#: The widest a panel is drawn (inches), however many bars it holds.
MAX_PANEL_WIDTH = 16.0


def setting_panels(settings: list[str], most: int = SETTINGS_PER_PANEL) -> list[list[str]]:
    """The settings in order, cut into the fewest panels of at most ``most`` each, as even as they can
    be (6 settings: 3 + 3, not 4 + 2)."""
    count = max(1, math.ceil(len(settings) / most))
    size, extra = divmod(len(settings), count)
    panels, start = [], 0
    for k in range(count):
        end = start + size + (1 if k < extra else 0)
        panels.append(settings[start:end])
        start = end
    return panels


def figure(results: StudyResults, path: Path) -> bool:
    """Bars of ours (mean, 95% interval) per setting and method, the paper's numbers as markers; at
    most ``SETTINGS_PER_PANEL`` settings a panel, panels stacked, one legend for all."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    study = results.study
    rows = list(results.methods) + ([CONTROL] if study.control is not None else [])
    if not results.values:
        return False
    panels = setting_panels(list(results.settings))
    widest = max(len(panel) for panel in panels)
    width_in = min(MAX_PANEL_WIDTH, max(6.0, 1.2 * widest * max(1, len(rows)) / 2))
    fig, axes = plt.subplots(len(panels), 1, figsize=(width_in, 4 * len(panels)), squeeze=False, sharey=True)
    width = 0.8 / len(rows)
    palette = plt.get_cmap("tab10" if len(results.methods) <= 10 else "tab20")
    handles = []
    for panel, ax in zip(panels, axes[:, 0]):
        for i, method in enumerate(rows):
            xs, means, below, above, paper_x, paper_y = [], [], [], [], [], []
            for j, setting in enumerate(panel):
                interval = results.interval(method, setting)
                x = j + (i - (len(rows) - 1) / 2) * width
                if interval is not None:  # the bar's whisker: its interval inside [0, 100], uneven about the mean
                    xs.append(x)
                    means.append(interval.mean)
                    below.append(max(0.0, interval.mean - interval.low) if interval.low is not None else 0.0)
                    above.append(max(0.0, interval.high - interval.mean) if interval.high is not None else 0.0)
                for p in study.paper[:1]:
                    value = p.values.get(method, {}).get(setting)
                    if value is not None:
                        paper_x.append(x)
                        paper_y.append(value)
            # The same colour for a method in every panel; the control and the untrained rows (each
            # method's own control) grey and hatched, apart from them.
            style = ({"color": "0.85", "edgecolor": "0.3", "hatch": "//"} if not study.ranked(method)
                     else {"color": palette(i % palette.N), **({"hatch": ".."} if i >= palette.N else {})})
            bars = ax.bar(xs, means, width, yerr=[below, above], capsize=3, label=study.label(method), **style)
            if ax is axes[0, 0]:
                handles.append(bars)
            if paper_x:
                ax.plot(paper_x, paper_y, linestyle="none", marker="_", markersize=12,  # the paper's number: a dash
                        color=style["color"])
        ax.set_xticks(range(len(panel)), panel)
        ax.set_xlim(-0.5, widest - 0.5)
    own = any(row.metric for rows in (study.methods, study.settings) for row in rows.values())
    for ax in axes[:, 0]:
        ax.set_ylabel("accuracy (%), each column's metric" if own else f"{study.metric} (%)")
    axes[0, 0].set_title(study.title or study.name, fontsize=9)
    # Outside the axes: with a dozen rows a legend inside covers bars.
    fig.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 0.98), frameon=False)
    if study.paper:
        axes[-1, 0].text(0.0, -0.15, f"horizontal marks: paper ({study.paper[0].source})",
                         transform=axes[-1, 0].transAxes, fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return True


def in_percent(key: str) -> bool:
    """Whether a history number is a fraction shown in percent (an accuracy), not a loss or a
    temperature (train_l_mi, train_kd_temperature), which are drawn as they are."""
    return "accuracy" in key


def mean_curve(per_seed: dict[int, list[dict[str, float]]], key: str) -> list[tuple[int, float, float, float]]:
    """(round, mean, low, high: the 95% interval over seeds) at the rounds where every seed's run has
    ``key``: a curve over seeds, for an accuracy in percent with its interval inside [0, 100] (as the
    tables'), else in the number's own unit with Student's t (mean ± the half-width; one seed: no band)."""
    scale = 100.0 if in_percent(key) else 1.0
    by_round: dict[int, dict[int, float]] = {}
    for seed, rows in per_seed.items():
        for row in rows:
            value = row.get(key)
            if isinstance(value, (int, float)) and math.isfinite(value):  # a term a variant switches off: nan
                by_round.setdefault(int(row["round"]), {})[seed] = scale * float(row[key])
    points = []
    for r in sorted(by_round):
        if len(by_round[r]) == len(per_seed):
            values = list(by_round[r].values())
            if in_percent(key):
                bounds = accuracy_interval(values)
                points.append((r, bounds.mean, bounds.mean if bounds.low is None else bounds.low,
                               bounds.mean if bounds.high is None else bounds.high))
            else:
                interval = t_interval(values)
                points.append((r, interval.mean, interval.low, interval.high))
    return points


def curve_keys(results: StudyResults) -> list[str]:
    """The numbers the stored records of this budget keep at their evaluated rounds (what --curve draws)."""
    return sorted({key for per_seed in results.histories.values() for rows in per_seed.values() for row in rows
                   for key in row if key != "round"})


def curve_figure(results: StudyResults, key: str, path: Path) -> bool:
    """``key`` (a history number such as test_accuracy or train_loss) against the round, one panel per
    setting, one line per method: the mean over seeds with its 95% band. False when no stored record
    of this budget keeps its evaluated rounds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves = {cell: mean_curve(per_seed, key) for cell, per_seed in results.histories.items()}
    curves = {cell: points for cell, points in curves.items() if points}
    if not curves:
        return False
    settings = [s for s in results.settings if any(cell[1] == s for cell in curves)]
    fig, axes = plt.subplots(1, len(settings), figsize=(4.2 * len(settings), 3.4), squeeze=False)
    for ax, setting in zip(axes[0], settings):
        for method in results.methods:
            points = curves.get((method, setting))
            if not points:
                continue
            rounds, means, lows, highs = zip(*points)
            line, = ax.plot(rounds, means, marker=".", label=results.study.label(method))
            ax.fill_between(rounds, lows, highs, color=line.get_color(), alpha=0.15)
        ax.set_title(setting, fontsize=9)
        ax.set_xlabel("round")
        ax.set_ylabel(f"{key} (%)" if in_percent(key) else key)
    axes[0][0].legend(fontsize=7)
    fig.suptitle(f"{results.study.title or results.study.name}: mean over seeds, 95% band", fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
