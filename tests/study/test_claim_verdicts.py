"""A study's claims judged (fedfew.study.claim_verdicts): a chain shows each link's raw and Holm verdict,
declared families are judged apart, and the headline claims run on five seeds."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedfew.study.claim_verdicts import claims, claims_table
from fedfew.study.collect import collect
from fedfew.study.study_file import load_study
from fedfew.study.verdict import (
    HOLDS,
    NOT_RESOLVED,
)
from tests.study.common import CHAIN, CHAIN_VALUES, REPO, _results

#: Each paper's headline claim and the benchmark's one-line summary: (study file, budget, a claim id the
#: budget judges). These run on 5 seeds.
HEADLINES = [
    ("fedfsl_table3.yaml", "headline-50x4", "non-iid-1-shot:fedfsl-mi-adv>fedfsl-naive"),
    ("f2l_ledger.yaml", "paper-headline", "iid-1-shot:base>fl-proto"),
    ("fml_tables.yaml", "headline", "mnist-mlp-iid:fml>fedavg"),
    ("frl_table3.yaml", "headline", "non-iid-2-unseen-3-seen:frl>finetune"),
    ("adfl_mnist.yaml", "headline", "iid-fig-2:adfl-ensemble>cv-ensemble"),
    ("benchmark_fewshot.yaml", "headline", "huffpost-non-iid-1-shot:fedfsl-mi-adv>fedfsl-naive"),
]


@pytest.mark.parametrize("study_file, budget, claim", HEADLINES, ids=[h[0] for h in HEADLINES])
def test_headline_claims_run_on_five_seeds(study_file: str, budget: str, claim: str) -> None:
    from fedfew.study.claim_verdicts import claims

    study, root = load_study(REPO / "studies" / study_file)
    assert len(study.budget(budget).seeds or study.seeds) >= 5
    results = collect(study, root, REPO / "studies/store", budget)
    assert results.cells_found == results.cells_total, f"{study_file}@{budget}: cells not yet in the store"
    judged = {j.id: j for j in claims(results)}
    assert claim in judged and len(results.seeds) >= 5


def test_a_chain_shows_each_links_verdict_raw_and_holm_beside_the_chains(tmp_path: Path) -> None:
    results = _results(tmp_path, CHAIN, CHAIN_VALUES)
    judged = {j.id: j for j in claims(results)}
    chain = judged["iid-1-shot:fl-proto>fl-maml>control"]
    assert [p.verdict for p in chain.pairs] == [NOT_RESOLVED, HOLDS] and chain.verdict == NOT_RESOLVED
    assert chain.family == "all" and chain.family_claims == 3 and chain.family_tests == 4
    # Holm over the family's 4 tests: each p-value times up to 4
    raw = sorted(p.p_value for j in judged.values() for p in j.pairs)
    assert sorted(p.adjusted_p for j in judged.values() for p in j.pairs)[0] == pytest.approx(min(1.0, 4 * raw[0]))
    table = claims_table(results)
    row = next(line for line in table.splitlines() if "`iid-1-shot:fl-proto>fl-maml>control`" in line)
    cells = row.split(" | ")
    assert cells[3] == "**not resolved**" and cells[4] == "**not resolved**"  # the chain's raw, then Holm
    assert ": not resolved / not resolved;" in cells[5] and cells[5].count(" / ") == 2  # each link: raw / Holm
    assert "(p " in cells[5] and ", Holm " in cells[5]
    assert "`all`: 3 claims, 4 comparisons with a test" in table
    assert "A chain A > B > C holds when every link holds" in table


def test_declared_families_are_judged_apart(tmp_path: Path) -> None:
    data = {**CHAIN, "families": {"trained": ["proto-trained"]}}
    results = _results(tmp_path, data, CHAIN_VALUES)
    judged = {j.id: j for j in claims(results)}
    assert judged["proto-trained"].family == "trained" and judged["proto-trained"].family_claims == 1
    assert judged["non-iid-1-shot:fl-proto>fl-maml"].family == "other"
    alone = judged["proto-trained"].pairs[0]
    assert alone.adjusted_p == alone.p_value  # a family of one
    table = claims_table(results)
    assert "`trained`: 1 claim, 1 comparison with a test" in table and "`other`: 2 claims" in table
    assert "**holds** (trained)" in table  # the Holm cell names the family when the study declares families
