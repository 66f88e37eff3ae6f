"""The parts of a study file, each checked as it is read: its rows and columns (:class:`Row`), budgets,
the control, the paper's numbers, claims and their ids, the winners' rule, further tables and choices;
the metric paths they name (:func:`parse_metric`), the control row's name (:data:`CONTROL`) and the
study layer's error (:class:`StudyError`). The whole file, and what its parts say of one another, is
:mod:`fedfew.study.study_file`."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field

from fedfew.core.errors import UsageError

#: The pseudo-method name a claim uses for the untrained control row.
CONTROL = "control"


class StudyError(UsageError):
    """A study file, its grid, seeds, budget or store cannot be used as asked (exit 2)."""


#: A metric path: dotted keys into a run's summary (``test.accuracy``, one client's score
#: ``test.local_by_client.0``), optionally ending in ``[k1,k2,...]``: the mean of those keys of the
#: mapping the path names (``test.local_by_client[1,2,3,4]``: the mean over clients 1-4).
METRIC_PATH = re.compile(r"^(?P<path>[A-Za-z0-9_-]+(?:\.[A-Za-z0-9_-]+)*)(?:\[(?P<keys>[A-Za-z0-9_-]+(?:,[A-Za-z0-9_-]+)*)\])?$")


def parse_metric(text: str) -> tuple[list[str], list[str] | None]:
    """``test.local_by_client[1,2]`` -> (["test", "local_by_client"], ["1", "2"]); a path without
    brackets gives None as its keys. A path of another form is a ValueError."""
    match = METRIC_PATH.match(text.replace(" ", ""))
    if match is None:
        raise ValueError(f"{text!r} is not a metric path: dotted keys (test.accuracy, test.local_by_client.0), "
                         "optionally ending in [k1,k2] for the mean of those keys (test.local_by_client[1,2])")
    keys = match.group("keys")
    return match.group("path").split("."), (keys.split(",") if keys else None)


def _checked_metric(text: str) -> str:
    parse_metric(text)
    return text


#: A metric path (see :func:`parse_metric`), checked when the study file is read.
MetricPath = Annotated[str, AfterValidator(_checked_metric)]


class StrictSection(BaseModel):
    """A part of a study file: an unknown key or a non-finite number is an error."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


def _distinct_seeds(seeds: list[int]) -> list[int]:
    # Two cells of one seed are the same run: "seeds 0, 0" would count it twice in every interval.
    for seed in seeds:
        if seeds.count(seed) > 1:
            raise ValueError(f"seed {seed} is given twice; give each seed once")
    return seeds


def _distinct_names(names: list[str]) -> list[str]:
    for name in names:
        if names.count(name) > 1:
            raise ValueError(f"{name!r} is given twice; give each once")
    return names


def _not_bool(value: object) -> object:
    if isinstance(value, bool):  # YAML's true is an int to pydantic: `seeds: [true]` would be seed 1
        raise ValueError(f"{value!r} is not a seed; give an integer")
    return value


#: The seeds of a study or a budget: one or more integers (not true/false), each once.
Seeds = Annotated[list[Annotated[int, BeforeValidator(_not_bool)]], Field(min_length=1),
                  AfterValidator(_distinct_seeds)]
#: A value a paper reports, in percent (6340 is a typo for 63.40, never a score).
Percent = Annotated[float, Field(ge=0, le=100)]
#: A budget's or a table's rows or columns: one or more, each once (an empty list would silently mean all).
Names = Annotated[list[str], Field(min_length=1), AfterValidator(_distinct_names)]


#: Overrides as a study file gives them: dotted config keys and their YAML values, passed on as they are
#: (written as JSON, :func:`fedfew.study.grid.assignments`); a cell's config checks them when it is loaded.
Overrides = dict[str, object]


class Row(StrictSection):
    """A method (row) or a setting (column): overrides, and for a method optionally its own base config."""

    set: Overrides = Field(default_factory=dict)
    config: str | None = None
    #: Shown in the table in place of the name (e.g. the paper's label).
    label: str | None = None
    #: An untrained row (a method only): ``federation.rounds: 0`` after every other override, as the
    #: study's ``control`` row is made; for a second control (another network).
    untrained: bool = False
    #: An untrained row that is another method's cell in every setting (its config, ``set`` and the
    #: settings' and budgets' ``per_method`` entries for it) at ``federation.rounds: 0``: that method's own
    #: control, which it takes unless it names another (implies ``untrained``).
    untrained_of: str | None = None
    #: A trained method only: its matching untrained row (a method with ``untrained: true``, or one that reads
    #: the same runs at ``initial_score.*``, of the same head and adaptation, e.g. FL-Proto's prototypes at
    #: round 0), which its "above its control" claims name; such a method's claims may not name the study's
    #: ``control`` (another head's or another step's round 0).
    control: str | None = None
    #: A setting only: overrides for one method in this column, applied after the method's own ``set``
    #: (a column that means the same budget in each method's own unit, e.g. FRL's Fig. 2, where an FRL
    #: episode is R + 1 communication rounds and fine-tuning's round is one).
    per_method: dict[str, Overrides] = Field(default_factory=dict)
    #: This row's metric in place of the study's (on methods or on settings, not both): rows or columns
    #: that read different numbers of the same runs (FML's catfish table: the global model's accuracy,
    #: the weak clients' and client 0's). Cells with the same resolved config run once.
    metric: MetricPath | None = None

    def is_control(self) -> bool:
        """An untrained row: a round-0 run, or runs read at their initial (round-0) score."""
        return self.untrained or (self.metric or "").startswith("initial_score.")


class Budget(StrictSection):
    set: Overrides = Field(default_factory=dict)
    seeds: Seeds | None = None
    #: Only these methods / settings at this budget (a smoke budget keeps CI short).
    methods: Names | None = None
    settings: Names | None = None
    control: bool = True
    #: Why this budget runs no untrained control (required with ``control: false`` when the study has
    #: one): shown under its table, so every block has a control or says why none applies.
    no_control: str = ""
    note: str = ""
    #: Overrides for one method at this budget, applied after the budget's ``set``: a budget that scales
    #: each method in its own unit (FRL's episodes of R + 1 rounds, fine-tuning's rounds) by one factor.
    per_method: dict[str, Overrides] = Field(default_factory=dict)
    #: The metric at this budget in place of the study's (a row's or column's own still wins): a budget
    #: with the cells of another (the same ``set``) reads other numbers of the same runs, e.g. the last
    #: evaluated round's test score (``history.last.test_accuracy``) beside the selected round's.
    metric: MetricPath | None = None


class Control(StrictSection):
    method: str
    label: str = "(control) untrained, round 0"


class PaperColumns(StrictSection):
    source: str
    values: dict[str, dict[str, Percent | None]] = Field(default_factory=dict)


#: A claim id as a study file may give it, or as :func:`claim_id` makes it: cited by the docs' prose
#: (``[claim: STUDY#ID = holds]``) and named by ``families``.
CLAIM_ID = r"^[A-Za-z0-9][A-Za-z0-9_.:>~+-]*$"
#: The family of a study's claims when it declares none, and of the claims its ``families`` leave out.
ALL_CLAIMS, OTHER_CLAIMS = "all", "other"


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "x"


def claim_id(setting: str, order: list[str]) -> str:
    """The id a claim gets when its file gives none: its setting and its order, each name lower-cased with
    every run of other characters one hyphen (``IID 1-shot`` + [F2L, FL-MAML] -> ``iid-1-shot:f2l>fl-maml``):
    stable when other claims are added, removed or moved; a second claim of the same setting and order
    gets ``~2``."""
    return f"{_slug(setting)}:{'>'.join(_slug(name) for name in order)}"


class Claim(StrictSection):
    setting: str
    #: The rows from best to worst, each once (a row twice could never be judged: "not resolved").
    order: Annotated[list[str], Field(min_length=2), AfterValidator(_distinct_names)]
    source: str = ""
    #: How the docs cite it and ``families`` name it (default: :func:`claim_id`).
    id: str | None = Field(default=None, pattern=CLAIM_ID)


class Winners(StrictSection):
    """How a ``study:NAME:winners`` block judges each setting."""

    #: Rows scored by another protocol than the rest (FRL's deployment groups beside K-shot episodes):
    #: shown in a column of their own, never named best or compared with the best.
    apart: list[str] = Field(default_factory=list)
    #: Why they stand apart, the column's heading.
    why: str = "scored differently"
    #: A federated row -> its ceiling: the same learner trained without federation (one client holding
    #: every training class, the centralised twin), what the row is measured against (the price of
    #: federation). A ceiling is never named best or ranked among the federated rows.
    ceilings: dict[str, str] = Field(default_factory=dict)


class MetricTable(StrictSection):
    """A further table of the same cells: another number from each run's summary (a bad client's
    rank, a correlation), mean and 95% interval over seeds, after the main table. No paper column,
    control or claims: those belong to the study's ``metric``."""

    metric: str
    #: What the numbers are, shown above the table.
    title: str
    #: The stored value times this (100: percent, as the main table shows ``metric``; 1: as stored).
    scale: float = 1.0
    #: Only these rows / columns (default: every one the budget runs).
    methods: Names | None = None
    settings: Names | None = None


#: What a choice may read: the validation tasks' numbers (an evaluated round's ``val_*``, the selected
#: round's score, which the validation tasks chose and scored) and never the test tasks'.
VALIDATION_METRIC = re.compile(r"^(history\.(last|first|\d+)\.val_[A-Za-z0-9_]+|selected_score|"
                               r"initial_score\.accuracy)$")


def validation_metric(text: str) -> str:
    """``text`` if it reads validation tasks only (:data:`VALIDATION_METRIC`), else a ValueError naming it."""
    parse_metric(text)
    if not VALIDATION_METRIC.match(text):
        raise ValueError(f"{text!r} is not a validation metric: a choice reads the validation tasks only "
                         "(history.last.val_accuracy, history.<round>.val_*, selected_score, "
                         "initial_score.accuracy of runs that have validation tasks), never the test tasks")
    return text


class Choice(StrictSection):
    """A choice made from results (the rows of a combination, a step size): computed from the store by
    ``fedfew study choose`` on validation numbers only, shown in the docs (``study:NAME:choice:KEY``),
    and checked against the config that holds it by the study's tests."""

    #: The budget and setting whose stored runs the choice reads.
    budget: str
    setting: str
    #: A validation metric of each run (:data:`VALIDATION_METRIC`): reading a test number is an error.
    metric: Annotated[str, AfterValidator(validation_metric)]
    #: ``positive``: every candidate whose mean paired difference to ``against`` over the seeds is above
    #: 0 (the rows of a combination); ``best``: the one candidate with the highest mean (a step size).
    rule: str = Field(pattern=r"^(positive|best)$")
    candidates: Names
    #: The reference row of ``positive`` (each candidate's effect is its difference to it).
    against: str | None = None
    #: What the choice is for, in words (shown above its table).
    title: str = ""
