"""Prose that cannot drift: a sentence of the docs that states a comparison cites the claim row that
computes it, with the verdict it states, and :func:`check_pages` compares every citation with what the
store gives (tests/study/test_citations.py runs it on every docs page; ``fedfew study docs`` reports a citation
whose claim's verdict has changed).

A citation, as it reads in the page::

    [claim: STUDY#ID = holds]                          the raw and the Holm-adjusted verdict are both "holds"
    [claim: STUDY@BUDGET#ID = holds; Holm: not resolved]   they differ; at a budget other than the docs budget
    [claim: STUDY#ID, link 2 = reversed]               one link of a chain claim (A > B > C: link 2 is B > C)

STUDY is the study's ``name``, ID the claim's id (its ``id``, or the one made from its setting and order,
shown in the last column of every claims table), and the verdicts are ``holds``, ``reversed`` or
``not resolved``. Inline code (between backticks) and fenced code are not read, so a page can show the
syntax.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from fedfew.study.claim_verdicts import JudgedClaim, claims
from fedfew.study.collect import StudyResults, collect
from fedfew.study.study_file import Study, load_study
from fedfew.study.study_sections import CLAIM_ID, StudyError

_VERDICT = r"holds|reversed|not resolved"
#: A well-formed citation.
CITATION = re.compile(r"\[claim: (?P<study>[A-Za-z0-9_.-]+)(?:@(?P<budget>[A-Za-z0-9_.-]+))?#(?P<id>"
                      + CLAIM_ID.strip("^$") + r")(?:, link (?P<link>[1-9][0-9]*))? = (?P<raw>" + _VERDICT
                      + r")(?:; Holm: (?P<holm>" + _VERDICT + r"))?\]")
#: Anything that opens like a citation (one that does not parse as :data:`CITATION` is reported).
OPENING = re.compile(r"\[claim:")
#: Fenced code, and inline code (which may run over a line break, not over a blank line).
_CODE = re.compile(r"```.*?```|`(?:[^`\n]|\n(?!\n))*`", re.DOTALL)


@dataclass(frozen=True)
class Citation:
    page: Path
    line: int
    text: str
    study: str
    budget: str | None
    id: str
    link: int | None
    raw: str
    holm: str  # the stated Holm verdict: the raw one when the citation names none


@dataclass(frozen=True)
class Problem:
    page: Path
    line: int
    text: str
    why: str

    def __str__(self) -> str:
        return f"{self.page}:{self.line}: {self.text}: {self.why}"


def _without_code(text: str) -> str:
    """``text`` with code blanked (spaces, newlines kept): positions and line numbers stay the page's."""
    return _CODE.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), text)


def find_citations(page: Path, text: str) -> tuple[list[Citation], list[Problem]]:
    """The citations of a page's text, and a problem for each ``[claim:`` that is not one."""
    prose = _without_code(text)
    found, problems = [], []
    for opening in OPENING.finditer(prose):
        line = prose.count("\n", 0, opening.start()) + 1
        match = CITATION.match(prose, opening.start())
        if match is None:
            snippet = prose[opening.start():opening.start() + 80].split("]")[0] + "]"
            problems.append(Problem(page, line, snippet, "not a citation: [claim: STUDY[@BUDGET]#ID[, link N] = "
                                    "VERDICT[; Holm: VERDICT]] with VERDICT holds, reversed or not resolved"))
            continue
        found.append(Citation(page, line, match.group(0), match["study"], match["budget"], match["id"],
                              int(match["link"]) if match["link"] else None, match["raw"],
                              match["holm"] or match["raw"]))
    return found, problems


def check_citation(citation: Citation, judged: list[JudgedClaim], study: Study, budget: str) -> str | None:
    """Why ``citation`` disagrees with the verdicts the store gives (None: it agrees)."""
    claim = next((j for j in judged if j.id == citation.id), None)
    if claim is None:
        if citation.id not in study.claim_ids():
            return f"study {study.name} has no claim {citation.id!r}"
        return f"claim {citation.id!r} is not judged at the {budget} budget (its rows or setting do not run there)"
    raw, holm = claim.verdict, claim.adjusted
    if citation.link is not None:
        if citation.link > len(claim.pairs):
            return f"claim {citation.id!r} has {len(claim.pairs)} link(s), not {citation.link}"
        pair = claim.pairs[citation.link - 1]
        raw, holm = pair.verdict, pair.adjusted
    if (raw, holm) != (citation.raw, citation.holm):
        stated = citation.raw if citation.raw == citation.holm else f"{citation.raw}; Holm: {citation.holm}"
        computed = raw if raw == holm else f"{raw}; Holm: {holm}"
        return f"states {stated!r}, the store gives {computed!r}"
    return None


def check_pages(root: Path, store_base: Path | None = None,
                results_of: Callable[[Study, str], StudyResults] | None = None) -> tuple[int, list[Problem]]:
    """Every citation of every docs page against the store: (citations read, problems)."""
    store_base = store_base or root / "studies" / "store"
    studies: dict[str, Study] = {}
    for path in sorted((root / "studies").glob("*.yaml")):
        loaded, _ = load_study(path)
        studies[loaded.name] = loaded
    judged: dict[tuple[str, str], list[JudgedClaim]] = {}

    def claims_at(study: Study, budget: str) -> list[JudgedClaim]:
        if (study.name, budget) not in judged:
            results = results_of(study, budget) if results_of else collect(study, root, store_base, budget)
            judged[study.name, budget] = claims(results)
        return judged[study.name, budget]

    count, problems = 0, []
    for page in sorted((root / "docs").glob("*.md")):
        found, bad = find_citations(page.relative_to(root), page.read_text())
        problems += bad
        count += len(found)
        for citation in found:
            study = studies.get(citation.study)
            if study is None:
                problems.append(Problem(citation.page, citation.line, citation.text,
                                        f"no study named {citation.study!r} in {root / 'studies'}"))
                continue
            budget = citation.budget or study.docs_budget
            if budget not in study.budgets:
                problems.append(Problem(citation.page, citation.line, citation.text,
                                        f"study {study.name} has no budget {budget!r}"))
                continue
            try:
                why = check_citation(citation, claims_at(study, budget), study, budget)
            except StudyError as err:
                why = str(err)
            if why:
                problems.append(Problem(citation.page, citation.line, citation.text, why))
    return count, problems
