"""The study file: one YAML file per paper table or figure, under ``studies/``. This module is the whole
file (:class:`Study`: what its parts say of one another, the claim ids, the budgets) and :func:`load_study`;
its parts, each checked alone, are :mod:`fedfew.study.study_sections`.

A study is a grid of ordinary runs. Every cell's config is the base config with overrides applied in
this order: the study's ``set``, the setting's ``set``, the method's ``set``, the setting's
``per_method`` entry for the method, the budget's ``set``, the budget's ``per_method`` entry for the
method, the command line's ``--set``, then ``seed``. The untrained control of a setting is the control
method's cell with ``federation.rounds: 0``. Unknown keys are errors naming the key and the file.

::

    name: fedfsl-table3                      # the store's folder and the docs marker's name
    title: FedFSL Table 3 on Omniglot
    config: configs/fedfsl/omniglot.yaml     # base config, relative to the study's root (see above)
    set: {federation.rounds: 20}             # overrides for every cell (dotted keys, YAML values)
    methods:                                  # rows, in order
      FedFSL-naive: {set: {algorithm.name: fl-maml}}
      FedFSL-MI: {set: {algorithm.name: fedfsl-mi}, config: other.yaml}   # a method's own base config
    settings:                                 # columns, in order
      IID 1-shot: {set: {partition.name: iid, episodes.k_shot: 1}}
    seeds: [0, 1, 2]                          # distinct; no list in the file may be empty
    budgets:                                  # smoke (seconds, for CI), cpu (hours on 2 cores), paper
      smoke: {set: {federation.rounds: 1}, seeds: [0, 1], methods: [FedFSL-naive]}
      cpu: {}
    control: {method: FedFSL-naive}           # the round-0 row (omit it, and say why in no_control)
    paper:                                    # the paper's numbers, one entry per table column group
      - source: Table 3, miniImageNet
        values: {FedFSL-naive: {IID 1-shot: 53.00}}
    claims:                                   # orderings within a column: first > second > ...
      - {setting: IID 1-shot, order: [FedFSL-MI, FedFSL-naive], source: section 5.4, id: mi-first}
    families: {headline: [mi-first]}          # claims judged together (Holm); default: all claims, one family
    choices:                                  # a choice made from results: validation metrics only
      rows: {budget: cpu, setting: IID 1-shot, metric: history.last.val_accuracy, against: FedFSL-naive,
             candidates: [FedFSL-MI], rule: positive}
    tables:                                   # further tables of the same cells, one metric each
      - {metric: test.corrupt_rank_mean, title: mean rank of the bad clients, scale: 1, methods: [FedFSL-MI]}
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml
from pydantic import Field, ValidationError, field_validator, model_validator

from fedfew.config.validation import DuplicateKeyError, load_yaml
from fedfew.core.yaml12 import MAX_BYTES, TooLargeError, YamlNumberError
from fedfew.study.study_sections import (
    ALL_CLAIMS,
    CONTROL,
    OTHER_CLAIMS,
    Budget,
    Choice,
    Claim,
    Control,
    MetricTable,
    Names,
    Overrides,
    PaperColumns,
    Row,
    Seeds,
    StrictSection,
    StudyError,
    Winners,
    claim_id,
    parse_metric,
)

#: The longest study name: it names the store's folder and begins every cell's run folder name.
MAX_NAME = 100


class Study(StrictSection):
    #: Letters, digits, ``_``, ``-`` and ``.``, not first: ``.``, ``..`` or ``.hidden`` would put records
    #: beside other studies, in the store's parent or out of sight.
    name: str = Field(pattern=r"^[A-Za-z0-9_-][A-Za-z0-9_.-]*$", max_length=MAX_NAME)
    title: str = ""
    config: str | None = None
    set: Overrides = Field(default_factory=dict)
    methods: dict[str, Row] = Field(min_length=1)
    settings: dict[str, Row] = Field(default_factory=lambda: {"all": Row()}, min_length=1)
    seeds: Seeds = Field(default_factory=lambda: [0, 1, 2])
    budgets: dict[str, Budget]
    #: The budget whose results the docs show.
    docs_budget: str = "cpu"
    #: A path into a run's summary.json (``test.accuracy``), reported in percent; ``[k1,k2]`` at the end
    #: is the mean of those keys (:data:`METRIC_PATH`). A method or a setting may name its own.
    metric: str = "test.accuracy"
    #: Further tables of the same cells, each another metric of the runs (after the main table).
    tables: list[MetricTable] = Field(default_factory=list)
    control: Control | None = None
    #: Why the study has no untrained control (required without ``control``): shown under its tables.
    no_control: str = ""
    paper: list[PaperColumns] = Field(default_factory=list)
    claims: list[Claim] = Field(default_factory=list)
    #: Families of claims, by claim id: each family's comparisons are judged together (Holm), and a claim
    #: belongs to one family. Without it every claim is in one family (``all``); with it the claims it
    #: does not name form the family ``other``.
    families: dict[str, Names] = Field(default_factory=dict)
    winners: Winners = Field(default_factory=Winners)
    #: Choices made from results, by name: each on validation numbers only.
    choices: dict[str, Choice] = Field(default_factory=dict)
    notes: str = ""

    @field_validator("methods", "settings", mode="before")
    @classmethod
    def _rows(cls, value: object) -> object:
        # A row may be written as its overrides alone: ``FedFSL-MI: {algorithm.name: fedfsl-mi}`` is
        # short for ``{set: {...}}`` when none of its keys is a Row field.
        if isinstance(value, dict):
            return {k: (v if isinstance(v, dict) and set(v) <= set(Row.model_fields) else
                        {"set": v} if isinstance(v, dict) else v if v is not None else {})
                    for k, v in value.items()}
        return value

    @field_validator("metric")
    @classmethod
    def _metric_path(cls, value: str) -> str:
        parse_metric(value)
        return value

    @model_validator(mode="after")
    def _names(self) -> Study:
        if any(m.metric for m in self.methods.values()) and any(s.metric for s in self.settings.values()):
            raise ValueError("metric: set it on methods or on settings, not both (a cell reads one number)")
        if "smoke" not in self.budgets:
            raise ValueError("budgets: a study needs a 'smoke' budget (seconds, for the test suite)")
        if CONTROL in self.methods:
            raise ValueError(f"methods: {CONTROL!r} is reserved for the untrained control row")
        for budget_name, budget in self.budgets.items():
            for kind, names, known in (("methods", budget.methods, self.methods),
                                       ("settings", budget.settings, self.settings)):
                for name in names or []:
                    if name not in known:
                        raise ValueError(f"budgets.{budget_name}.{kind}: {name!r} is not one of {list(known)}")
            for method_name in budget.per_method:
                if method_name not in self.methods:
                    raise ValueError(f"budgets.{budget_name}.per_method: {method_name!r} is not one of "
                                     f"{list(self.methods)}")
        named = [("apart", name) for name in self.winners.apart] + [
            ("ceilings", name) for pair in self.winners.ceilings.items() for name in pair]
        for key, name in named:
            if name not in self.methods:
                raise ValueError(f"winners.{key}: {name!r} is not one of {list(self.methods)}")
        for name, method in self.methods.items():
            if method.per_method:
                raise ValueError(f"methods.{name}.per_method: only a setting takes per-method overrides")
        for name, setting in self.settings.items():
            for method_name in setting.per_method:
                if method_name not in self.methods:
                    raise ValueError(f"settings.{name}.per_method: {method_name!r} is not one of {list(self.methods)}")
        for i, extra in enumerate(self.tables):
            for kind, names, known in (("methods", extra.methods, self.methods), ("settings", extra.settings, self.settings)):
                for name in names or []:
                    if name not in known:
                        raise ValueError(f"tables[{i}].{kind}: {name!r} is not one of {list(known)}")
        if self.control is not None and self.control.method not in self.methods:
            raise ValueError(f"control.method: {self.control.method!r} is not one of {list(self.methods)}")
        if self.control is None and not self.no_control.strip():
            raise ValueError("control: the study has no untrained control; add one (control: {method: ...}) or say "
                             "why none applies (no_control: ...)")
        if self.control is not None:
            for budget_name, budget in self.budgets.items():
                if not budget.control and not budget.no_control.strip():
                    raise ValueError(f"budgets.{budget_name}: control: false needs no_control: why this budget runs "
                                     "no untrained control")
        for name, method in self.methods.items():
            if method.untrained_of is None:
                continue
            source = self.methods.get(method.untrained_of)
            if source is None or source.untrained or method.set or method.config:
                raise ValueError(f"methods.{name}.untrained_of: {method.untrained_of!r} is not one of this study's "
                                 "trained rows" if source is None or source.untrained else
                                 f"methods.{name}: an untrained_of row takes its method's config and set; give "
                                 "neither")
            method.untrained = True
            if source.control is None:
                source.control = name
        for name, method in self.methods.items():
            if method.control is None:
                continue
            own = self.methods.get(method.control)
            if own is None or not own.is_control():
                untrained = [n for n, m in self.methods.items() if m.is_control()]
                raise ValueError(f"methods.{name}.control: {method.control!r} is not one of this study's untrained "
                                 f"rows ({', '.join(untrained) or 'it has none: add one with untrained: true'})")
            if method.untrained:
                raise ValueError(f"methods.{name}.control: an untrained row has no control of its own")
        for choice_name, choice in self.choices.items():
            where = f"choices.{choice_name}"
            if choice.budget not in self.budgets:
                raise ValueError(f"{where}.budget: {choice.budget!r} is not one of {list(self.budgets)}")
            if choice.setting not in self.settings:
                raise ValueError(f"{where}.setting: {choice.setting!r} is not one of {list(self.settings)}")
            for method_name in [*choice.candidates, *([choice.against] if choice.against else [])]:
                if method_name not in self.methods:
                    raise ValueError(f"{where}: {method_name!r} is not one of {list(self.methods)}")
            if choice.rule == "positive" and choice.against is None:
                raise ValueError(f"{where}.against: rule positive needs the reference row each candidate is "
                                 "compared with")
        for i, columns in enumerate(self.paper):
            for method_name, values in columns.values.items():
                if method_name not in self.methods and method_name != CONTROL:
                    raise ValueError(f"paper[{i}].values: {method_name!r} is not one of {list(self.methods)}")
                for setting_name in values:
                    if setting_name not in self.settings:
                        raise ValueError(f"paper[{i}].values.{method_name}: {setting_name!r} is not one of "
                                         f"{list(self.settings)}")
        for i, claim in enumerate(self.claims):
            if claim.setting not in self.settings:
                raise ValueError(f"claims[{i}].setting: {claim.setting!r} is not one of {list(self.settings)}")
            for method_name in claim.order:
                if method_name not in self.methods and not (method_name == CONTROL and self.control is not None):
                    raise ValueError(f"claims[{i}].order: {method_name!r} is not one of {list(self.methods)}"
                                     + ("" if self.control is not None else " (no control declared)"))
            if CONTROL in claim.order:
                # "above its control" means above its own head's round 0, never another head's
                for method_name in claim.order:
                    own_control = self.methods[method_name].control if method_name in self.methods else None
                    if own_control is not None:
                        raise ValueError(f"claims[{i}].order: {method_name!r} has its own control {own_control!r}; "
                                         f"name it in place of {CONTROL!r} (the study's control is another head's "
                                         "round 0)")
        if self.docs_budget not in self.budgets:
            raise ValueError(f"docs_budget: {self.docs_budget!r} is not one of {list(self.budgets)}")
        ids = self.claim_ids()  # a given id used twice is an error there
        owner: dict[str, str] = {}
        for family, members in self.families.items():
            if family in (ALL_CLAIMS, OTHER_CLAIMS) or not re.match(r"^[A-Za-z0-9_.-]+$", family):
                raise ValueError(f"families: {family!r} is not a family name (letters, digits, _ . -; "
                                 f"{ALL_CLAIMS!r} and {OTHER_CLAIMS!r} are the default families' names)")
            for member in members:
                if member not in ids:
                    shown = ", ".join(ids[:6]) + (f", ... ({len(ids)} in all)" if len(ids) > 6 else "")
                    raise ValueError(f"families.{family}: {member!r} is not one of this study's claim ids"
                                     + (f" ({shown})" if ids else " (it has no claims)"))
                if member in owner:
                    raise ValueError(f"families.{family}: claim {member!r} is already in family {owner[member]!r}; "
                                     "a claim belongs to one family")
                owner[member] = family
        return self

    def claim_ids(self) -> list[str]:
        """Each claim's id, in the file's order: its own, or :func:`claim_id` (``~2``, ``~3`` on a
        repeat). A given id used twice is a ValueError."""
        ids: list[str] = []
        for i, claim in enumerate(self.claims):
            if claim.id is not None:
                if claim.id in ids:
                    raise ValueError(f"claims[{i}].id: {claim.id!r} is the id of another claim; give each claim "
                                     "its own")
                ids.append(claim.id)
                continue
            base = claim_id(claim.setting, claim.order)
            made, k = base, 1
            while made in ids or any(c.id == made for c in self.claims):
                k += 1
                made = f"{base}~{k}"
            ids.append(made)
        return ids

    def family_of(self) -> dict[str, str]:
        """{claim id: its family's name}."""
        owner = {member: family for family, members in self.families.items() for member in members}
        default = OTHER_CLAIMS if self.families else ALL_CLAIMS
        return {cid: owner.get(cid, default) for cid in self.claim_ids()}

    def budget(self, name: str) -> Budget:
        if name not in self.budgets:
            raise StudyError(f"study {self.name}: budget {name!r} does not exist; this study has "
                             f"{', '.join(self.budgets)}")
        return self.budgets[name]

    def metric_of(self, method: str, setting: str) -> str:
        """The metric path a cell of ``method`` (or the control) in ``setting`` reports."""
        row = self.methods.get(method)
        return (row.metric if row is not None else None) or self.settings[setting].metric or self.metric

    def source_of(self, method: str) -> str:
        """The row whose config, ``set`` and ``per_method`` entries a row's cells take: its own, or for an
        ``untrained_of`` row that method's."""
        row = self.methods.get(method)
        return row.untrained_of if row is not None and row.untrained_of else method

    def ranked(self, method: str) -> bool:
        """Whether a row is a trained method: not the control, not an untrained row."""
        return method != CONTROL and not self.methods[method].is_control()

    def competes(self, method: str) -> bool:
        """Whether a row competes (winners, the aggregate view, the summary line): a trained row neither
        kept apart (``winners.apart``) nor a ceiling (``winners.ceilings``)."""
        return (self.ranked(method) and method not in self.winners.apart
                and method not in self.winners.ceilings.values())

    def no_control_reason(self, budget: str) -> str | None:
        """Why ``budget``'s block has no untrained control row, or None when it has one."""
        if self.control is None:
            return self.no_control.strip()
        chosen = self.budget(budget)
        return None if chosen.control else chosen.no_control.strip()

    def label(self, method: str) -> str:
        if method == CONTROL:
            return self.control.label if self.control else CONTROL
        return self.methods[method].label or method


def _format(err: ValidationError) -> str:
    parts = []
    for e in err.errors():
        key = ".".join(str(p) for p in e["loc"]) or "(top level)"
        if e["type"] == "extra_forbidden":
            parts.append(f"{key}: unknown key")
        elif e["type"] == "missing":
            parts.append(f"{key}: required key missing")
        else:
            parts.append(f"{key}: {e['msg'].removeprefix('Value error, ')}"
                         + ("" if e["type"] == "value_error" else f" (got {json.dumps(e.get('input'), default=str)})"))
    return "; ".join(parts)


def load_study(path: str | Path) -> tuple[Study, Path]:
    """The validated study in ``path`` and its root, the folder its relative config paths start from
    and whose ``studies/store`` is its default store: the folder above ``studies/`` for a file in a
    folder named ``studies`` (a repository's studies), else the file's own folder."""
    path = Path(path)
    if not path.is_file():
        raise StudyError(f"study file {path} does not exist")
    try:
        if path.stat().st_size > MAX_BYTES:  # refused unread
            raise StudyError(f"study file {path} is {path.stat().st_size:,} bytes, above the {MAX_BYTES:,} a study "
                             "file may hold")
        data = load_yaml(path.read_text())
    except DuplicateKeyError as err:  # plain YAML keeps the last of the two silently
        raise StudyError(f"study file {path}: {err}; remove one of them") from None
    except (YamlNumberError, TooLargeError) as err:
        raise StudyError(f"study file {path}: {err}") from None
    except (yaml.YAMLError, UnicodeDecodeError) as err:
        raise StudyError(f"study file {path} is not valid YAML: {' '.join(str(err).split())}") from None
    if not isinstance(data, dict):
        raise StudyError(f"study file {path} must hold a mapping at the top level")
    try:
        study = Study.model_validate(data)
    except ValidationError as err:
        raise StudyError(f"study file {path}: {_format(err)}") from None
    base = path.resolve().parent
    root = base.parent if base.name == "studies" else base
    return study, root
