"""A study's claims judged at one budget: each claim's raw and Holm-adjusted verdicts over its family
(the statistics are :mod:`fedfew.study.verdict`'s), and their table with each link's paired difference."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from fedfew.study.collect import StudyResults
from fedfew.study.study_sections import CONTROL, Claim
from fedfew.study.table_cells import format_interval, marked_label, table_legend
from fedfew.study.verdict import ALPHA, PairVerdict, adjust, chain_verdict, judge_order


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


def pair_links(results: StudyResults, judged: JudgedClaim) -> str:
    """Each link's paired difference with its p-value, raw and Holm-adjusted; a chain's links also with
    their verdicts (raw / Holm), beside the chain's."""
    study = results.study
    chain = len(judged.pairs) > 1
    parts = []
    for p in judged.pairs:
        text = (f"{study.label(p.above)} − {study.label(p.below)}: {format_interval(p.difference)} "
                f"(p {_p(p.p_value)}, Holm {_p(p.adjusted_p)})")
        parts.append(text + (f": {p.verdict} / {p.adjusted}" if chain else ""))
    return "; ".join(parts)


def holm_cell(results: StudyResults, judged: JudgedClaim) -> str:
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
        order = " > ".join(marked_label(results, m, j.claim.setting) for m in j.claim.order)
        lines.append(f"| {order} | {j.claim.setting} | {j.claim.source or '—'} | **{j.verdict}** | "
                     f"{holm_cell(results, j)} | {pair_links(results, j)} | `{j.id}` |")
    text = "\n".join(lines) + "\n"
    return text + table_legend(text)
