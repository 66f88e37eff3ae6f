"""Choices made from results (a study's ``choices:``): the rows of a combination or a step size, computed
from the store on validation numbers only, so that no choice is made on the test tasks that then score
it. ``fedfew study choose STUDY NAME`` prints one; a ``<!-- study:NAME:choice-KEY begin -->`` block shows
it in the docs; the study's tests check that the config holding the choice is what the rule gives.

Rules (:class:`fedfew.study.study_file.Choice`):

- ``positive``: every candidate whose mean paired difference to ``against`` over the seeds both have is
  above 0 (whatever its interval: the rule of a combination of small effects);
- ``best``: the candidate with the highest mean over seeds (ties: the first listed).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

from fedfew.study.collect import collect
from fedfew.study.study_file import Study
from fedfew.study.study_sections import Choice, StudyError


@dataclass(frozen=True)
class Candidate:
    method: str
    #: {seed: the candidate's value} (percent) and, for ``positive``, {seed: its difference to ``against``}
    values: dict[int, float]
    differences: dict[int, float]

    @property
    def score(self) -> float:
        """What the rule ranks: the mean paired difference (``positive``) or the mean value (``best``)."""
        numbers = self.differences or self.values
        return sum(numbers.values()) / len(numbers) if numbers else float("nan")


@dataclass(frozen=True)
class MadeChoice:
    name: str
    choice: Choice
    candidates: list[Candidate]
    chosen: list[str]
    #: Candidates (or the reference row) with no stored value at some seed of the budget: the choice
    #: waits for them.
    missing: list[str]


def make_choice(study: Study, root: Path, store_base: Path, name: str) -> MadeChoice:
    """The choice ``name`` of ``study`` as the committed store gives it."""
    if name not in study.choices:
        known = ", ".join(study.choices) or "none"
        raise StudyError(f"study {study.name} has no choice {name!r} (its choices: {known})")
    choice = study.choices[name]
    # Read every candidate at the choice's validation metric, whatever the study's or the budget's metric.
    reading = study.model_copy(update={"metric": choice.metric, "budgets": {
        **study.budgets, choice.budget: study.budget(choice.budget).model_copy(update={"metric": None})}})
    results = collect(reading, root, store_base, choice.budget)
    seeds = study.budget(choice.budget).seeds or study.seeds
    reference = results.values.get((choice.against, choice.setting), {}) if choice.against else {}
    missing = [m for m in [*choice.candidates, *([choice.against] if choice.against else [])]
               if set(results.values.get((m, choice.setting), {})) < set(seeds)]
    if missing and results.cells_without_metric:  # stored, yet without the number: waiting would not help
        raise StudyError(f"study {study.name}, choice {name}: {results.cells_without_metric} stored cell(s) at the "
                         f"{choice.budget} budget have no {choice.metric} in their records (a validation number needs "
                         "runs with a validation split, splits.val); the choice cannot be made from them")
    candidates = []
    for method in choice.candidates:
        values = {s: v for s, v in results.values.get((method, choice.setting), {}).items() if s in seeds}
        differences = {s: v - reference[s] for s, v in values.items() if s in reference} if choice.against else {}
        candidates.append(Candidate(method, values, differences))
    if missing:
        chosen: list[str] = []
    elif choice.rule == "positive":
        chosen = [c.method for c in candidates if c.score > 0]
    else:
        chosen = [max(candidates, key=lambda c: c.score).method]
    return MadeChoice(name, choice, candidates, chosen, missing)


def choice_markdown(made: MadeChoice, study: Study, study_path: str) -> str:
    """The choice as the docs show it: the rule, each candidate's validation number, the chosen rows."""
    choice = made.choice
    command = f"fedfew study choose {shlex.quote(study_path)} {made.name}"
    if made.missing:
        return (f"*Choice `{made.name}` waits for runs*: {', '.join(made.missing)} at the {choice.budget} budget "
                f"({choice.setting}) are not all in the store. Made by `{command}`.\n")
    what = (f"mean paired difference to {study.label(choice.against)} over seeds"
            if choice.rule == "positive" and choice.against else "mean over seeds")
    rule = ("every candidate whose mean paired difference is above 0" if choice.rule == "positive"
            else "the candidate with the highest mean")
    seeds = ", ".join(map(str, sorted({s for c in made.candidates for s in c.values})))
    lines = [f"{choice.title + ': ' if choice.title else ''}chosen on validation tasks only: `{choice.metric}` of "
             f"the {choice.budget} budget's runs, {choice.setting}, seeds {seeds}; rule: {rule}. "
             f"Made by `{command}`.", "",
             f"| candidate | {what} | per seed | chosen |", "|---|---|---|---|"]
    signed = choice.rule == "positive"  # differences carry their sign; plain means do not
    for c in sorted(made.candidates, key=lambda c: -c.score):
        per_seed = c.differences if signed else c.values
        shown = ", ".join(f"{per_seed[s]:+.2f}" if signed else f"{per_seed[s]:.2f}" for s in sorted(per_seed))
        score = f"{c.score:+.2f}" if signed else f"{c.score:.2f}"
        lines.append(f"| {study.label(c.method)} | {score} | {shown} | {'**yes**' if c.method in made.chosen else 'no'} |")
    lines.append("")
    lines.append(f"Chosen: {'; '.join(study.label(m) for m in made.chosen) or 'none'}.")
    return "\n".join(lines) + "\n"
